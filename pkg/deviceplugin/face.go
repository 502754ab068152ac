package deviceplugin

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"sync"

	"golang.org/x/sync/errgroup"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Core is the daemon's allocation core as the device plugins see it.
type Core interface {
	// Pools are the pools the device plugins serve now: each one's
	// extended resource, by pool name.
	Pools() map[string]string
	// Devices are a pool's devices for kubelet, healthy or not.
	Devices(pool string) []Device
	// Allocate makes the allocation of the devices ids of pool for a
	// container, replacing the one that held them (kubelet allocates a
	// restarted container's devices again).
	Allocate(ctx context.Context, pool string, ids []string) (Allocation, error)
}

// Allocation is what a container that holds devices gets.
type Allocation struct {
	ID       string
	Resource string
	Devices  []string
	// PCI is the NIC's PCI address: its devices get device-info files
	// for CNI meta-plugins; "" (a virtual netdev) none.
	PCI    string
	Env    map[string]string
	Mounts []*pluginapi.Mount
}

// PluginsConfig configures the pools' plugins.
type PluginsConfig struct {
	// Dir and RegistryDir are Config's, for every pool's plugin; a
	// RegistryDir that is not a directory is none (a kubelet without
	// its plugin watcher).
	Dir, RegistryDir string
	// DeviceInfoDir is where device-info files are written; "" means
	// DeviceInfoDir.
	DeviceInfoDir string
	Logger        *slog.Logger
}

// Plugins is the device plugin face of the daemon: one Plugin a pool
// the core has them serve, run in the daemon's group (a plugin that
// fails stops the daemon), kubelet's Allocate answered through the core
// and the device-info files written and removed. Its mutex guards the
// running set alone and is never held across a call out.
type Plugins struct {
	cfg  PluginsConfig
	log  *slog.Logger
	core Core

	mu       sync.Mutex
	running  map[string]*running // by pool
	group    *errgroup.Group     // Use's
	groupCtx context.Context
}

// running is a pool's running plugin.
type running struct {
	resource string
	p        *Plugin
	cancel   context.CancelFunc
	done     chan struct{} // closed when it stopped serving
}

// stop stops the plugin and waits until it no longer serves.
func (r *running) stop() {
	r.cancel()
	<-r.done
}

// NewPlugins returns the face; Use gives it the group its plugins run in.
func NewPlugins(cfg PluginsConfig, core Core) *Plugins {
	if cfg.DeviceInfoDir == "" {
		cfg.DeviceInfoDir = DeviceInfoDir
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Plugins{cfg: cfg, log: cfg.Logger, core: core, running: map[string]*running{}}
}

// Use has the plugins started from now on run in g, under ctx.
func (ps *Plugins) Use(ctx context.Context, g *errgroup.Group) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.group, ps.groupCtx = g, ctx
}

// start runs a pool's device plugin.
func (ps *Plugins) start(pool, resource string) *running {
	registry := ps.cfg.RegistryDir
	if st, err := os.Stat(registry); registry != "" && (err != nil || !st.IsDir()) {
		registry = "" // no plugin watcher on this kubelet
	}
	p := New(Config{Resource: resource, Dir: ps.cfg.Dir, RegistryDir: registry, Logger: ps.log,
		Devices: func() []Device { return ps.core.Devices(pool) },
		Allocate: func(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
			return ps.Allocate(ctx, pool, ids)
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
	return &running{resource: resource, p: p, cancel: cancel, done: done}
}

// Sync runs one plugin per pool the core has them serve: a pool added
// gets one, a pool gone loses it, a pool whose resource name changed gets
// a new one; all send their devices again. One goroutine calls it (the
// daemon's reconciler, as the core tells it the pools changed).
func (ps *Plugins) Sync() {
	want := ps.core.Pools()
	ps.mu.Lock()
	run := maps.Clone(ps.running)
	ps.mu.Unlock()
	for name, pl := range run {
		if want[name] != pl.resource {
			pl.stop()
			delete(run, name)
			ps.log.Info("device plugin stopped", "pool", name, "resource", pl.resource)
		}
	}
	for name, resource := range want {
		if run[name] == nil {
			run[name] = ps.start(name, resource)
		}
	}
	ps.mu.Lock()
	ps.running = run
	ps.mu.Unlock()
	for _, pl := range run {
		pl.p.Changed()
	}
}

// Changed has every plugin send its devices again (a netdev's state, and
// so its devices' health, changed).
func (ps *Plugins) Changed() {
	ps.mu.Lock()
	var all []*Plugin
	for _, pl := range ps.running {
		all = append(all, pl.p)
	}
	ps.mu.Unlock()
	for _, p := range all {
		p.Changed()
	}
}

// Allocate answers kubelet's Allocate for pool: the core's allocation of the
// devices, what the container gets of it, and the devices' device-info
// files (a PCI NIC's).
func (ps *Plugins) Allocate(ctx context.Context, pool string, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	a, err := ps.core.Allocate(ctx, pool, ids)
	if err != nil {
		return nil, err
	}
	if a.PCI != "" {
		for _, id := range a.Devices {
			if err := WriteDeviceInfo(ps.cfg.DeviceInfoDir, a.Resource, id, a.PCI); err != nil {
				ps.log.Warn("device info", "device", id, "err", err)
			}
		}
	}
	return &pluginapi.ContainerAllocateResponse{Envs: a.Env, Mounts: a.Mounts}, nil
}

// Unserved removes the device-info files of devices of resource whose
// allocation is no longer served.
func (ps *Plugins) Unserved(resource string, devices []string) {
	for _, dev := range devices {
		if err := RemoveDeviceInfo(ps.cfg.DeviceInfoDir, resource, dev); err != nil {
			ps.log.Warn("device-info file of a freed device left", "device", dev, "err", err)
		}
	}
}
