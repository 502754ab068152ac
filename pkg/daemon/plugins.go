package daemon

import (
	"context"
	"fmt"
	"os"
	"slices"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/xdpq/xdpq/pkg/agent"
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

// startPlugin runs a pool's device plugin in Run's group: a plugin that
// fails stops the daemon. Only the reconciler calls it.
func (d *Daemon) startPlugin(pool, resource string) *plugin {
	registry := d.opts.RegistryDir
	if st, err := os.Stat(registry); registry != "" && (err != nil || !st.IsDir()) {
		registry = "" // no plugin watcher on this kubelet
	}
	p := deviceplugin.New(deviceplugin.Config{Resource: resource, Dir: d.opts.PluginDir, RegistryDir: registry, Logger: d.log,
		Devices: func() []deviceplugin.Device { return d.devices(pool) },
		Allocate: func(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
			return d.allocate(ctx, pool, ids)
		}})
	d.mu.Lock()
	g, gctx := d.group, d.groupCtx
	d.mu.Unlock()
	ctx, cancel := context.WithCancel(gctx)
	done := make(chan struct{})
	g.Go(func() error {
		defer close(done)
		err := p.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		d.log.Error("device plugin failed; stopping", "pool", pool, "err", err)
		return fmt.Errorf("device plugin %s: %w", resource, err)
	})
	d.log.Info("device plugin started", "pool", pool, "resource", resource)
	return &plugin{resource: resource, p: p, cancel: cancel, done: done}
}

// devices lists a pool's devices for kubelet, healthy or not: unhealthy
// when the link is down, the queue is gone, the netdev is gone or a
// foreign program owns its hook.
func (d *Daemon) devices(pool string) []deviceplugin.Device {
	p, ok := d.ledger.Pool(pool)
	if !ok {
		return nil
	}
	return d.toPluginDevices(p.Devices)
}

// withHealth is devices as the device plugin API sees them.
func (d *Daemon) withHealth(devs []ledger.Device) []deviceplugin.Device {
	return d.toPluginDevices(devs)
}

func (d *Daemon) toPluginDevices(devs []ledger.Device) []deviceplugin.Device {
	type state struct {
		ok     bool
		queues int
	}
	health := map[string]state{}
	for _, s := range d.netdevStatus() {
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

// devicesChanged tells the device plugins to send their lists again, and
// the node reporter to look (the agents call it when a netdev's state
// changes).
func (d *Daemon) devicesChanged() {
	d.signalNetdevs()
	d.mu.Lock()
	var ps []*deviceplugin.Plugin
	for _, pl := range d.plugins {
		ps = append(ps, pl.p)
	}
	d.mu.Unlock()
	for _, p := range ps {
		p.Changed()
	}
}

// netdevStatus is every netdev's agent status, a netdev in a pod under
// its node name.
func (d *Daemon) netdevStatus() []agent.Status {
	out := d.agent.Status()
	d.mu.Lock()
	var pods []*podNetdev
	for _, pn := range d.pods {
		pods = append(pods, pn)
	}
	d.mu.Unlock()
	for _, pn := range pods {
		ag := pn.agent
		if ag == nil {
			continue
		}
		for _, s := range ag.Status() {
			s.Netdev = pn.rec.netdev()
			s.Reason = fmt.Sprintf("in pod netns %s as %s. %s", pn.rec.Netns, pn.rec.ifName(), s.Reason)
			out = append(out, s)
		}
	}
	return out
}
