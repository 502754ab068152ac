package daemon

import (
	"context"
	"net/netip"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/dra"
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

// draCore is the core as the DRA face (dra.Face) sees it.
type draCore struct{ c *core }

var _ dra.Core = draCore{}

func (d draCore) Closed() error {
	if d.c.isUninstalling() {
		return errUninstalling
	}
	return nil
}

func (d draCore) Allocations() []ledger.Allocation               { return d.c.ledger.Allocations() }
func (d draCore) ByClaim(uid string) (ledger.Allocation, bool)   { return d.c.ledger.ByClaim(uid) }
func (d draCore) Metas() []ledger.Pool                           { return d.c.ledger.Metas() }
func (d draCore) Meta(pool string) (ledger.Pool, bool)           { return d.c.ledger.Meta(pool) }
func (d draCore) Pool(pool string) (ledger.Pool, bool)           { return d.c.ledger.Pool(pool) }
func (d draCore) Device(pool, id string) (ledger.Device, bool)   { return d.c.ledger.Device(pool, id) }
func (d draCore) SetOwner(id string, o ledger.Owner) error       { return d.c.setOwner(id, o) }
func (d draCore) Free(ctx context.Context, id, why string) error { return d.c.free(ctx, id, why) }
func (d draCore) Network(a ledger.Allocation) *dra.Network       { return claimNetwork(a) }

func (d draCore) ServedByDRA(p ledger.Pool) (bool, string) {
	by, why := d.c.servedBy(p)
	return by == ServedByDRA, why
}

func (d draCore) Allocate(ctx context.Context, res ledger.Reservation) (ledger.Allocation, error) {
	return d.c.allocate(ctx, res)
}

func (d draCore) CheckNotNode(flows []api.CNIFlow, claimed []netip.Addr, shared []netip.Prefix) error {
	return d.c.checkNotNode(flows, claimed, shared)
}

// Netdevs are the netdevs the agents manage (a netdev moved into its
// pod is its pod agent's: the node's would call it missing, its claim
// not Ready and its device tainted), with what discovery found of them;
// one discovery found and no agent manages is missing.
func (d draCore) Netdevs() map[string]dra.NetdevState {
	out := map[string]dra.NetdevState{}
	for _, s := range d.c.netdevStatus() {
		out[s.Netdev] = dra.NetdevState{Missing: s.State == agent.StateMissing, Overridden: s.State == agent.StateOverridden,
			Foreign: s.Foreign, LinkUp: s.LinkUp, RXQueues: s.RXQueues,
			Steering: map[agent.Steering]string{agent.SteerHardware: "ntuple", agent.SteerSoftware: "filter"}[s.Steering]}
	}
	for name, nd := range d.c.rec.netdevs() {
		st, ok := out[name]
		st.Missing = st.Missing || !ok
		st.Driver, st.Native, st.ZeroCopy = nd.Driver, nd.XDP&nic.XDPRedirect != 0, nd.XDP&nic.XSKZeroCopy != 0
		out[name] = st
	}
	return out
}

// Edits are the CDI edits of a claim's allocation: what the device
// plugin's Allocate gives a container.
func (d draCore) Edits(a ledger.Allocation) dra.Edits {
	env, mounts := containerEdits(d.c, a)
	e := dra.Edits{Env: env}
	for _, m := range mounts {
		e.Mounts = append(e.Mounts, dra.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, ReadOnly: m.ReadOnly})
	}
	return e
}

// newDRAFace is the daemon's DRA face as its options (DRA) say.
func newDRAFace(d *Daemon) *dra.Face {
	cfg := dra.FaceConfig{NodeName: d.opts.NodeName, Socket: "/run/xdpq/" + broker.SocketName, Logger: d.log}
	if o := d.opts.DRA; o != nil {
		cfg.Kube, cfg.RegistryDir, cfg.PluginDir, cfg.CDIDir, cfg.RollingUpdate = o.Kube, o.RegistryDir, o.PluginDir, o.CDIDir, o.RollingUpdate
		cfg.NRI = o.NRISocket != ""
	}
	if d.opts.Pods != nil {
		cfg.Pods = d.opts.Pods
	}
	if d.metrics != nil {
		cfg.Durations = d.metrics.dra
	}
	return dra.NewFace(cfg, draCore{d.core})
}
