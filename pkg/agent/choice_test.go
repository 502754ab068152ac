package agent_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/ethtool"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// TestNormalizePolicy: what an agent makes of a policy before any
// kernel work: the defaults filled in (auto steering, the default rule
// range, auto mode, the agent's linger, the reserved queues sorted once
// each), and what it refuses, naming the field. TestSetRefusesBadPolicy
// shows Set refusing them on veth, as root.
func TestNormalizePolicy(t *testing.T) {
	p, err := agent.NormalizePolicy(agent.Policy{Reserved: []uint32{3, 1, 3, 2, 1}}, 7*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if p.Steering != agent.SteerAuto || p.Rules != agent.DefaultRules || p.Mode != xdp.ModeAuto || p.Linger != 7*time.Second ||
		fmt.Sprint(p.Reserved) != "[1 2 3]" {
		t.Errorf("the zero policy's defaults: %+v", p)
	}
	kept := agent.Policy{Steering: agent.SteerSoftware, Rules: agent.RuleRange{First: 100, Count: 8}, Mode: xdp.ModeGeneric, Linger: time.Minute}
	if p, err := agent.NormalizePolicy(kept, 7*time.Second); err != nil || p.Steering != kept.Steering || p.Rules != kept.Rules ||
		p.Mode != kept.Mode || p.Linger != kept.Linger {
		t.Errorf("a policy that says everything: %+v, %v; want it kept", p, err)
	}
	for _, c := range []struct {
		p    agent.Policy
		want string
	}{
		{agent.Policy{Steering: "magic"}, `steering "magic": want hardware, software or auto`},
		{agent.Policy{Mode: xdp.ModeOffload}, "want auto, native or generic"},
		{agent.Policy{Linger: -time.Second}, "linger -1s is negative"},
		{agent.Policy{Rules: agent.RuleRange{First: 1<<32 - 2, Count: 4}}, "goes past the last location"},
	} {
		if _, err := agent.NormalizePolicy(c.p, time.Second); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.p, err, c.want)
		}
	}
	if _, err := agent.NormalizePolicy(agent.Policy{Rules: agent.RuleRange{First: 1<<32 - 4, Count: 4}}, time.Second); err != nil {
		t.Errorf("a rule range up to the last location: %v", err)
	}
}

// ntupleProbe is a NIC whose ntuple filters the probe finds or not.
type ntupleProbe struct {
	*fakeNtupleNIC
	err error // RuleTable's
}

func (n ntupleProbe) RuleTable(ifname string) (uint32, bool, error) {
	if n.err != nil {
		return 0, false, n.err
	}
	return n.fakeNtupleNIC.RuleTable(ifname)
}

// TestSteeringChoice: auto steering is hardware on a NIC with ntuple
// filters and software on one that answers it has none; a probe that
// fails otherwise is an error, not a guess; hardware or software asked
// is taken as it is. What hardware steering lacks on the NIC (no ntuple
// filters, reserved queues the RSS table does not keep off) is said so
// the operator knows; software steering lacks neither.
func TestSteeringChoice(t *testing.T) {
	nic := newFakeNtupleNIC(4)
	none := ntupleProbe{nic, fmt.Errorf("get rule count: %w", ethtool.ErrNotSupported)}
	broken := ntupleProbe{nic, errors.New("no such device")}
	for _, c := range []struct {
		name           string
		dev            agent.NtupleDevice
		steer          agent.Steering
		asked, inForce []uint32
		want           agent.Steering
		gaps           string // in the gaps; "" none
		err            string
	}{
		{name: "auto with ntuple filters", dev: nic, steer: agent.SteerAuto, want: agent.SteerHardware},
		{name: "auto without", dev: none, steer: agent.SteerAuto, want: agent.SteerSoftware},
		{name: "auto, the probe failing", dev: broken, steer: agent.SteerAuto, err: "probe ntuple filters: no such device"},
		{name: "hardware asked without ntuple filters", dev: none, steer: agent.SteerHardware, want: agent.SteerHardware,
			gaps: "steering hardware: eth1 has no ntuple filters (an ADD with flows is refused); use steering software (or auto)"},
		{name: "hardware with queues reserved and kept off RSS", dev: nic, steer: agent.SteerHardware, asked: []uint32{2, 3},
			inForce: []uint32{2, 3}, want: agent.SteerHardware},
		{name: "hardware with queues reserved, no RSS table", dev: nic, steer: agent.SteerHardware, asked: []uint32{2, 3},
			want: agent.SteerHardware, gaps: "no RSS indirection table (the host's traffic on queues [2 3] reaches the pods' sockets)"},
		{name: "hardware lacking both", dev: none, steer: agent.SteerHardware, asked: []uint32{3}, want: agent.SteerHardware,
			gaps: "has no ntuple filters (an ADD with flows is refused) and no RSS indirection table"},
		{name: "software asked, the NIC lacking everything", dev: broken, steer: agent.SteerSoftware, asked: []uint32{3},
			want: agent.SteerSoftware},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, gaps, err := agent.SteeringChoice(c.dev, "eth1", c.steer, c.asked, c.inForce)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("steering %s: %v, %v; want the error %q", c.steer, got, err, c.err)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("steering %s: %v, %v; want %v", c.steer, got, err, c.want)
			}
			if (c.gaps == "") != (gaps == "") || !strings.Contains(gaps, c.gaps) {
				t.Errorf("gaps %q, want %q", gaps, c.gaps)
			}
		})
	}
}
