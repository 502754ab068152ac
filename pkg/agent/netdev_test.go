package agent_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/ethtool"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// TestNetdevChanges: down and up, rename, delete. The agent notices each
// from link notifications, reports it and converges; nothing panics.
func TestNetdevChanges(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Second)
	if err := a.Set(p.A.Name, agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	s0, r0 := socket(t, p, 0)
	if err := a.AddSocket(p.A.Name, 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	prog := waitState(t, a, p.A.Name, agent.StateDirect).Program
	send := sender(t, p, 0)

	// Down and up: the program stays, traffic flows again.
	ip(t, p, "link", "set", "dev", p.A.Name, "down")
	ip(t, p, "link", "set", "dev", p.A.Name, "up")
	if st := waitState(t, a, p.A.Name, agent.StateDirect); st.Program != prog {
		t.Errorf("after down/up: program %d, want %d", st.Program, prog)
	}
	if err := r0.Expect(send.UDP(20), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}

	// Rename: the agent follows the ifindex and reports the new name.
	ip(t, p, "link", "set", "dev", p.A.Name, "down")
	ip(t, p, "link", "set", "dev", p.A.Name, "name", "xr")
	ip(t, p, "link", "set", "dev", "xr", "up")
	waitState(t, a, "xr", agent.StateDirect)
	if err := r0.Expect(send.UDP(20), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}

	// Delete: reported missing; the managed name still answers.
	ip(t, p, "link", "del", "dev", "xr")
	a.waitFor(t, "missing after delete", func(all []agent.Status) bool {
		return len(all) == 1 && all[0].State == agent.StateMissing
	})
	if err := a.RemoveSocket(p.A.Name, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Unmanage(p.A.Name); err != nil {
		t.Fatal(err)
	}
}

// TestChannelsAndMode: the agent says why it chose native mode and that
// veth has no zero-copy; the kernel refuses to lower the channel count
// below a bound queue; a lower count above it is noticed and reported,
// and a socket for a queue that went is refused.
func TestChannelsAndMode(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Second)
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerHardware}); err != nil {
		t.Fatal(err)
	}
	s2, _ := socket(t, p, 2)
	if err := a.AddSocket("xa", 2, s2.FD()); err != nil {
		t.Fatal(err)
	}
	st := waitState(t, a, "xa", agent.StateDirect)
	if st.Mode != xdp.ModeNative || !strings.Contains(st.ModeReason, "native XDP_REDIRECT") || st.ZeroCopy || st.RXQueues != 4 {
		t.Errorf("status %+v", st)
	}
	h, err := ethtool.Open(p.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// Native XDP on veth needs as many rx queues as the peer has tx queues.
	if err := h.SetChannels("xb", ethtool.Channels{RX: 4, TX: 2}); err != nil {
		t.Fatal(err)
	}
	if err := h.SetChannels("xa", ethtool.Channels{RX: 2, TX: 4}); err == nil {
		t.Fatal("the kernel let the rx queues drop below bound queue 2")
	}
	if err := h.SetChannels("xa", ethtool.Channels{RX: 3, TX: 4}); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, "3 rx queues noticed", func(all []agent.Status) bool {
		return status(agentReport(all), "xa").RXQueues == 3
	})
	s3, _ := socket(t, p, 0)
	if err := a.AddSocket("xa", 3, s3.FD()); err == nil || !strings.Contains(err.Error(), "3 rx queues now") {
		t.Errorf("socket for queue 3 of 3: %v", err)
	}
}

// TestFreshManageLeavesQueuesFree: with no predecessor's pins, Set
// binds nothing to look for leftover sockets, so the queues are free the
// moment it returns: the rx queues can shrink to one at once (the kernel
// refuses that while any probe socket's pool is still on a queue).
func TestFreshManageLeavesQueuesFree(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Second)
	if err := a.Set("xa", agent.Policy{Steering: agent.SteerSoftware}); err != nil {
		t.Fatal(err)
	}
	h, err := ethtool.Open(p.NSPath())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.SetChannels("xa", ethtool.Channels{RX: 1, TX: 4}); err != nil {
		t.Fatalf("shrink xa's rx queues right after Set: %v", err)
	}
}

// TestAttachAlways: the program is on while the netdev is managed, with
// or without sockets, past the linger period; when the policy stops
// asking, the linger period starts then, and the program goes at its
// end; unmanaged, it goes at once. The agent's clock is the test's.
func TestAttachAlways(t *testing.T) {
	p := testnet.NewPair(t, 4)
	a := start(t, p, time.Second)
	clock := newFakeClock()
	agent.SetClock(a.Agent, clock.Now)
	policy := agent.Policy{Steering: agent.SteerHardware, AttachAlways: true, Linger: 10 * time.Millisecond}
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	if st := status(a, "xa"); st.State != agent.StateDirect {
		t.Fatalf("attach always, no socket: %+v", st)
	}
	s0, _ := socket(t, p, 0)
	if err := a.AddSocket("xa", 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	if err := a.RemoveSocket("xa", 0, 0); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Second) // well past the 10ms linger
	a.ReconcileNow()
	if st := status(a, "xa"); st.State != agent.StateDirect {
		t.Fatalf("attach always, past the linger: %+v", st)
	}
	policy.AttachAlways = false
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	clock.Add(9 * time.Millisecond)
	a.ReconcileNow()
	if st := status(a, "xa"); st.State != agent.StateDirect || st.Policy.AttachAlways {
		t.Fatalf("attach always turned off, within the linger: %+v", st)
	}
	clock.Add(2 * time.Millisecond)
	a.ReconcileNow()
	if st := status(a, "xa"); st.State != agent.StateNone {
		t.Fatalf("attach always turned off, past the linger: %+v", st)
	}
	policy.AttachAlways = true
	if err := a.Set("xa", policy); err != nil {
		t.Fatal(err)
	}
	if st := status(a, "xa"); st.State != agent.StateDirect {
		t.Fatalf("attach always turned on: %+v", st)
	}
	if err := a.Unmanage("xa"); err != nil {
		t.Fatal(err)
	}
	if att, _ := xdp.Query(p.NSPath(), p.A.Index); att != nil {
		t.Fatalf("unmanaged, the program stays: %+v", att)
	}
}

// TestNetdevRecreated: a managed netdev deleted and made again with the
// same name (a driver reload, a VF re-made) is managed again under its
// new ifindex: not Missing for good. The sockets bound to the old one
// are gone from the XSKMAP; a socket bound to the new one is added, the
// program attached to the new netdev, and frames arrive byte for byte.
func TestNetdevRecreated(t *testing.T) {
	for _, steer := range []agent.Steering{agent.SteerHardware, agent.SteerSoftware} {
		t.Run(string(steer), func(t *testing.T) {
			p := testnet.NewPair(t, 4)
			a := start(t, p, time.Second)
			if err := a.Set(p.A.Name, agent.Policy{Steering: steer}); err != nil {
				t.Fatal(err)
			}
			state := map[agent.Steering]agent.State{agent.SteerHardware: agent.StateDirect, agent.SteerSoftware: agent.StateFilter}[steer]
			s0, _ := socket(t, p, 0)
			if err := a.AddSocket(p.A.Name, 0, s0.FD()); err != nil {
				t.Fatal(err)
			}
			waitState(t, a, p.A.Name, state)
			old := p.A.Index

			if err := p.Recreate(); err != nil {
				t.Fatal(err)
			}
			st := status(agentReport(a.waitFor(t, "the new xa managed", func(all []agent.Status) bool {
				return len(all) == 1 && all[0].Ifindex == p.A.Index && all[0].State == agent.StateNone
			})), p.A.Name)
			if st.Ifindex == old || len(st.Sockets) != 0 {
				t.Errorf("after re-creation: %+v; want ifindex %d, no socket", st, p.A.Index)
			}
			if ifindex, ok := a.Ifindex(p.A.Name); !ok || ifindex != p.A.Index {
				t.Errorf("Ifindex: %d %v, want %d", ifindex, ok, p.A.Index)
			}
			s1, r1 := socket(t, p, 0) // bound to the new xa
			if err := a.AddSocket(p.A.Name, 0, s1.FD()); err != nil {
				t.Fatal(err)
			}
			waitState(t, a, p.A.Name, state)
			if steer == agent.SteerSoftware {
				if err := a.Steer(p.A.Name, "c1", []agent.Flow{{Protocol: xdp.UDP, Dst: netip.PrefixFrom(p.A.Addr, 32), DstPort: 5000, Queues: []uint32{0}}}); err != nil {
					t.Fatal(err)
				}
			}
			if err := r1.Expect(sender(t, p, 0).UDP(20), time.Now().Add(5*time.Second)); err != nil {
				t.Fatal(err)
			}
		})
	}
}
