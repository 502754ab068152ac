package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/deviceplugin"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// plugin is a pool's running kubelet device plugin.
type plugin struct {
	resource string
	p        *deviceplugin.Plugin
	cancel   context.CancelFunc
	done     chan struct{} // closed when it stopped serving
}

// stop stops the plugin and waits until it no longer serves.
func (pl *plugin) stop() {
	pl.cancel()
	<-pl.done
}

// devicePlugins are the kubelet device plugins of the pools, one a pool
// (Kubernetes mode), run in the daemon's group: a plugin that fails stops
// the daemon. Its mutex guards the running set alone and is never held
// across a call out.
type devicePlugins struct {
	dir, registry string // the plugins' sockets; kubelet's plugin watcher's ("" for none)
	log           *slog.Logger
	core          *core

	mu       sync.Mutex
	running  map[string]*plugin // by pool
	group    *errgroup.Group    // Run's, set by use
	groupCtx context.Context
}

// use has the plugins started from now on run in g, under ctx.
func (ps *devicePlugins) use(ctx context.Context, g *errgroup.Group) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.group, ps.groupCtx = g, ctx
}

// start runs a pool's device plugin.
func (ps *devicePlugins) start(pool, resource string) *plugin {
	registry := ps.registry
	if st, err := os.Stat(registry); registry != "" && (err != nil || !st.IsDir()) {
		registry = "" // no plugin watcher on this kubelet
	}
	p := deviceplugin.New(deviceplugin.Config{Resource: resource, Dir: ps.dir, RegistryDir: registry, Logger: ps.log,
		Devices: func() []deviceplugin.Device { return ps.devices(pool) },
		Allocate: func(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
			return ps.allocate(ctx, pool, ids)
		}})
	ps.mu.Lock()
	g, gctx := ps.group, ps.groupCtx
	ps.mu.Unlock()
	ctx, cancel := context.WithCancel(gctx)
	done := make(chan struct{})
	g.Go(func() error {
		defer close(done)
		err := p.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		ps.log.Error("device plugin failed; stopping", "pool", pool, "err", err)
		return fmt.Errorf("device plugin %s: %w", resource, err)
	})
	ps.log.Info("device plugin started", "pool", pool, "resource", resource)
	return &plugin{resource: resource, p: p, cancel: cancel, done: done}
}

// sync runs one plugin per pool of want (pool: resource): a pool added
// gets one, a pool gone loses it, a pool whose resource name changed gets
// a new one; all send their devices again. Only the reconciler calls it.
func (ps *devicePlugins) sync(want map[string]string) {
	ps.mu.Lock()
	running := maps.Clone(ps.running)
	ps.mu.Unlock()
	for name, pl := range running {
		if want[name] != pl.resource {
			pl.stop()
			delete(running, name)
			ps.log.Info("device plugin stopped", "pool", name, "resource", pl.resource)
		}
	}
	for name, resource := range want {
		if running[name] == nil {
			running[name] = ps.start(name, resource)
		}
	}
	ps.mu.Lock()
	ps.running = running
	ps.mu.Unlock()
	for _, pl := range running {
		pl.p.Changed()
	}
}

// changed has every plugin send its devices again.
func (ps *devicePlugins) changed() {
	ps.mu.Lock()
	var all []*deviceplugin.Plugin
	for _, pl := range ps.running {
		all = append(all, pl.p)
	}
	ps.mu.Unlock()
	for _, p := range all {
		p.Changed()
	}
}

// devices lists a pool's devices for kubelet, healthy or not: unhealthy
// when the link is down, the queue is gone, the netdev is gone or a
// foreign program owns its hook.
func (ps *devicePlugins) devices(pool string) []deviceplugin.Device {
	p, ok := ps.core.ledger.Pool(pool)
	if !ok {
		return nil
	}
	return pluginDevices(ps.core, p.Devices)
}

// pluginDevices is devs as the device plugin API sees them, each
// healthy or not by its netdev's agent status.
func pluginDevices(c *core, devs []ledger.Device) []deviceplugin.Device {
	type state struct {
		ok     bool
		queues int
	}
	health := map[string]state{}
	for _, s := range c.netdevStatus() {
		health[s.Netdev] = state{s.LinkUp && s.State != agent.StateMissing && s.State != agent.StateOverridden, s.RXQueues}
	}
	out := make([]deviceplugin.Device, 0, len(devs))
	for _, dv := range devs {
		pd := deviceplugin.Device{ID: dv.ID, Netdev: dv.Netdev, Queue: dv.Queues[0], NUMA: dv.NUMA, PCI: dv.PCI}
		if dv.ID == dv.Netdev { // a whole netdev
			pd.Queues = slices.Clone(dv.Queues)
		}
		h := health[dv.Netdev]
		pd.Healthy = h.ok && int(slices.Max(dv.Queues)) < h.queues
		out = append(out, pd)
	}
	return out
}

// removeDeviceInfo removes the device-info files of an allocation no
// longer served (Kubernetes mode).
func (ps *devicePlugins) removeDeviceInfo(a ledger.Allocation) {
	if ps.core.opts.Standalone {
		return
	}
	if p, ok := ps.core.ledger.Meta(a.Pool); ok {
		for _, dev := range a.Devices {
			if err := deviceplugin.RemoveDeviceInfo(ps.devInfoDir(), p.Resource, dev); err != nil {
				ps.log.Warn("device-info file of a freed device left", "device", dev, "err", err)
			}
		}
	}
}

func (ps *devicePlugins) devInfoDir() string {
	if ps.core.opts.DeviceInfoDir != "" {
		return ps.core.opts.DeviceInfoDir
	}
	return deviceplugin.DeviceInfoDir
}

// allocate answers kubelet's Allocate: an allocation of the devices
// (replacing the one that held them, when kubelet restarts a container),
// its directory mounted at /run/xdpq, the environment, and the devices'
// device-info files.
func (ps *devicePlugins) allocate(ctx context.Context, pool string, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	if ps.core.isUninstalling() {
		return nil, errUninstalling
	}
	a, err := ps.core.allocate(ctx, ledger.Reservation{Pool: pool, Devices: ids, Owner: ledger.Owner{AnyPod: true}, Replace: true})
	if err != nil {
		return nil, err
	}
	// Device-info files for CNI plugins, where the NIC is a PCI device.
	dev, _ := ps.core.rec.netdev(a.Netdev)
	pci := dev.PCI
	if p, ok := ps.core.ledger.Meta(pool); ok && pci != "" {
		for _, id := range ids {
			if err := deviceplugin.WriteDeviceInfo(ps.devInfoDir(), p.Resource, id, pci); err != nil {
				ps.core.log.Warn("device info", "device", id, "err", err)
			}
		}
	}
	ps.core.log.Info("allocated", "allocation", a.ID, "pool", pool, "netdev", a.Netdev, "queues", a.Queues, "replaces", a.Replaces)
	env, mounts := containerEdits(ps.core, a)
	return &pluginapi.ContainerAllocateResponse{Envs: env, Mounts: mounts}, nil
}

// containerEdits are what a container holding allocation a gets, from
// the device plugin's Allocate or in a DRA claim's CDI spec: the
// allocation's directory at /run/xdpq (its broker socket), the
// environment that names it, and a DPDK pool's mounts.
func containerEdits(c *core, a ledger.Allocation) (map[string]string, []*pluginapi.Mount) {
	env := strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(a.Pool))
	var qs []string
	for _, q := range a.Queues {
		qs = append(qs, fmt.Sprintf("%s:%d", a.Netdev, q))
	}
	meta, _ := c.ledger.Meta(a.Pool)
	return map[string]string{
			"XDPQ_SOCKET":        "/run/xdpq/" + broker.SocketName,
			"XDPQ_QUEUES_" + env: strings.Join(qs, ","),
			"XDPQ_NETDEV_" + env: a.Netdev,
			"XDPQ_ALLOCATION":    a.ID,
		},
		append([]*pluginapi.Mount{{ContainerPath: "/run/xdpq", HostPath: c.allocDir(a.ID)}}, dpdkMounts(c, a, meta.Config)...)
}

// dpdkMounts are the mounts of an allocation of pool p, made by Allocate,
// that put its socket (and map) where DPDK looks.
func dpdkMounts(c *core, a ledger.Allocation, p config.Pool) []*pluginapi.Mount {
	if p.DPDK == nil {
		return nil
	}
	dir := filepath.Join(dpdkDir, p.DPDK.Iface)
	m := []*pluginapi.Mount{
		{ContainerPath: dir, HostPath: c.allocDir(a.ID)},
		{ContainerPath: dpdkOldPath, HostPath: c.dpdkLinks(a.ID)[1]},
	}
	if p.DPDK.PinnedMap {
		m = append(m, &pluginapi.Mount{ContainerPath: filepath.Join(dir, dpdkMapName), HostPath: dpdkMapPin(c.pinRoot(), a.Netdev), ReadOnly: true})
	}
	return m
}
