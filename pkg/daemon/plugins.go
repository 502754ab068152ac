package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/deviceplugin"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// pluginsCore is the core as the device plugin face
// (deviceplugin.Plugins) sees it: the pools it serves, their devices'
// health, and kubelet's allocations.
type pluginsCore struct{ c *core }

var _ deviceplugin.Core = pluginsCore{}

// Pools are the pools the device plugins serve now (servedBy): their
// resource by name.
func (p pluginsCore) Pools() map[string]string {
	want := map[string]string{}
	for _, m := range p.c.ledger.Metas() {
		if m.Resource == "" { // a pool of records only, gone from the config before this daemon started
			continue
		}
		if by, _ := p.c.servedBy(m); by == ServedByDevicePlugin {
			want[m.Name] = m.Resource
		}
	}
	return want
}

// Devices lists a pool's devices for kubelet, healthy or not: unhealthy
// when the link is down, the queue is gone, the netdev is gone or a
// foreign program owns its hook.
func (p pluginsCore) Devices(pool string) []deviceplugin.Device {
	lp, ok := p.c.ledger.Pool(pool)
	if !ok {
		return nil
	}
	return pluginDevices(p.c, lp.Devices)
}

// Allocate makes kubelet's allocation of the devices (replacing the one
// that held them, when kubelet restarts a container): its directory
// mounted at /run/xdpq, the environment, and the NIC's PCI address for
// the device-info files.
func (p pluginsCore) Allocate(ctx context.Context, pool string, ids []string) (deviceplugin.Allocation, error) {
	if p.c.isUninstalling() {
		return deviceplugin.Allocation{}, errUninstalling
	}
	a, err := p.c.allocate(ctx, ledger.Reservation{Pool: pool, Devices: ids, Owner: ledger.Owner{AnyPod: true}, Replace: true})
	if err != nil {
		return deviceplugin.Allocation{}, err
	}
	p.c.log.Info("allocated", "allocation", a.ID, "pool", pool, "netdev", a.Netdev, "queues", a.Queues, "replaces", a.Replaces)
	meta, _ := p.c.ledger.Meta(pool)
	dev, _ := p.c.rec.netdev(a.Netdev)
	env, mounts := containerEdits(p.c, a)
	return deviceplugin.Allocation{ID: a.ID, Resource: resourceOf(a, meta), Devices: slices.Clone(a.Devices), PCI: dev.PCI,
		Env: env, Mounts: mounts}, nil
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
