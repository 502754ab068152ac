package kubeevents

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	clocktesting "k8s.io/utils/clock/testing"
)

// call is one write a fakeSink was asked for.
type call struct {
	verb  string // create or patch
	event *eventsv1.Event
	patch []byte
}

// fakeSink records its calls on a channel; fail, if set, says which
// call (counted from 1) fails with which error.
type fakeSink struct {
	calls chan call
	mu    sync.Mutex
	n     int
	fail  func(n int, verb string) error
}

func newSink(fail func(n int, verb string) error) *fakeSink {
	return &fakeSink{calls: make(chan call, 100), fail: fail}
}

func (s *fakeSink) do(verb string, e *eventsv1.Event, patch []byte) (*eventsv1.Event, error) {
	s.mu.Lock()
	s.n++
	n := s.n
	s.mu.Unlock()
	s.calls <- call{verb, e.DeepCopy(), patch}
	if s.fail != nil {
		if err := s.fail(n, verb); err != nil {
			return nil, err
		}
	}
	return e.DeepCopy(), nil
}

func (s *fakeSink) Create(_ context.Context, e *eventsv1.Event) (*eventsv1.Event, error) {
	return s.do("create", e, nil)
}

func (s *fakeSink) Patch(_ context.Context, e *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	return s.do("patch", e, data)
}

func (s *fakeSink) next(t *testing.T) call {
	t.Helper()
	select {
	case c := <-s.calls:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no write")
		return call{}
	}
}

func newRecorder(sink Sink) *Recorder {
	r := New(sink, "xdpq.io/daemon", slog.New(slog.DiscardHandler))
	r.retryAfter = time.Millisecond
	return r
}

func run(t *testing.T, r *Recorder) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

var (
	node = &corev1.ObjectReference{APIVersion: "xdpq.io/v1alpha1", Kind: "XdpqNode", Name: "n1", UID: "u1"}
	pod  = &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "p", Name: "pod-a", UID: "u2"}
)

// TestRecorder: an Event is created as client-go's tools/events makes
// it; an isomorphic one patches it into a series with the very patch
// tools/events computes.
func TestRecorder(t *testing.T) {
	sink := newSink(nil)
	r := newRecorder(sink)
	run(t, r)

	r.Event(node, nil, corev1.EventTypeWarning, "ConfigRefused", "Reload", "bad")
	c := sink.next(t)
	e := c.event
	if c.verb != "create" || e.Namespace != "default" || !strings.HasPrefix(e.Name, "n1.") || e.Regarding != *node || e.Related != nil ||
		e.Type != "Warning" || e.Reason != "ConfigRefused" || e.Action != "Reload" || e.Note != "bad" ||
		e.ReportingController != "xdpq.io/daemon" || !strings.HasPrefix(e.ReportingInstance, "xdpq.io/daemon-") || e.EventTime.IsZero() || e.Series != nil {
		t.Fatalf("first: %s %+v", c.verb, e)
	}

	r.Event(node, nil, corev1.EventTypeWarning, "ConfigRefused", "Reload", "bad again")
	c = sink.next(t)
	if c.verb != "patch" || c.event.Name != e.Name || c.event.Series == nil || c.event.Series.Count != 2 {
		t.Fatalf("second: %s %+v", c.verb, c.event)
	}
	old, series := c.event.DeepCopy(), c.event.DeepCopy()
	old.Series = nil
	oldJSON, _ := json.Marshal(old)
	newJSON, _ := json.Marshal(series)
	want, err := strategicpatch.CreateTwoWayMergePatch(oldJSON, newJSON, eventsv1.Event{})
	if err != nil {
		t.Fatal(err)
	}
	if string(c.patch) != string(want) {
		t.Errorf("series patch %s, tools/events' %s", c.patch, want)
	}

	r.Event(pod, node, corev1.EventTypeNormal, "FlowsApplied", "Steer", "2 flows")
	c = sink.next(t)
	if c.verb != "create" || c.event.Namespace != "p" || !strings.HasPrefix(c.event.Name, "pod-a.") || c.event.Related == nil || *c.event.Related != *node {
		t.Fatalf("on the pod: %s %+v", c.verb, c.event)
	}
}

// TestRecorderRetries: a write the API server did not answer is tried
// again; one it refused is not.
func TestRecorderRetries(t *testing.T) {
	unreachable := errors.New("connection refused")
	sink := newSink(func(n int, _ string) error {
		if n <= 2 {
			return unreachable
		}
		return nil
	})
	r := newRecorder(sink)
	run(t, r)
	r.Event(node, nil, corev1.EventTypeNormal, "NetdevReclaimed", "Attach", "back")
	for i := range 3 {
		if c := sink.next(t); c.verb != "create" || c.event.Reason != "NetdevReclaimed" {
			t.Fatalf("try %d: %s %+v", i+1, c.verb, c.event)
		}
	}

	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, "x", errors.New("no"))
	for _, tc := range []struct {
		name   string
		err    error
		series bool
		again  bool
	}{
		{"unreachable", unreachable, false, true},
		{"forbidden", forbidden, false, false},
		{"exists", apierrors.NewAlreadyExists(schema.GroupResource{}, "x"), false, false},
		{"series exists", apierrors.NewAlreadyExists(schema.GroupResource{}, "x"), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecorder(newSink(func(int, string) error { return tc.err }))
			e := &eventsv1.Event{}
			e.Namespace = "default"
			if tc.series {
				e.Series = &eventsv1.EventSeries{Count: 2}
			}
			if _, again := r.record(context.Background(), e); again != tc.again {
				t.Errorf("tried again %v, want %v", again, tc.again)
			}
		})
	}
}

// TestRecorderSeries: a series counts the isomorphic Events without a
// write each; it is written when it ends (6 minutes without one), and
// forgotten then; a series the API server lost is created again.
func TestRecorderSeries(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1700000000, 0))
	notFound := apierrors.NewNotFound(schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, "x")
	sink := newSink(func(n int, verb string) error {
		if n == 2 && verb == "patch" { // the series's end
			return notFound
		}
		return nil
	})
	r := newRecorder(sink)
	r.clock = clk
	ev := func() *eventsv1.Event {
		r.Event(node, nil, corev1.EventTypeWarning, "ConnectionRefused", "Connect", "refused")
		return <-r.queue
	}
	if e := r.fold(ev()); e == nil || e.Series != nil {
		t.Fatalf("first: %+v", e)
	}
	if e := r.fold(ev()); e == nil || e.Series.Count != 2 {
		t.Fatalf("second: %+v", e)
	}
	if e := r.fold(ev()); e != nil {
		t.Fatalf("third written at once: %+v", e)
	}
	r.finishSeries(context.Background())
	if len(r.cache) != 1 || len(sink.calls) != 0 {
		t.Fatalf("a series ended early: cache %d, writes %d", len(r.cache), len(sink.calls))
	}
	r.refreshSeries(context.Background())
	if c := sink.next(t); c.verb != "patch" || c.event.Series.Count != 3 {
		t.Fatalf("refresh: %s %+v", c.verb, c.event)
	}
	clk.Step(finishTime + time.Second)
	r.finishSeries(context.Background())
	if c := sink.next(t); c.verb != "patch" || c.event.Series.Count != 3 {
		t.Fatalf("end: %s %+v", c.verb, c.event)
	}
	if c := sink.next(t); c.verb != "create" || c.event.Series.Count != 3 || c.event.ResourceVersion != "" {
		t.Fatalf("lost series: %s %+v", c.verb, c.event)
	}
	if len(r.cache) != 0 {
		t.Fatalf("an ended series is kept: %d", len(r.cache))
	}
	if e := r.fold(ev()); e == nil || e.Series != nil {
		t.Fatalf("after the series: %+v", e)
	}
}
