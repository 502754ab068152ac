package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/flow"
	"github.com/xdpq/xdpq/pkg/kubepods"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// Core is the daemon's allocation core as the DRA face sees it: the
// records of allocations and pools it reads, and the verbs it calls down.
type Core interface {
	// Closed says why the core takes nothing new (an uninstall has
	// begun); nil while it does.
	Closed() error
	Allocations() []ledger.Allocation
	ByClaim(uid string) (ledger.Allocation, bool)
	// Metas are the pools' settings; Meta one pool's. Pool is a pool
	// with its devices; Device one device of it.
	Metas() []ledger.Pool
	Meta(pool string) (ledger.Pool, bool)
	Pool(pool string) (ledger.Pool, bool)
	Device(pool, id string) (ledger.Device, bool)
	// ServedByDRA says whether DRA serves pool p now, and if not, why
	// when the reason is not simply its config (devices the other way
	// still holds).
	ServedByDRA(p ledger.Pool) (bool, string)
	// Allocate reserves, serves and records an allocation; Free ends
	// one; SetOwner says who may use it.
	Allocate(ctx context.Context, res ledger.Reservation) (ledger.Allocation, error)
	Free(ctx context.Context, id, why string) error
	SetOwner(id string, o ledger.Owner) error
	// CheckNotNode refuses flows that would take an address of the node
	// (unless shared grants it).
	CheckNotNode(flows []api.CNIFlow, claimed []netip.Addr, shared []netip.Prefix) error
	// Netdevs are the node's netdevs (a netdev moved into a pod
	// included) as the node agent and discovery know them.
	Netdevs() map[string]NetdevState
	// Edits are what a container holding allocation a gets; Network
	// where a netdev claim's netdev is in its pod (nil: not there).
	Edits(a ledger.Allocation) Edits
	Network(a ledger.Allocation) *Network
}

// NetdevState is a netdev as the DRA face publishes it.
type NetdevState struct {
	Missing bool // gone from the node (or from its pod), or not managed
	// Overridden says a foreign XDP program (Foreign) holds its hook.
	Overridden bool
	Foreign    string
	LinkUp     bool
	RXQueues   int
	Steering   string // "ntuple", "filter", "" unknown
	Driver     string
	Native     bool // XDP in the driver (XDP_REDIRECT)
	ZeroCopy   bool
}

// Pods are the node's pods as the face asks them.
type Pods interface {
	// Cached is the pod of this node with uid, as last seen.
	Cached(uid string) (kubepods.Pod, bool)
	// Touch has the pod looked at again: its allocation changed.
	Touch(uid string)
}

// FaceConfig configures the face.
type FaceConfig struct {
	NodeName string
	// Kube reads claims and writes the node's ResourceSlices; the rest
	// but Socket, NRI, Pods and Durations are Options'.
	Kube          kubernetes.Interface
	RegistryDir   string
	PluginDir     string
	CDIDir        string
	RollingUpdate string
	// Socket is an allocation's socket in its containers.
	Socket string
	// NRI says netdev-mode pools can be served: the daemon moves their
	// netdevs into pods through the runtime's NRI.
	NRI bool
	// Pods, if set, are the node's pods: a claim whose pod is still on
	// the node is kubelet's to unprepare.
	Pods Pods
	// Durations, if set, times Prepare and Unprepare, by verb and result.
	Durations *prometheus.HistogramVec
	Logger    *slog.Logger
}

// Face is the daemon's DRA face (Node): the node's slices of the pools
// DRA serves, kubelet's Prepare and Unprepare of their claims, the
// claims' status, stale and gone claims, over the core.
type Face struct {
	core Core
	cfg  FaceConfig
	log  *slog.Logger
	// changed wakes Run to publish; capacity 1.
	changed chan struct{}
	// unprepared wakes an uninstall waiting for kubelet to unprepare
	// claims; capacity 1.
	unprepared chan struct{}
	// goneClaims are the claims the collector found gone (Collect).
	goneClaims goneClaims
	// pcieRoots are the pools' PCI devices' PCIe roots (Devices).
	pcieRoots pcieRoots
}

var _ Node = (*Face)(nil)

// NewFace returns the face; Run runs its driver.
func NewFace(cfg FaceConfig, core Core) *Face {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Face{core: core, cfg: cfg, log: cfg.Logger, changed: make(chan struct{}, 1), unprepared: make(chan struct{}, 1)}
}

// Changed has Run publish the slices again.
func (f *Face) Changed() {
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

// Unprepared receives after each Unprepare that freed an allocation.
func (f *Face) Unprepared() <-chan struct{} { return f.unprepared }

// observe times a verb; deferred at its start.
func (f *Face) observe(verb string, began time.Time, err *error) {
	if f.cfg.Durations == nil {
		return
	}
	f.cfg.Durations.WithLabelValues(verb, api.ResultOf(*err)).Observe(time.Since(began).Seconds())
}

// draPools are the names of the pools DRA serves now.
func (f *Face) draPools() []string {
	var out []string
	for _, p := range f.core.Metas() {
		if p.Resource == "" {
			continue
		}
		if ok, _ := f.core.ServedByDRA(p); ok {
			out = append(out, p.Name)
		}
	}
	return out
}

// Run runs the DRA driver until ctx ends: registered with kubelet, it
// publishes the devices of the pools DRA serves whenever they (or their
// health) change (Changed). When the core is closed (an uninstall) as
// ctx ends, the node's ResourceSlices are withdrawn.
func (f *Face) Run(ctx context.Context) error {
	c := f.cfg
	drv, err := Start(ctx, Options{NodeName: c.NodeName, Kube: c.Kube, Node: f, RegistryDir: c.RegistryDir,
		PluginDir: c.PluginDir, CDIDir: c.CDIDir, RollingUpdate: c.RollingUpdate, Logger: f.log})
	if err != nil {
		return err
	}
	defer drv.Stop()
	keep := map[string]bool{}
	for _, a := range f.core.Allocations() {
		if a.Claim != nil {
			keep[a.Claim.UID] = true
		}
	}
	if err := drv.RemoveSpecsExcept(keep); err != nil {
		f.log.Warn("CDI specs of claims no longer prepared are left", "err", err)
	}
	f.log.Info("DRA driver registered", "driver", DriverName, "pools", f.draPools())
	for {
		select {
		case <-ctx.Done():
			if f.core.Closed() != nil {
				f.removeSlices(drv)
			}
			return nil
		case <-f.changed:
		}
		if err := drv.Publish(ctx); err != nil {
			f.log.Warn("ResourceSlices not published; again at the next change", "err", err)
		}
	}
}

// RemoveStaleSpecs removes the CDI specs of the claims that no longer have
// an allocation: those freed by an uninstall without kubelet's
// unprepare. A spec left (said here) the next daemon's driver removes
// when it starts.
func (f *Face) RemoveStaleSpecs() {
	keep := map[string]bool{}
	for _, a := range f.core.Allocations() {
		if a.Claim != nil {
			keep[a.Claim.UID] = true
		}
	}
	if err := RemoveSpecsExcept(f.cfg.CDIDir, keep); err != nil {
		f.log.Error("uninstall: CDI specs of freed claims left", "dir", f.cfg.CDIDir, "err", err)
	}
}

// removeSlices withdraws the node's ResourceSlices (uninstall).
func (f *Face) removeSlices(drv *Driver) {
	ctx, cancel := context.WithTimeout(context.Background(), api.RequestTimeout)
	defer cancel()
	if err := drv.Withdraw(ctx); err != nil {
		f.log.Warn("uninstall: the node's ResourceSlices stay", "err", err)
	}
}

// PrepareClaim makes the allocation of a claim the scheduler allocated
// devices of an xdpq pool on this node, or finds the one made before.
func (f *Face) PrepareClaim(ctx context.Context, c Claim) (_ Edits, err error) {
	defer f.observe("prepare", time.Now(), &err)
	if err := f.core.Closed(); err != nil {
		return Edits{}, err
	}
	if a, ok := f.core.ByClaim(c.UID); ok {
		if a.State != ledger.Active {
			return Edits{}, api.Errorf(api.ErrConflict, "allocation %s of the claim is %s: %w", a.ID, a.State, ledger.ErrBusy)
		}
		return f.claimEdits(a), nil
	}
	p, ok := f.core.Meta(c.Pool)
	if !ok {
		return Edits{}, api.Errorf(api.ErrNotFound, "no pool %s on this node", c.Pool)
	}
	if ok, why := f.core.ServedByDRA(p); !ok {
		if why == "" {
			why = fmt.Sprintf("pool %s is served by the device plugin on this node (servedBy)", c.Pool)
		}
		return Edits{}, api.Errorf(api.ErrConflict, "%s", why)
	}
	claim := &ledger.Claim{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Flows: c.Flows}
	if p.Mode() == api.ModeNetdev {
		if !f.cfg.NRI {
			return Edits{}, api.Errorf(api.ErrNotSupported, "pool %s hands out whole netdevs, which DRA moves into pods through the runtime's NRI, and the daemon has no NRI socket (--nri-socket)", c.Pool)
		}
		if len(c.Pods) != 1 {
			return Edits{}, api.Errorf(api.ErrInvalid, "the claim is reserved for %d pods: a whole netdev moves into one pod's network namespace; give each pod a claim of its own (a ResourceClaimTemplate)", len(c.Pods))
		}
		if c.Interface != nil {
			b, err := json.Marshal(c.Interface)
			if err != nil {
				return Edits{}, err
			}
			claim.Interface = b
		}
		// Refused now, not when the pod's sandbox runs.
		if _, _, err := ClaimNetdevFlows(ledger.Allocation{Claim: claim}, derefInterface(c.Interface)); err != nil {
			return Edits{}, api.Errorf(api.ErrInvalid, "claim config: %w", err)
		}
	} else if c.Interface != nil {
		return Edits{}, api.Errorf(api.ErrInvalid, "claim config: interface: pool %s shares queues of a netdev that stays the node's; interface applies to pools of mode netdev", c.Pool)
	} else if c.Flows != nil {
		// Refused now, before anything is held, as the CNI path refuses
		// it: a flow whose destination is the node's own address would
		// take the node's traffic (its SSH, its kubelet) off the stack.
		// Flows to the pod's address are checked once it has one.
		if err := f.checkClaimFlows(c.Flows, p.Config.SharedPrefixes()); err != nil {
			return Edits{}, err
		}
	}
	ids, err := f.deviceIDs(c.Pool, c.Devices)
	if err != nil {
		return Edits{}, err
	}
	if err := f.checkOneNetdev(c, ids); err != nil {
		return Edits{}, err
	}
	owner := ledger.Owner{AnyPod: true}
	if len(c.Pods) == 1 {
		owner = ledger.Owner{PodUID: c.Pods[0]}
	} else if c.Flows != nil {
		return Edits{}, api.Errorf(api.ErrInvalid, "the claim is reserved for %d pods: flows steer to one pod's addresses; give each pod a claim of its own (a ResourceClaimTemplate)", len(c.Pods))
	}
	res := ledger.Reservation{Pool: c.Pool, Devices: ids, Owner: owner, Claim: claim}
	a, err := f.core.Allocate(ctx, res)
	if errors.Is(err, api.ErrConflict) && f.releaseStale(ctx, c, ids) {
		a, err = f.core.Allocate(ctx, res)
	}
	if err != nil {
		return Edits{}, err
	}
	f.log.Info("allocated", "allocation", a.ID, "pool", a.Pool, "netdev", a.Netdev, "queues", a.Queues,
		"claim", c.Namespace+"/"+c.Name, "pods", c.Pods)
	if owner.PodUID != "" && f.cfg.Pods != nil {
		f.cfg.Pods.Touch(owner.PodUID) // its claim's flows apply once it has an address
	}
	return f.claimEdits(a), nil
}

// checkOneNetdev refuses a claim given queues of several netdevs: an
// allocation, and the lease a pod takes of it, is on one netdev. The
// scheduler allocates so whatever the slices say when a request has no
// matchAttribute constraint on xdpq.io/netdev, which the claim it makes
// for a pod asking the extended resource never has: the refusal names
// both ways out.
func (f *Face) checkOneNetdev(c Claim, ids []string) error {
	p, _ := f.core.Pool(c.Pool)
	var netdevs []string
	for _, dv := range p.Devices {
		if slices.Contains(ids, dv.ID) && !slices.Contains(netdevs, dv.Netdev) {
			netdevs = append(netdevs, dv.Netdev)
		}
	}
	if len(netdevs) < 2 {
		return nil
	}
	slices.Sort(netdevs)
	return api.Errorf(api.ErrInvalid, "claim %s/%s was given queues of netdevs %s, and its queues must be of one netdev (a lease is): "+
		"ask with the constraint matchAttribute: %s/netdev on its requests; a pod asking for the extended resource of pool %s gets no such constraint, so give that pool one netdev per node",
		c.Namespace, c.Name, strings.Join(netdevs, " and "), DriverName, c.Pool)
}

// checkClaimFlows refuses a queue claim's flows whose own destination
// (not the pod's address, "ipam" or none) is an address of the node,
// unless shared grants it.
func (f *Face) checkClaimFlows(raw []byte, shared []netip.Prefix) error {
	parsed, err := flow.ParseList(raw, "flows")
	if err != nil {
		return api.Errorf(api.ErrInvalid, "claim config: %w", err)
	}
	var own []flow.Parsed
	for _, f := range parsed {
		if f.Dst.IsValid() {
			own = append(own, f)
		}
	}
	flows, err := flow.Resolve(own, nil)
	if err != nil {
		return api.Errorf(api.ErrInvalid, "claim config: %w", err)
	}
	if err := f.core.CheckNotNode(flows, flow.Claimed(flows, shared), shared); err != nil {
		return fmt.Errorf("claim config: flows: %w", err)
	}
	return nil
}

// deviceIDs are the ledger's ids of a pool's devices named as in its
// ResourceSlice. A queue of a netdev whose name is a DNS label has the
// same name in both ("eth1-q3"): looked up directly; any other (a
// netdev name made into a label) by the names of every device.
func (f *Face) deviceIDs(pool string, names []string) ([]string, error) {
	ids := make([]string, 0, len(names))
	var byName map[string]string
	for _, name := range names {
		if dv, ok := f.core.Device(pool, name); ok && DeviceName(dv.Netdev, deviceQueue(dv)) == name {
			ids = append(ids, name)
			continue
		}
		if byName == nil {
			p, _ := f.core.Pool(pool)
			byName = make(map[string]string, len(p.Devices))
			for _, dv := range p.Devices {
				byName[DeviceName(dv.Netdev, deviceQueue(dv))] = dv.ID
			}
		}
		id, ok := byName[name]
		if !ok {
			return nil, api.Errorf(api.ErrNotFound, "device %s is no longer in pool %s", name, pool)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// UnprepareClaim frees the claim's allocation, if it has one.
func (f *Face) UnprepareClaim(ctx context.Context, uid string) (err error) {
	defer f.observe("unprepare", time.Now(), &err)
	a, ok := f.core.ByClaim(uid)
	if !ok {
		return nil
	}
	if err := f.core.Free(ctx, a.ID, "its claim was unprepared"); err != nil {
		return err
	}
	select {
	case f.unprepared <- struct{}{}:
	default:
	}
	return nil
}

// Devices are the devices of the pools DRA serves, with what discovery
// and the agent know of their netdevs.
func (f *Face) Devices() map[string][]Device {
	// A netdev moved into its pod is its pod agent's (netdevStatus lists
	// it after the node's agent, which no longer sees it): the node's
	// would call it missing, its claim not Ready and its device tainted.
	netdevs := f.core.Netdevs()
	out := map[string][]Device{}
	for _, name := range f.draPools() {
		p, ok := f.core.Pool(name)
		if !ok {
			continue
		}
		devs := make([]Device, 0, len(p.Devices))
		for _, dv := range p.Devices {
			st, ok := netdevs[dv.Netdev]
			x := Device{ID: dv.ID, Netdev: dv.Netdev, Queue: deviceQueue(dv), Queues: len(dv.Queues), Driver: st.Driver,
				PCI: dv.PCI, NUMA: dv.NUMA, Native: st.Native, ZeroCopy: st.ZeroCopy}
			if x.Queue >= 0 {
				x.Steering = st.Steering
			}
			if dv.PCI != "" {
				x.PCIeRoot = f.pcieRoots.get(dv.PCI)
			}
			switch {
			case st.Missing || !ok:
				x.Unavailable, x.Reason = "netdev "+dv.Netdev+" is missing", "Missing"
			case st.Overridden:
				x.Unavailable, x.Reason = fmt.Sprintf("a foreign XDP program (%s) holds netdev %s's hook", st.Foreign, dv.Netdev), "Overridden"
			case !st.LinkUp:
				x.Unavailable, x.Reason = "netdev "+dv.Netdev+"'s link is down", "LinkDown"
			case dv.Queues[len(dv.Queues)-1] >= uint32(st.RXQueues):
				x.Unavailable, x.Reason = fmt.Sprintf("netdev %s has %d rx queues now", dv.Netdev, st.RXQueues), "QueueGone"
			}
			devs = append(devs, x)
		}
		out[name] = devs
	}
	return out
}

// Prepared are the claims with an allocation on this node, for their
// status (PreparedClaims).
func (f *Face) Prepared() []PreparedClaim {
	var out []PreparedClaim
	pools := map[string]map[string]ledger.Device{}
	for _, a := range f.core.Allocations() {
		if a.Claim == nil || a.State != ledger.Active {
			continue
		}
		devs, ok := pools[a.Pool]
		if !ok {
			devs = map[string]ledger.Device{}
			if p, ok := f.core.Pool(a.Pool); ok {
				for _, dv := range p.Devices {
					devs[dv.ID] = dv
				}
			}
			pools[a.Pool] = devs
		}
		c := PreparedClaim{UID: a.Claim.UID, Namespace: a.Claim.Namespace, Name: a.Claim.Name, Pool: a.Pool,
			Data:    ClaimData{Allocation: a.ID, Netdev: a.Netdev, Queues: a.Queues, Socket: f.cfg.Socket},
			Network: f.core.Network(a)}
		for _, id := range a.Devices {
			dv, ok := devs[id]
			if !ok { // a device gone from the pool: named as it was
				dv = ledger.Device{ID: id, Netdev: a.Netdev, Queues: []uint32{0}}
			}
			c.Devices = append(c.Devices, DeviceName(dv.Netdev, deviceQueue(dv)))
		}
		out = append(out, c)
	}
	return out
}

// derefInterface is the interface configuration given, or none.
func derefInterface(ic *InterfaceConfig) InterfaceConfig {
	if ic == nil {
		return InterfaceConfig{}
	}
	return *ic
}

// deviceQueue is a ledger device's queue, -1 for a whole netdev.
func deviceQueue(dv ledger.Device) int {
	if dv.ID == dv.Netdev {
		return -1
	}
	return int(dv.Queues[0])
}

// pcieRoots are the PCIe roots of the PCI devices of the pools, read
// from sysfs once per device, not at each publish.
type pcieRoots struct {
	read func(pci string) string // pcieRoot; a test's
	mu   sync.Mutex
	m    map[string]string
}

func (r *pcieRoots) get(pci string) string {
	r.mu.Lock()
	v, ok := r.m[pci]
	r.mu.Unlock()
	if ok {
		return v
	}
	read := r.read
	if read == nil {
		read = pcieRoot
	}
	v = read(pci) // sysfs: not under the lock
	r.mu.Lock()
	if r.m == nil {
		r.m = map[string]string{}
	}
	r.m[pci] = v
	r.mu.Unlock()
	return v
}

// pcieRoot is the PCIe root complex of a PCI device, "" when sysfs does
// not say.
func pcieRoot(pci string) string {
	a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(pci)
	if err != nil || a.Value.StringValue == nil {
		return ""
	}
	return *a.Value.StringValue
}

// claimEdits are the CDI edits of a claim's allocation: what the device
// plugin's Allocate gives a container.
func (f *Face) claimEdits(a ledger.Allocation) Edits {
	return f.core.Edits(a)
}

// ClaimInterface is the interface configuration of a claim's allocation.
func ClaimInterface(a ledger.Allocation) (InterfaceConfig, error) {
	var ic InterfaceConfig
	if a.Claim == nil || len(a.Claim.Interface) == 0 {
		return ic, nil
	}
	err := json.Unmarshal(a.Claim.Interface, &ic)
	return ic, err
}

// ClaimNetdevFlows are the flows a netdev-mode claim steers: its
// configured flows, an empty destination being each of the interface's
// addresses.
func ClaimNetdevFlows(a ledger.Allocation, ic InterfaceConfig) ([]api.CNIFlow, []netip.Addr, error) {
	var addrs []netip.Addr
	for _, p := range ic.Prefixes() {
		addrs = append(addrs, p.Addr())
	}
	if a.Claim == nil || a.Claim.Flows == nil {
		return nil, addrs, nil
	}
	parsed, err := flow.ParseList(a.Claim.Flows, "flows")
	if err != nil {
		return nil, nil, err
	}
	flows, err := flow.Resolve(parsed, addrs)
	if err != nil {
		return nil, nil, fmt.Errorf("%w (a netdev-mode claim's own addresses are its interface.addresses)", err)
	}
	return flows, addrs, nil
}
