package daemon

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

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/dra"
	"github.com/xdpq/xdpq/pkg/flow"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/nic"
)

// How a pool is served to pods (config.Pool.ServedBy).
const (
	ServedByDRA          = "dra"
	ServedByDevicePlugin = "devicePlugin"
)

// DRA configures the daemon's DRA driver (Kubernetes mode): it serves
// the pools whose servedBy is dra.
type DRA struct {
	// Kube is the API server as the kubeletplugin helper needs it: it
	// reads claims and writes the node's ResourceSlices.
	Kube kubernetes.Interface
	// RegistryDir, PluginDir, CDIDir and RollingUpdate are
	// dra.Options'.
	RegistryDir   string
	PluginDir     string
	CDIDir        string
	RollingUpdate string
	// NRISocket is the runtime's NRI socket (nri.DefaultSocket): netdev-
	// mode pools move their netdevs into pods through it. Empty: DRA
	// serves no netdev-mode pool.
	NRISocket string
	// UninstallWait is how long an uninstall waits for kubelet to
	// unprepare the claims still prepared (it does as their pods are
	// deleted) before it frees them anyway. Without the driver kubelet
	// cannot unprepare a claim, and its pod stays Terminating; the pod
	// must give the daemon this long and more to stop
	// (terminationGracePeriodSeconds). 0 frees them at once.
	UninstallWait time.Duration
}

// draPools are the names of the pools DRA serves now.
func (dr *draFace) draPools() []string {
	var out []string
	for _, p := range dr.core.ledger.Metas() {
		if p.Resource == "" {
			continue
		}
		if by, _ := dr.core.servedBy(p); by == ServedByDRA {
			out = append(out, p.Name)
		}
	}
	return out
}

// draLoop runs the DRA driver: registered with kubelet, it publishes the
// devices of the pools DRA serves whenever they (or their health) change.
func (dr *draFace) draLoop(ctx context.Context) error {
	o := dr.opts.DRA
	drv, err := dra.Start(ctx, dra.Options{NodeName: dr.opts.NodeName, Kube: o.Kube, Node: dr, RegistryDir: o.RegistryDir,
		PluginDir: o.PluginDir, CDIDir: o.CDIDir, RollingUpdate: o.RollingUpdate, Logger: dr.log})
	if err != nil {
		return err
	}
	defer drv.Stop()
	keep := map[string]bool{}
	for _, a := range dr.core.ledger.Allocations() {
		if a.Claim != nil {
			keep[a.Claim.UID] = true
		}
	}
	if err := drv.RemoveSpecsExcept(keep); err != nil {
		dr.log.Warn("CDI specs of claims no longer prepared are left", "err", err)
	}
	dr.log.Info("DRA driver registered", "driver", dra.DriverName, "pools", dr.draPools())
	for {
		select {
		case <-ctx.Done():
			if dr.core.isUninstalling() {
				dr.removeSlices(drv)
			}
			return nil
		case <-dr.changed:
		}
		if err := drv.Publish(ctx); err != nil {
			dr.log.Warn("ResourceSlices not published; again at the next change", "err", err)
		}
	}
}

// removeSpecs removes the CDI specs of the claims that no longer have
// an allocation: those freed by an uninstall without kubelet's
// unprepare. A spec left (said here) the next daemon's driver removes
// when it starts.
func (dr *draFace) removeSpecs() {
	keep := map[string]bool{}
	for _, a := range dr.core.ledger.Allocations() {
		if a.Claim != nil {
			keep[a.Claim.UID] = true
		}
	}
	if err := dra.RemoveSpecsExcept(dr.opts.DRA.CDIDir, keep); err != nil {
		dr.log.Error("uninstall: CDI specs of freed claims left", "dir", dr.opts.DRA.CDIDir, "err", err)
	}
}

// removeSlices withdraws the node's ResourceSlices (uninstall).
func (dr *draFace) removeSlices(drv *dra.Driver) {
	ctx, cancel := context.WithTimeout(context.Background(), api.RequestTimeout)
	defer cancel()
	if err := drv.Withdraw(ctx); err != nil {
		dr.log.Warn("uninstall: the node's ResourceSlices stay", "err", err)
	}
}

// signalDRA has draLoop publish again.
func (dr *draFace) signal() {
	select {
	case dr.changed <- struct{}{}:
	default:
	}
}

// draFace is the DRA driver's face (dra.Node): the node's slices of the
// pools DRA serves, kubelet's Prepare and Unprepare of their claims,
// and the claims gone from the API server, over the core.
type draFace struct {
	core    *core
	opts    *Options // the daemon's
	log     *slog.Logger
	metrics *metrics
	// changed wakes draLoop to publish; capacity 1.
	changed chan struct{}
	// unprepared wakes an uninstall waiting for kubelet to unprepare
	// claims; capacity 1.
	unprepared chan struct{}
	// goneClaims are the claims the collector found gone (collectClaims).
	goneClaims goneClaims
	// pcieRoots are the pools' PCI devices' PCIe roots (Devices).
	pcieRoots pcieRoots
}

var _ dra.Node = (*draFace)(nil)

// PrepareClaim makes the allocation of a claim the scheduler allocated
// devices of an xdpq pool on this node, or finds the one made before.
func (dr *draFace) PrepareClaim(ctx context.Context, c dra.Claim) (_ dra.Edits, err error) {
	defer dr.metrics.observeDRA("prepare", time.Now(), &err)
	if dr.core.isUninstalling() {
		return dra.Edits{}, errUninstalling
	}
	if a, ok := dr.core.ledger.ByClaim(c.UID); ok {
		if a.State != ledger.Active {
			return dra.Edits{}, api.Errorf(api.ErrConflict, "allocation %s of the claim is %s: %w", a.ID, a.State, ledger.ErrBusy)
		}
		return dr.claimEdits(a), nil
	}
	p, ok := dr.core.ledger.Meta(c.Pool)
	if !ok {
		return dra.Edits{}, api.Errorf(api.ErrNotFound, "no pool %s on this node", c.Pool)
	}
	if by, why := dr.core.servedBy(p); by != ServedByDRA {
		if why == "" {
			why = fmt.Sprintf("pool %s is served by the device plugin on this node (servedBy)", c.Pool)
		}
		return dra.Edits{}, api.Errorf(api.ErrConflict, "%s", why)
	}
	claim := &ledger.Claim{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Flows: c.Flows}
	if p.Mode() == api.ModeNetdev {
		if dr.opts.DRA.NRISocket == "" {
			return dra.Edits{}, api.Errorf(api.ErrNotSupported, "pool %s hands out whole netdevs, which DRA moves into pods through the runtime's NRI, and the daemon has no NRI socket (--nri-socket)", c.Pool)
		}
		if len(c.Pods) != 1 {
			return dra.Edits{}, api.Errorf(api.ErrInvalid, "the claim is reserved for %d pods: a whole netdev moves into one pod's network namespace; give each pod a claim of its own (a ResourceClaimTemplate)", len(c.Pods))
		}
		if c.Interface != nil {
			b, err := json.Marshal(c.Interface)
			if err != nil {
				return dra.Edits{}, err
			}
			claim.Interface = b
		}
		// Refused now, not when the pod's sandbox runs.
		if _, _, err := claimNetdevFlows(ledger.Allocation{Claim: claim}, derefInterface(c.Interface)); err != nil {
			return dra.Edits{}, api.Errorf(api.ErrInvalid, "claim config: %w", err)
		}
	} else if c.Interface != nil {
		return dra.Edits{}, api.Errorf(api.ErrInvalid, "claim config: interface: pool %s shares queues of a netdev that stays the node's; interface applies to pools of mode netdev", c.Pool)
	} else if c.Flows != nil {
		// Refused now, before anything is held, as the CNI path refuses
		// it: a flow whose destination is the node's own address would
		// take the node's traffic (its SSH, its kubelet) off the stack.
		// Flows to the pod's address are checked once it has one.
		if err := dr.checkClaimFlows(c.Flows, p.Config.SharedPrefixes()); err != nil {
			return dra.Edits{}, err
		}
	}
	ids, err := dr.deviceIDs(c.Pool, c.Devices)
	if err != nil {
		return dra.Edits{}, err
	}
	if err := dr.checkOneNetdev(c, ids); err != nil {
		return dra.Edits{}, err
	}
	owner := ledger.Owner{AnyPod: true}
	if len(c.Pods) == 1 {
		owner = ledger.Owner{PodUID: c.Pods[0]}
	} else if c.Flows != nil {
		return dra.Edits{}, api.Errorf(api.ErrInvalid, "the claim is reserved for %d pods: flows steer to one pod's addresses; give each pod a claim of its own (a ResourceClaimTemplate)", len(c.Pods))
	}
	res := ledger.Reservation{Pool: c.Pool, Devices: ids, Owner: owner, Claim: claim}
	a, err := dr.core.allocate(ctx, res)
	if errors.Is(err, api.ErrConflict) && dr.releaseStale(ctx, c, ids) {
		a, err = dr.core.allocate(ctx, res)
	}
	if err != nil {
		return dra.Edits{}, err
	}
	dr.log.Info("allocated", "allocation", a.ID, "pool", a.Pool, "netdev", a.Netdev, "queues", a.Queues,
		"claim", c.Namespace+"/"+c.Name, "pods", c.Pods)
	if owner.PodUID != "" && dr.opts.Pods != nil {
		dr.opts.Pods.Touch(owner.PodUID) // its claim's flows apply once it has an address
	}
	return dr.claimEdits(a), nil
}

// checkOneNetdev refuses a claim given queues of several netdevs: an
// allocation, and the lease a pod takes of it, is on one netdev. The
// scheduler allocates so whatever the slices say when a request has no
// matchAttribute constraint on xdpq.io/netdev, which the claim it makes
// for a pod asking the extended resource never has: the refusal names
// both ways out.
func (dr *draFace) checkOneNetdev(c dra.Claim, ids []string) error {
	p, _ := dr.core.ledger.Pool(c.Pool)
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
		c.Namespace, c.Name, strings.Join(netdevs, " and "), dra.DriverName, c.Pool)
}

// checkClaimFlows refuses a queue claim's flows whose own destination
// (not the pod's address, "ipam" or none) is an address of the node,
// unless shared grants it.
func (dr *draFace) checkClaimFlows(raw []byte, shared []netip.Prefix) error {
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
	if err := dr.core.checkNotNode(flows, flow.Claimed(flows, shared), shared); err != nil {
		return fmt.Errorf("claim config: flows: %w", err)
	}
	return nil
}

// deviceIDs are the ledger's ids of a pool's devices named as in its
// ResourceSlice. A queue of a netdev whose name is a DNS label has the
// same name in both ("eth1-q3"): looked up directly; any other (a
// netdev name made into a label) by the names of every device.
func (dr *draFace) deviceIDs(pool string, names []string) ([]string, error) {
	ids := make([]string, 0, len(names))
	var byName map[string]string
	for _, name := range names {
		if dv, ok := dr.core.ledger.Device(pool, name); ok && dra.DeviceName(dv.Netdev, deviceQueue(dv)) == name {
			ids = append(ids, name)
			continue
		}
		if byName == nil {
			p, _ := dr.core.ledger.Pool(pool)
			byName = make(map[string]string, len(p.Devices))
			for _, dv := range p.Devices {
				byName[dra.DeviceName(dv.Netdev, deviceQueue(dv))] = dv.ID
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
func (dr *draFace) UnprepareClaim(ctx context.Context, uid string) (err error) {
	defer dr.metrics.observeDRA("unprepare", time.Now(), &err)
	a, ok := dr.core.ledger.ByClaim(uid)
	if !ok {
		return nil
	}
	if err := dr.core.free(ctx, a.ID, "its claim was unprepared"); err != nil {
		return err
	}
	select {
	case dr.unprepared <- struct{}{}:
	default:
	}
	return nil
}

// Devices are the devices of the pools DRA serves, with what discovery
// and the agent know of their netdevs.
func (dr *draFace) Devices() map[string][]dra.Device {
	// A netdev moved into its pod is its pod agent's (netdevStatus lists
	// it after the node's agent, which no longer sees it): the node's
	// would call it missing, its claim not Ready and its device tainted.
	status := map[string]agent.Status{}
	for _, s := range dr.core.netdevStatus() {
		status[s.Netdev] = s
	}
	found := dr.core.rec.netdevs()
	out := map[string][]dra.Device{}
	for _, name := range dr.draPools() {
		p, ok := dr.core.ledger.Pool(name)
		if !ok {
			continue
		}
		devs := make([]dra.Device, 0, len(p.Devices))
		for _, dv := range p.Devices {
			nd := found[dv.Netdev]
			st := status[dv.Netdev]
			x := dra.Device{ID: dv.ID, Netdev: dv.Netdev, Queue: deviceQueue(dv), Queues: len(dv.Queues), Driver: nd.Driver,
				PCI: dv.PCI, NUMA: dv.NUMA, Native: nd.XDP&nic.XDPRedirect != 0, ZeroCopy: nd.XDP&nic.XSKZeroCopy != 0}
			if x.Queue >= 0 {
				x.Steering = map[agent.Steering]string{agent.SteerHardware: "ntuple", agent.SteerSoftware: "filter"}[st.Steering]
			}
			if dv.PCI != "" {
				x.PCIeRoot = dr.pcieRoots.get(dv.PCI)
			}
			switch {
			case st.State == agent.StateMissing || st.Netdev == "":
				x.Unavailable, x.Reason = "netdev "+dv.Netdev+" is missing", "Missing"
			case st.State == agent.StateOverridden:
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
// status (dra.PreparedClaims).
func (dr *draFace) Prepared() []dra.PreparedClaim {
	var out []dra.PreparedClaim
	pools := map[string]map[string]ledger.Device{}
	for _, a := range dr.core.ledger.Allocations() {
		if a.Claim == nil || a.State != ledger.Active {
			continue
		}
		devs, ok := pools[a.Pool]
		if !ok {
			devs = map[string]ledger.Device{}
			if p, ok := dr.core.ledger.Pool(a.Pool); ok {
				for _, dv := range p.Devices {
					devs[dv.ID] = dv
				}
			}
			pools[a.Pool] = devs
		}
		c := dra.PreparedClaim{UID: a.Claim.UID, Namespace: a.Claim.Namespace, Name: a.Claim.Name, Pool: a.Pool,
			Data:    dra.ClaimData{Allocation: a.ID, Netdev: a.Netdev, Queues: a.Queues, Socket: "/run/xdpq/" + broker.SocketName},
			Network: claimNetwork(a)}
		for _, id := range a.Devices {
			dv, ok := devs[id]
			if !ok { // a device gone from the pool: named as it was
				dv = ledger.Device{ID: id, Netdev: a.Netdev, Queues: []uint32{0}}
			}
			c.Devices = append(c.Devices, dra.DeviceName(dv.Netdev, deviceQueue(dv)))
		}
		out = append(out, c)
	}
	return out
}

// releaseStale frees the allocations of other claims that hold any of
// the devices ids claim c was given, if the API server no longer gives
// those claims the devices: a pod deleted at once (grace period 0) goes
// from the API server before kubelet has stopped it and unprepared its
// claim, and the scheduler gives its devices to the next claim, whose
// Prepare comes first. The API server's allocation is the truth: the
// old allocation goes now (its pod, if still running, loses the queues
// the cluster gave another), instead of kubelet retrying the new
// claim's Prepare for seconds. It says whether it freed any.
func (dr *draFace) releaseStale(ctx context.Context, c dra.Claim, ids []string) bool {
	freed := false
	for _, a := range dr.core.ledger.Allocations() {
		if a.Claim == nil || a.Claim.UID == c.UID || a.Pool != c.Pool || a.State != ledger.Active ||
			!slices.ContainsFunc(a.Devices, func(id string) bool { return slices.Contains(ids, id) }) {
			continue
		}
		why, err := dr.claimReleased(ctx, a)
		if err != nil || why == "" {
			continue // still the other claim's: the conflict stands
		}
		if err := dr.core.free(ctx, a.ID, fmt.Sprintf("claim %s/%s was given its devices, and its claim %s/%s %s",
			c.Namespace, c.Name, a.Claim.Namespace, a.Claim.Name, why)); err != nil {
			dr.log.Warn("free", "allocation", a.ID, "err", err)
			continue
		}
		freed = true
	}
	return freed
}

// claimReleased says how the API server no longer gives allocation a's
// claim its devices ("" if it does).
func (dr *draFace) claimReleased(ctx context.Context, a ledger.Allocation) (string, error) {
	c, gone, err := dr.claimOf(ctx, a)
	switch {
	case err != nil:
		return "", err
	case gone != "":
		return "was " + gone, nil
	case c.Status.Allocation == nil:
		return "was deallocated", nil
	}
	held := map[string]bool{}
	p, _ := dr.core.ledger.Pool(a.Pool)
	for _, dv := range p.Devices {
		if slices.Contains(a.Devices, dv.ID) {
			held[dra.DeviceName(dv.Netdev, deviceQueue(dv))] = true
		}
	}
	pool := dra.PoolName(dr.opts.NodeName, a.Pool)
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == dra.DriverName && r.Pool == pool && held[r.Device] {
			return "", nil
		}
	}
	return "was given other devices", nil
}

// derefInterface is the interface configuration given, or none.
func derefInterface(ic *dra.InterfaceConfig) dra.InterfaceConfig {
	if ic == nil {
		return dra.InterfaceConfig{}
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
func (dr *draFace) claimEdits(a ledger.Allocation) dra.Edits {
	env, mounts := containerEdits(dr.core, a)
	e := dra.Edits{Env: env}
	for _, m := range mounts {
		e.Mounts = append(e.Mounts, dra.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, ReadOnly: m.ReadOnly})
	}
	return e
}

// goneClaims are the claims whose allocations the collector found
// without a claim to serve, by claim UID: freed when found so again at
// the next collection.
type goneClaims struct {
	mu   sync.Mutex
	seen map[string]bool
}

// mark records what this collection found gone and says which of it
// the last one found gone too.
func (g *goneClaims) mark(gone []string) (twice []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	next := make(map[string]bool, len(gone))
	for _, uid := range gone {
		if g.seen[uid] {
			twice = append(twice, uid)
		}
		next[uid] = true
	}
	g.seen = next
	return twice
}

// collectClaims frees the allocations of claims kubelet will never
// unprepare: the claim was deleted (or replaced under its name) or is
// no longer reserved for the allocation's pod, and that pod is gone
// from this node; kubelet lost its checkpoint, or the claim went while
// kubelet was down. Found so at two collections in a row, so that a
// claim kubelet is unpreparing now is not freed under it. A claim whose
// pod is still on the node is kubelet's to unprepare.
func (dr *draFace) collectClaims(ctx context.Context) (freed []string) {
	if dr.opts.DRA == nil || dr.opts.DRA.Kube == nil {
		return nil
	}
	byUID := map[string]ledger.Allocation{}
	var gone []string
	for _, a := range dr.core.ledger.Allocations() {
		if a.Claim == nil || a.State != ledger.Active {
			continue
		}
		if a.Owner.PodUID != "" && dr.opts.Pods != nil {
			if _, ok := dr.opts.Pods.Cached(a.Owner.PodUID); ok {
				continue
			}
		}
		why, others, err := dr.claimGone(ctx, a)
		if err != nil {
			dr.log.Warn("cannot read the claim of an allocation whose pod is gone; kept", "allocation", a.ID,
				"claim", a.Claim.Namespace+"/"+a.Claim.Name, "err", err)
			continue
		}
		if others {
			// kubelet keeps the claim prepared for its other pods: the
			// queues wait for the first of them to connect.
			if err := dr.core.setOwner(a.ID, ledger.Owner{AnyPod: true}); err != nil {
				dr.log.Warn("set owner", "allocation", a.ID, "err", err)
				continue
			}
			dr.log.Info("the pod that held a shared claim's queues is gone; the next of the claim's pods to connect takes them",
				"allocation", a.ID, "claim", a.Claim.Namespace+"/"+a.Claim.Name, "pod_uid", a.Owner.PodUID)
			continue
		}
		if why != "" {
			byUID[a.Claim.UID] = a
			gone = append(gone, a.Claim.UID)
			dr.log.Info("the claim of an allocation is gone; freed at the next collection unless kubelet unprepares it first",
				"allocation", a.ID, "claim", a.Claim.Namespace+"/"+a.Claim.Name, "why", why)
		}
	}
	for _, uid := range dr.goneClaims.mark(gone) {
		a := byUID[uid]
		if err := dr.core.free(ctx, a.ID, "its claim is gone and kubelet did not unprepare it"); err != nil {
			dr.log.Warn("free", "allocation", a.ID, "err", err)
			continue
		}
		freed = append(freed, a.ID)
	}
	return freed
}

// claimOf is allocation a's claim as the API server has it now, or
// why there is none: "deleted", or "deleted and made again" under its
// name with another UID.
func (dr *draFace) claimOf(ctx context.Context, a ledger.Allocation) (*resourceapi.ResourceClaim, string, error) {
	ctx, cancel := context.WithTimeout(ctx, api.RequestTimeout)
	defer cancel()
	c, err := dr.opts.DRA.Kube.ResourceV1().ResourceClaims(a.Claim.Namespace).Get(ctx, a.Claim.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, "deleted", nil
	case err != nil:
		return nil, "", err
	case string(c.UID) != a.Claim.UID:
		return nil, "deleted and made again (UID " + string(c.UID) + ")", nil
	}
	return c, "", nil
}

// claimGone says why allocation a's claim no longer needs it ("" if it
// does): the claim is not in the API server under its UID, or is
// reserved for none of the allocation's pods. others says the claim is
// still reserved for pods, none of them the allocation's owner: a
// claim several pods share outlived the one that held its queues.
func (dr *draFace) claimGone(ctx context.Context, a ledger.Allocation) (why string, others bool, err error) {
	c, gone, err := dr.claimOf(ctx, a)
	if err != nil || gone != "" {
		return gone, false, err
	}
	for _, r := range c.Status.ReservedFor {
		if a.Owner.AnyPod || string(r.UID) == a.Owner.PodUID {
			return "", false, nil
		}
	}
	if a.Owner.AnyPod {
		return "reserved for no pod", false, nil
	}
	if len(c.Status.ReservedFor) > 0 {
		return "", true, nil
	}
	return "no longer reserved for pod " + a.Owner.PodUID, false, nil
}

// claimReservedFor refuses pod uid the queues of claim allocation a
// unless the API server's claim is reserved for it. kubelet's
// PodResources does not list DRA devices: the claim's status is what
// says which pods may use them.
func (dr *draFace) claimReservedFor(ctx context.Context, a ledger.Allocation, uid string) error {
	if dr.opts.DRA == nil || dr.opts.DRA.Kube == nil {
		return fmt.Errorf("claim %s/%s: no API server to read it from", a.Claim.Namespace, a.Claim.Name)
	}
	c, gone, err := dr.claimOf(ctx, a)
	if err != nil {
		return fmt.Errorf("claim %s/%s: %w", a.Claim.Namespace, a.Claim.Name, err)
	}
	if gone != "" {
		return fmt.Errorf("claim %s/%s was %s", a.Claim.Namespace, a.Claim.Name, gone)
	}
	for _, r := range c.Status.ReservedFor {
		if string(r.UID) == uid {
			return nil
		}
	}
	return fmt.Errorf("claim %s/%s is not reserved for this pod (its status.reservedFor): only the pods that name the claim in spec.resourceClaims may use its queues",
		a.Claim.Namespace, a.Claim.Name)
}
