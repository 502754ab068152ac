// Package daemon is the xdpq node daemon: it keeps the pool configuration
// in force (pkg/config), finds the netdevs (pkg/nic), has the node agent
// manage them (pkg/agent), serves allocations through the socket broker
// (pkg/broker), and offers the pools to kubelet as device plugins
// (pkg/deviceplugin) or, standalone, to local processes through a small
// API on a Unix socket (xdpqctl).
package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/deviceplugin"
	"github.com/xdpq/xdpq/pkg/nic"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// Options configure the daemon; cmd/deviceplugin sets them from flags.
type Options struct {
	ConfigPath string
	NodeName   string
	NodeLabels map[string]string
	// NetNS is the network namespace of the NICs; "" for the daemon's own.
	NetNS string
	// SysRoot is sysfs for discovery; "" means /sys, or with NetNS a
	// sysfs the daemon mounts from inside that namespace.
	SysRoot   string
	PinDir    string // agent pins; "" means /sys/fs/bpf/xdpq
	StateDir  string // agent state; "" means /run/xdpq/agent
	AllocDir  string // one broker directory per allocation; "" means /run/xdpq/alloc
	PluginDir string // kubelet's device plugin directory (Kubernetes mode)
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
	// Standalone serves the local API at APISocket instead of kubelet.
	Standalone bool
	APISocket  string
	Logger     *slog.Logger
}

// Allocation, Status and PoolStatus are the API's.
type (
	Allocation = api.Allocation
	Status     = api.Status
	PoolStatus = api.PoolStatus
)

// Daemon is the running node daemon.
type Daemon struct {
	opts    Options
	log     *slog.Logger
	agent   *agent.Agent
	broker  *broker.Server
	watcher *config.Watcher
	unmount func()

	plugins sync.WaitGroup // device plugin goroutines; Run waits for them

	mu          sync.Mutex // guards everything below
	cfg         *config.Config
	pools       map[string]*pool
	allocs      map[string]*Allocation
	attachments map[string]Attachment // CNI attachments by "containerID/ifName"
	managed     map[string]bool       // netdevs under the agent
	moved       map[string]*moved     // netdev-mode pools' netdevs in pods, by node name
	discovered  map[string]nic.Netdev // the netdevs of the last config applied, moved ones included
}

type pool struct {
	cfg      config.Pool
	resource string
	devices  []deviceplugin.Device
	used     map[string]string // device id -> allocation id
	plugin   *deviceplugin.Plugin
	stop     context.CancelFunc
}

// New starts the parts that need no context: agent, broker, config.
func New(opts Options) (*Daemon, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.AllocDir == "" {
		opts.AllocDir = "/run/xdpq/alloc"
	}
	d := &Daemon{opts: opts, log: opts.Logger, pools: map[string]*pool{}, allocs: map[string]*Allocation{},
		attachments: map[string]Attachment{}, managed: map[string]bool{}, moved: map[string]*moved{},
		discovered: map[string]nic.Netdev{}}
	ok := false
	defer func() {
		if !ok {
			d.close()
		}
	}()
	if opts.NetNS != "" && opts.SysRoot == "" {
		if err := d.mountSysfs(); err != nil {
			return nil, err
		}
	}
	var err error
	d.agent, err = agent.New(agent.Config{NetNS: opts.NetNS, PinDir: opts.PinDir, StateDir: opts.StateDir,
		Logger: opts.Logger, OnChange: d.devicesChanged})
	if err != nil {
		return nil, err
	}
	d.broker = broker.NewServer(broker.Config{Logger: opts.Logger}, d.agent)
	if err := os.MkdirAll(opts.AllocDir, 0o755); err != nil {
		return nil, err
	}
	d.loadMoved()
	d.watcher, err = config.NewWatcher(opts.ConfigPath, opts.Logger)
	if err != nil {
		return nil, err
	}
	if err := d.apply(d.watcher.Current()); err != nil {
		return nil, err
	}
	d.restore()
	d.mu.Lock()
	d.loadAttachments()
	d.adoptMovedLocked()
	for _, att := range d.attachments {
		if att.PodUID != "" {
			d.broker.SetOwner(att.AllocationID, broker.Owner{PodUID: att.PodUID})
		}
	}
	d.mu.Unlock()
	ok = true
	return d, nil
}

// record is what survives a daemon restart of an allocation: a file next
// to (not in) the directory the allocation's container mounts.
type record struct {
	Allocation
	Devices []string     `json:"devices"`
	Owner   broker.Owner `json:"owner"`
}

func (d *Daemon) recordPath(id string) string { return filepath.Join(d.opts.AllocDir, id+".json") }

// restore serves again the allocations a previous daemon made, at the same
// paths: a running container's mount of its directory then sees the
// socket come back, and its client connects again. An allocation whose
// pool or queues are gone is removed; in Kubernetes mode so is one whose
// devices kubelet says no running container holds (when kubelet cannot be
// asked, all are kept: losing a live pod's socket is worse).
func (d *Daemon) restore() {
	files, _ := filepath.Glob(filepath.Join(d.opts.AllocDir, "*.json"))
	var held map[string]bool
	if !d.opts.Standalone && len(files) > 0 {
		var err error
		if held, err = d.heldDevices(context.Background()); err != nil {
			d.log.Warn("cannot ask kubelet which devices are in use; restoring every allocation", "err", err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, f := range files {
		var r record
		b, err := os.ReadFile(f)
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		p := d.pools[r.Pool]
		if err == nil && p == nil {
			err = fmt.Errorf("pool %q is gone", r.Pool)
		}
		if err == nil && held != nil && !d.heldBy(held, p.resource, r.Devices) {
			err = fmt.Errorf("kubelet says no running container holds %v", r.Devices)
		}
		if err == nil {
			_, err = d.allocAt(p, r.Devices, r.Owner, r.ID, r.Created)
		}
		if err != nil {
			d.log.Warn("allocation not restored; removing it", "record", f, "err", err)
			os.Remove(f)
			os.RemoveAll(strings.TrimSuffix(f, ".json"))
			continue
		}
		d.log.Info("allocation restored", "allocation", r.ID, "devices", r.Devices)
	}
}

// mountSysfs mounts a sysfs that shows the NICs' namespace.
func (d *Daemon) mountSysfs() error {
	dir, err := os.MkdirTemp("", "xdpq-sysfs-")
	if err != nil {
		return err
	}
	if err := ns.WithNetNSPath(d.opts.NetNS, func(ns.NetNS) error { return unix.Mount("sysfs", dir, "sysfs", 0, "") }); err != nil {
		os.Remove(dir)
		return fmt.Errorf("sysfs of %s: %w", d.opts.NetNS, err)
	}
	d.opts.SysRoot = dir
	d.unmount = func() { unix.Unmount(dir, unix.MNT_DETACH); os.Remove(dir) }
	return nil
}

// apply puts a config in force: pools are (re)computed from the netdevs
// found now; netdevs newly pooled are managed; queues in use stay with
// their allocations even when a shrink took them out of the pool.
func (d *Daemon) apply(c *config.Config) error {
	netdevs, err := (nic.Discoverer{SysRoot: d.opts.SysRoot, NetNS: d.opts.NetNS}).List()
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// A netdev inside a pod is not on the node now, but still the pool's.
	for name, m := range d.moved {
		if !slices.ContainsFunc(netdevs, func(n nic.Netdev) bool { return n.Name == name }) {
			netdevs = append(netdevs, m.Device)
		}
	}
	pools := c.ForNode(d.opts.NodeName, d.opts.NodeLabels)
	res, problems := config.Resolve(pools, netdevs)
	for _, p := range problems {
		d.log.Warn("pool", "problem", p)
	}
	d.discovered = map[string]nic.Netdev{}
	for _, n := range netdevs {
		d.discovered[n.Name] = n
	}
	// Manage every netdev a pool uses, with the first pool's policy.
	policies := map[string]agent.Policy{}
	for _, r := range res {
		if _, ok := policies[r.Netdev.Name]; ok {
			continue
		}
		p := poolByName(pools, r.Pool)
		pol := agent.Policy{Steering: agent.Steering(p.Steering), AttachAlways: p.Attach == "always", Exclusive: p.Exclusive}
		if pol.Steering == agent.SteerHardware || pol.Steering == agent.SteerAuto {
			pol.Reserved = reservedOn(res, r.Netdev.Name)
		}
		policies[r.Netdev.Name] = pol
	}
	for name, pol := range policies {
		if d.managed[name] || d.moved[name] != nil {
			continue
		}
		if err := d.agent.Manage(name, pol); err != nil {
			return fmt.Errorf("manage %s: %w", name, err)
		}
		d.managed[name] = true
	}
	next := map[string]*pool{}
	for _, pc := range pools {
		p := d.pools[pc.Name]
		if p == nil {
			p = &pool{used: map[string]string{}}
		}
		p.cfg, p.resource, p.devices = pc, c.Resource(pc), nil
		for _, r := range res {
			if r.Pool != pc.Name {
				continue
			}
			healthy := r.Netdev.OperUp || r.Netdev.Virtual
			if pc.Mode == api.ModeNetdev {
				p.devices = append(p.devices, deviceplugin.Device{ID: r.Netdev.Name, Netdev: r.Netdev.Name, Queue: r.Queues[0],
					Queues: r.Queues, NUMA: r.Netdev.NUMANode, PCI: r.Netdev.PCI, Healthy: healthy})
				continue
			}
			for _, q := range r.Queues {
				p.devices = append(p.devices, deviceplugin.Device{ID: deviceplugin.DeviceID(r.Netdev.Name, q),
					Netdev: r.Netdev.Name, Queue: q, NUMA: r.Netdev.NUMANode, PCI: r.Netdev.PCI, Healthy: healthy})
			}
		}
		next[pc.Name] = p
	}
	for name, p := range d.pools {
		if next[name] == nil {
			if len(p.used) > 0 {
				d.log.Info("pool removed from the config; it goes once its allocations are freed", "pool", name)
				p.devices = nil
				next[name] = p
			} else if p.stop != nil {
				p.stop()
			}
		}
	}
	d.pools, d.cfg = next, c
	for _, p := range d.pools {
		if p.plugin != nil {
			p.plugin.Changed()
		}
	}
	return nil
}

func poolByName(pools []config.Pool, name string) config.Pool {
	for _, p := range pools {
		if p.Name == name {
			return p
		}
	}
	return config.Pool{}
}

func reservedOn(res []config.Reservation, netdev string) []uint32 {
	var out []uint32
	for _, r := range res {
		if r.Netdev.Name == netdev {
			out = append(out, r.Queues...)
		}
	}
	slices.Sort(out)
	return out
}

// Alloc hands count queues of a pool to a local user (standalone mode).
func (d *Daemon) Alloc(poolName string, count int, uid uint32) (*Allocation, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pools[poolName]
	if p == nil {
		return nil, fmt.Errorf("no pool %q (pools: %s)", poolName, strings.Join(d.poolNames(), ", "))
	}
	var free []deviceplugin.Device
	for _, dev := range p.devices {
		if p.used[dev.ID] == "" {
			free = append(free, dev)
		}
	}
	ids := deviceplugin.Prefer(free, nil, count)
	if count < 1 || len(ids) < count {
		return nil, fmt.Errorf("pool %s: %d queues asked, %d free", poolName, count, len(ids))
	}
	return d.allocLocked(p, ids, broker.Owner{UID: &uid}, "")
}

// allocLocked creates the broker allocation of devices ids of pool p, with
// a new id unless one is given (a restored allocation), and records it.
func (d *Daemon) allocLocked(p *pool, ids []string, owner broker.Owner, id string) (*Allocation, error) {
	return d.allocAt(p, ids, owner, id, time.Now())
}

func (d *Daemon) allocAt(p *pool, ids []string, owner broker.Owner, id string, created time.Time) (*Allocation, error) {
	byID := map[string]deviceplugin.Device{}
	for _, dev := range p.devices {
		byID[dev.ID] = dev
	}
	netdev := byID[ids[0]].Netdev
	var queues []uint32
	for _, id := range ids {
		dev, ok := byID[id]
		if !ok {
			return nil, fmt.Errorf("device %s is not in pool %s", id, p.cfg.Name)
		}
		if dev.Netdev != netdev {
			return nil, fmt.Errorf("devices %v span netdevs %s and %s; an allocation is on one netdev", ids, netdev, dev.Netdev)
		}
		if a := p.used[id]; a != "" {
			return nil, fmt.Errorf("device %s is in use by allocation %s", id, a)
		}
		if dev.Queues != nil {
			queues = append(queues, dev.Queues...)
		} else {
			queues = append(queues, dev.Queue)
		}
	}
	sort.Slice(queues, func(i, j int) bool { return queues[i] < queues[j] })
	if id == "" {
		b := make([]byte, 6)
		rand.Read(b)
		id = p.cfg.Name + "-" + hex.EncodeToString(b)
	}
	l := p.cfg.Limits
	ba := broker.Allocation{ID: id, Netdev: d.netdev(netdev), Queues: queues, Owner: owner,
		Limits: broker.Limits{MaxUMEM: l.MaxUMEMBytes, MaxRing: l.MaxRing, AllowTX: p.cfg.AllowTX, MaxQueue: l.MaxQueuesPerPod},
		Dir:    filepath.Join(d.opts.AllocDir, id)}
	if err := d.broker.Add(ba); err != nil {
		return nil, err
	}
	for _, idv := range ids {
		p.used[idv] = id
	}
	a := &Allocation{ID: id, Pool: p.cfg.Name, Netdev: netdev, Queues: queues, Socket: ba.SocketPath(), UID: owner.UID,
		Created: created, Devices: ids}
	rec, _ := json.Marshal(record{Allocation: *a, Devices: ids, Owner: owner})
	if err := os.WriteFile(d.recordPath(id), rec, 0o600); err != nil {
		d.broker.Remove(id)
		for _, idv := range ids {
			delete(p.used, idv)
		}
		return nil, fmt.Errorf("record allocation %s: %w", id, err)
	}
	d.allocs[id] = a
	d.log.Info("allocated", "allocation", id, "pool", p.cfg.Name, "netdev", netdev, "queues", queues)
	return a, nil
}

func (d *Daemon) netdev(name string) xsk.Netdev {
	for _, s := range d.agent.Status() {
		if s.Netdev == name {
			return xsk.Netdev{Name: name, Ifindex: s.Ifindex, NetNS: d.opts.NetNS}
		}
	}
	return xsk.Netdev{Name: name, NetNS: d.opts.NetNS}
}

// Free ends an allocation: its lease (if any) ends, its queues are free.
func (d *Daemon) Free(id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.freeLocked(id, nil)
}

// freeLocked frees an allocation. Its CNI attachments end with it, unless
// keep is given: they are then left in place and returned in it, for the
// allocation that succeeds it.
func (d *Daemon) freeLocked(id string, keep map[string]Attachment) error {
	a := d.allocs[id]
	if a == nil {
		return fmt.Errorf("no allocation %q", id)
	}
	delete(d.allocs, id)
	if p := d.pools[a.Pool]; p != nil {
		for dev, owner := range p.used {
			if owner == id {
				delete(p.used, dev)
				if !d.opts.Standalone {
					deviceplugin.RemoveDeviceInfo(d.devInfoDir(), p.resource, dev)
				}
			}
		}
	}
	// Its CNI attachments go with it: their flows must not reach the
	// queues' next holder.
	var errs []error
	for k, att := range d.attachments {
		if att.AllocationID == id && keep != nil {
			keep[k] = att
		} else if att.AllocationID == id {
			errs = append(errs, d.detachLocked(k, att))
			d.log.Info("detached with its allocation", "container", att.ContainerID, "ifname", att.IfName, "allocation", id)
		}
	}
	if len(errs) > 0 {
		d.saveAttachmentsLocked()
	}
	errs = append(errs, d.broker.Remove(id))
	err := errors.Join(errs...)
	os.RemoveAll(filepath.Join(d.opts.AllocDir, id))
	os.Remove(d.recordPath(id))
	d.log.Info("freed", "allocation", id)
	return err
}

// Status reports the daemon's state.
func (d *Daemon) Status() Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	var s Status
	for _, name := range d.poolNames() {
		p := d.pools[name]
		s.Pools = append(s.Pools, PoolStatus{Name: name, Resource: p.resource, Queues: len(p.devices), Free: len(p.devices) - len(p.used)})
	}
	for _, a := range d.allocs {
		s.Allocations = append(s.Allocations, *a)
	}
	sort.Slice(s.Allocations, func(i, j int) bool { return s.Allocations[i].ID < s.Allocations[j].ID })
	for _, n := range d.statusLocked() {
		s.Netdevs = append(s.Netdevs, api.NetdevStatus{Netdev: n.Netdev, State: string(n.State), Mode: n.Mode.String(),
			Steering: string(n.Steering), Flows: n.Flows, Sockets: n.Sockets, LinkUp: n.LinkUp, Reason: n.Reason})
	}
	if err := d.watcher.LastError(); err != nil {
		s.ConfigError = err.Error()
	}
	return s
}

func (d *Daemon) poolNames() []string {
	var out []string
	for n := range d.pools {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Run runs the agent, the config watcher, and the local API (standalone)
// or the device plugins (Kubernetes) until ctx ends, then stops them. What
// is attached and pinned stays: traffic keeps flowing while the daemon is
// away.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.close()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	run := func(f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil {
				errs <- err
			}
		}()
	}
	run(d.agent.Run)
	run(func(ctx context.Context) error { return d.watcher.Run(ctx, d.apply) })
	run(d.serveAPI)
	if !d.opts.Standalone {
		d.startPlugins(ctx)
	}
	run(func(ctx context.Context) error {
		period := d.opts.CollectPeriod
		if period == 0 {
			period = 30 * time.Second
		}
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				d.collectAttachments()
				if !d.opts.Standalone {
					d.collect(ctx, period)
				}
			}
		}
	})
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	wg.Wait()
	d.mu.Lock()
	for _, p := range d.pools {
		if p.stop != nil {
			p.stop()
		}
	}
	d.mu.Unlock()
	d.plugins.Wait()
	return err
}

// Reload reads the config file again and applies it, changed or not
// (cmd/deviceplugin calls it on SIGHUP).
func (d *Daemon) Reload(ctx context.Context) error { return d.watcher.Reload(ctx) }

// startPlugins starts one device plugin per pool (Kubernetes mode).
func (d *Daemon) startPlugins(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, p := range d.pools {
		if p.plugin != nil {
			continue
		}
		registry := d.opts.RegistryDir
		if st, err := os.Stat(registry); registry != "" && (err != nil || !st.IsDir()) {
			registry = "" // no plugin watcher on this kubelet
		}
		p.plugin = deviceplugin.New(deviceplugin.Config{Resource: p.resource, Dir: d.opts.PluginDir, RegistryDir: registry, Logger: d.log,
			Devices: func() []deviceplugin.Device { return d.devices(name) },
			Allocate: func(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
				return d.allocate(name, ids)
			}})
		pctx, cancel := context.WithCancel(ctx)
		p.stop = cancel
		d.plugins.Add(1)
		go func() {
			defer d.plugins.Done()
			if err := p.plugin.Run(pctx); err != nil {
				d.log.Error("device plugin stopped", "pool", name, "err", err)
			}
		}()
	}
}

func (d *Daemon) devices(poolName string) []deviceplugin.Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pools[poolName]
	if p == nil {
		return nil
	}
	// Unhealthy: the link is down, the queue is gone, the netdev is gone or
	// a foreign program owns its hook.
	type state struct {
		ok     bool
		queues int
	}
	health := map[string]state{}
	for _, s := range d.statusLocked() {
		health[s.Netdev] = state{s.LinkUp && s.State != agent.StateMissing && s.State != agent.StateOverridden, s.RXQueues}
	}
	out := slices.Clone(p.devices)
	for i := range out {
		h := health[out[i].Netdev]
		last := out[i].Queue
		if len(out[i].Queues) > 0 {
			last = slices.Max(out[i].Queues)
		}
		out[i].Healthy = h.ok && int(last) < h.queues
	}
	return out
}

// devicesChanged tells the device plugins to send their lists again.
func (d *Daemon) devicesChanged() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.pools {
		if p.plugin != nil {
			p.plugin.Changed()
		}
	}
}

// allocate answers kubelet's Allocate: a broker allocation for the
// devices, its directory mounted at /run/xdpq, and the environment.
func (d *Daemon) allocate(poolName string, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pools[poolName]
	if p == nil {
		return nil, fmt.Errorf("no pool %s", poolName)
	}
	// kubelet calls Allocate again for a container it restarts: free what
	// these devices were given before, and hand their pod's attachments
	// (its flows, its netdev) to the new allocation: CNI ADD does not run
	// again for a container restart.
	kept := map[string]Attachment{}
	for _, id := range ids {
		if old := p.used[id]; old != "" {
			d.freeLocked(old, kept)
		}
	}
	// No owner yet: kubelet does not say which pod this is; the directory,
	// mounted only into that container, is the boundary (see the package doc).
	a, err := d.allocLocked(p, ids, broker.Owner{AnyPod: true}, "")
	if err != nil {
		for k, att := range kept {
			d.detachLocked(k, att)
		}
		return nil, err
	}
	d.carryLocked(kept, a)
	// Device-info files for CNI plugins, where the NIC is a PCI device.
	for _, dev := range p.devices {
		if slices.Contains(ids, dev.ID) && dev.PCI != "" {
			if err := deviceplugin.WriteDeviceInfo(d.devInfoDir(), p.resource, dev.ID, dev.PCI); err != nil {
				d.log.Warn("device info", "device", dev.ID, "err", err)
			}
		}
	}
	env := strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(poolName))
	var qs []string
	for _, q := range a.Queues {
		qs = append(qs, fmt.Sprintf("%s:%d", a.Netdev, q))
	}
	return &pluginapi.ContainerAllocateResponse{
		Envs: map[string]string{
			"XDPQ_SOCKET":        "/run/xdpq/" + broker.SocketName,
			"XDPQ_QUEUES_" + env: strings.Join(qs, ","),
			"XDPQ_NETDEV_" + env: a.Netdev,
			"XDPQ_ALLOCATION":    a.ID,
		},
		Mounts: []*pluginapi.Mount{{ContainerPath: "/run/xdpq", HostPath: filepath.Join(d.opts.AllocDir, a.ID)}},
	}, nil
}

func (d *Daemon) devInfoDir() string {
	if d.opts.DeviceInfoDir != "" {
		return d.opts.DeviceInfoDir
	}
	return deviceplugin.DeviceInfoDir
}

func (d *Daemon) close() {
	if d.broker != nil {
		d.broker.Close()
	}
	d.closeMoved()
	if d.agent != nil {
		d.agent.Close()
	}
	if d.unmount != nil {
		d.unmount()
	}
}
