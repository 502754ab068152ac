package kubectlxdpq

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
)

// Describe writes everything n says, for a person, as kubectl describe
// does: its metadata, a summary, its conditions, config, netdevs, pools
// and allocations, then events, the Events about it (eventsErr: why they
// could not be read). Times are written in now's location, with their
// age at now.
func Describe(w io.Writer, n *v1alpha1.XdpqNode, events []corev1.Event, eventsErr error, now time.Time) error {
	d := describer{w: newTabWriter(w), now: now}
	s := &n.Status

	d.field(0, "Name", n.Name)
	d.field(0, "Labels", labels(n.Labels))
	owners := make([]string, 0, len(n.OwnerReferences))
	for _, o := range n.OwnerReferences {
		owners = append(owners, o.Kind+"/"+o.Name)
	}
	d.field(0, "Owner", orNone(strings.Join(owners, ", ")))
	d.field(0, "CreationTimestamp", d.time(n.CreationTimestamp))
	summary := fmt.Sprintf("%s (%d overridden), %d of %d queues allocated, %s", plural(int(s.Summary.Netdevs), "netdev"),
		s.Summary.Overridden, s.Summary.QueuesAllocated, s.Summary.QueuesTotal, plural(int(s.Summary.Allocations), "allocation"))
	if len(s.Conditions) == 0 {
		summary = "<none>: the daemon has not reported yet"
	}
	d.field(0, "Summary", summary)

	d.section(0, "Conditions", len(s.Conditions), func() {
		d.row(1, "Type", "Status", "LastTransitionTime", "Reason", "Message")
		d.row(1, "----", "------", "------------------", "------", "-------")
		for _, c := range slices.SortedFunc(slices.Values(s.Conditions), func(a, b metav1.Condition) int { return cmp.Compare(a.Type, b.Type) }) {
			d.row(1, c.Type, string(c.Status), d.timestamp(c.LastTransitionTime), orNone(c.Reason), orNone(c.Message))
		}
	})

	d.heading(0, "Config")
	d.field(1, "Hash", orNone(s.Config.Hash))
	d.field(1, "Last Good Reload", d.time(s.Config.LastGoodReload))
	d.field(1, "Last Error", orNone(s.Config.LastError))

	d.section(0, "Netdevs", len(s.Netdevs), func() {
		held := heldQueues(s.Allocations)
		for _, nd := range sortedNetdevs(s.Netdevs) {
			d.heading(1, nd.Name)
			d.field(2, "State", string(nd.State))
			d.field(2, "Program", program(&nd))
			d.field(2, "XDP Mode", orNone(nd.XDPMode))
			d.field(2, "Driver", orNone(nd.Driver))
			d.field(2, "PCI Address", orNone(nd.PCIAddress))
			d.field(2, "NUMA Node", numa(nd.NUMANode))
			zc := "not available"
			if nd.ZeroCopy {
				zc = "available"
			}
			d.field(2, "Zero-Copy", zc)
			d.field(2, "Queues", fmt.Sprintf("%d (%d held by pods)", nd.Queues, held[nd.Name]))
			d.field(2, "Reserved Queues", orNone(QueueList(nd.ReservedQueues)))
			d.field(2, "Steering", fmt.Sprintf("%s, %s", orNone(nd.Steering), plural(int(nd.Flows), "flow")))
			d.field(2, "Link", link(nd.LinkUp))
			d.field(2, "Reason", orNone(nd.Reason))
		}
	})

	d.section(0, "Pools", len(s.Pools), func() {
		d.row(1, "Name", "Resource", "Allocated", "Capacity", "Reason")
		d.row(1, "----", "--------", "---------", "--------", "------")
		for _, p := range slices.SortedFunc(slices.Values(s.Pools), func(a, b v1alpha1.Pool) int { return cmp.Compare(a.Name, b.Name) }) {
			d.row(1, p.Name, p.Resource, strconv.Itoa(int(p.Allocated)), strconv.Itoa(int(p.Capacity)), orNone(p.Reason))
		}
	})

	d.section(0, "Allocations", len(s.Allocations), func() {
		d.row(1, "ID", "Pool", "Netdev", "Queues", "Pod", "Lease", "Flows")
		d.row(1, "--", "----", "------", "------", "---", "-----", "-----")
		for _, a := range slices.SortedFunc(slices.Values(s.Allocations), func(a, b v1alpha1.Allocation) int { return cmp.Compare(a.ID, b.ID) }) {
			pod := none
			if a.Pod != nil {
				switch {
				case a.Pod.Name != "":
					pod = a.Pod.Namespace + "/" + a.Pod.Name
				case a.Pod.UID != "":
					pod = "uid " + a.Pod.UID
				}
			}
			lease := "not connected"
			if a.LeaseConnected {
				lease = "connected"
			}
			d.row(1, a.ID, a.Pool, a.Netdev, QueueList(a.Queues), pod, lease, orNone(strings.Join(a.Flows, ", ")))
		}
	})

	_ = d.flush() // its first error is kept and returned by the last flush
	switch {
	case eventsErr != nil:
		d.field(0, "Events", "<cannot read: "+eventsErr.Error()+">")
	case len(events) == 0:
		d.field(0, "Events", none)
	default:
		d.heading(0, "Events")
		d.row(1, "Type", "Reason", "Age", "From", "Message")
		d.row(1, "----", "------", "----", "----", "-------")
		for _, e := range sortedEvents(events) {
			from := e.Source.Component
			if from == "" {
				from = e.ReportingController
			}
			d.row(1, e.Type, e.Reason, d.eventAge(&e), orNone(from), strings.TrimSpace(e.Message))
		}
	}
	return d.flush()
}

// describer writes kubectl describe's layout: "Field:\tvalue" lines and
// tables, indented two spaces a level. Each top-level heading starts a
// new alignment: a section's columns do not follow another's.
type describer struct {
	w   *tabwriter.Writer
	now time.Time
	err error // the first error of a flush
}

func (d *describer) flush() error {
	if err := d.w.Flush(); d.err == nil {
		d.err = err
	}
	return d.err
}

func (d *describer) field(level int, name, value string) {
	d.row(level, name+":", value)
}

func (d *describer) heading(level int, name string) {
	if level == 0 {
		_ = d.flush() // its first error is kept and returned by the last flush
	}
	d.row(level, name+":")
}

// section writes a heading and, when there are n > 0 items, body; else
// "<none>" after the heading.
func (d *describer) section(level int, name string, n int, body func()) {
	if n == 0 {
		if level == 0 {
			_ = d.flush() // its first error is kept and returned by the last flush
		}
		d.field(level, name, none)
		return
	}
	d.heading(level, name)
	body()
}

func (d *describer) row(level int, cells ...string) {
	fmt.Fprint(d.w, strings.Repeat("  ", level))
	row(d.w, cells...)
}

// timestamp is t as kubectl describe writes it (RFC 1123 with a
// numeric zone), in now's location.
func (d *describer) timestamp(t metav1.Time) string {
	if t.IsZero() {
		return none
	}
	return t.In(d.now.Location()).Format(time.RFC1123Z)
}

// time is t and its age.
func (d *describer) time(t metav1.Time) string {
	if t.IsZero() {
		return none
	}
	return d.timestamp(t) + " (" + d.since(t.Time) + " ago)"
}

func (d *describer) since(t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(d.now.Sub(t))
}

// eventAge is an event's age as kubectl describe writes it: "5m", or
// "2m (x3 over 10m)" for a repeated one, from the core/v1 fields or, for
// an event written through events.k8s.io/v1 (xdpq's daemon does), its
// series.
func (d *describer) eventAge(e *corev1.Event) string {
	switch {
	case e.Series != nil:
		return fmt.Sprintf("%s (x%d over %s)", d.since(e.Series.LastObservedTime.Time), e.Series.Count, d.since(e.EventTime.Time))
	case e.Count > 1:
		return fmt.Sprintf("%s (x%d over %s)", d.since(e.LastTimestamp.Time), e.Count, d.since(e.FirstTimestamp.Time))
	case !e.FirstTimestamp.IsZero():
		return d.since(e.FirstTimestamp.Time)
	default:
		return d.since(e.EventTime.Time)
	}
}

// sortedEvents is events oldest first, by when each was last seen.
func sortedEvents(es []corev1.Event) []corev1.Event {
	last := func(e *corev1.Event) time.Time {
		switch {
		case e.Series != nil:
			return e.Series.LastObservedTime.Time
		case !e.LastTimestamp.IsZero():
			return e.LastTimestamp.Time
		case !e.FirstTimestamp.IsZero():
			return e.FirstTimestamp.Time
		default:
			return e.EventTime.Time
		}
	}
	return slices.SortedStableFunc(slices.Values(es), func(a, b corev1.Event) int { return last(&a).Compare(last(&b)) })
}

// plural is "1 flow", "2 flows".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// program is the program on d's hook and its id.
func program(d *v1alpha1.Netdev) string {
	name := programName(d)
	if d.State == v1alpha1.StateOverridden {
		name += " (foreign)"
	}
	if d.ProgramID != 0 && d.ProgramName != "" {
		name += fmt.Sprintf(", id %d", d.ProgramID)
	}
	return name
}

// labels is a label set as kubectl describe writes it: "k=v" sorted,
// comma-separated here (one line).
func labels(l map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		out = append(out, k+"="+l[k])
	}
	return orNone(strings.Join(out, ","))
}
