package nodestatus_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
	"github.com/xdpq/xdpq/pkg/nodestatus"
)

// The API server here is client-go's fake clients: these tests are of the
// writer's timing (a fake clock). test/e2e runs the writer against a real
// kube-apiserver.

const nodeName = "node-a"

// harness runs a writer on a fake clock against fake clients, with the
// daemon's status set by the test.
type harness struct {
	t      *testing.T
	w      *nodestatus.Writer
	clk    *clocktesting.FakeClock
	waits  chan time.Time
	kube   *kubefake.Clientset
	dyn    *dynamicfake.FakeDynamicClient
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	status  *api.Status
	list    *api.AllocationList
	applied []*v1alpha1.XdpqNode // status applies, in order
	fail    error                // the next applies fail with it
	created int                  // object applies
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{t: t, clk: clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)), waits: make(chan time.Time, 1),
		done: make(chan struct{}), status: baseStatus(), list: &api.AllocationList{}}
	h.kube = kubefake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "node-uid"}})
	scheme := runtime.NewScheme()
	h.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{v1alpha1.Resource: "XdpqNodeList"})
	h.dyn.PrependReactor("patch", "xdpqnodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		if p.GetPatchType() != types.ApplyPatchType {
			t.Errorf("patch type %s, want server-side apply", p.GetPatchType())
		}
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(p.GetPatch()); err != nil {
			t.Errorf("apply body: %v", err)
		}
		var o v1alpha1.XdpqNode
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &o); err != nil {
			t.Errorf("apply body: %v", err)
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.fail != nil {
			return true, nil, h.fail
		}
		if p.GetSubresource() == "status" {
			h.applied = append(h.applied, &o)
		} else {
			h.created++
			if len(o.OwnerReferences) != 1 || o.OwnerReferences[0].Kind != "Node" || o.OwnerReferences[0].UID != "node-uid" {
				t.Errorf("XdpqNode owners %+v, want the Node", o.OwnerReferences)
			}
		}
		u.SetUID("xdpqnode-uid")
		return true, &u, nil
	})
	h.w = nodestatus.New(nodestatus.Config{Node: nodeName, Nodes: h.kube.CoreV1().Nodes(), Events: &events.EventSinkImpl{Interface: h.kube.EventsV1()}, Dynamic: h.dyn, Clock: h.clk,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Source: func(context.Context) (*api.Status, *api.AllocationList, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			return cloneStatus(h.status), &api.AllocationList{Allocations: slices.Clone(h.list.Allocations), Attachments: slices.Clone(h.list.Attachments)}, nil
		}})
	nodestatus.SetWaiting(h.w, func(due time.Time) { h.waits <- due })
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.done)
		h.w.Run(ctx)
	}()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	h.cancel()
	for {
		select {
		case <-h.waits:
		case <-h.done:
			return
		}
	}
}

// wait is when the writer looks next, once it waits.
func (h *harness) wait() time.Time {
	h.t.Helper()
	select {
	case due := <-h.waits:
		return due
	case <-time.After(10 * time.Second):
		h.t.Fatal("the writer does not wait")
		return time.Time{}
	}
}

// advanceTo steps the clock to due (the writer's next look) and waits for
// the look to end.
func (h *harness) advanceTo(due time.Time) time.Time {
	h.clk.SetTime(due)
	return h.wait()
}

func (h *harness) writes() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.applied)
}

func (h *harness) last() *v1alpha1.XdpqNode {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.applied[len(h.applied)-1]
}

func (h *harness) update(f func(*api.Status, *api.AllocationList)) {
	h.mu.Lock()
	f(h.status, h.list)
	h.mu.Unlock()
	h.w.Changed()
}

// start lets the writer make its first write.
func (h *harness) start() time.Time {
	h.t.Helper()
	due := h.advanceTo(h.wait())
	if h.writes() != 1 {
		h.t.Fatalf("%d writes at start, want 1", h.writes())
	}
	return due
}

func baseStatus() *api.Status {
	return &api.Status{
		Pools: []api.PoolStatus{{Name: "rx", Resource: "xdpq.io/rx", Queues: 8, Free: 8}},
		Netdevs: []api.NetdevStatus{{Netdev: "eth1", State: "None", Mode: "none", Steering: "software", LinkUp: true,
			RXQueues: 8, NUMANode: -1, Reason: "no socket bound"}},
		Config: api.ConfigStatus{Hash: "0123456789abcdef0123", Loaded: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
}

func cloneStatus(s *api.Status) *api.Status {
	c := *s
	c.Pools = append([]api.PoolStatus(nil), s.Pools...)
	c.Netdevs = append([]api.NetdevStatus(nil), s.Netdevs...)
	return &c
}

func TestWriterFirstWrite(t *testing.T) {
	h := newHarness(t)
	h.start()
	o := h.last()
	if o.Name != nodeName || o.Kind != v1alpha1.Kind || o.APIVersion != "xdpq.io/v1alpha1" {
		t.Errorf("applied %s %s/%s", o.Name, o.APIVersion, o.Kind)
	}
	if s := o.Status.Summary; s.Netdevs != 1 || s.Queues != "0/8" || s.Config != "0123456789ab" {
		t.Errorf("summary %+v", s)
	}
	if h.created != 1 {
		t.Errorf("%d object applies, want 1", h.created)
	}
}

// A netdev's state change is written within 2 s, however recent the
// last write.
func TestWriterNetdevChangeWithin2s(t *testing.T) {
	h := newHarness(t)
	h.start()
	for i, state := range []string{"Overridden", "Filter", "Missing", "None"} {
		changedAt := h.clk.Now()
		h.update(func(s *api.Status, _ *api.AllocationList) { s.Netdevs[0].State = state })
		due := h.wait()
		if d := due.Sub(changedAt); d > 2*time.Second {
			t.Fatalf("state %s looked at after %v", state, d)
		}
		h.advanceTo(due)
		if h.writes() != i+2 {
			t.Fatalf("state %s: %d writes, want %d", state, h.writes(), i+2)
		}
		want := v1alpha1.ProgramState(state)
		if state == "None" {
			want = v1alpha1.StateIdle
		}
		if got := h.last().Status.Netdevs[0].State; got != want {
			t.Errorf("state %s written as %s, want %s", state, got, want)
		}
	}
}

// Allocation churn of one change a second is written at most once per
// MinInterval (10 s): at most 0.1 writes a second.
func TestWriterChurnCoalesced(t *testing.T) {
	h := newHarness(t)
	h.start()
	const seconds = 120
	begin, before := h.clk.Now(), h.writes()
	var due time.Time
	for i := range seconds {
		h.update(func(s *api.Status, l *api.AllocationList) {
			if i%2 == 0 {
				l.Allocations = append(l.Allocations, api.Allocation{ID: fmt.Sprint("a", i), Pool: "rx", Netdev: "eth1", Queues: []uint32{uint32(i % 8)}})
				s.Allocations++
				s.Pools[0].Allocations++
				s.Pools[0].Free--
			} else {
				l.Allocations = l.Allocations[1:]
				s.Allocations--
				s.Pools[0].Allocations--
				s.Pools[0].Free++
			}
		})
		due = h.wait()
		// The second passes: the writer looks whenever it is due.
		next := begin.Add(time.Duration(i+1) * time.Second)
		for !due.After(next) {
			due = h.advanceTo(due)
		}
		h.clk.SetTime(next)
	}
	writes := h.writes() - before
	elapsed := h.clk.Now().Sub(begin)
	rate := float64(writes) / elapsed.Seconds()
	t.Logf("%d writes in %v of churn at 1 change/s: %.3f/s", writes, elapsed, rate)
	if rate > 0.1+1/elapsed.Seconds() {
		t.Errorf("%.3f writes/s under churn, want at most 0.1", rate)
	}
	if writes < seconds/10-1 {
		t.Errorf("%d writes in %v: the churn is not written every 10 s", writes, elapsed)
	}
	// The last of the churn is written: what is there is what the daemon has.
	h.advanceTo(due)
	if got, want := len(h.last().Status.Allocations), 0; got != want {
		t.Errorf("last write has %d allocations, want %d", got, want)
	}
}

// Nothing changed, nothing written: not on a Changed with no change, not
// on resyncs.
func TestWriterIdleWritesNothing(t *testing.T) {
	h := newHarness(t)
	due := h.start()
	for range 10 {
		h.w.Changed()
		due = h.advanceTo(h.wait())
	}
	for range 60 { // an hour of resyncs
		due = h.advanceTo(due)
	}
	if h.writes() != 1 {
		t.Errorf("%d writes while idle, want only the first", h.writes())
	}
}

// While the API server is away the writer backs off, and writes what is
// current once it is back.
func TestWriterRetriesWithBackoff(t *testing.T) {
	h := newHarness(t)
	h.start()
	h.mu.Lock()
	h.fail = apierrors.NewServiceUnavailable("etcd is away")
	h.mu.Unlock()
	h.update(func(s *api.Status, _ *api.AllocationList) {
		s.Netdevs[0].State = "Overridden"
		s.Netdevs[0].Foreign = "fw"
	})
	due := h.advanceTo(h.wait())
	var gaps []time.Duration
	for range 8 {
		now := h.clk.Now()
		next := h.advanceTo(due)
		gaps = append(gaps, due.Sub(now))
		due = next
	}
	t.Logf("retries after %v", gaps)
	for i := 1; i < len(gaps); i++ {
		if gaps[i] < gaps[i-1] || gaps[i] > 30*time.Second {
			t.Errorf("backoff %v", gaps)
			break
		}
	}
	if gaps[len(gaps)-1] != 30*time.Second {
		t.Errorf("backoff reaches %v, want 30s", gaps[len(gaps)-1])
	}
	h.mu.Lock()
	h.fail = nil
	h.mu.Unlock()
	h.advanceTo(due)
	if got := h.last().Status.Netdevs[0]; got.State != v1alpha1.StateOverridden || got.ForeignProgram != "fw" {
		t.Errorf("after the outage: %+v", got)
	}
}

// An XdpqNode someone deleted is created again.
func TestWriterRecreates(t *testing.T) {
	h := newHarness(t)
	h.start()
	h.mu.Lock()
	h.fail = apierrors.NewNotFound(v1alpha1.Resource.GroupResource(), nodeName)
	h.mu.Unlock()
	h.update(func(s *api.Status, _ *api.AllocationList) { s.Netdevs[0].LinkUp = false })
	due := h.advanceTo(h.wait())
	h.mu.Lock()
	h.fail = nil
	h.mu.Unlock()
	h.advanceTo(due)
	if h.created != 2 {
		t.Errorf("%d object applies, want 2 (created again)", h.created)
	}
	if h.last().Status.Netdevs[0].LinkUp {
		t.Error("link down not written")
	}
}

// Changed never blocks the daemon, whatever the writer is doing.
func relatedKind(e *eventsv1.Event) string {
	if e.Related == nil {
		return ""
	}
	return e.Related.Kind
}

func TestWriterChangedNeverBlocks(t *testing.T) {
	w := nodestatus.New(nodestatus.Config{Node: nodeName})
	for range 1000 {
		w.Changed()
	}
	// Events before Run are dropped, not blocked on.
	w.ConfigRefused(errors.New("bad"))
}

// Events land in events.k8s.io/v1, on the XdpqNode and the pod.
func TestWriterEvents(t *testing.T) {
	h := newHarness(t)
	created := make(chan *eventsv1.Event, 10)
	h.kube.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		created <- a.(k8stesting.CreateAction).GetObject().(*eventsv1.Event)
		return false, nil, nil
	})
	h.start()
	h.w.NetdevOverridden("eth1", "fw", 42)
	h.w.ConnectionRefused("a1", v1alpha1.PodRef{Namespace: "ns1", Name: "p1", UID: "pod-uid"}, "forbidden", "not the owner")
	want := map[string]string{"XdpqNode/NetdevOverridden": "", "XdpqNode/ConnectionRefused": "Pod", "Pod/ConnectionRefused": "XdpqNode"}
	timeout := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case e := <-created:
			key := e.Regarding.Kind + "/" + e.Reason
			related, ok := want[key]
			if !ok {
				t.Errorf("unexpected event %s: %s", key, e.Note)
				continue
			}
			if got := relatedKind(e); got != related {
				t.Errorf("event %s related to %q, want %q", key, got, related)
			}
			if e.Regarding.Kind == v1alpha1.Kind && (e.Regarding.Name != nodeName || e.Regarding.UID != "xdpqnode-uid") {
				t.Errorf("event %s regarding %+v", key, e.Regarding)
			}
			if e.ReportingController != nodestatus.ReportingController || e.Type != corev1.EventTypeWarning {
				t.Errorf("event %s: controller %q type %q", key, e.ReportingController, e.Type)
			}
			delete(want, key)
		case <-timeout:
			t.Fatalf("events missing: %v", want)
		}
	}
}
