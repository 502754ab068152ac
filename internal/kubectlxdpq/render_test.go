package kubectlxdpq_test

import (
	"bytes"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/xdpq/xdpq/internal/kubectlxdpq"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
	"github.com/xdpq/xdpq/pkg/nodestatus"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ with the output")

// t0 is the fixtures' clock: the daemons wrote at t0, the user looks an
// hour later.
var (
	t0  = time.Date(2030, 1, 2, 15, 4, 5, 0, time.UTC)
	now = t0.Add(time.Hour)
)

// fixture is a cluster's XdpqNodes as xdpq's daemons write them: each
// status is nodestatus.Convert of a daemon's api.Status, the writer's
// own conversion.
//
//   - worker-1: two E810 ports, one Direct with hardware steering and two
//     pods' allocations (one connected), one Overridden by an operator's
//     firewall; two pools; a standalone allocation no pod holds.
//   - worker-2: a veth in Filter mode with a pod bound by its UID alone
//     (no CNI named it), a missing netdev, a refused newer config,
//     still starting.
//   - worker-3: created, no status written yet.
func fixture(t *testing.T) []v1alpha1.XdpqNode {
	t.Helper()
	node := func(name string, s *api.Status, l *api.AllocationList, serving bool) v1alpha1.XdpqNode {
		n := v1alpha1.XdpqNode{
			TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.Kind},
			ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(t0.Add(-24 * time.Hour)),
				Labels:          map[string]string{"app.kubernetes.io/managed-by": "xdpq"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: name, UID: "node-uid"}}},
		}
		if s != nil {
			n.Status = nodestatus.Convert(s, l, serving, nil, t0)
		}
		return n
	}
	udp := func(dst string, port uint16) api.CNIFlow {
		return api.CNIFlow{Protocol: "udp", Dst: netip.MustParsePrefix(dst), DstPort: port}
	}
	attach := func(alloc string, flows ...api.CNIFlow) api.AttachmentStatus {
		return api.AttachmentStatus{Attachment: api.Attachment{AllocationID: alloc, CNIAddRequest: api.CNIAddRequest{Flows: flows}}, State: "active"}
	}
	uid := uint32(1000)
	w1 := &api.Status{
		Pools: []api.PoolStatus{{Name: "upf", Resource: "xdpq.io/upf", Queues: 16, Free: 13}, {Name: "dns", Resource: "xdpq.io/dns", Queues: 8, Free: 7}},
		Netdevs: []api.NetdevStatus{
			{Netdev: "ens1f0", State: "Direct", Mode: "native", Steering: "hardware", Flows: 3, Sockets: []uint32{8, 9}, LinkUp: true,
				Program: 41, RXQueues: 64, Reserved: []uint32{8, 9, 10, 11, 12, 13, 14, 15}, ZeroCopy: true, Driver: "ice", PCI: "0000:3b:00.0", NUMANode: 0},
			{Netdev: "ens1f1", State: "Overridden", Mode: "native", Steering: "hardware", LinkUp: true, Program: 97, Foreign: "xdp_firewall",
				Reason: "a foreign XDP program has precedence", RXQueues: 64, Reserved: []uint32{8, 9, 10, 11, 12, 13, 14, 15}, ZeroCopy: true,
				Driver: "ice", PCI: "0000:3b:00.1", NUMANode: 0},
		},
		Allocations: 3,
		Attachments: 2,
		Config:      api.ConfigStatus{Hash: "3f2a9c1d8e7b6a5f4e3d2c1b0a998877", Loaded: t0.Add(-10 * time.Minute)},
	}
	w1l := &api.AllocationList{
		Allocations: []api.Allocation{
			{ID: "a7f3", Pool: "upf", Netdev: "ens1f0", Queues: []uint32{8, 9}, PodUID: "6f1c", Pod: "telco/upf-0", Lease: []uint32{8, 9}},
			{ID: "b210", Pool: "dns", Netdev: "ens1f1", Queues: []uint32{4}, PodUID: "9d2e", Pod: "dns/resolver-5d8f"},
			{ID: "c001", Pool: "upf", Netdev: "ens1f0", Queues: []uint32{10}, UID: &uid},
		},
		Attachments: []api.AttachmentStatus{
			attach("a7f3", udp("10.20.0.5/32", 2152), api.CNIFlow{Protocol: "udp", Dst: netip.MustParsePrefix("10.20.0.5/32"), DstPort: 8805, Src: netip.MustParsePrefix("10.9.0.0/16"), VLAN: 100}),
			attach("b210", udp("10.20.0.9/32", 53)),
		},
	}
	w2 := &api.Status{
		Pools: []api.PoolStatus{{Name: "upf", Resource: "xdpq.io/upf", Queues: 4, Free: 3, Reason: "netdev eth9 is missing"}},
		Netdevs: []api.NetdevStatus{
			{Netdev: "eth9", State: "Missing", Mode: "none", LinkUp: false, NUMANode: -1, Reason: "not found"},
			{Netdev: "veth0", State: "Filter", Mode: "generic", Steering: "software", Flows: 1, LinkUp: true, Program: 12, RXQueues: 4, NUMANode: -1},
		},
		Allocations: 1,
		ConfigError: "config /etc/xdpq/config.yaml: pools[0].queues: \"9-2\": empty range",
		Config:      api.ConfigStatus{Hash: "0badc0ffee0012345678", Loaded: t0.Add(-2 * time.Hour)},
	}
	w2l := &api.AllocationList{Allocations: []api.Allocation{{ID: "d4e5", Pool: "upf", Netdev: "veth0", Queues: []uint32{0}, PodUID: "77aa", Lease: []uint32{0}}}}
	return []v1alpha1.XdpqNode{node("worker-2", w2, w2l, false), node("worker-3", nil, nil, false), node("worker-1", w1, w1l, true)}
}

// golden compares got with testdata/name, or writes it there with
// -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run %s -update writes it)", err, t.Name())
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s differs (-want +got; go test -run '%s' -update rewrites it):\n%s", path, t.Name(), diff)
	}
}

func TestPrintStatus(t *testing.T) {
	nodes := fixture(t)
	for _, tc := range []struct {
		name  string
		nodes []v1alpha1.XdpqNode
		wide  bool
	}{
		{"status.golden", nodes, false},
		{"status-wide.golden", nodes, true},
		{"status-one-node.golden", nodes[2:], false},
		{"status-empty.golden", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := kubectlxdpq.PrintStatus(&b, tc.nodes, tc.wide); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name, b.Bytes())
		})
	}
}

func TestPodQueuesOf(t *testing.T) {
	nodes := fixture(t)
	ids := func(rows []kubectlxdpq.PodQueues) []string {
		var out []string
		for _, r := range rows {
			out = append(out, r.Node+"/"+r.Allocation)
		}
		return out
	}
	for _, tc := range []struct {
		namespace string
		want      []string
	}{
		// Every namespace: unbound allocations first (no namespace), then
		// by namespace and pod.
		{"", []string{"worker-1/c001", "worker-2/d4e5", "worker-1/b210", "worker-1/a7f3"}},
		{"telco", []string{"worker-1/a7f3"}},
		{"dns", []string{"worker-1/b210"}},
		{"default", nil},
	} {
		if diff := cmp.Diff(tc.want, ids(kubectlxdpq.PodQueuesOf(nodes, tc.namespace))); diff != "" {
			t.Errorf("namespace %q (-want +got):\n%s", tc.namespace, diff)
		}
	}
}

func TestPrintPods(t *testing.T) {
	nodes := fixture(t)
	for _, tc := range []struct {
		name      string
		namespace string
		all, wide bool
	}{
		{"pods-all.golden", "", true, false},
		{"pods-all-wide.golden", "", true, true},
		{"pods-telco.golden", "telco", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := kubectlxdpq.PrintPods(&b, kubectlxdpq.PodQueuesOf(nodes, tc.namespace), tc.all, tc.wide); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name, b.Bytes())
		})
	}
}

func TestDescribe(t *testing.T) {
	nodes := fixture(t)
	events := []corev1.Event{
		// As the daemon records them (events.k8s.io/v1, read as core/v1):
		// a series for a repeated one.
		{Type: corev1.EventTypeNormal, Reason: nodestatus.EventNetdevReclaimed, ReportingController: "xdpq.io/daemon",
			EventTime: metav1.NewMicroTime(t0.Add(-30 * time.Minute)), Message: "netdev ens1f1: the foreign XDP program is gone; xdpq's hook state is Direct"},
		{Type: corev1.EventTypeWarning, Reason: nodestatus.EventNetdevOverridden, ReportingController: "xdpq.io/daemon",
			EventTime: metav1.NewMicroTime(t0.Add(-50 * time.Minute)),
			Series:    &corev1.EventSeries{Count: 3, LastObservedTime: metav1.NewMicroTime(t0.Add(-5 * time.Minute))},
			Message:   "netdev ens1f1: foreign XDP program \"xdp_firewall\" (id 97) has precedence; xdpq's sockets there get only what it redirects to them"},
		// A core/v1 event, as older recorders write them.
		{Type: corev1.EventTypeWarning, Reason: nodestatus.EventConfigRefused, Source: corev1.EventSource{Component: "xdpq"},
			FirstTimestamp: metav1.NewTime(t0.Add(-3 * time.Hour)), LastTimestamp: metav1.NewTime(t0.Add(-3 * time.Hour)), Count: 1,
			Message: "config refused, the last good one stays in force: bad pool"},
	}
	for _, tc := range []struct {
		name      string
		node      *v1alpha1.XdpqNode
		events    []corev1.Event
		eventsErr error
	}{
		{"describe-worker-1.golden", &nodes[2], events, nil},
		{"describe-worker-2.golden", &nodes[0], nil, nil},
		{"describe-worker-3.golden", &nodes[1], nil, errors.New(`events is forbidden: User "dev" cannot list resource "events" in API group "" at the cluster scope`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := kubectlxdpq.Describe(&b, tc.node, tc.events, tc.eventsErr, now); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name, b.Bytes())
		})
	}
}

func TestQueueList(t *testing.T) {
	for _, tc := range []struct {
		in   []int32
		want string
	}{
		{nil, ""},
		{[]int32{3}, "3"},
		{[]int32{0, 1, 2, 3}, "0-3"},
		{[]int32{0, 1, 2, 3, 6}, "0-3,6"},
		{[]int32{9, 8, 1, 3, 2}, "1-3,8-9"},
		{[]int32{4, 6, 8}, "4,6,8"},
	} {
		if got := kubectlxdpq.QueueList(tc.in); got != tc.want {
			t.Errorf("QueueList(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzRender: whatever text an XdpqNode holds (any writer of its status
// may put anything in a name, reason, flow or message), the tables and
// describe text keep their shape (as many lines as with plain text) and
// carry no control character but the newlines ending lines, nor invalid
// UTF-8.
func FuzzRender(f *testing.F) {
	f.Add("ens1f0", "telco", "upf-0", "udp 10.0.0.1:2152", "a foreign XDP program has precedence")
	f.Add("eth\t0", "ns\n1", "pod\r", "udp\x1b[31m red", "line one\nline two\n\n")
	f.Add("\x9b31m", "\u0085", "\xff\xfe", "\x00", "tab\tand\vform\ffeed")
	f.Fuzz(func(t *testing.T, netdev, namespace, pod, flow, reason string) {
		render := func(netdev, namespace, pod, flow, reason string) string {
			n := v1alpha1.XdpqNode{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"l": reason}}}
			n.Status = v1alpha1.XdpqNodeStatus{
				Summary:     v1alpha1.Summary{Config: reason},
				Netdevs:     []v1alpha1.Netdev{{Name: netdev, State: v1alpha1.StateOverridden, ForeignProgram: reason, Reason: reason, XDPMode: reason, Steering: reason}},
				Pools:       []v1alpha1.Pool{{Name: reason, Resource: reason, Reason: reason}},
				Allocations: []v1alpha1.Allocation{{ID: reason, Pool: reason, Netdev: netdev, Queues: []int32{1}, Pod: &v1alpha1.PodRef{Namespace: namespace, Name: pod, UID: reason}, Flows: []string{flow, flow}}},
				Config:      v1alpha1.Config{Hash: reason, LastError: reason},
				Conditions:  []metav1.Condition{{Type: reason, Status: metav1.ConditionTrue, Reason: reason, Message: reason}},
			}
			events := []corev1.Event{{Type: reason, Reason: reason, Message: reason, ReportingController: reason}}
			var b bytes.Buffer
			nodes := []v1alpha1.XdpqNode{n}
			for _, err := range []error{
				kubectlxdpq.PrintStatus(&b, nodes, true),
				kubectlxdpq.PrintPods(&b, kubectlxdpq.PodQueuesOf(nodes, ""), true, true),
				kubectlxdpq.Describe(&b, &n, events, nil, now),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			return b.String()
		}
		got := render(netdev, namespace, pod, flow, reason)
		plain := render("x", "x", "x", "x", "x")
		if g, p := strings.Count(got, "\n"), strings.Count(plain, "\n"); g != p {
			t.Errorf("%d lines, %d with plain text:\n%s", g, p, got)
		}
		if !utf8.ValidString(got) {
			t.Errorf("invalid UTF-8: %q", got)
		}
		if i := strings.IndexFunc(got, func(r rune) bool { return r != '\n' && unicode.IsControl(r) }); i >= 0 {
			t.Errorf("control character %q at %d: %q", got[i:min(i+4, len(got))], i, got)
		}
	})
}
