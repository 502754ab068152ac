package agent

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xdpq/xdpq/pkg/xdp"
)

var (
	stateDesc = prometheus.NewDesc("xdpq_agent_netdev_state",
		"1 for the netdev's current XDP program state (None, Direct, Filter, Overridden, Missing), 0 for the others.",
		[]string{"netdev", "state"}, nil)
	modeDesc = prometheus.NewDesc("xdpq_agent_netdev_xdp_mode",
		"1 for the mode the program on the netdev runs in (native, generic, offload), 0 for the others.",
		[]string{"netdev", "mode"}, nil)
	socketsDesc = prometheus.NewDesc("xdpq_agent_netdev_sockets",
		"Queues of the netdev with an xdpq socket in the XSKMAP.",
		[]string{"netdev"}, nil)
	flowsDesc = prometheus.NewDesc("xdpq_agent_steered_flows",
		"Flows xdpq steers on the netdev: ntuple rules it owns (hardware) or flow map entries (software).",
		[]string{"netdev", "steering"}, nil)
	packetsDesc = prometheus.NewDesc("xdpq_agent_program_packets_total",
		"Frames the filter program saw, per queue and result: redirected to the socket, passed to the kernel, or redirect_failed (the flow's queue had no socket).",
		[]string{"netdev", "queue", "result"}, nil)
)

var (
	allStates = []State{StateNone, StateDirect, StateFilter, StateOverridden, StateMissing}
	allModes  = []xdp.Mode{xdp.ModeNative, xdp.ModeGeneric, xdp.ModeOffload}
)

// Collector returns a Prometheus collector of the agent's state. It reads
// the agent's report and the filter programs' counters at scrape time.
func (a *Agent) Collector() prometheus.Collector { return collector{a} }

type collector struct{ a *Agent }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{stateDesc, modeDesc, socketsDesc, flowsDesc, packetsDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	type counted struct {
		name   string
		queues int
		prog   *xdp.Program
	}
	var filters []counted
	c.a.mu.Lock()
	for name, d := range c.a.netdevs {
		if d.prog == nil {
			continue // its first Set is under way
		}
		for _, s := range allStates {
			ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, b2f(d.status.State == s), name, string(s))
		}
		for _, m := range allModes {
			ch <- prometheus.MustNewConstMetric(modeDesc, prometheus.GaugeValue, b2f(d.status.Mode == m), name, m.String())
		}
		ch <- prometheus.MustNewConstMetric(socketsDesc, prometheus.GaugeValue, float64(len(d.sockets)), name)
		ch <- prometheus.MustNewConstMetric(flowsDesc, prometheus.GaugeValue, float64(d.flows), name, string(d.steerMode))
		if d.kind == xdp.Filter {
			filters = append(filters, counted{name, d.queues, d.prog})
		}
	}
	c.a.mu.Unlock()
	// The counters are read outside the lock: a map lookup per queue.
	for _, f := range filters {
		for q := range f.queues {
			cnt, err := f.prog.Counters(uint32(q))
			if err != nil {
				continue // the program was closed by Unmanage meanwhile
			}
			queue := strconv.Itoa(q)
			ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(cnt.Redirected), f.name, queue, "redirected")
			ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(cnt.Passed), f.name, queue, "passed")
			ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(cnt.RedirectFailed), f.name, queue, "redirect_failed")
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
