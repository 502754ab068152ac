package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/dynamic"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/internal/kubeevents"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/deviceplugin"
	"github.com/xdpq/xdpq/pkg/dra"
	"github.com/xdpq/xdpq/pkg/kubepods"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/localapi"
	"github.com/xdpq/xdpq/pkg/mover"
	"github.com/xdpq/xdpq/pkg/nic"
	"github.com/xdpq/xdpq/pkg/nodestatus"
	"github.com/xdpq/xdpq/pkg/podflows"
)

// Kube is the API server as the daemon uses it. cmd/deviceplugin makes
// it from internal/kubeclient and a dynamic client; client-go's
// clientset serves as well (CoreV1().Pods(""), CoreV1().Nodes(),
// &events.EventSinkImpl{Interface: EventsV1()}), or its fakes in tests.
type Kube struct {
	Pods    kubepods.Pods     // of every namespace: the node's are watched
	Nodes   nodestatus.Nodes  // the Node, the XdpqNode's owner
	Events  kubeevents.Sink   // events.k8s.io/v1 Events
	Dynamic dynamic.Interface // the XdpqNode, a custom resource
}

// Options configure the daemon; cmd/deviceplugin sets them from flags.
type Options struct {
	ConfigPath string
	NodeName   string
	NodeLabels map[string]string
	// NetNS is the network namespace of the NICs; "" for the daemon's own.
	NetNS string
	// SysRoot is sysfs for discovery; "" means /sys, or with NetNS a
	// sysfs the daemon mounts from inside that namespace.
	SysRoot  string
	PinDir   string // agent pins; "" means /sys/fs/bpf/xdpq
	StateDir string // state: the lock, allocation records, agent state; "" means /run/xdpq/agent
	AllocDir string // one broker directory per allocation; "" means /run/xdpq/alloc
	// PluginDir is kubelet's device plugin directory (Kubernetes mode).
	PluginDir string
	// RegistryDir is kubelet's plugin watcher directory; when it exists the
	// plugins serve there instead of registering on kubelet.sock.
	RegistryDir string
	// PodResourcesSocket is kubelet's PodResources API (Kubernetes mode):
	// which devices running containers hold. "" means the default path.
	PodResourcesSocket string
	// DeviceInfoDir is where device-info files are written (Kubernetes
	// mode); "" means deviceplugin.DeviceInfoDir.
	DeviceInfoDir string
	// CollectPeriod is how often attachments of gone pods end and
	// (Kubernetes mode) allocations no container holds are freed; zero
	// means 30s.
	CollectPeriod time.Duration
	// Resync is how often the config is applied again to the netdevs found
	// then (a netdev that appeared, a queue count that changed); zero
	// means 30s.
	Resync time.Duration
	// Standalone serves allocations through the local API instead of
	// kubelet.
	Standalone bool
	APISocket  string // "" means api.DefaultSocket
	// MetricsAddr is the TCP address of /metrics, /healthz and /readyz
	// (host:port); "" serves none.
	MetricsAddr string
	// Kube is the API server's clients: with them the daemon keeps its
	// node's XdpqNode (named NodeName, which it needs then) and records
	// Events. Nil: no API server, and everything else works as well.
	Kube *Kube
	// Pods finds this node's pods by UID (Kubernetes mode): an allocation
	// is then bound to the pod whose process connects first, if kubelet
	// says that pod holds it. Nil with Kube: an informer on the API
	// server's pods of this node (pkg/kubepods). Nil without Kube: an
	// allocation is bound to its pod only by CNI ADD (K8S_POD_UID); until
	// then a process of any pod that reaches its socket is served.
	Pods PodDirectory
	// Uninstalling, if set, is asked when Run's context ends whether xdpq
	// is being uninstalled from the node (its DaemonSet deleted), and
	// why. If so, the daemon removes what it put on the node before Run
	// returns: allocations and leases ended, flows removed, netdevs back
	// from pods, programs detached, pins, records and sockets removed,
	// the XdpqNode deleted (if the API server still lets it). Otherwise,
	// and without it, all of that stays for the next daemon to adopt. It
	// must return when its context ends.
	Uninstalling func(context.Context) (bool, string)
	// DRA, with Kube (Kubernetes mode), runs the DRA driver xdpq.io for
	// the pools served by DRA; nil: every pool is served by the device
	// plugin.
	DRA *DRA
	// ServedBy is how a pool whose config does not say is served:
	// ServedByDRA or ServedByDevicePlugin ("", the default).
	ServedBy string
	Logger   *slog.Logger
}

// DefaultAPISocket is where the daemon serves its local API.
const DefaultAPISocket = api.DefaultSocket

// Daemon is the node daemon: it wires the config, the ledger, the node
// agent, the broker, the device plugins and the local API, and runs them.
type Daemon struct {
	opts   Options
	log    *slog.Logger
	unlock func()
	apiLn  net.Listener
	// core owns the allocations and attachments: the faces below call
	// down into it, and it tells them of changes only through its
	// subscription.
	core   *core
	local  *localapi.Backend   // the local API: standalone allocations, the status, the CNI verbs
	podDir *kubepods.Directory // Kubernetes mode with an API server, unless Options.Pods; set by New
	// flows is the xdpq.io/flows annotation's face (with a pod
	// directory; else nil).
	flows   *podflows.Face
	plugins *deviceplugin.Plugins // Kubernetes mode, one a pool
	unmount func()
	// metricsLn is the metrics address's listener, nil when none is served.
	metricsLn net.Listener
	metrics   *metrics
	health    health
	// node is told what the cluster should see of the node: the
	// XdpqNode's status and Events.
	node nodeReporter
	// netdevsChanged wakes reportNetdevs; capacity 1.
	netdevsChanged chan struct{}
	// dra is the DRA driver's face (run with Options.DRA).
	dra *dra.Face
}

// New checks what must be right before the daemon touches anything: that
// it is the only daemon on its state directory, that it can serve its API
// at the socket path, that the config is valid, and that pins and records
// can be read. Run does the rest.
func New(opts Options) (_ *Daemon, err error) {
	d := newDaemon(opts)
	opts = d.opts
	if opts.Kube != nil && (opts.NodeName == "" || opts.Kube.Pods == nil || opts.Kube.Nodes == nil || opts.Kube.Events == nil || opts.Kube.Dynamic == nil) {
		return nil, errors.New("with an API server the daemon needs its node's name (--node-name, or NODE_NAME) and every client of Options.Kube")
	}
	if opts.DRA != nil && (opts.NodeName == "" || opts.DRA.Kube == nil) {
		return nil, errors.New("the DRA driver needs its node's name (--node-name, or NODE_NAME) and a client of the API server")
	}
	if !slices.Contains([]string{"", ServedByDRA, ServedByDevicePlugin}, opts.ServedBy) {
		return nil, fmt.Errorf("served by %q: %s or %s", opts.ServedBy, ServedByDRA, ServedByDevicePlugin)
	}
	if opts.ServedBy == ServedByDRA && opts.DRA == nil {
		return nil, errors.New("pools are to be served by DRA, but the DRA driver is off")
	}
	d.node = d.newNodeReporter()
	if opts.Pods == nil && opts.Kube != nil && !opts.Standalone {
		if d.podDir, err = kubepods.New(opts.Kube.Pods, opts.NodeName); err != nil {
			return nil, err
		}
		d.opts.Pods = d.podDir
	}
	if d.opts.Pods != nil && !opts.Standalone {
		d.flows = podflows.New(podFlowsCore{ownAttachments{d}}, d.opts.Pods, d.node, d.log)
	}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.unlock, err = lockStateDir(opts.StateDir); err != nil {
		return nil, err
	}
	if d.apiLn, err = api.Listen(opts.APISocket); err != nil {
		return nil, err
	}
	if opts.MetricsAddr != "" {
		if d.metricsLn, err = listenMetrics(opts.MetricsAddr); err != nil {
			return nil, err
		}
	}
	if d.core.watcher, err = config.NewWatcher(opts.ConfigPath, opts.Logger); err != nil {
		return nil, err
	}
	d.core.watcher.OnRefused = func(err error) {
		d.node.ConfigRefused(err)
		d.node.Changed()
	}
	if d.core.ledger, err = ledger.Open(ledger.Options{Dir: filepath.Join(opts.StateDir, "allocations"), OnChange: d.node.Changed}); err != nil {
		return nil, err
	}
	for id, err := range d.core.ledger.Broken() {
		d.log.Error("allocation record unreadable: it stays, and its pool takes no new allocation until it is repaired or removed",
			"allocation", id, "err", err)
	}
	if err := os.MkdirAll(opts.AllocDir, 0o755); err != nil {
		return nil, fmt.Errorf("allocation directory: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(opts.AllocDir, dpdkLinkDir), 0o700); err != nil {
		return nil, fmt.Errorf("allocation directory: %w", err)
	}
	// Before anything in it is removed as stale.
	unlockAlloc, err := lockAllocDir(opts.AllocDir)
	if err != nil {
		return nil, err
	}
	unlockState := d.unlock
	d.unlock = func() { unlockAlloc(); unlockState() }
	if opts.NetNS != "" && opts.SysRoot == "" {
		if err := d.mountSysfs(); err != nil {
			return nil, err
		}
	}
	nodeAgent, err := agent.New(agent.Config{NetNS: opts.NetNS, SysRoot: d.opts.SysRoot, PinDir: opts.PinDir, StateDir: opts.StateDir,
		Logger: opts.Logger, OnChange: d.core.devicesChanged})
	if err != nil {
		return nil, err
	}
	d.core.agent = nodeAgent
	// Before the agent touches a pin (Set adopts what is pinned).
	unlockPins, err := lockPinDir(d.core.pinRoot())
	if err != nil {
		return nil, err
	}
	unlockOthers := d.unlock
	d.unlock = func() { unlockPins(); unlockOthers() }
	m, err := mover.New(mover.Config{Node: opts.NetNS})
	if err != nil {
		return nil, err
	}
	d.core.mover = m
	if err := m.InitErr(); err != nil {
		d.log.Warn("a netdev-mode pool's netdev that the kernel returns to the initial namespace will not be found", "err", err)
	}
	bcfg := broker.Config{Logger: opts.Logger, OnLease: d.core.onLease, OnRefuse: d.onRefuse}
	if !opts.Standalone && d.opts.Pods != nil {
		bcfg.ClaimPod = d.claimPod
	}
	d.core.broker = broker.NewServer(bcfg, nodeAgent)
	d.core.rec = d.core.newReconciler()
	d.metrics = newMetrics(d)
	d.dra = newDRAFace(d) // last: it takes the metrics and the pod directory
	return d, nil
}

// newDaemon is a daemon with nothing of the kernel or the node wired
// yet: New gives it the node agent, the broker, the mover, the ledger,
// the config watcher, the metrics and the DRA face; the decision tests
// give it fakes.
func newDaemon(opts Options) *Daemon {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.AllocDir == "" {
		opts.AllocDir = "/run/xdpq/alloc"
	}
	opts.AllocDir = filepath.Clean(opts.AllocDir) // allocDir joins by hand
	if opts.StateDir == "" {
		opts.StateDir = agent.DefaultStateDir
	}
	if opts.APISocket == "" {
		opts.APISocket = DefaultAPISocket
	}
	if opts.CollectPeriod == 0 {
		opts.CollectPeriod = 30 * time.Second
	}
	if opts.Resync == 0 {
		opts.Resync = 30 * time.Second
	}
	d := &Daemon{opts: opts, log: opts.Logger,
		health: health{running: map[string]bool{}}, netdevsChanged: make(chan struct{}, 1)}
	c := &core{opts: &d.opts, log: d.log, kubelet: kubeletAPI{opts.PodResourcesSocket}, ready: make(chan struct{}),
		retry: map[string]error{}, ifindexes: map[string]int{}}
	d.core = c
	c.discover = func() ([]nic.Netdev, error) {
		return nic.Discoverer{SysRoot: d.opts.SysRoot, NetNS: d.opts.NetNS}.List()
	}
	c.nodeAddrs = func(addrs []netip.Addr) (map[netip.Addr]string, error) { return nic.Holders(d.opts.NetNS, addrs) }
	c.pods = newPodNetdevs(d.log, c.pinRoot(), opts.StateDir, c.devicesChanged)
	d.local = localapi.New(localCore{d}, d.log)
	d.plugins = deviceplugin.NewPlugins(deviceplugin.PluginsConfig{Dir: opts.PluginDir, RegistryDir: opts.RegistryDir,
		DeviceInfoDir: opts.DeviceInfoDir, Logger: d.log}, pluginsCore{c})
	c.subscribe(d.changed)
	return d
}

// Ready is closed once Run serves: the allocations of a previous daemon
// are restored, the node agent follows link notifications and the local
// API answers.
func (d *Daemon) Ready() <-chan struct{} { return d.core.ready }

// MetricsAddr is the address /metrics is served on (with Options'
// MetricsAddr "127.0.0.1:0", the port the kernel chose); nil when none is.
func (d *Daemon) MetricsAddr() net.Addr {
	if d.metricsLn == nil {
		return nil
	}
	return d.metricsLn.Addr()
}

// API is the daemon's local API, as its socket serves it: in-process
// users (the demo, the benchmarks, tests) call it directly.
func (d *Daemon) API() api.Backend { return d.local }

// Reload reads the config file again and applies it, changed or not, and
// reads again the allocation records that could not be read
// (cmd/deviceplugin calls it on SIGHUP).
func (d *Daemon) Reload(ctx context.Context) error { return d.core.watcher.Reload(ctx) }

// Run puts the config in force, finishes what a previous daemon left half
// done, serves its allocations again, and runs the parts (the agent's
// event loop, the config watcher, the reconciler, the local API, the
// collector and, with kubelet, one device plugin per pool) until ctx ends
// or one of them fails: then the others stop and Run returns that part's
// error. What is attached and pinned stays: traffic keeps flowing while
// the daemon is away. Only when ctx ends and Options.Uninstalling says
// xdpq is being uninstalled does the daemon remove it all first.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.close()
	// The parts stop when ctx ends, but only after stopping, which may
	// need them (the reconciler) to remove the datapath.
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	g, gctx := errgroup.WithContext(pctx)
	go func() {
		select {
		case <-ctx.Done():
			d.stopping(gctx)
		case <-gctx.Done(): // a part failed
		}
		cancel()
	}()
	d.plugins.Use(gctx, g)
	part := func(name string, run func(context.Context) error) {
		d.health.started(name)
		g.Go(func() error {
			err := run(gctx)
			if gctx.Err() != nil {
				d.health.stopped(name, nil)
				return nil // stopping
			}
			if err == nil {
				err = errors.New("stopped on its own")
			}
			d.health.stopped(name, err)
			d.log.Error("a part of the daemon failed; stopping", "part", name, "err", err)
			return fmt.Errorf("%s: %w", name, err)
		})
	}
	// The reconciler first: it is the one goroutine that changes what the
	// node agent manages, start's changes included.
	part("reconciler", d.core.rec.run)
	if d.metricsLn != nil {
		// Before start: probes are answered while it recovers.
		part("metrics", d.serveMetrics)
	}
	if d.opts.Kube != nil {
		// Before start too: the XdpqNode says the daemon is starting,
		// and what start finds is told.
		part("node status", d.node.Run)
		if d.podDir != nil {
			part("pods", d.podDir.Run)
		}
		part("netdev events", d.reportNetdevs)
	}
	if err := d.core.start(gctx); err != nil {
		d.log.Error("the daemon could not start", "err", err)
		cancel()     // the reconciler
		_ = g.Wait() // the parts end for the cancel: start's error is the one to tell
		return fmt.Errorf("start: %w", err)
	}
	part("agent", d.core.agent.Run)
	// Ready, and the local API answering, mean the agent follows link
	// notifications already: its namespace handle and netlink socket are
	// open (a descriptor count of a fresh daemon taken then is whole). A
	// daemon whose agent failed, or that stops, starts nothing more.
	select {
	case <-d.core.agent.Listening():
	case <-gctx.Done():
	}
	if gctx.Err() == nil {
		if d.flows != nil {
			part("pod flows", d.flows.Run)
		}
		if d.opts.DRA != nil && !d.opts.Standalone {
			part("dra", d.dra.Run)
			if d.opts.DRA.NRISocket != "" {
				part("nri", d.nriLoop)
			}
		}
		part("config watcher", func(ctx context.Context) error { return d.core.watcher.Run(ctx, d.core.applier(ctx)) })
		part("local api", func(ctx context.Context) error {
			return api.Serve(ctx, d.apiLn, api.NewHandler(metered{d.local, d.metrics}, d.log), d.log)
		})
		part("collector", d.collectLoop)
		close(d.core.ready)
		d.node.Changed() // Ready
		d.log.Info("daemon ready", "release", xdpq.Version(), "standalone", d.opts.Standalone, "api", d.opts.APISocket, "state", d.opts.StateDir)
	}
	err := g.Wait()
	uninstalled := d.core.isUninstalled()
	if uninstalled {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if derr := d.node.Delete(dctx); derr != nil {
			// helm uninstall deletes the daemon's service account in the
			// same breath as its DaemonSet: this often comes too late.
			d.log.Warn("uninstall: the XdpqNode stays (kubectl delete xdpqnode removes it)", "err", derr)
		}
		cancel()
	}
	return err
}

// close releases what New and Run took; attached programs, pins and
// moved netdevs stay.
func (d *Daemon) close() {
	if d.core.broker != nil {
		d.core.broker.Close()
	}
	d.core.pods.release()
	// Handles and listeners: what they held in the kernel stays for the
	// next daemon, so a failure to close one loses nothing; it is said.
	if d.core.agent != nil {
		if err := d.core.agent.Close(); err != nil {
			d.log.Warn("close the node agent", "err", err)
		}
	}
	if d.core.mover != nil {
		if err := d.core.mover.Close(); err != nil {
			d.log.Warn("close the netdev mover", "err", err)
		}
	}
	if d.unmount != nil {
		d.unmount()
	}
	if d.apiLn != nil {
		_ = d.apiLn.Close() // served and closed by Run already, or never served
	}
	if d.metricsLn != nil {
		_ = d.metricsLn.Close() // if Run never served it; else closed already
	}
	uninstalled := d.core.isUninstalled()
	if uninstalled {
		d.core.removeState() // the lock still held
	}
	if d.unlock != nil {
		d.unlock()
	}
}

// mountSysfs mounts a sysfs that shows the NICs' namespace, attached to
// no directory (nic.MountSysfs): it goes with the daemon however the
// daemon ends. (A sysfs mounted on a temporary directory stayed in the
// host's mount table, holding the namespace, after every daemon that was
// killed.)
func (d *Daemon) mountSysfs() error {
	fs, err := nic.MountSysfs(d.opts.NetNS)
	if err != nil {
		return fmt.Errorf("sysfs of %s: %w", d.opts.NetNS, err)
	}
	d.opts.SysRoot = fs.Path()
	d.unmount = func() {
		if err := fs.Close(); err != nil {
			d.log.Warn("release the netdevs' sysfs", "err", err)
		}
	}
	return nil
}

// changed tells the faces what the core changed.
func (d *Daemon) changed(ch change) {
	switch ch.kind {
	case netdevsChanged:
		d.signalNetdevs()
		d.plugins.Changed()
		d.dra.Changed()
	case poolsChanged:
		// Once recovery is done (start's last reconcile): kubelet
		// allocates at once.
		if !d.opts.Standalone && d.core.recovered.Load() {
			d.plugins.Sync()
		}
		d.dra.Changed()
	case allocationUnserved:
		// By the resource it was made under, which its record keeps
		// even when its pool has gone from the config since.
		p, _ := d.core.ledger.Meta(ch.alloc.Pool)
		if r := resourceOf(ch.alloc, p); r != "" && !d.opts.Standalone {
			d.plugins.Unserved(r, ch.alloc.Devices)
		}
	case configApplied:
		d.node.Changed()
	case allocationFreed:
		if ch.alloc.Owner.PodUID != "" && d.flows != nil {
			d.flows.Forget(ch.alloc.Owner.PodUID, ch.alloc.Pool)
		}
	}
}
