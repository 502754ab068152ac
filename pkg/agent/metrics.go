package agent

import (
	"slices"
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
		"Frames xdpq's program saw, per queue and result: redirected to the queue's socket; passed to the kernel (the filter program: no flow matched; the direct program: the queue had no socket); redirect_failed (the filter program's only: a flow matched but its queue had no socket).",
		[]string{"netdev", "queue", "result"}, nil)
	reattachDesc = prometheus.NewDesc("xdpq_agent_reattach_duration_seconds",
		"Re-attaches of xdpq's program after a foreign program left the netdev, and how long each took: from the reconcile that found the hook free (on the link notification) to the program attached.",
		[]string{"netdev"}, nil)
)

// reattachBuckets are the upper bounds of the re-attach histogram: a
// re-attach takes about a millisecond (BenchmarkReattach).
var reattachBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// histogram counts observations in reattachBuckets.
type histogram struct {
	count   uint64
	sum     float64
	buckets []uint64 // per bucket, not cumulative; nil until the first observation
}

func (h *histogram) observe(v float64) {
	if h.buckets == nil {
		h.buckets = make([]uint64, len(reattachBuckets))
	}
	h.count++
	h.sum += v
	if i, _ := slices.BinarySearch(reattachBuckets, v); i < len(h.buckets) {
		h.buckets[i]++
	}
}

// cumulative returns the counts by upper bound, as Prometheus has them.
func (h *histogram) cumulative() map[float64]uint64 {
	out := make(map[float64]uint64, len(reattachBuckets))
	var n uint64
	for i, le := range reattachBuckets {
		if h.buckets != nil {
			n += h.buckets[i]
		}
		out[le] = n
	}
	return out
}

var (
	allStates = []State{StateNone, StateDirect, StateFilter, StateOverridden, StateMissing}
	allModes  = []xdp.Mode{xdp.ModeNative, xdp.ModeGeneric, xdp.ModeOffload}
)

// Collector returns a Prometheus collector of the agent's state. It reads
// the agent's report and the programs' per-queue counters (direct and
// filter alike) at scrape time.
func (a *Agent) Collector() prometheus.Collector { return collector{a, nil} }

// CollectorAs is Collector with each netdev reported as name returns: an
// agent in a pod's network namespace reports its netdev by its name on
// the node.
func (a *Agent) CollectorAs(name func(netdev string) string) prometheus.Collector {
	return collector{a, name}
}

type collector struct {
	a    *Agent
	name func(string) string // nil: the netdevs' own names
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{stateDesc, modeDesc, socketsDesc, flowsDesc, packetsDesc, reattachDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	type counted struct {
		name   string
		queues int
		prog   *xdp.Program
	}
	var progs []counted
	// Made under the lock, sent after it: the registry reads ch at its
	// own pace.
	var out []prometheus.Metric
	c.a.mu.Lock()
	for name, d := range c.a.netdevs {
		if d.prog == nil {
			continue // its first Set is under way
		}
		if c.name != nil {
			name = c.name(name)
		}
		for _, s := range allStates {
			out = append(out, prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, b2f(d.status.State == s), name, string(s)))
		}
		for _, m := range allModes {
			out = append(out, prometheus.MustNewConstMetric(modeDesc, prometheus.GaugeValue, b2f(d.status.Mode == m), name, m.String()))
		}
		out = append(out, prometheus.MustNewConstMetric(socketsDesc, prometheus.GaugeValue, float64(len(d.status.Sockets)), name),
			prometheus.MustNewConstMetric(flowsDesc, prometheus.GaugeValue, float64(d.flows), name, string(d.steerMode)),
			prometheus.MustNewConstHistogram(reattachDesc, d.reattach.count, d.reattach.sum, d.reattach.cumulative(), name))
		progs = append(progs, counted{name, d.queues, d.prog})
	}
	c.a.mu.Unlock()
	for _, m := range out {
		ch <- m
	}
	// The counters are read outside the lock: a map lookup per queue.
	for _, f := range progs {
		for q := range f.queues {
			cnt, err := f.prog.Counters(uint32(q))
			if err != nil {
				break // the program was closed by Unmanage meanwhile
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
