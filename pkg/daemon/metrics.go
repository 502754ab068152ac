package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/localapi"
	"github.com/xdpq/xdpq/pkg/wire"
)

// The daemon serves /metrics, /healthz and /readyz over HTTP at
// Options.MetricsAddr. Everything but the CNI verbs' latency is read at
// scrape time from the parts that hold it (the ledger, the broker, the
// agents, the config watcher), so a scrape shows the state of that
// moment and the daemon keeps no second copy of it. The families and
// their labels are bounded by the config: pools, netdevs and their
// queues, a fixed set of codes and verbs.

var (
	poolCapacityDesc = prometheus.NewDesc("xdpq_pool_capacity_devices",
		"Devices (queues, or netdevs in a netdev-mode pool) the pool has.", []string{"pool"}, nil)
	poolAllocatedDesc = prometheus.NewDesc("xdpq_pool_allocated_devices",
		"Devices of the pool that allocations hold (those held beyond a shrunk pool included).", []string{"pool"}, nil)
	poolAllocationsDesc = prometheus.NewDesc("xdpq_pool_allocations",
		"Allocations of the pool.", []string{"pool"}, nil)
	poolLeasesDesc = prometheus.NewDesc("xdpq_pool_leases",
		"Allocations of the pool whose sockets a client holds now (an active lease).", []string{"pool"}, nil)
	refusalsDesc = prometheus.NewDesc("xdpq_broker_refusals_total",
		"Connections to allocations' sockets the broker refused, by the protocol's error code (forbidden: a peer that is not the allocation's owner).",
		[]string{"code"}, nil)
	reloadsDesc = prometheus.NewDesc("xdpq_config_reloads_total",
		"Reloads of the config file after the first load, by result: success (put in force) or failure (refused; the last good config stays).",
		[]string{"result"}, nil)
	lastReloadDesc = prometheus.NewDesc("xdpq_config_last_reload_success_timestamp_seconds",
		"When the config in force was put in force, in seconds since the epoch.", nil, nil)
	reloadOKDesc = prometheus.NewDesc("xdpq_config_last_reload_successful",
		"1 if the config file on disk is the config in force, 0 if its last reload was refused.", nil, nil)
	queueInfoDesc = prometheus.NewDesc("xdpq_queue_info",
		"1 for each queue an allocation holds, naming its pool, allocation and pod (namespace and pod empty until the pod is known): "+
			"join the per-queue families on (node, netdev, queue) to see them per pod.",
		[]string{"netdev", "queue", "pool", "allocation", "namespace", "pod"}, nil)
)

// socketStats are the per-queue families of the kernel's counters of the
// socket bound there (XDP_STATISTICS), read through the broker's
// duplicates while a lease is active: a queue's series exist only then,
// and start from zero with each new lease (a counter reset).
var socketStats = []struct {
	desc *prometheus.Desc
	get  func(broker.QueueStats) uint64
}{
	{prometheus.NewDesc("xdpq_socket_rx_dropped_frames_total",
		"Frames for the queue's socket the kernel dropped for another reason than a full RX ring (no frame on the fill ring, a frame too large).",
		[]string{"netdev", "queue"}, nil), func(s broker.QueueStats) uint64 { return s.RXDropped }},
	{prometheus.NewDesc("xdpq_socket_rx_ring_full_frames_total",
		"Frames for the queue's socket dropped because its RX ring was full: the pod does not read fast enough.",
		[]string{"netdev", "queue"}, nil), func(s broker.QueueStats) uint64 { return s.RXRingFull }},
	{prometheus.NewDesc("xdpq_socket_fill_ring_empty_total",
		"Times the kernel found the socket's fill ring empty when a frame came: the pod gives back frames too slowly.",
		[]string{"netdev", "queue"}, nil), func(s broker.QueueStats) uint64 { return s.RXFillRingEmptyDescs }},
	{prometheus.NewDesc("xdpq_socket_rx_invalid_descriptors_total",
		"Invalid descriptors the pod put on the socket's fill ring.",
		[]string{"netdev", "queue"}, nil), func(s broker.QueueStats) uint64 { return s.RXInvalidDescs }},
	{prometheus.NewDesc("xdpq_socket_tx_invalid_descriptors_total",
		"Invalid descriptors the pod put on the socket's TX ring.",
		[]string{"netdev", "queue"}, nil), func(s broker.QueueStats) uint64 { return s.TXInvalidDescs }},
	{prometheus.NewDesc("xdpq_socket_tx_ring_empty_total",
		"Times the kernel found the socket's TX ring empty when it looked for frames to send.",
		[]string{"netdev", "queue"}, nil), func(s broker.QueueStats) uint64 { return s.TXRingEmptyDescs }},
}

// refusalCodes are the codes a refusal may have; each is reported, zero
// or not, so that a rate sees the first refusal.
var refusalCodes = []string{wire.CodeBadMessage, wire.CodeVersion, wire.CodeForbidden, wire.CodeLimit,
	wire.CodeBadRequest, wire.CodeBusy, wire.CodeTimeout, wire.CodeInternal}

// metrics are the daemon's registry and the instruments it updates as
// things happen (the rest is read at scrape time).
type metrics struct {
	reg *prometheus.Registry
	// cni times the CNI verbs, by verb (add, del, check, gc) and result
	// (success, or the API's error code).
	cni *prometheus.HistogramVec
	// dra times the DRA driver's Prepare and Unprepare of a claim on
	// this node, by verb (prepare, unprepare) and result.
	dra *prometheus.HistogramVec
}

func newMetrics(d *Daemon) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(),
		cni: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "xdpq_cni_operation_duration_seconds",
			Help:    "CNI operations the daemon answered, by verb and result (success, or the error's code), and how long each took.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}},
			[]string{"verb", "result"}),
		dra: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "xdpq_dra_operation_duration_seconds",
			Help: "DRA claims the daemon prepared and unprepared for kubelet, by verb (prepare, unprepare) and result " +
				"(success, or the error's code), and how long each took: a pod's containers start after its claims' Prepare.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}},
			[]string{"verb", "result"})}
	build := prometheus.NewGauge(prometheus.GaugeOpts{Name: "xdpq_build_info",
		Help:        "Always 1: the daemon's release (version), the commit it was built from (revision) and its Go.",
		ConstLabels: prometheus.Labels{"version": xdpq.Version(), "revision": revision(), "goversion": runtime.Version()}})
	build.Set(1)
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.cni, m.dra, build, daemonCollector{d})
	return m
}

// revision is the commit the binary was built from, as the Go toolchain
// stamped it; "unknown" when it did not (a build outside a checkout).
func revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// daemonCollector reads the daemon's state at scrape time.
type daemonCollector struct{ d *Daemon }

func (c daemonCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, desc := range []*prometheus.Desc{poolCapacityDesc, poolAllocatedDesc, poolAllocationsDesc, poolLeasesDesc,
		refusalsDesc, reloadsDesc, lastReloadDesc, reloadOKDesc, queueInfoDesc} {
		ch <- desc
	}
	for _, s := range socketStats {
		ch <- s.desc
	}
	// The pod agents' families are the node agent's.
	c.d.core.agent.Collector().Describe(ch)
}

func (c daemonCollector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	gauge := func(desc *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(v), labels...)
	}
	allocs := d.core.ledger.Allocations()
	netdevOf := map[string]string{}
	allocations, leases := map[string]int{}, map[string]int{}
	for _, a := range allocs {
		netdevOf[a.ID] = a.Netdev
		allocations[a.Pool]++
		if d.core.broker.Leased(a.ID) {
			leases[a.Pool]++
		}
		ns, pod, _ := strings.Cut(d.core.podOf(a), "/")
		for _, q := range a.Queues {
			gauge(queueInfoDesc, 1, a.Netdev, strconv.FormatUint(uint64(q), 10), a.Pool, a.ID, ns, pod)
		}
	}
	for _, p := range d.core.ledger.Metas() {
		u := d.core.ledger.Usage(p.Name)
		gauge(poolCapacityDesc, u.Devices, p.Name)
		gauge(poolAllocatedDesc, u.Devices-u.Free+u.Beyond, p.Name)
		gauge(poolAllocationsDesc, allocations[p.Name], p.Name)
		gauge(poolLeasesDesc, leases[p.Name], p.Name)
	}

	// A socket is reported on the node's name of its netdev: an
	// allocation retargeted into a pod binds on the pod's name for it.
	for _, st := range d.core.broker.Stats() {
		netdev := st.Netdev
		if n, ok := netdevOf[st.Allocation]; ok {
			netdev = n
		}
		queue := strconv.FormatUint(uint64(st.Queue), 10)
		for _, s := range socketStats {
			ch <- prometheus.MustNewConstMetric(s.desc, prometheus.CounterValue, float64(s.get(st)), netdev, queue)
		}
	}

	refused := d.core.broker.Refusals()
	codes := slices.Clone(refusalCodes)
	for code := range refused {
		if !slices.Contains(codes, code) { // a code the list lacks shows too
			codes = append(codes, code)
		}
	}
	for _, code := range codes {
		ch <- prometheus.MustNewConstMetric(refusalsDesc, prometheus.CounterValue, float64(refused[code]), code)
	}

	r := d.core.watcher.Reloads()
	ch <- prometheus.MustNewConstMetric(reloadsDesc, prometheus.CounterValue, float64(r.Succeeded), "success")
	ch <- prometheus.MustNewConstMetric(reloadsDesc, prometheus.CounterValue, float64(r.Failed), "failure")
	ch <- prometheus.MustNewConstMetric(lastReloadDesc, prometheus.GaugeValue, float64(r.LastSuccess.UnixNano())/1e9)
	ok := 1
	if d.core.watcher.LastError() != nil {
		ok = 0
	}
	gauge(reloadOKDesc, ok)

	// The node agent's netdevs, then those in pods by their node names.
	d.core.agent.Collector().Collect(ch)
	for _, pn := range d.core.pods.all() {
		if pn.agent == nil {
			continue
		}
		node := pn.rec.netdev()
		pn.agent.CollectorAs(func(string) string { return node }).Collect(ch)
	}
}

// metered is the daemon as its local API serves it: the CNI verbs are
// timed and counted.
type metered struct {
	*localapi.Backend
	metrics *metrics
}

// observe records a verb's outcome; deferred at the verb's start.
func (m metered) observe(verb string, began time.Time, err *error) {
	m.metrics.cni.WithLabelValues(verb, api.ResultOf(*err)).Observe(time.Since(began).Seconds())
}

func (m metered) CNIAdd(ctx context.Context, req api.CNIAddRequest) (att *api.Attachment, err error) {
	defer m.observe("add", time.Now(), &err)
	return m.Backend.CNIAdd(ctx, req)
}

func (m metered) CNIDel(ctx context.Context, ref api.AttachmentRef) (err error) {
	defer m.observe("del", time.Now(), &err)
	return m.Backend.CNIDel(ctx, ref)
}

func (m metered) CNICheck(ctx context.Context, ref api.AttachmentRef) (att *api.Attachment, err error) {
	defer m.observe("check", time.Now(), &err)
	return m.Backend.CNICheck(ctx, ref)
}

func (m metered) CNIGC(ctx context.Context, req api.GCRequest) (removed []string, err error) {
	defer m.observe("gc", time.Now(), &err)
	return m.Backend.CNIGC(ctx, req)
}

var _ api.Backend = metered{}

// health is what /healthz answers: whether the daemon's parts run.
type health struct {
	mu      sync.Mutex // guards the fields below
	running map[string]bool
	failed  string // the first part that stopped on its own, and why
}

func (h *health) started(part string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.running[part] = true
}

func (h *health) stopped(part string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.running[part] = false
	if err != nil && h.failed == "" {
		h.failed = fmt.Sprintf("%s: %v", part, err)
	}
}

// problem says why the daemon is not healthy; "" when it is.
func (h *health) problem() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failed != "" {
		return "part " + h.failed
	}
	var stopped []string
	for part, run := range h.running {
		if !run {
			stopped = append(stopped, part)
		}
	}
	if len(stopped) > 0 {
		slices.Sort(stopped)
		return "stopped: " + strings.Join(stopped, ", ")
	}
	return ""
}

// listenMetrics opens the metrics address, so that a daemon that cannot
// serve there fails before it touches anything.
func listenMetrics(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w; another process serves there (another xdpq daemon?): choose another address, or none", err)
	}
	return ln, nil
}

// The metrics server's limits. It listens on the host's network, where
// every pod of the cluster can reach it, so a connection costs the daemon
// a descriptor for a bounded time and there are at most
// metricsMaxConns of them: a flood of idle or slow connections gets
// scrapes wait or fail, never the API, the broker, the kubelet's
// sockets or the config watcher a descriptor (a daemon with nofile 1024
// once had none left). A connection accepted past the limit waits in
// the kernel's backlog, not in the daemon. Prometheus and kubelet's
// probes need a handful; a scrape reuses its connection across intervals
// up to metricsIdleTimeout.
const (
	metricsMaxConns          = 64
	metricsReadHeaderTimeout = 10 * time.Second
	metricsReadTimeout       = 15 * time.Second
	metricsWriteTimeout      = 30 * time.Second
	metricsIdleTimeout       = 90 * time.Second
	metricsMaxHeaderBytes    = 16 << 10
)

// serveMetrics serves the metrics handler at the metrics address until
// ctx ends.
func (d *Daemon) serveMetrics(ctx context.Context) error {
	srv := &http.Server{Handler: d.metricsHandler(ctx),
		ReadHeaderTimeout: metricsReadHeaderTimeout, ReadTimeout: metricsReadTimeout,
		WriteTimeout: metricsWriteTimeout, IdleTimeout: metricsIdleTimeout, MaxHeaderBytes: metricsMaxHeaderBytes,
		ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelDebug)}
	done := make(chan error, 1)
	ln := netutil.LimitListener(d.metricsLn, metricsMaxConns)
	go func() { done <- srv.Serve(ln) }()
	d.log.Info("serving metrics", "addr", d.metricsLn.Addr().String())
	select {
	case err := <-done:
		return fmt.Errorf("serve on %s: %w", d.metricsLn.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close() // a scrape still running: cut, as the daemon stops
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// metricsHandler serves /metrics, /healthz and /readyz; ctx is the
// daemon's run. /healthz answers 200 while every part of the daemon runs
// (during start too: recovery may take a while), /readyz once the daemon
// is ready (start done: the config in force, a previous daemon's
// allocations served again) and until it stops; both answer 503 with the
// reason otherwise.
func (d *Daemon) metricsHandler(ctx context.Context) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.metrics.reg, promhttp.HandlerOpts{
		ErrorLog: promLog{d.log}, ErrorHandling: promhttp.ContinueOnError, Registry: d.metrics.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		probe(w, d.health.problem())
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		why := ""
		switch {
		case ctx.Err() != nil:
			why = "stopping"
		case !d.core.started():
			why = "starting: putting the config in force and taking over a previous daemon's allocations"
		default:
			why = d.health.problem()
		}
		probe(w, why)
	})
	return mux
}

// probe answers a health probe: 200 "ok", or 503 with why not.
func probe(w http.ResponseWriter, why string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if why == "" {
		w.Write([]byte("ok\n"))
		return
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write([]byte(why + "\n"))
}

// promLog logs the metrics handler's errors (a collector that failed).
type promLog struct{ log *slog.Logger }

func (l promLog) Println(v ...any) { l.log.Warn("metrics", "err", fmt.Sprint(v...)) }
