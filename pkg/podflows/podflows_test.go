package podflows

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
	"github.com/xdpq/xdpq/pkg/flow"
	"github.com/xdpq/xdpq/pkg/kubepods"
)

// The face's decisions against a fake core, as kubelet's managers are
// tested: pkg/daemon's TestPodFlowsAnnotation shows the same path on a
// real daemon, with frames on veth.

const uid = "0c5e1a5e-0000-4000-8000-000000000001"

// fakeCore holds a pod's allocations and the attachments the face made,
// as the ledger would, and records each verb.
type fakeCore struct {
	mu     sync.Mutex
	allocs []Allocation
	calls  []string
	addErr map[string]error // by pool
	delErr error
}

func (c *fakeCore) PodAllocations(u string) []Allocation {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u != uid {
		return nil
	}
	return slices.Clone(c.allocs)
}

func (c *fakeCore) find(containerID, ifName string) *Allocation {
	for i := range c.allocs {
		if r := Ref(uid, c.allocs[i].Pool); r.ContainerID == containerID && r.IfName == ifName {
			return &c.allocs[i]
		}
	}
	return nil
}

func (c *fakeCore) Add(_ context.Context, req api.CNIAddRequest) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	fs := make([]string, len(req.Flows))
	for i, f := range req.Flows {
		fs[i] = flow.Format(f)
	}
	c.calls = append(c.calls, fmt.Sprintf("add %s/%s %s pod %s/%s %s", req.ContainerID, req.IfName, req.Allocation,
		req.PodNamespace, req.PodName, strings.Join(fs, ",")))
	a := c.find(req.ContainerID, req.IfName)
	if a == nil {
		return errors.New("no such allocation")
	}
	if err := c.addErr[a.Pool]; err != nil {
		return err
	}
	a.Attached, a.Flows = true, req.Flows
	return nil
}

func (c *fakeCore) Del(_ context.Context, ref api.AttachmentRef) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, "del "+ref.ContainerID+"/"+ref.IfName)
	if c.delErr != nil {
		return c.delErr
	}
	if a := c.find(ref.ContainerID, ref.IfName); a != nil {
		a.Attached, a.Flows = false, nil
	}
	return nil
}

func (c *fakeCore) take() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.calls
	c.calls = nil
	return out
}

// fakePods is the node's pods; UIDs sent on changed come out of Next.
type fakePods struct {
	mu      sync.Mutex
	pods    map[string]kubepods.Pod
	changed chan string
	done    []string
}

func (p *fakePods) Cached(u string) (kubepods.Pod, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pod, ok := p.pods[u]
	return pod, ok
}

func (p *fakePods) Next(ctx context.Context) (string, bool) {
	select {
	case u := <-p.changed:
		return u, true
	case <-ctx.Done():
		return "", false
	}
}

func (p *fakePods) Done(u string) {
	p.mu.Lock()
	p.done = append(p.done, u)
	p.mu.Unlock()
}

func (p *fakePods) set(pod kubepods.Pod) {
	p.mu.Lock()
	p.pods[pod.UID] = pod
	p.mu.Unlock()
}

// events records what the face tells the cluster.
type events struct {
	mu   sync.Mutex
	said []string
}

func (e *events) PodFlows(pod v1alpha1.PodRef, alloc string, flows []string, refused string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if refused != "" {
		e.said = append(e.said, fmt.Sprintf("%s/%s %s refused: %s", pod.Namespace, pod.Name, alloc, refused))
		return
	}
	e.said = append(e.said, fmt.Sprintf("%s/%s %s steered: %s", pod.Namespace, pod.Name, alloc, strings.Join(flows, ",")))
}

func (e *events) take() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.said
	e.said = nil
	return out
}

var podIP = netip.MustParseAddr("10.99.0.7")

func dnsPod(annotations map[string]string) kubepods.Pod {
	return kubepods.Pod{UID: uid, Namespace: "default", Name: "dns-0", IPs: []netip.Addr{podIP}, Annotations: annotations}
}

func newFace(t *testing.T, allocs ...Allocation) (*Face, *fakeCore, *fakePods, *events) {
	t.Helper()
	core := &fakeCore{allocs: allocs, addErr: map[string]error{}}
	pods := &fakePods{pods: map[string]kubepods.Pod{}, changed: make(chan string)}
	ev := &events{}
	return New(core, pods, ev, slog.New(slog.NewTextHandler(io.Discard, nil))), core, pods, ev
}

func check(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got %q\nwant %q", what, got, want)
	}
}

// TestSync: the pod's annotation is made its allocation's attachment
// once, changed by ending the old and making the new, and removed with
// the annotation; each outcome is told once, a refusal with its reason.
func TestSync(t *testing.T) {
	f, core, pods, ev := newFace(t, Allocation{ID: "dns-1", Pool: "dns"})
	ctx := context.Background()
	udp5000 := `[{"protocol": "udp", "destinationPort": "5000"}]`

	// A pod the directory has not seen, or one without allocations:
	// nothing.
	f.Sync(ctx, uid)
	f.Sync(ctx, "other")
	check(t, "unknown pod", core.take())

	pods.set(dnsPod(map[string]string{Annotation: udp5000}))
	f.Sync(ctx, uid)
	check(t, "annotated", core.take(), "add pod-"+uid+"/flows.dns dns-1 pod default/dns-0 udp 10.99.0.7:5000")
	check(t, "annotated", ev.take(), "default/dns-0 dns-1 steered: udp 10.99.0.7:5000")
	f.Sync(ctx, uid)
	check(t, "the same again", core.take())
	check(t, "the same again", ev.take())

	pods.set(dnsPod(map[string]string{Annotation + ".dns": `[{"protocol": "udp", "destination": "ipam", "destinationPort": "5001"}]`}))
	f.Sync(ctx, uid)
	check(t, "changed", core.take(), "del pod-"+uid+"/flows.dns", "add pod-"+uid+"/flows.dns dns-1 pod default/dns-0 udp 10.99.0.7:5001")
	check(t, "changed", ev.take(), "default/dns-0 dns-1 steered: udp 10.99.0.7:5001")

	// Another pod's address: the face refuses before the core is asked,
	// and the flows it had go.
	pods.set(dnsPod(map[string]string{Annotation: `[{"protocol": "udp", "destination": "10.99.0.2", "destinationPort": "5000"}]`}))
	f.Sync(ctx, uid)
	check(t, "not its own", core.take(), "del pod-"+uid+"/flows.dns")
	if said := ev.take(); len(said) != 1 || !strings.Contains(said[0], "refused: xdpq.io/flows: ") {
		t.Errorf("not its own: told %q", said)
	}
	f.Sync(ctx, uid)
	check(t, "refused again", core.take())
	check(t, "refused again: told once", ev.take())

	// The core refuses (the node's address, say): told, with its words.
	core.addErr["dns"] = errors.New("the node's address")
	pods.set(dnsPod(map[string]string{Annotation: udp5000}))
	f.Sync(ctx, uid)
	check(t, "the core refuses", core.take(), "add pod-"+uid+"/flows.dns dns-1 pod default/dns-0 udp 10.99.0.7:5000")
	check(t, "the core refuses", ev.take(), "default/dns-0 dns-1 refused: the node's address")
	delete(core.addErr, "dns")
	f.Sync(ctx, uid)
	check(t, "then granted", core.take(), "add pod-"+uid+"/flows.dns dns-1 pod default/dns-0 udp 10.99.0.7:5000")
	check(t, "then granted", ev.take(), "default/dns-0 dns-1 steered: udp 10.99.0.7:5000")

	// An end that fails leaves the attachment, and is tried again at the
	// pod's next change.
	core.delErr = errors.New("busy")
	pods.set(dnsPod(nil))
	f.Sync(ctx, uid)
	check(t, "removal fails", core.take(), "del pod-"+uid+"/flows.dns")
	core.delErr = nil
	f.Sync(ctx, uid)
	check(t, "removed", core.take(), "del pod-"+uid+"/flows.dns")
	check(t, "removed: nothing to tell", ev.take())
	f.Sync(ctx, uid)
	check(t, "nothing left", core.take())

	if n := f.Remembered(); n != 1 {
		t.Errorf("%d outcomes remembered, want the one allocation's", n)
	}
	f.Forget(uid, "dns")
	if n := f.Remembered(); n != 0 {
		t.Errorf("%d outcomes remembered after the allocation went", n)
	}
}

// TestSyncWaitsForAddress: flows naming the pod's own addresses wait
// for the pod to have one; flows of several pools are per pool.
func TestSyncWaitsForAddress(t *testing.T) {
	f, core, pods, ev := newFace(t, Allocation{ID: "a-1", Pool: "a"}, Allocation{ID: "b-1", Pool: "b"})
	ctx := context.Background()
	pod := dnsPod(map[string]string{Annotation + ".a": `[{"protocol": "udp", "destinationPort": "5000"}]`,
		Annotation + ".b": `[{"protocol": "tcp", "destination": "10.99.0.7", "destinationPort": "80"}]`})
	pod.IPs = nil
	pods.set(pod)
	f.Sync(ctx, uid)
	check(t, "no address yet", core.take())
	check(t, "no address yet", ev.take())
	pod.IPs = []netip.Addr{podIP}
	pods.set(pod)
	f.Sync(ctx, uid)
	check(t, "its address", core.take(), "add pod-"+uid+"/flows.a a-1 pod default/dns-0 udp 10.99.0.7:5000",
		"add pod-"+uid+"/flows.b b-1 pod default/dns-0 tcp 10.99.0.7:80")
	check(t, "its address", ev.take(), "default/dns-0 a-1 steered: udp 10.99.0.7:5000", "default/dns-0 b-1 steered: tcp 10.99.0.7:80")
}

// TestRun: Run syncs each pod the directory says changed, says it is
// done with it, and returns when its context ends.
func TestRun(t *testing.T) {
	f, core, pods, _ := newFace(t, Allocation{ID: "dns-1", Pool: "dns"})
	pods.set(dnsPod(map[string]string{Annotation: `[{"protocol": "udp", "destinationPort": "5000"}]`}))
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- f.Run(ctx) }()
	// Unbuffered: each send returns once Run's Next took it, so the
	// third is taken only after the first two are done.
	pods.changed <- uid
	pods.changed <- "other"
	pods.changed <- uid
	cancel()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	check(t, "run", core.take(), "add pod-"+uid+"/flows.dns dns-1 pod default/dns-0 udp 10.99.0.7:5000")
	pods.mu.Lock()
	done := slices.Clone(pods.done)
	pods.mu.Unlock()
	if len(done) < 2 || done[0] != uid || done[1] != "other" {
		t.Errorf("done %q, want %q then %q first", done, uid, "other")
	}
}

// TestAnnotated is each way an annotation is read: by pool, or the
// pod's one for its only pool; a claim's own flows first; refused with a
// reason the pod's owner can act on.
func TestAnnotated(t *testing.T) {
	udp := func(port string) string { return `[{"protocol": "udp", "destinationPort": "` + port + `"}]` }
	queue := Allocation{ID: "q-1", Pool: "q"}
	netdev := Allocation{ID: "v-1", Pool: "v", Netdev: true}
	claim := Allocation{ID: "q-2", Pool: "q", Claim: "telco/rx", ClaimFlows: []byte(udp("6000"))}
	shared := Allocation{ID: "q-3", Pool: "q", Shared: []netip.Prefix{netip.MustParsePrefix("10.96.0.10/32")}}
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		a       Allocation
		n       int
		want    string // flows, formatted, comma-separated
		refused string // a part of the reason
	}{
		{name: "none", a: queue, n: 1},
		{name: "blank", ann: map[string]string{Annotation: "  "}, a: queue, n: 1},
		{name: "the pod's one", ann: map[string]string{Annotation: udp("5000")}, a: queue, n: 1, want: "udp 10.99.0.7:5000"},
		{name: "its pool's", ann: map[string]string{Annotation: udp("5000"), Annotation + ".q": udp("5001")}, a: queue, n: 2, want: "udp 10.99.0.7:5001"},
		{name: "the pod's one, of two pools", ann: map[string]string{Annotation: udp("5000")}, a: queue, n: 2,
			refused: "annotate each pool's flows as xdpq.io/flows.<pool>"},
		{name: "another pool's", ann: map[string]string{Annotation + ".r": udp("5000")}, a: queue, n: 2},
		{name: "the claim's before the pod's", ann: map[string]string{Annotation: udp("5000")}, a: claim, n: 1, want: "udp 10.99.0.7:6000"},
		{name: "a netdev pool's", ann: map[string]string{Annotation: udp("5000")}, a: netdev, n: 1,
			refused: "pool v hands out whole netdevs"},
		{name: "a netdev claim's come with its move", a: Allocation{ID: "v-2", Pool: "v", Netdev: true, Claim: "telco/v",
			ClaimFlows: []byte(udp("5000"))}, n: 1},
		{name: "not JSON", ann: map[string]string{Annotation: "udp 5000"}, a: queue, n: 1, refused: "xdpq.io/flows: "},
		{name: "an unknown field", ann: map[string]string{Annotation: `[{"protocol": "udp", "port": "5000"}]`}, a: queue, n: 1,
			refused: "unknown field"},
		{name: "not its own", ann: map[string]string{Annotation: `[{"protocol": "udp", "destination": "10.96.0.10", "destinationPort": "53"}]`},
			a: queue, n: 1, refused: "xdpq.io/flows: "},
		{name: "shared", ann: map[string]string{Annotation: `[{"protocol": "udp", "destination": "10.96.0.10", "destinationPort": "53"}]`},
			a: shared, n: 1, want: "udp 10.96.0.10:53"},
		{name: "a claim's, not its own", a: Allocation{ID: "q-4", Pool: "q", Claim: "telco/rx",
			ClaimFlows: []byte(`[{"protocol": "udp", "destination": "10.0.0.1", "destinationPort": "53"}]`)}, n: 1,
			refused: "claim telco/rx: flows: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flows, refused, wait := Annotated(dnsPod(tc.ann), tc.a, tc.n)
			got := make([]string, len(flows))
			for i, f := range flows {
				got[i] = flow.Format(f)
			}
			if wait || strings.Join(got, ",") != tc.want || (tc.refused == "") != (refused == "") || !strings.Contains(refused, tc.refused) {
				t.Errorf("flows %q, refused %q, wait %v; want %q, refused with %q", got, refused, wait, tc.want, tc.refused)
			}
		})
	}
}

func TestRef(t *testing.T) {
	r := Ref(uid, "dns")
	if !IsPodFlows(r.ContainerID) || r.IfName != "flows.dns" {
		t.Errorf("Ref %+v", r)
	}
	if IsPodFlows("0123abcd") {
		t.Error("a runtime's container id taken for a pod's flows")
	}
}

// FuzzAnnotated: a pod's annotation is anyone's input who can create a
// pod. Whatever it says, Annotated does not panic, and what it steers
// is the pod's own: every flow's destination is one of the pod's
// addresses (the allocation here grants nothing shared).
func FuzzAnnotated(f *testing.F) {
	for _, s := range []string{`[{"protocol": "udp", "destinationPort": "5000"}]`,
		`[{"protocol": "tcp", "destination": "10.99.0.7", "destinationPort": "80-90"}]`,
		`[{"protocol": "udp", "destination": "10.99.0.0/24"}]`, `[{"protocol": "udp", "destination": "::ffff:10.99.0.7"}]`,
		`[]`, `null`, `{}`, `[{"protocol": "sctp", "sourcePort": "1", "vlan": 4095}]`} {
		f.Add(s)
	}
	a := Allocation{ID: "q-1", Pool: "q"}
	f.Fuzz(func(t *testing.T, val string) {
		flows, refused, wait := Annotated(dnsPod(map[string]string{Annotation: val}), a, 1)
		if wait {
			t.Fatalf("waits for an address the pod has: %q", val)
		}
		if refused != "" && len(flows) > 0 {
			t.Fatalf("refused (%s) and steered %v", refused, flows)
		}
		for _, fl := range flows {
			if fl.Dst != netip.PrefixFrom(podIP, 32) {
				t.Fatalf("%q steers %s, not the pod's own %s", val, flow.Format(fl), podIP)
			}
		}
	})
}
