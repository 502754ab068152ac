package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Node is the daemon as the driver uses it.
type Node interface {
	// PrepareClaim makes the ledger allocation of the claim, or finds
	// the one made for it before (kubelet asks again after a restart),
	// and says what its containers get.
	PrepareClaim(ctx context.Context, c Claim) (Edits, error)
	// UnprepareClaim frees the claim's allocation; nil when there is
	// none (any more).
	UnprepareClaim(ctx context.Context, uid string) error
	// Devices are the devices of the pools DRA serves, by xdpq pool.
	Devices() map[string][]Device
}

// Claim is a ResourceClaim as the daemon sees it.
type Claim struct {
	UID       string
	Namespace string
	Name      string
	// Pods are the UIDs of the pods the claim is reserved for.
	Pods []string
	// Pool is the xdpq pool of its devices; Devices their names in the
	// ResourceSlice (DeviceName), which the daemon maps to its own.
	Pool    string
	Devices []string
	// Flows are the configured flows (QueueConfig.Flows), nil if none.
	Flows json.RawMessage
	// Interface is the configured interface (QueueConfig.Interface),
	// nil if none.
	Interface *InterfaceConfig
}

// Edits are what a claim's containers get: its CDI device's edits.
type Edits struct {
	Env    map[string]string
	Mounts []Mount
}

// Mount is a bind mount into the container.
type Mount struct {
	HostPath      string
	ContainerPath string
	ReadOnly      bool
}

// CDIKind is the CDI kind of a claim's device: "xdpq.io/claim=<uid>".
const CDIKind = DriverName + "/claim"

// DefaultCDIDir is where the driver writes its CDI specs: the transient
// spec directory containerd reads.
const DefaultCDIDir = "/var/run/cdi"

// healthResend is how often the devices' health is sent again when it
// did not change: within kubelet's 30 s, after which it takes a device's
// health as unknown.
const healthResend = 10 * time.Second

// Options configure Start.
type Options struct {
	NodeName string
	Kube     kubernetes.Interface
	Node     Node
	// RegistryDir is kubelet's plugin registration directory; "" is
	// kubeletplugin.KubeletRegistryDir.
	RegistryDir string
	// PluginDir is the driver's own directory (its socket); "" is
	// kubeletplugin.KubeletPluginsDir/xdpq.io.
	PluginDir string
	// CDIDir is where CDI specs are written; "" is DefaultCDIDir.
	CDIDir string
	// RollingUpdate, the UID of the daemon's pod, lets a new daemon
	// register while the old one still serves (the DaemonSet's
	// maxSurge); "" registers under the driver's name alone.
	RollingUpdate string
	Logger        *slog.Logger
}

// Driver is the node's DRA kubelet plugin.
type Driver struct {
	opts        Options
	log         *slog.Logger
	cdi         *cdiapi.Cache
	helper      *kubeletplugin.Helper
	healthEvery time.Duration // how often health is sent again: healthResend

	mu        sync.Mutex // guards published and changed
	published map[string][]Device
	// changed is closed, and replaced, when published changes: it wakes
	// every health watcher, however many kubelet runs at once, and none
	// for a change it reported already.
	changed chan struct{}

	statusMu sync.Mutex             // guards status; never held across a call out
	status   map[string]claimStatus // by claim UID: what was last applied

	// statusDue wakes statusLoop to write the prepared claims' status
	// (capacity 1: prepares in a burst are written together).
	statusDue chan struct{}
	// stopStatus ends statusLoop, which closes statusDone.
	stopStatus func()
	statusDone chan struct{}

	// kubelet's calls under way, when the last one ended (UnixNano), and
	// a wake-up for Stop when one ends (capacity 1): see Stop.
	inflight atomic.Int64
	lastEnd  atomic.Int64
	rpcEnded chan struct{}
}

// answerGrace is how long after kubelet's last call returned Stop waits
// before it stops the server, so that the answer is written: the
// library's server stops without draining (grpc's Server.Stop), and an
// answer whose handler has returned but which grpc has not yet written
// is lost. kubelet then retries an Unprepare the daemon has done against
// a driver that is gone, and the claim's pod stays Terminating (seen
// when the uninstall ended 2 ms after kubelet's last Unprepare on a
// loaded machine). answerWait bounds the wait for calls under way.
const (
	answerGrace = 500 * time.Millisecond
	answerWait  = 10 * time.Second
)

// track counts kubelet's calls under way (a gRPC interceptor).
func (d *Driver) track(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	d.inflight.Add(1)
	defer func() {
		d.lastEnd.Store(time.Now().UnixNano())
		d.inflight.Add(-1)
		select {
		case d.rpcEnded <- struct{}{}:
		default: // a wake-up is pending already
		}
	}()
	return handler(ctx, req)
}

// awaitAnswers returns once no call of kubelet's is under way and the
// last returned answerGrace ago, or after answerWait.
func (d *Driver) awaitAnswers() {
	give := time.NewTimer(answerWait)
	defer give.Stop()
	for {
		left := time.Duration(-1) // a call under way: until one ends
		if d.inflight.Load() == 0 {
			if left = time.Until(time.Unix(0, d.lastEnd.Load()).Add(answerGrace)); left <= 0 {
				return
			}
		}
		if !d.awaitAnswer(left, give.C) {
			d.log.Warn("stopping the kubelet plugin with a call of kubelet's under way", "calls", d.inflight.Load())
			return
		}
	}
}

// awaitAnswer waits until a call ends, left passes (left < 0: no limit)
// or give fires; it returns false for give.
func (d *Driver) awaitAnswer(left time.Duration, give <-chan time.Time) bool {
	var wait <-chan time.Time
	if left >= 0 {
		t := time.NewTimer(left)
		defer t.Stop()
		wait = t.C
	}
	select {
	case <-d.rpcEnded:
	case <-wait:
	case <-give:
		return false
	}
	return true
}

// Start registers the driver with kubelet and publishes the devices.
func Start(ctx context.Context, o Options) (*Driver, error) {
	d, err := newDriver(o)
	if err != nil {
		return nil, err
	}
	o = d.opts
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.NodeName(o.NodeName),
		kubeletplugin.KubeClient(o.Kube),
	}
	if o.RegistryDir != "" {
		opts = append(opts, kubeletplugin.RegistrarDirectoryPath(o.RegistryDir))
	}
	if o.PluginDir != "" {
		opts = append(opts, kubeletplugin.PluginDataDirectoryPath(o.PluginDir))
	}
	if o.RollingUpdate != "" {
		opts = append(opts, kubeletplugin.RollingUpdate(types.UID(o.RollingUpdate)))
	}
	opts = append(opts, kubeletplugin.GRPCInterceptor(d.track))
	h, err := kubeletplugin.Start(ctx, d, opts...)
	if err != nil {
		return nil, fmt.Errorf("start the kubelet plugin: %w", err)
	}
	d.helper = h
	if err := d.Publish(ctx); err != nil {
		h.Stop()
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	d.stopStatus, d.statusDone = cancel, make(chan struct{})
	go d.statusLoop(sctx)
	return d, nil
}

// newDriver is the driver of o before it registers with kubelet: what
// kubelet asks of it (prepare, unprepare) works, publishing does not.
func newDriver(o Options) (*Driver, error) {
	if o.CDIDir == "" {
		o.CDIDir = DefaultCDIDir
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(o.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI spec directory %s: %w", o.CDIDir, err)
	}
	return &Driver{opts: o, log: o.Logger, cdi: cache, changed: make(chan struct{}), status: map[string]claimStatus{},
		statusDue: make(chan struct{}, 1), rpcEnded: make(chan struct{}, 1),
		healthEvery: healthResend}, nil
}

// Stop unregisters the driver; its ResourceSlices stay (a restarting
// daemon publishes the same) until Withdraw. It first lets kubelet's
// calls under way finish and their answers go out (awaitAnswers).
func (d *Driver) Stop() {
	if d.stopStatus != nil {
		d.stopStatus()
		<-d.statusDone
	}
	d.awaitAnswers()
	d.helper.Stop()
}

// Publish publishes the node's devices as they are now, if they changed
// since the last time: the helper's controller writes only the slices
// that differ.
func (d *Driver) Publish(ctx context.Context) error {
	devs := d.opts.Node.Devices()
	if devs == nil {
		devs = map[string][]Device{} // published: none
	}
	d.mu.Lock()
	same := equalDevices(d.published, devs)
	if !same {
		d.published = devs
		close(d.changed)
		d.changed = make(chan struct{})
	}
	d.mu.Unlock()
	if !same {
		if err := d.helper.PublishResources(ctx, Resources(d.opts.NodeName, devs)); err != nil {
			return fmt.Errorf("publish ResourceSlices: %w", err)
		}
	}
	// The prepared claims' status follows their devices (and one whose
	// last apply failed is tried again).
	if err := d.syncStatus(ctx, devs); err != nil {
		return fmt.Errorf("claims' status: %w", err)
	}
	return nil
}

func equalDevices(a, b map[string][]Device) bool {
	if a == nil || len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !slices.Equal(v, w) {
			return false
		}
	}
	return true
}

// Withdraw deletes the node's ResourceSlices of the driver (uninstall),
// once the helper no longer publishes them.
func (d *Driver) Withdraw(ctx context.Context) error {
	d.helper.Stop()
	sel := fields.Set{resourceapi.ResourceSliceSelectorNodeName: d.opts.NodeName, resourceapi.ResourceSliceSelectorDriver: DriverName}
	err := d.opts.Kube.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: sel.String()})
	if err != nil {
		return fmt.Errorf("delete the node's ResourceSlices: %w", err)
	}
	return nil
}

// PrepareResourceClaims is kubelet's NodePrepareResources.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		out[c.UID] = d.prepare(ctx, c)
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	name := c.Namespace + "/" + c.Name
	cl, results, err := d.claimOf(c)
	if err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s: %w", name, err)}
	}
	if len(results) == 0 {
		return kubeletplugin.PrepareResult{}
	}
	edits, err := d.opts.Node.PrepareClaim(ctx, cl)
	if err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s: %w", name, err)}
	}
	id, err := d.writeSpec(string(c.UID), edits)
	if err != nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s: %w", name, err)}
	}
	var devs []kubeletplugin.Device
	for _, r := range results {
		devs = append(devs, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{id}})
	}
	d.log.Info("claim prepared", "claim", name, "uid", c.UID, "pool", cl.Pool, "devices", cl.Devices)
	// Its status is written after kubelet hears it is prepared, by
	// statusLoop: nothing in kubelet's call waits on the API server.
	select {
	case d.statusDue <- struct{}{}:
	default: // a write is due already, and will include it
	}
	return kubeletplugin.PrepareResult{Devices: devs}
}

// statusLoop writes the prepared claims' status whenever a prepare asks,
// once for a burst of them, until ctx ends. Before the first publish
// (kubelet may prepare as soon as the driver registers) the devices are
// not known: their claims are not "Gone", and the first publish writes
// their status. A write that fails is tried again at the next publish
// or prepare; the pods start all the same.
func (d *Driver) statusLoop(ctx context.Context) {
	defer close(d.statusDone)
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.statusDue:
		}
		d.mu.Lock()
		devices := d.published
		d.mu.Unlock()
		if devices == nil {
			continue
		}
		if err := d.syncStatus(ctx, devices); err != nil && ctx.Err() == nil {
			d.log.Warn("claims' status not written; again at the next publish", "err", err)
		}
	}
}

// claimOf is the claim as the daemon sees it, with the allocation
// results of this driver; an error when they are not one xdpq pool's on
// this node, or its configuration is refused.
func (d *Driver) claimOf(c *resourceapi.ResourceClaim) (Claim, []resourceapi.DeviceRequestAllocationResult, error) {
	cl := Claim{UID: string(c.UID), Namespace: c.Namespace, Name: c.Name}
	if c.Status.Allocation == nil {
		return cl, nil, errors.New("not allocated")
	}
	var results []resourceapi.DeviceRequestAllocationResult
	var requests []string
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		pool, ok := xdpqPool(d.opts.NodeName, r.Pool)
		switch {
		case !ok:
			return cl, nil, fmt.Errorf("device %s of pool %s is not of node %s", r.Device, r.Pool, d.opts.NodeName)
		case cl.Pool != "" && pool != cl.Pool:
			return cl, nil, fmt.Errorf("its devices are of pools %s and %s: a claim's xdpq devices are of one pool (a claim per pool)", cl.Pool, pool)
		}
		cl.Pool = pool
		cl.Devices = append(cl.Devices, r.Device)
		results = append(results, r)
		requests = append(requests, r.Request)
	}
	if len(results) == 0 {
		return cl, nil, nil
	}
	for _, ref := range c.Status.ReservedFor {
		if ref.Resource == "pods" && ref.APIGroup == "" {
			cl.Pods = append(cl.Pods, string(ref.UID))
		}
	}
	cfg, err := ClaimConfig(c, requests)
	if err != nil {
		return cl, nil, err
	}
	cl.Flows, cl.Interface = cfg.Flows, cfg.Interface
	return cl, results, nil
}

// specName is the CDI spec file of a claim.
func specName(uid string) string {
	return cdiapi.GenerateTransientSpecName(DriverName, "claim", uid) + ".json"
}

// writeSpec writes the claim's CDI spec and returns its device's ID.
func (d *Driver) writeSpec(uid string, e Edits) (string, error) {
	edits := cdispec.ContainerEdits{}
	for _, k := range slices.Sorted(maps.Keys(e.Env)) {
		edits.Env = append(edits.Env, k+"="+e.Env[k])
	}
	for _, m := range e.Mounts {
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		} else {
			opts = append(opts, "rw")
		}
		edits.Mounts = append(edits.Mounts, &cdispec.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Type: "bind", Options: opts})
	}
	spec := &cdispec.Spec{Kind: CDIKind, Devices: []cdispec.Device{{Name: uid, ContainerEdits: edits}}}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return "", fmt.Errorf("CDI spec: %w", err)
	}
	spec.Version = v
	if err := d.cdi.WriteSpec(spec, specName(uid)); err != nil {
		return "", fmt.Errorf("CDI spec: %w", err)
	}
	return CDIKind + "=" + uid, nil
}

// UnprepareResourceClaims is kubelet's NodeUnprepareResources.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		uid := string(c.UID)
		if err := d.opts.Node.UnprepareClaim(ctx, uid); err != nil {
			out[c.UID] = fmt.Errorf("claim %s: %w", c.String(), err)
			continue
		}
		if err := d.cdi.RemoveSpec(specName(uid)); err != nil {
			out[c.UID] = fmt.Errorf("claim %s: its CDI spec: %w", c.String(), err)
			continue
		}
		out[c.UID] = nil
		d.log.Info("claim unprepared", "claim", c.String(), "uid", uid)
	}
	return out, nil
}

// RemoveSpecsExcept removes the CDI specs of claims not in keep (a
// claim unprepared while no daemon ran, whose allocation the daemon
// freed at start).
func (d *Driver) RemoveSpecsExcept(keep map[string]bool) error {
	return removeSpecsExcept(d.opts.CDIDir, keep)
}

// RemoveSpecsExcept removes the driver's claim CDI specs in dir ("":
// DefaultCDIDir) whose claim UID is not in keep, with no driver running
// (an uninstall that freed claims kubelet did not unprepare).
func RemoveSpecsExcept(dir string, keep map[string]bool) error {
	if dir == "" {
		dir = DefaultCDIDir
	}
	return removeSpecsExcept(dir, keep)
}

// HandleError is told of errors in the background, mostly publishing
// slices; the helper's controller retries them.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	level := slog.LevelWarn
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		level = slog.LevelError
	}
	d.log.Log(context.Background(), level, "dra: "+msg, "err", err)
}

// WatchHealthStatus reports every device's health to kubelet, again when
// it changes and every healthResend.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	t := time.NewTicker(d.healthEvery)
	defer t.Stop()
	for {
		r, changed := d.health()
		select {
		case <-ctx.Done():
			return nil
		case reports <- r:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-changed:
		}
	}
}

// health is every published device's health, and what is closed when
// it changes.
func (d *Driver) health() (kubeletplugin.DeviceHealthReport, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	var r kubeletplugin.DeviceHealthReport
	for _, pool := range slices.Sorted(maps.Keys(d.published)) {
		for _, dv := range d.published[pool] {
			h := kubeletplugin.DeviceHealth{PoolName: PoolName(d.opts.NodeName, pool), DeviceName: DeviceName(dv.Netdev, dv.Queue),
				Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now, HealthCheckTimeout: 3 * d.healthEvery}
			if dv.Unavailable != "" {
				h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, dv.Unavailable
			}
			r.Devices = append(r.Devices, h)
		}
	}
	return r, d.changed
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)
