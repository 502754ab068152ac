package kubectlxdpq

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
)

// none is what a table shows for nothing, as kubectl's do.
const none = "<none>"

// newTabWriter is kubectl's table layout: columns two spaces apart.
func newTabWriter(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
}

// PrintStatus writes one row per node and netdev of nodes: the netdev's
// program state, the program on its hook (the foreign one when
// Overridden), its XDP mode, the queues pods hold of its queues, and the
// node's pools, Ready condition (and its reason when not True) and
// config. A node that reports no
// netdev has one row. wide adds the program id, steering, flows, link,
// driver, PCI address, NUMA node, zero-copy, the reserved queues, the
// Degraded reason and what the daemon says of the netdev.
func PrintStatus(w io.Writer, nodes []v1alpha1.XdpqNode, wide bool) error {
	tw := newTabWriter(w)
	header := []string{"NODE", "NETDEV", "STATE", "PROGRAM", "MODE", "QUEUES", "POOLS", "READY", "CONFIG"}
	if wide {
		header = append(header, "PROGRAM-ID", "STEERING", "FLOWS", "LINK", "DRIVER", "PCI", "NUMA", "ZERO-COPY", "RESERVED", "DEGRADED", "REASON")
	}
	row(tw, header...)
	for _, n := range sortedNodes(nodes) {
		s := &n.Status
		pools, ready, config := poolSummary(s.Pools), readiness(s.Conditions), orNone(s.Summary.Config)
		degraded := none
		if c := meta.FindStatusCondition(s.Conditions, v1alpha1.ConditionDegraded); c != nil && c.Status == metav1.ConditionTrue {
			degraded = c.Reason
		}
		if len(s.Netdevs) == 0 {
			cells := []string{n.Name, none, none, none, none, none, pools, ready, config}
			if wide {
				cells = append(cells, none, none, none, none, none, none, none, none, none, degraded, none)
			}
			row(tw, cells...)
			continue
		}
		held := heldQueues(s.Allocations)
		for _, d := range sortedNetdevs(s.Netdevs) {
			cells := []string{n.Name, d.Name, string(d.State), programName(&d), orNone(d.XDPMode),
				fmt.Sprintf("%d/%d", held[d.Name], d.Queues), pools, ready, config}
			if wide {
				id := none
				if d.ProgramID != 0 {
					id = strconv.FormatUint(uint64(d.ProgramID), 10)
				}
				cells = append(cells, id, orNone(d.Steering), strconv.Itoa(int(d.Flows)), link(d.LinkUp), orNone(d.Driver),
					orNone(d.PCIAddress), numa(d.NUMANode), yesNo(d.ZeroCopy), orNone(QueueList(d.ReservedQueues)), degraded, orNone(d.Reason))
			}
			row(tw, cells...)
		}
	}
	return tw.Flush()
}

// PodQueues is the queues one pod holds on one netdev of a node: one
// allocation. It is a row of `kubectl xdpq pods`, and of its JSON.
type PodQueues struct {
	// Pod is the pod the allocation is bound to; nil while none is
	// known (a standalone allocation, or one no pod has claimed yet).
	Pod *v1alpha1.PodRef `json:"pod,omitempty"`
	// Node is the node, Netdev the netdev on it, Pool the pool.
	Node   string `json:"node"`
	Netdev string `json:"netdev"`
	Pool   string `json:"pool"`
	// Allocation is the allocation's id on its node.
	Allocation string `json:"allocation"`
	// Queues are the netdev's queues the pod holds.
	Queues []int32 `json:"queues"`
	// Flows are the flows steered to them.
	Flows []string `json:"flows,omitempty"`
	// LeaseConnected is whether the pod holds their bound sockets now.
	LeaseConnected bool `json:"leaseConnected"`
}

// PodQueuesList is `kubectl xdpq pods -o json`.
type PodQueuesList struct {
	Items []PodQueues `json:"items"`
}

// PodQueuesOf returns the allocations of nodes held by pods of
// namespace, or every allocation (also those no pod holds yet) when
// namespace is "", sorted by namespace, pod, node, netdev and
// allocation.
func PodQueuesOf(nodes []v1alpha1.XdpqNode, namespace string) []PodQueues {
	var out []PodQueues
	for _, n := range nodes {
		for _, a := range n.Status.Allocations {
			if namespace != "" && (a.Pod == nil || a.Pod.Namespace != namespace) {
				continue
			}
			out = append(out, PodQueues{Pod: a.Pod, Node: n.Name, Netdev: a.Netdev, Pool: a.Pool, Allocation: a.ID,
				Queues: a.Queues, Flows: a.Flows, LeaseConnected: a.LeaseConnected})
		}
	}
	slices.SortFunc(out, func(a, b PodQueues) int {
		var pa, pb v1alpha1.PodRef
		if a.Pod != nil {
			pa = *a.Pod
		}
		if b.Pod != nil {
			pb = *b.Pod
		}
		return cmp.Or(cmp.Compare(pa.Namespace, pb.Namespace), cmp.Compare(pa.Name, pb.Name), cmp.Compare(a.Node, b.Node),
			cmp.Compare(a.Netdev, b.Netdev), cmp.Compare(a.Allocation, b.Allocation))
	})
	return out
}

// PrintPods writes rows as a table: the pod (with its namespace when
// allNamespaces), node, netdev, pool, queues, flows and whether its
// lease is connected. wide adds the allocation's id and the pod's UID.
func PrintPods(w io.Writer, rows []PodQueues, allNamespaces, wide bool) error {
	tw := newTabWriter(w)
	var header []string
	if allNamespaces {
		header = append(header, "NAMESPACE")
	}
	header = append(header, "POD", "NODE", "NETDEV", "POOL", "QUEUES", "FLOWS", "LEASE")
	if wide {
		header = append(header, "ALLOCATION", "UID")
	}
	row(tw, header...)
	for _, r := range rows {
		var pod v1alpha1.PodRef
		if r.Pod != nil {
			pod = *r.Pod
		}
		var cells []string
		if allNamespaces {
			cells = append(cells, orNone(pod.Namespace))
		}
		name := pod.Name
		if name == "" && pod.UID != "" {
			// Bound to a pod by its UID alone (no CNI told its name).
			name = "uid " + pod.UID
		}
		lease := "not connected"
		if r.LeaseConnected {
			lease = "connected"
		}
		cells = append(cells, orNone(name), r.Node, r.Netdev, r.Pool, QueueList(r.Queues), orNone(strings.Join(r.Flows, ", ")), lease)
		if wide {
			cells = append(cells, r.Allocation, orNone(pod.UID))
		}
		row(tw, cells...)
	}
	return tw.Flush()
}

// QueueList writes queues as ranges: "0-3,6".
func QueueList(qs []int32) string {
	qs = slices.Sorted(slices.Values(qs))
	var b strings.Builder
	for i := 0; i < len(qs); {
		j := i
		for j+1 < len(qs) && qs[j+1] == qs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(int(qs[i])))
		if j > i {
			b.WriteString("-" + strconv.Itoa(int(qs[j])))
		}
		i = j + 1
	}
	return b.String()
}

// row writes a table row: its cells, tab-separated, each made safe by
// cell.
func row(w io.Writer, cells ...string) {
	clean := make([]string, len(cells))
	for i, c := range cells {
		clean[i] = cell(c)
	}
	fmt.Fprintln(w, strings.Join(clean, "\t"))
}

// cell is s safe to print in a table on a terminal: whitespace that would
// break the table (tabs, newlines) becomes a space, and every other
// control character is escaped ("\x1b"), so that text from the API (a
// reason, a message, a name) can neither break a table nor drive the
// operator's terminal. Bytes that are not UTF-8 become U+FFFD.
func cell(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\t' || r == '\n' || r == '\r' || r == '\f' || r == '\v':
			b.WriteByte(' ')
		case unicode.IsControl(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// sortedNodes is nodes by name.
func sortedNodes(nodes []v1alpha1.XdpqNode) []v1alpha1.XdpqNode {
	return slices.SortedFunc(slices.Values(nodes), func(a, b v1alpha1.XdpqNode) int { return cmp.Compare(a.Name, b.Name) })
}

// sortedNetdevs is netdevs by name.
func sortedNetdevs(ns []v1alpha1.Netdev) []v1alpha1.Netdev {
	return slices.SortedFunc(slices.Values(ns), func(a, b v1alpha1.Netdev) int { return cmp.Compare(a.Name, b.Name) })
}

// heldQueues counts the queues allocations hold, by netdev.
func heldQueues(as []v1alpha1.Allocation) map[string]int {
	held := map[string]int{}
	for _, a := range as {
		held[a.Netdev] += len(a.Queues)
	}
	return held
}

// poolSummary is "upf 3/16,dns 0/4": each pool's allocated and capacity.
func poolSummary(ps []v1alpha1.Pool) string {
	var out []string
	for _, p := range slices.SortedFunc(slices.Values(ps), func(a, b v1alpha1.Pool) int { return cmp.Compare(a.Name, b.Name) }) {
		out = append(out, fmt.Sprintf("%s %d/%d", p.Name, p.Allocated, p.Capacity))
	}
	return orNone(strings.Join(out, ","))
}

// programName is the program on d's hook: the foreign one when
// Overridden.
func programName(d *v1alpha1.Netdev) string {
	if d.State == v1alpha1.StateOverridden && d.ForeignProgram != "" {
		return d.ForeignProgram
	}
	if d.ProgramName == "" && d.ProgramID != 0 {
		return "id " + strconv.FormatUint(uint64(d.ProgramID), 10)
	}
	return orNone(d.ProgramName)
}

// readiness is the Ready condition's status, with its reason when it is
// not True ("False (Starting)", "False (DaemonStopped)"); Unknown when
// the daemon has not reported yet.
func readiness(cs []metav1.Condition) string {
	c := meta.FindStatusCondition(cs, v1alpha1.ConditionReady)
	switch {
	case c == nil:
		return string(metav1.ConditionUnknown)
	case c.Status == metav1.ConditionTrue || c.Reason == "":
		return string(c.Status)
	}
	return string(c.Status) + " (" + c.Reason + ")"
}

func orNone(s string) string {
	if s == "" {
		return none
	}
	return s
}

func link(up bool) string {
	if up {
		return "up"
	}
	return "down"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func numa(n int32) string {
	if n < 0 {
		return "unknown"
	}
	return strconv.Itoa(int(n))
}
