package agent_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/xdp"
)

func TestMetrics(t *testing.T) {
	p := testnet.NewPair(t, 2)
	a := start(t, p, time.Second)
	if err := a.Set(p.A.Name, agent.Policy{Steering: agent.SteerSoftware}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(a.Collector()); err != nil {
		t.Fatal(err)
	}
	s0, r0 := socket(t, p, 0)
	flow := agent.Flow{Protocol: xdp.UDP, Dst: netip.PrefixFrom(p.A.Addr, 32), DstPort: 5000, Queues: []uint32{0}}
	if err := a.Steer(p.A.Name, "pod-a", []agent.Flow{flow}); err != nil {
		t.Fatal(err)
	}
	if err := a.AddSocket(p.A.Name, 0, s0.FD()); err != nil {
		t.Fatal(err)
	}
	waitState(t, a, p.A.Name, agent.StateFilter)
	if err := r0.Expect(sender(t, p, 0).UDP(25), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP xdpq_agent_netdev_sockets Queues of the netdev with an xdpq socket in the XSKMAP.
# TYPE xdpq_agent_netdev_sockets gauge
xdpq_agent_netdev_sockets{netdev="xa"} 1
# HELP xdpq_agent_netdev_state 1 for the netdev's current XDP program state (None, Direct, Filter, Overridden, Missing), 0 for the others.
# TYPE xdpq_agent_netdev_state gauge
xdpq_agent_netdev_state{netdev="xa",state="Direct"} 0
xdpq_agent_netdev_state{netdev="xa",state="Filter"} 1
xdpq_agent_netdev_state{netdev="xa",state="Missing"} 0
xdpq_agent_netdev_state{netdev="xa",state="None"} 0
xdpq_agent_netdev_state{netdev="xa",state="Overridden"} 0
# HELP xdpq_agent_netdev_xdp_mode 1 for the mode the program on the netdev runs in (native, generic, offload), 0 for the others.
# TYPE xdpq_agent_netdev_xdp_mode gauge
xdpq_agent_netdev_xdp_mode{mode="generic",netdev="xa"} 0
xdpq_agent_netdev_xdp_mode{mode="native",netdev="xa"} 1
xdpq_agent_netdev_xdp_mode{mode="offload",netdev="xa"} 0
# HELP xdpq_agent_reattach_duration_seconds Re-attaches of xdpq's program after a foreign program left the netdev, and how long each took: from the reconcile that found the hook free (on the link notification) to the program attached.
# TYPE xdpq_agent_reattach_duration_seconds histogram
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="0.0005"} 0
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="0.001"} 0
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="0.0025"} 0
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="0.005"} 0
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="0.01"} 0
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="0.025"} 0
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="0.05"} 0
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="0.1"} 0
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="0.25"} 0
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="0.5"} 0
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="1"} 0
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="2.5"} 0
xdpq_agent_reattach_duration_seconds_bucket{netdev="xa",le="+Inf"} 0
xdpq_agent_reattach_duration_seconds_sum{netdev="xa"} 0
xdpq_agent_reattach_duration_seconds_count{netdev="xa"} 0
# HELP xdpq_agent_steered_flows Flows xdpq steers on the netdev: ntuple rules it owns (hardware) or flow map entries (software).
# TYPE xdpq_agent_steered_flows gauge
xdpq_agent_steered_flows{netdev="xa",steering="software"} 1
# HELP xdpq_agent_program_packets_total Frames xdpq's program saw, per queue and result: redirected to the queue's socket; passed to the kernel (the filter program: no flow matched; the direct program: the queue had no socket); redirect_failed (the filter program's only: a flow matched but its queue had no socket).
# TYPE xdpq_agent_program_packets_total counter
xdpq_agent_program_packets_total{netdev="xa",queue="0",result="passed"} 0
xdpq_agent_program_packets_total{netdev="xa",queue="0",result="redirect_failed"} 0
xdpq_agent_program_packets_total{netdev="xa",queue="0",result="redirected"} 25
xdpq_agent_program_packets_total{netdev="xa",queue="1",result="passed"} 0
xdpq_agent_program_packets_total{netdev="xa",queue="1",result="redirect_failed"} 0
xdpq_agent_program_packets_total{netdev="xa",queue="1",result="redirected"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}
