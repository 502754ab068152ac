// Package kubeevents records events.k8s.io/v1 Events as client-go's
// tools/events does (v0.37): each Event is created once; an isomorphic
// one (same type, action, reason, reporter, regarding and related
// object) turns it into a series, patched with its count at once, every
// 30 minutes, and once more when no new one came for 6 minutes; a write
// that fails for want of the API server is tried again, up to 12 times,
// about 10 s apart. It does not use tools/events because that package
// imports client-go's all-groups clientset, whose scheme registers every
// API group at init: about 9 MB of resident memory in a node daemon.
package kubeevents

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record/util"
	"k8s.io/utils/clock"
)

// Sink writes Events, each in its own namespace; client-go's
// tools/events.EventSinkImpl and kubeclient.EventSink are ones.
type Sink interface {
	Create(ctx context.Context, event *eventsv1.Event) (*eventsv1.Event, error)
	// Patch applies data, a strategic merge patch, to event.
	Patch(ctx context.Context, event *eventsv1.Event, data []byte) (*eventsv1.Event, error)
}

// tools/events' constants.
const (
	maxTries   = 12
	retryAfter = 10 * time.Second
	finishTime = 6 * time.Minute
	refresh    = 30 * time.Minute
	maxQueued  = 1000
)

// Recorder records Events through a Sink. Create it with New and run it
// with Run; Event may be called from any goroutine and never blocks.
type Recorder struct {
	sink                 Sink
	controller, instance string
	log                  *slog.Logger
	clock                clock.WithTicker
	retryAfter           time.Duration
	queue                chan *eventsv1.Event // Events not yet looked at; dropped when full
	// cache is the Events recorded lately, by what makes them
	// isomorphic; Run's own.
	cache map[key]*eventsv1.Event
}

// key is what makes two Events isomorphic (tools/events' eventKey).
type key struct {
	typ, action, reason, controller, instance string
	regarding, related                        corev1.ObjectReference
}

// New returns a recorder of Events reported by controller: the instance,
// as tools/events names it, is controller-hostname.
func New(sink Sink, controller string, log *slog.Logger) *Recorder {
	host, _ := os.Hostname()
	return &Recorder{sink: sink, controller: controller, instance: controller + "-" + host, log: log,
		clock: clock.RealClock{}, retryAfter: retryAfter, queue: make(chan *eventsv1.Event, maxQueued), cache: map[key]*eventsv1.Event{}}
}

// Event records an Event regarding regarding, related to related if not
// nil, of type typ (corev1.EventTypeNormal or EventTypeWarning). It is
// written when Run runs; one that finds maxQueued others waiting is
// dropped.
func (r *Recorder) Event(regarding, related *corev1.ObjectReference, typ, reason, action, note string) {
	if typ != corev1.EventTypeNormal && typ != corev1.EventTypeWarning {
		r.log.Error("event not recorded: unsupported type", "type", typ, "reason", reason)
		return
	}
	now := r.clock.Now()
	ns := regarding.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	e := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: util.GenerateEventName(regarding.Name, now.UnixNano()), Namespace: ns},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: r.controller,
		ReportingInstance:   r.instance,
		Action:              action,
		Reason:              reason,
		Regarding:           *regarding,
		Related:             related,
		Note:                note,
		Type:                typ,
	}
	select {
	case r.queue <- e:
	default:
		r.log.Warn("event dropped: too many waiting to be written", "reason", reason, "note", note)
	}
}

// Run writes the recorded Events until ctx ends, and returns when every
// write it started has ended.
func (r *Recorder) Run(ctx context.Context) {
	var writes sync.WaitGroup
	defer writes.Wait()
	finish, again := r.clock.NewTicker(finishTime), r.clock.NewTicker(refresh)
	defer finish.Stop()
	defer again.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case e := <-r.queue:
			if e = r.fold(e); e != nil {
				writes.Go(func() { r.write(ctx, e) })
			}
		case <-finish.C():
			r.finishSeries(ctx)
		case <-again.C():
			r.refreshSeries(ctx)
		}
	}
}

// fold keeps e in the cache, or counts it in the series of an isomorphic
// Event there, and returns what to write: e, the series when it starts,
// nil while it goes on.
func (r *Recorder) fold(e *eventsv1.Event) *eventsv1.Event {
	k := keyOf(e)
	prev, ok := r.cache[k]
	if !ok {
		r.cache[k] = e
		return e.DeepCopy()
	}
	now := metav1.NewMicroTime(r.clock.Now())
	if prev.Series != nil {
		prev.Series.Count++
		prev.Series.LastObservedTime = now
		return nil
	}
	prev.Series = &eventsv1.EventSeries{Count: 2, LastObservedTime: now}
	return prev.DeepCopy()
}

// write writes e, trying again while the API server cannot be reached.
func (r *Recorder) write(ctx context.Context, e *eventsv1.Event) {
	for try := 1; ; try++ {
		if _, again := r.record(ctx, e); !again {
			return
		}
		if try >= maxTries {
			r.log.Warn("event not written: retry limit reached", "reason", e.Reason, "note", e.Note)
			return
		}
		t := r.clock.NewTimer(r.retryAfter + time.Duration(rand.Float64()*0.25*float64(r.retryAfter)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// finishSeries writes the series no Event joined for finishTime once
// more, and forgets them and the single Events as old.
func (r *Recorder) finishSeries(ctx context.Context) {
	old := r.clock.Now().Add(-finishTime)
	for k, e := range r.cache {
		switch {
		case e.Series == nil:
			if e.EventTime.Time.Before(old) {
				delete(r.cache, k)
			}
		case e.Series.LastObservedTime.Time.Before(old):
			if _, again := r.record(ctx, e.DeepCopy()); !again {
				delete(r.cache, k)
			}
		}
	}
}

// refreshSeries writes every series, so that none lasts in the API
// server's view only as long as its first write.
func (r *Recorder) refreshSeries(ctx context.Context) {
	for k, e := range r.cache {
		if e.Series == nil {
			continue
		}
		if got, again := r.record(ctx, e.DeepCopy()); !again && got != nil {
			r.cache[k] = got
		}
	}
}

// record writes e once: a series as a patch of its Event (created if the
// API server has it no more), any other as a new Event. It says whether
// to try again.
func (r *Recorder) record(ctx context.Context, e *eventsv1.Event) (*eventsv1.Event, bool) {
	var got *eventsv1.Event
	var err error
	series := e.Series != nil
	if series {
		patch, perr := json.Marshal(struct {
			Series *eventsv1.EventSeries `json:"series"`
		}{e.Series})
		if perr != nil {
			r.log.Warn("event not written: its series patch", "reason", e.Reason, "err", perr)
			return nil, false
		}
		got, err = r.sink.Patch(ctx, e, patch)
	}
	if !series || apierrors.IsNotFound(err) {
		e.ResourceVersion = ""
		got, err = r.sink.Create(ctx, e)
	}
	if err == nil {
		return got, false
	}
	var construct *rest.RequestConstructionError
	var status *apierrors.StatusError
	switch {
	case errors.As(err, &construct):
		r.log.Warn("event not written: the request could not be made (not tried again)", "reason", e.Reason, "err", err)
		return nil, false
	case errors.As(err, &status):
		if apierrors.IsAlreadyExists(err) {
			return nil, series
		}
		r.log.Warn("event rejected by the API server (not tried again)", "reason", e.Reason, "err", err)
		return nil, false
	}
	r.log.Warn("event not written; trying again", "reason", e.Reason, "err", err)
	return nil, true
}

func keyOf(e *eventsv1.Event) key {
	k := key{typ: e.Type, action: e.Action, reason: e.Reason, controller: e.ReportingController, instance: e.ReportingInstance, regarding: e.Regarding}
	if e.Related != nil {
		k.related = *e.Related
	}
	return k
}
