package kubectlxdpq

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
)

// Where top finds the daemons: the chart's DaemonSet pods, by the label
// its selector has, in the namespace xdpq is installed in (the README's
// is kube-system), and their container port named metrics.
const (
	DefaultDaemonNamespace = "kube-system"
	DefaultDaemonSelector  = "app.kubernetes.io/name=xdpq"
	metricsPortName        = "metrics"
)

// The daemon's series top reads, all per netdev and queue: what xdpq's
// program redirected to the queue's socket (its receive rate), and what
// the kernel lost of it, by reason (the socket's XDP_STATISTICS).
const (
	metricPackets   = "xdpq_agent_program_packets_total"
	metricDropped   = "xdpq_socket_rx_dropped_frames_total"
	metricRingFull  = "xdpq_socket_rx_ring_full_frames_total"
	metricFillEmpty = "xdpq_socket_fill_ring_empty_total"
	metricInvalid   = "xdpq_socket_rx_invalid_descriptors_total"
)

// lossMetrics are the loss reasons in the order of the table's columns.
var lossMetrics = [...]string{metricDropped, metricRingFull, metricFillEmpty, metricInvalid}

// TopList is `kubectl xdpq top -o json`: the rates between two scrapes
// of each node's daemon.
type TopList struct {
	// IntervalSeconds is the interval asked for between the scrapes.
	IntervalSeconds float64 `json:"intervalSeconds"`
	// Nodes are the nodes, with their daemon and netdevs.
	Nodes []TopNode `json:"nodes"`
	// Items are the queues pods hold, one per queue.
	Items []TopQueue `json:"items"`
}

// TopNode is one node of top: its daemon's pod, its netdevs, and why
// its daemon could not be read, if it could not.
type TopNode struct {
	Node string `json:"node"`
	// Daemon is the namespace/name of the daemon's pod scraped.
	Daemon string `json:"daemon,omitempty"`
	// Seconds is the time between the node's two scrapes.
	Seconds float64 `json:"seconds,omitempty"`
	// Unreachable says why the daemon's metrics could not be read; its
	// queues' rates are then unknown (null).
	Unreachable string `json:"unreachable,omitempty"`
	// Netdevs are the netdevs the XdpqNode reports.
	Netdevs []TopNetdev `json:"netdevs"`
}

// TopNetdev is a netdev's XDP state and mode, as the XdpqNode reports it.
type TopNetdev struct {
	Name  string `json:"name"`
	State string `json:"state"`
	Mode  string `json:"mode,omitempty"`
}

// TopQueue is one queue a pod holds, with its rates in frames per second
// (null: unknown, as when the daemon could not be read, or the queue has
// no socket to count).
type TopQueue struct {
	// Pod is the pod holding the queue; nil for an allocation no pod
	// holds yet.
	Pod    *v1alpha1.PodRef `json:"pod,omitempty"`
	Node   string           `json:"node"`
	Netdev string           `json:"netdev"`
	Queue  int32            `json:"queue"`
	// State and Mode are the netdev's.
	State string `json:"state"`
	Mode  string `json:"mode,omitempty"`
	// LeaseConnected is whether the pod holds the queue's socket now.
	LeaseConnected bool `json:"leaseConnected"`
	// RXFramesPerSecond is what xdpq's program redirected to the queue's
	// socket.
	RXFramesPerSecond *float64 `json:"rxFramesPerSecond"`
	// LossesPerSecond is what the kernel lost of it, by reason.
	LossesPerSecond TopLosses `json:"lossesPerSecond"`
}

// TopLosses are a queue's losses per second by reason: the socket's
// XDP_STATISTICS.
type TopLosses struct {
	// RXDropped: frames dropped for another reason (a frame larger than
	// the socket's frame, say).
	RXDropped *float64 `json:"rxDropped"`
	// RXRingFull: frames dropped because the RX ring was full (the pod
	// does not read fast enough).
	RXRingFull *float64 `json:"rxRingFull"`
	// FillRingEmpty: times the fill ring was found empty (the pod gives
	// back buffers too slowly).
	FillRingEmpty *float64 `json:"fillRingEmpty"`
	// RXInvalidDescriptors: invalid descriptors on the fill ring.
	RXInvalidDescriptors *float64 `json:"rxInvalidDescriptors"`
}

// queueKey is a netdev's queue.
type queueKey struct {
	netdev string
	queue  int32
}

// counters are one queue's counters in one scrape; a series the daemon
// did not serve is absent.
type counters struct {
	rx     float64
	hasRX  bool
	losses [len(lossMetrics)]float64
	hasLos bool
}

// scrape is one read of a daemon's /metrics.
type scrape struct {
	at     time.Time
	queues map[queueKey]counters
}

// parseMetrics reads the queues' counters out of a /metrics body in
// Prometheus' text format.
func parseMetrics(body []byte, at time.Time) (*scrape, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	s := &scrape{at: at, queues: map[queueKey]counters{}}
	each := func(name string, f func(k queueKey, labels map[string]string, v float64)) {
		for _, m := range fams[name].GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			q, err := strconv.ParseInt(labels["queue"], 10, 32)
			if err != nil || labels["netdev"] == "" {
				continue // not a queue's series
			}
			f(queueKey{labels["netdev"], int32(q)}, labels, m.GetCounter().GetValue())
		}
	}
	each(metricPackets, func(k queueKey, labels map[string]string, v float64) {
		if labels["result"] == "redirected" {
			c := s.queues[k]
			c.rx, c.hasRX = v, true
			s.queues[k] = c
		}
	})
	for i, name := range lossMetrics {
		each(name, func(k queueKey, _ map[string]string, v float64) {
			c := s.queues[k]
			c.losses[i], c.hasLos = v, true
			s.queues[k] = c
		})
	}
	return s, nil
}

// rate is a counter's rate between two values seconds apart. A counter
// that went down was reset (its daemon or socket started again): it
// counted from zero.
func rate(before, after, seconds float64) float64 {
	if after < before {
		before = 0
	}
	return (after - before) / seconds
}

// nodeScrape is what one refresh read of a node's daemon.
type nodeScrape struct {
	daemon string // namespace/name
	s      *scrape
	err    error
}

// sample is one refresh: the XdpqNodes and each node's scrape.
type sample struct {
	nodes   []v1alpha1.XdpqNode
	scrapes map[string]nodeScrape
}

// topper reads the daemons of nodes through the API server.
type topper struct {
	c         *Client
	nodes     []string // empty: every node with an XdpqNode
	chunk     int64
	namespace string // the daemons'
	selector  string
	timeout   time.Duration // of one scrape
	now       func() time.Time
}

// sample reads the XdpqNodes and scrapes their daemons, at once.
func (t *topper) sample(ctx context.Context) (*sample, error) {
	us, err := (&options{chunk: t.chunk}).fetch(ctx, t.c, t.nodes)
	if len(us) == 0 && err != nil {
		return nil, err
	}
	nodes, terr := Typed(us)
	if terr != nil {
		return nil, terr
	}
	nodes = sortedNodes(nodes)
	daemons, derr := t.daemons(ctx)
	// One scrape per node at once; each goroutine writes its own slot.
	scrapes := make([]nodeScrape, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		pod, ok := daemons[n.Name]
		switch {
		case derr != nil:
			scrapes[i] = nodeScrape{err: derr}
			continue
		case !ok:
			scrapes[i] = nodeScrape{err: fmt.Errorf("no running xdpq daemon pod (-l %s) on the node in namespace %s (--daemon-namespace)", t.selector, t.namespace)}
			continue
		}
		wg.Go(func() {
			s, err := t.scrape(ctx, pod)
			scrapes[i] = nodeScrape{daemon: pod.Namespace + "/" + pod.Name, s: s, err: err}
		})
	}
	wg.Wait()
	smp := &sample{nodes: nodes, scrapes: map[string]nodeScrape{}}
	for i, n := range nodes {
		smp.scrapes[n.Name] = scrapes[i]
	}
	return smp, err
}

// daemons returns the daemon pod of each node: running, not being
// deleted, Ready ones first.
func (t *topper) daemons(ctx context.Context) (map[string]*corev1.Pod, error) {
	l, err := t.c.core.Pods(t.namespace).List(ctx, metav1.ListOptions{LabelSelector: t.selector})
	if err != nil {
		return nil, fmt.Errorf("list xdpq daemon pods in namespace %s: %w", t.namespace, err)
	}
	out := map[string]*corev1.Pod{}
	for i := range l.Items {
		p := &l.Items[i]
		if p.Spec.NodeName == "" || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		if prev := out[p.Spec.NodeName]; prev == nil || !podReady(prev) && podReady(p) {
			out[p.Spec.NodeName] = p
		}
	}
	return out, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// metricsPort is the number of the pod's container port named metrics:
// the API server's pod proxy takes a number, not a name.
func metricsPort(p *corev1.Pod) (string, error) {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == metricsPortName {
				return strconv.Itoa(int(port.ContainerPort)), nil
			}
		}
	}
	return "", fmt.Errorf("daemon pod %s/%s has no container port named %s", p.Namespace, p.Name, metricsPortName)
}

// scrape reads the daemon pod's /metrics through the API server's pod
// proxy (pods/proxy get in its namespace).
func (t *topper) scrape(ctx context.Context, p *corev1.Pod) (*scrape, error) {
	port, err := metricsPort(p)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	body, err := t.c.core.Pods(p.Namespace).ProxyGet("http", p.Name, port, "metrics", nil).DoRaw(ctx)
	at := t.now()
	if err != nil {
		// The API server's own refusal (forbidden, say) comes as a JSON
		// Status that client-go leaves undecoded for a proxy ("unknown").
		var st metav1.Status
		if json.Unmarshal(body, &st) == nil && st.Kind == "Status" && st.Message != "" {
			err = &statusError{msg: st.Message, err: err}
		}
		return nil, fmt.Errorf("get /metrics of pod %s/%s through the API server: %w", p.Namespace, p.Name, err)
	}
	return parseMetrics(body, at)
}

// statusError is an API server's error with the message of its Status.
type statusError struct {
	msg string
	err error
}

func (e *statusError) Error() string { return e.msg }
func (e *statusError) Unwrap() error { return e.err }

// top computes the rates between two samples of the same nodes: the
// queues and netdevs are the later sample's.
func top(before, after *sample, interval time.Duration) TopList {
	out := TopList{IntervalSeconds: interval.Seconds(), Nodes: []TopNode{}, Items: []TopQueue{}}
	for _, n := range after.nodes {
		tn := TopNode{Node: n.Name, Netdevs: []TopNetdev{}}
		states := map[string]TopNetdev{}
		for _, d := range sortedNetdevs(n.Status.Netdevs) {
			nd := TopNetdev{Name: d.Name, State: string(d.State), Mode: d.XDPMode}
			tn.Netdevs = append(tn.Netdevs, nd)
			states[d.Name] = nd
		}
		b, a := before.scrapes[n.Name], after.scrapes[n.Name]
		tn.Daemon = a.daemon
		var seconds float64
		switch {
		case a.err != nil:
			tn.Unreachable = oneLine(a.err.Error())
		case b.err != nil:
			tn.Unreachable = "first scrape: " + oneLine(b.err.Error())
		case b.s == nil || a.s == nil:
			tn.Unreachable = "not scraped"
		default:
			seconds = a.s.at.Sub(b.s.at).Seconds()
			if seconds <= 0 {
				tn.Unreachable = "the two scrapes are not apart in time"
			}
		}
		if tn.Unreachable == "" {
			tn.Seconds = seconds
		}
		out.Nodes = append(out.Nodes, tn)
		allocs := slices.Clone(n.Status.Allocations)
		slices.SortFunc(allocs, func(x, y v1alpha1.Allocation) int {
			return strings.Compare(podKey(x.Pod)+"\x00"+x.Netdev+"\x00"+x.ID, podKey(y.Pod)+"\x00"+y.Netdev+"\x00"+y.ID)
		})
		for _, al := range allocs {
			for _, q := range al.Queues {
				nd := states[al.Netdev]
				row := TopQueue{Pod: al.Pod, Node: n.Name, Netdev: al.Netdev, Queue: q, State: nd.State, Mode: nd.Mode,
					LeaseConnected: al.LeaseConnected}
				if row.State == "" {
					row.State = "Missing"
				}
				if tn.Unreachable == "" {
					k := queueKey{al.Netdev, q}
					cb, ca := b.s.queues[k], a.s.queues[k]
					if cb.hasRX && ca.hasRX {
						row.RXFramesPerSecond = new(rate(cb.rx, ca.rx, seconds))
					}
					if cb.hasLos && ca.hasLos {
						l := make([]*float64, len(lossMetrics))
						for i := range lossMetrics {
							l[i] = new(rate(cb.losses[i], ca.losses[i], seconds))
						}
						row.LossesPerSecond = TopLosses{RXDropped: l[0], RXRingFull: l[1], FillRingEmpty: l[2], RXInvalidDescriptors: l[3]}
					}
				}
				out.Items = append(out.Items, row)
			}
		}
	}
	return out
}

func podKey(p *v1alpha1.PodRef) string {
	if p == nil {
		return ""
	}
	return p.Namespace + "/" + p.Name
}

// oneLine is an error's message on one line: an API server's proxy
// error can hold the upstream's body.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// PrintTop writes list as top's table: a line per node (its daemon, and
// its netdevs' states or why it could not be read), then a row per queue
// pods hold. An unreachable node's rows say so in place of their rates.
func PrintTop(w io.Writer, list TopList) error {
	tw := newTabWriter(w)
	row(tw, "NODE", "DAEMON", "NETDEVS")
	unreachable := map[string]string{}
	for _, n := range list.Nodes {
		var netdevs []string
		for _, d := range n.Netdevs {
			netdevs = append(netdevs, d.Name+" "+stateMode(d.State, d.Mode))
		}
		desc := orNone(strings.Join(netdevs, ", "))
		if n.Unreachable != "" {
			desc += "; unreachable: " + n.Unreachable
			unreachable[n.Node] = n.Unreachable
		}
		// The last cell is not a column: a long reason widens nothing.
		fmt.Fprintf(tw, "%s\t%s\t%s\n", cell(n.Node), cell(orNone(n.Daemon)), desc)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(w); err != nil {
		return err
	}
	if len(list.Items) == 0 {
		_, err := fmt.Fprintln(w, "No pods hold xdpq queues.")
		return err
	}
	tw = newTabWriter(w)
	row(tw, "NAMESPACE/POD", "NODE", "NETDEV", "QUEUE", "STATE", "RX/s", "DROPPED/s", "RING-FULL/s", "FILL-EMPTY/s", "INVALID/s")
	for _, q := range list.Items {
		pod := none
		if q.Pod != nil {
			pod = q.Pod.Namespace + "/" + q.Pod.Name
			if q.Pod.Name == "" {
				pod = "uid " + q.Pod.UID
			}
		}
		state := stateMode(q.State, q.Mode)
		if !q.LeaseConnected {
			state += " (not connected)"
		}
		cells := []string{pod, q.Node, q.Netdev, strconv.Itoa(int(q.Queue)), state}
		if why, ok := unreachable[q.Node]; ok {
			fmt.Fprintf(tw, "%s\tunreachable: %s\n", strings.Join(mapCells(cells), "\t"), truncate(why, 100))
			continue
		}
		l := q.LossesPerSecond
		row(tw, append(cells, perSecond(q.RXFramesPerSecond), perSecond(l.RXDropped), perSecond(l.RXRingFull),
			perSecond(l.FillRingEmpty), perSecond(l.RXInvalidDescriptors))...)
	}
	return tw.Flush()
}

func mapCells(cs []string) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = cell(c)
	}
	return out
}

// stateMode is a netdev's state with the mode its program runs in.
func stateMode(state, mode string) string {
	if mode == "" || mode == "none" {
		return state
	}
	return state + "/" + mode
}

// perSecond is a rate for the table: "-" when unknown, a tenth below 10
// where it has one, whole numbers up to a million, then millions.
func perSecond(v *float64) string {
	switch {
	case v == nil:
		return "-"
	case *v >= 1e6:
		return strconv.FormatFloat(*v/1e6, 'f', 2, 64) + "M"
	case *v < 10 && *v != math.Trunc(*v):
		return strconv.FormatFloat(*v, 'f', 1, 64)
	}
	return strconv.FormatFloat(*v, 'f', 0, 64)
}

// truncate shortens s to n runes.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// topRun is how top runs: once (a table or JSON) or live.
type topRun struct {
	interval time.Duration
	once     bool
	json     bool
	// clear redraws each frame in place (ANSI: cursor home, erase the
	// screen), as watch does on a terminal; else frames follow each
	// other.
	clear bool
	// wait returns at the next refresh, or with ctx's error.
	wait func(ctx context.Context) error
}

// clearScreen moves the cursor home and erases the screen.
const clearScreen = "\x1b[H\x1b[2J"

// run samples every interval and writes the rates between the last two
// samples: once (the table or JSON of the first two) or until ctx ends.
func (t *topper) run(ctx context.Context, w io.Writer, r topRun) error {
	prev, err := t.sample(ctx)
	if prev == nil {
		return err
	}
	if !r.once && !r.json && r.clear {
		fmt.Fprintf(w, "%s%s\n\nsampling: the first rates in %s\n", clearScreen, t.title(r.interval), r.interval)
	}
	for {
		if werr := r.wait(ctx); werr != nil {
			return nil // stopped (Ctrl-C)
		}
		next, err := t.sample(ctx)
		if next == nil {
			if r.once || r.json {
				return err
			}
			// The API server away: say so, and try again.
			if ferr := t.frame(w, r, func(io.Writer) error { return nil }, err); ferr != nil {
				return ferr // stdout went away
			}
			continue
		}
		list := top(prev, next, r.interval)
		prev = next
		switch {
		case r.json:
			return errors.Join(writeJSON(w, list), err)
		case r.once:
			return errors.Join(PrintTop(w, list), err)
		}
		if ferr := t.frame(w, r, func(w io.Writer) error { return PrintTop(w, list) }, err); ferr != nil {
			return ferr // stdout went away
		}
	}
}

// title is the first line of a live frame.
func (t *topper) title(interval time.Duration) string {
	cmd := strings.Join(append([]string{"kubectl xdpq top"}, t.nodes...), " ")
	return fmt.Sprintf("Every %s: %s    %s", interval, cmd, t.now().Format(time.DateTime))
}

// frame writes one live frame: the title, the table body writes, and an
// error of this refresh.
func (t *topper) frame(w io.Writer, r topRun, body func(io.Writer) error, err error) error {
	var b bytes.Buffer
	if r.clear {
		b.WriteString(clearScreen)
	}
	b.WriteString(t.title(r.interval) + "\n\n")
	if berr := body(&b); berr != nil {
		return berr
	}
	if err != nil {
		fmt.Fprintf(&b, "\nerror: %s\n", oneLine(err.Error()))
	}
	if !r.clear {
		b.WriteString("\n")
	}
	_, werr := w.Write(b.Bytes()) // one write: a terminal never shows half a frame
	return werr
}
