package nodestatus

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/clock"

	"github.com/xdpq/xdpq/internal/kubeevents"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
)

// FieldManager is the field manager of xdpq's server-side applies.
const FieldManager = "xdpq"

// ReportingController names xdpq's daemon in the Events it records.
const ReportingController = "xdpq.io/daemon"

// Defaults of Config.
const (
	DefaultSettle      = time.Second
	DefaultMinInterval = 10 * time.Second
	DefaultResync      = time.Minute
	maxBackoff         = 30 * time.Second
	callTimeout        = 15 * time.Second
)

// Source returns the daemon's status and its allocations now. It must not
// wait for the API server.
type Source func(context.Context) (*api.Status, *api.AllocationList, error)

// Nodes gets Nodes: client-go's CoreV1().Nodes() and
// internal/kubeclient's Nodes() are ones.
type Nodes interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error)
}

// Config configures a Writer.
type Config struct {
	// Node is the node's name: of its Node, and of its XdpqNode.
	Node string
	// Nodes reads the Node, the XdpqNode's owner.
	Nodes Nodes
	// Events writes the Events the writer records (events.k8s.io/v1):
	// &events.EventSinkImpl{Interface: clientset.EventsV1()} of client-go's
	// tools/events, or internal/kubeclient's EventSink().
	Events kubeevents.Sink
	// Dynamic applies the XdpqNode and its status.
	Dynamic dynamic.Interface
	// Source is the daemon's status and allocations.
	Source Source
	// Serving says whether the daemon serves yet (the Ready condition);
	// nil means it does.
	Serving func() bool
	// Settle is how long the writer waits after a change for more before
	// it looks; zero means DefaultSettle. A change of a netdev's state,
	// a condition or the config is written then.
	Settle time.Duration
	// MinInterval is the least time between two writes that change only
	// allocations (and what follows from them: pools' allocated counts,
	// flows); zero means DefaultMinInterval.
	MinInterval time.Duration
	// Resync is how often the writer looks at the status with no change
	// signalled, a safety net; zero means DefaultResync. It writes only
	// what changed.
	Resync time.Duration
	// Clock is nil for the real clock.
	Clock  clock.WithTicker
	Logger *slog.Logger
}

// Writer keeps the node's XdpqNode and its status, and records Events.
// Create it with New, run it with Run; Changed and the event methods may
// be called from any goroutine, before and during Run, and never block.
type Writer struct {
	cfg     Config
	log     *slog.Logger
	clock   clock.WithTicker
	changed chan struct{} // a change since the last look; capacity 1
	// waiting, if set (tests), is called each time Run waits, with when it
	// looks next.
	waiting func(due time.Time)

	mu       sync.Mutex // guards the fields below; never held across a call out
	obj      *v1alpha1.XdpqNode
	recorder *kubeevents.Recorder // nil until Run starts it
	writes   uint64

	// Run's own.
	written   *v1alpha1.XdpqNodeStatus // as last written; nil before the first write
	lastWrite time.Time
	backoff   time.Duration
}

// New returns a writer of node's XdpqNode.
func New(cfg Config) *Writer {
	if cfg.Settle == 0 {
		cfg.Settle = DefaultSettle
	}
	if cfg.MinInterval == 0 {
		cfg.MinInterval = DefaultMinInterval
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Writer{cfg: cfg, log: cfg.Logger, clock: cfg.Clock, changed: make(chan struct{}, 1)}
}

// Changed says the daemon's status may have changed; it never blocks.
func (w *Writer) Changed() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// Writes counts the status writes the writer made.
func (w *Writer) Writes() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes
}

// Run creates the XdpqNode, writes its status when it changes and records
// Events, until ctx ends; then it writes the Ready condition False (the
// daemon stopped), trying for a few seconds. It returns nil: an API server
// that is away is retried, never a failure of the daemon.
func (w *Writer) Run(ctx context.Context) error {
	rec := kubeevents.New(w.cfg.Events, ReportingController, w.log)
	evCtx, stopEvents := context.WithCancel(context.WithoutCancel(ctx))
	recorded := make(chan struct{})
	go func() {
		defer close(recorded)
		rec.Run(evCtx)
	}()
	defer func() {
		w.mu.Lock()
		w.recorder = nil // what is recorded now is dropped, as it was by a stopped broadcaster
		w.mu.Unlock()
		stopEvents()
		<-recorded
	}()
	w.mu.Lock()
	w.recorder = rec
	w.mu.Unlock()

	timer := w.clock.NewTimer(0) // the first look at once
	due := w.clock.Now()
	for {
		if w.waiting != nil {
			w.waiting(due)
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			w.stop()
			return nil
		case <-w.changed:
			if at := w.clock.Now().Add(w.cfg.Settle); at.Before(due) {
				due = at
				timer.Stop()
				timer.Reset(w.cfg.Settle)
			}
		case <-timer.C():
			next := w.look(ctx)
			due = w.clock.Now().Add(next)
			timer.Reset(next)
		}
	}
}

// look takes the daemon's status and writes it if it changed and may be
// written now. It returns when to look next.
func (w *Writer) look(ctx context.Context) time.Duration {
	now := w.clock.Now()
	if w.object() == nil {
		if err := w.ensure(ctx); err != nil {
			return w.failed("create the XdpqNode", err)
		}
	}
	s, l, err := w.cfg.Source(ctx)
	if err != nil {
		return w.failed("daemon status", err)
	}
	var prev []metav1.Condition
	if w.written != nil {
		prev = w.written.Conditions
	}
	serving := w.cfg.Serving == nil || w.cfg.Serving()
	next := Convert(s, l, serving, prev, now)
	if w.written != nil {
		if equalStatus(w.written, &next) {
			return w.cfg.Resync
		}
		if at := w.lastWrite.Add(w.cfg.MinInterval); !urgent(w.written, &next) && now.Before(at) {
			return at.Sub(now)
		}
	}
	if err := w.apply(ctx, &next); err != nil {
		if apierrors.IsNotFound(err) {
			w.setObject(nil) // deleted: created again on the next look
		}
		return w.failed("write the XdpqNode's status", err)
	}
	w.written, w.lastWrite, w.backoff = &next, now, 0
	return w.cfg.Resync
}

// failed logs a failed look and returns the backoff: 1 s, doubled each
// time up to 30 s.
func (w *Writer) failed(what string, err error) time.Duration {
	w.backoff = min(max(2*w.backoff, time.Second), maxBackoff)
	w.log.Warn("node status: "+what+" failed; trying again", "node", w.cfg.Node, "in", w.backoff, "err", err)
	return w.backoff
}

// ensure creates the XdpqNode, owned by the Node, or takes it as it is.
func (w *Writer) ensure(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	node, err := w.cfg.Nodes.Get(ctx, w.cfg.Node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s (the XdpqNode's owner): %w", w.cfg.Node, err)
	}
	obj := &v1alpha1.XdpqNode{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: w.cfg.Node,
			Labels:          map[string]string{"app.kubernetes.io/managed-by": "xdpq"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}},
	}
	u, err := toUnstructured(obj)
	if err != nil {
		return err
	}
	unstructured.RemoveNestedField(u.Object, "status")
	got, err := w.cfg.Dynamic.Resource(v1alpha1.Resource).Apply(ctx, w.cfg.Node, u, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil {
		return err
	}
	var created v1alpha1.XdpqNode
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &created); err != nil {
		return fmt.Errorf("xdpqnode %s: %w", w.cfg.Node, err)
	}
	w.setObject(&created)
	return nil
}

// apply writes the status with a server-side apply on the status
// subresource.
func (w *Writer) apply(ctx context.Context, st *v1alpha1.XdpqNodeStatus) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	u, err := toUnstructured(&v1alpha1.XdpqNode{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: w.cfg.Node},
		Status:     *st,
	})
	if err != nil {
		return err
	}
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	if _, err := w.cfg.Dynamic.Resource(v1alpha1.Resource).ApplyStatus(ctx, w.cfg.Node, u,
		metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		return err
	}
	w.mu.Lock()
	w.writes++
	w.mu.Unlock()
	return nil
}

// Delete deletes the node's XdpqNode, the one this writer made if it
// knows it (a precondition on its UID), and says nothing of one that is
// already gone. Call it after Run returned: xdpq was uninstalled from the
// node.
func (w *Writer) Delete(ctx context.Context) error {
	var opts metav1.DeleteOptions
	if o := w.object(); o != nil && o.UID != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &o.UID}
	}
	err := w.cfg.Dynamic.Resource(v1alpha1.Resource).Delete(ctx, w.cfg.Node, opts)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete xdpqnode %s: %w", w.cfg.Node, err)
	}
	return nil
}

// stop writes Ready False, if a status was written, with a few seconds'
// tries.
func (w *Writer) stop() {
	if w.written == nil {
		return
	}
	next := w.written.DeepCopy()
	for i, c := range next.Conditions {
		if c.Type == v1alpha1.ConditionReady {
			next.Conditions[i].Status, next.Conditions[i].Reason = metav1.ConditionFalse, ReasonStopped
			next.Conditions[i].Message = "the daemon stopped; what is attached keeps working, nothing new is served"
			next.Conditions[i].LastTransitionTime = metav1.NewTime(w.clock.Now().Truncate(time.Second))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := w.apply(ctx, next); err != nil {
		w.log.Warn("node status: Ready not set False on the way out", "node", w.cfg.Node, "err", err)
	}
}

func (w *Writer) object() *v1alpha1.XdpqNode {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.obj
}

func (w *Writer) setObject(o *v1alpha1.XdpqNode) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.obj = o
}

func toUnstructured(o *v1alpha1.XdpqNode) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
	if err != nil {
		return nil, fmt.Errorf("xdpqnode %s: %w", o.Name, err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

func equalStatus(a, b *v1alpha1.XdpqNodeStatus) bool { return equality.Semantic.DeepEqual(a, b) }
