package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Device is one queue of the pool.
type Device struct {
	ID     string // "<netdev>-q<N>", at most 63 characters
	Netdev string
	Queue  uint32
	// Queues, in a netdev-mode pool, are all the netdev's queues: the
	// device is the whole netdev, its ID the netdev's name.
	Queues  []uint32
	NUMA    int    // -1 when unknown
	PCI     string // the NIC's PCI address, "" for a virtual netdev
	Healthy bool
}

// Config configures one pool's plugin.
type Config struct {
	// Resource is the extended resource, e.g. xdpq.io/upf.
	Resource string
	// Dir is kubelet's device plugin directory; "" means
	// /var/lib/kubelet/device-plugins.
	Dir string
	// RegistryDir, if set, is kubelet's plugin watcher directory
	// (/var/lib/kubelet/plugins_registry): the plugin then serves there,
	// answering kubelet's GetInfo, instead of registering on kubelet.sock.
	RegistryDir string
	// Devices returns the pool's devices now. What it returns changes
	// only when Changed is called (kubelet sees a new list then).
	Devices func() []Device
	// Allocate says what the container that gets these devices receives;
	// it refuses ids that are not devices of the pool (the daemon's
	// ledger does, in the same step that reserves them).
	Allocate func(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error)
	Logger   *slog.Logger
}

// Plugin is one pool's device plugin.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	cfg    Config
	log    *slog.Logger
	socket string

	mu      sync.Mutex // guards watches, index and gen
	watches map[chan struct{}]bool
	// index is Devices by ID for GetPreferredAllocation, built when first
	// needed after a change; gen counts the changes, so that an index
	// built from an older list is not kept.
	index map[string]Device
	gen   uint64
}

var _ pluginapi.DevicePluginServer = (*Plugin)(nil)

// New returns the pool's plugin; Run serves it.
func New(cfg Config) *Plugin {
	if cfg.Dir == "" {
		cfg.Dir = pluginapi.DevicePluginPath
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	name := "xdpq-" + filepath.Base(cfg.Resource) + ".sock"
	return &Plugin{cfg: cfg, log: cfg.Logger.With("resource", cfg.Resource),
		socket: filepath.Join(cfg.Dir, name), watches: map[chan struct{}]bool{}}
}

// Socket returns the path the plugin serves on.
func (p *Plugin) Socket() string { return p.socket }

// Changed tells every ListAndWatch stream to send the devices again.
func (p *Plugin) Changed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	p.index = nil
	for ch := range p.watches {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Run serves the plugin and registers it with kubelet, again whenever
// kubelet re-creates its socket, until ctx ends. With a RegistryDir it
// serves in that directory for kubelet's plugin watcher instead.
func (p *Plugin) Run(ctx context.Context) error {
	if p.cfg.RegistryDir != "" {
		return p.runWatched(ctx)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer func() { _ = w.Close() }() // an inotify fd that only reads: closing it loses nothing
	if err := os.MkdirAll(p.cfg.Dir, 0o755); err != nil {
		return err
	}
	if err := w.Add(p.cfg.Dir); err != nil {
		return fmt.Errorf("watch %s: %w", p.cfg.Dir, err)
	}
	kubelet := filepath.Join(p.cfg.Dir, filepath.Base(pluginapi.KubeletSocket))
	for {
		stop := p.serveRetry(ctx)
		if stop == nil {
			return nil
		}
		registered := p.register(ctx, kubelet) // the kubelet socket's inode, 0 if not registered
		retry := time.NewTicker(time.Second)
	wait:
		for {
			select {
			case <-ctx.Done():
				retry.Stop()
				stop()
				p.removeSocket()
				return nil
			case ev := <-w.Events:
				switch {
				case ev.Name == kubelet && ev.Op&fsnotify.Create != 0:
					// A new kubelet: it wiped the directory. Serve anew and
					// register, unless that is the kubelet registered with.
					if registered != 0 && inode(kubelet) == registered {
						continue
					}
					p.log.Info("kubelet socket re-created; registering again")
					break wait
				case ev.Name == p.socket && ev.Op&fsnotify.Remove != 0:
					// Our own restart removes and re-creates it: only a socket
					// that is still gone was taken away.
					if _, err := os.Stat(p.socket); err == nil {
						continue
					}
					p.log.Warn("plugin socket removed; serving again")
					break wait
				}
			case err := <-w.Errors:
				p.log.Error("watch device plugin directory", "err", err)
			case <-retry.C:
				if registered == 0 {
					registered = p.register(ctx, kubelet)
				}
			}
		}
		retry.Stop()
		stop()
	}
}

// runWatched serves the plugin in kubelet's plugin watcher directory;
// kubelet finds the socket, asks GetInfo and connects. A removed socket
// is served again.
func (p *Plugin) runWatched(ctx context.Context) error {
	p.socket = filepath.Join(p.cfg.RegistryDir, filepath.Base(p.socket))
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer func() { _ = w.Close() }() // an inotify fd that only reads: closing it loses nothing
	if err := w.Add(p.cfg.RegistryDir); err != nil {
		return fmt.Errorf("watch %s: %w", p.cfg.RegistryDir, err)
	}
	for {
		stop := p.serveRetry(ctx)
		if stop == nil {
			return nil
		}
		p.log.Info("serving for kubelet's plugin watcher", "socket", p.socket)
	wait:
		for {
			select {
			case <-ctx.Done():
				stop()
				p.removeSocket()
				return nil
			case ev := <-w.Events:
				if ev.Name == p.socket && ev.Op&fsnotify.Remove != 0 {
					if _, err := os.Stat(p.socket); err != nil {
						p.log.Warn("plugin socket removed; serving again")
						break wait
					}
				}
			case err := <-w.Errors:
				p.log.Error("watch plugin registry directory", "err", err)
			}
		}
		stop()
	}
}

// registration answers kubelet's plugin watcher.
type registration struct {
	registerapi.UnimplementedRegistrationServer
	p *Plugin
}

// GetInfo tells kubelet what the plugin is and where it serves.
func (r registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.DevicePlugin, Name: r.p.cfg.Resource,
		Endpoint: r.p.socket, SupportedVersions: []string{pluginapi.Version}}, nil
}

// NotifyRegistrationStatus is kubelet's word on the registration.
func (r registration) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		r.p.log.Info("registered with kubelet through its plugin watcher")
	} else {
		r.p.log.Error("kubelet refused the plugin", "err", s.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// serveRetry serves, trying again while it fails (kubelet may be wiping
// the directory right now), until it serves or ctx ends (nil).
func (p *Plugin) serveRetry(ctx context.Context) (stop func()) {
	for {
		stop, err := p.serve()
		if err == nil {
			return stop
		}
		p.log.Warn("serve device plugin (retrying)", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// serve starts the gRPC server on the plugin socket and checks that it
// answers before anything registers it.
func (p *Plugin) serve() (stop func(), err error) {
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("device plugin %s: remove the old socket: %w", p.cfg.Resource, err)
	}
	ln, err := net.Listen("unix", p.socket)
	if err != nil {
		return nil, fmt.Errorf("device plugin %s: %w", p.cfg.Resource, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	if p.cfg.RegistryDir != "" {
		registerapi.RegisterRegistrationServer(srv, registration{p: p})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// nil after Stop; an error of the listener shows in the probe
		// below or as kubelet's failed calls, logged here for the cause.
		if err := srv.Serve(ln); err != nil {
			p.log.Warn("device plugin server stopped", "socket", p.socket, "err", err)
		}
	}()
	conn, err := grpc.NewClient("unix://"+p.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
		cancel()
		_ = conn.Close() // a probe's connection: its one call is answered or failed
	}
	if err != nil {
		srv.Stop()
		<-done
		return nil, fmt.Errorf("device plugin %s does not answer on %s: %w", p.cfg.Resource, p.socket, err)
	}
	return func() {
		srv.Stop()
		<-done
	}, nil
}

// removeSocket removes the plugin's socket when it stops serving. One
// left behind is only stale: kubelet's next dial fails, and the next
// serve removes it; it is logged, as nothing else can be done.
func (p *Plugin) removeSocket() {
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		p.log.Warn("remove the device plugin socket", "socket", p.socket, "err", err)
	}
}

// register registers with the kubelet at socket kubelet and returns the
// inode of that socket, or 0 when it did not register.
func (p *Plugin) register(ctx context.Context, kubelet string) uint64 {
	ino := inode(kubelet)
	if ino == 0 {
		return 0
	}
	conn, err := grpc.NewClient("unix://"+kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0
	}
	defer func() { _ = conn.Close() }() // its one call is answered or failed
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.cfg.Resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		p.log.Warn("register with kubelet (retrying every second)", "err", err)
		return 0
	}
	p.log.Info("registered with kubelet", "endpoint", filepath.Base(p.socket))
	return ino
}

func inode(path string) uint64 {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	return st.Ino
}

// GetDevicePluginOptions says the plugin answers GetPreferredAllocation.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch sends the devices now and whenever they change.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	ch := make(chan struct{}, 1)
	p.mu.Lock()
	p.watches[ch] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.watches, ch)
		p.mu.Unlock()
	}()
	for {
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: toAPI(p.cfg.Devices())}); err != nil {
			return err
		}
		select {
		case <-s.Context().Done():
			return nil
		case <-ch:
		}
	}
}

func toAPI(ds []Device) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(ds))
	for _, d := range ds {
		h := pluginapi.Unhealthy
		if d.Healthy {
			h = pluginapi.Healthy
		}
		dev := &pluginapi.Device{ID: d.ID, Health: h}
		if d.NUMA >= 0 {
			dev.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(d.NUMA)}}}
		}
		out = append(out, dev)
	}
	return out
}

// GetPreferredAllocation prefers queues of one netdev, contiguous, on the
// NUMA node of what must be included.
func (p *Plugin) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	byID := p.byID()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range r.ContainerRequests {
		avail := make([]Device, 0, len(cr.AvailableDeviceIDs))
		var must []Device
		for _, id := range cr.AvailableDeviceIDs {
			if d, ok := byID[id]; ok {
				avail = append(avail, d)
			}
		}
		for _, id := range cr.MustIncludeDeviceIDs {
			if d, ok := byID[id]; ok {
				must = append(must, d)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses,
			&pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: Prefer(avail, must, int(cr.AllocationSize))})
	}
	return resp, nil
}

// byID is the devices by ID as kubelet was last told them. Kubelet asks
// for a preferred allocation before every pod it admits, offering every
// free device, so the index is kept until the devices change.
func (p *Plugin) byID() map[string]Device {
	p.mu.Lock()
	index, gen := p.index, p.gen
	p.mu.Unlock()
	if index != nil {
		return index
	}
	devs := p.cfg.Devices()
	index = make(map[string]Device, len(devs))
	for _, d := range devs {
		index[d.ID] = d
	}
	p.mu.Lock()
	if p.gen == gen {
		p.index = index
	}
	p.mu.Unlock()
	return index
}

// Allocate checks that every device is the pool's and asks the daemon
// what the container gets.
func (p *Plugin) Allocate(ctx context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range r.ContainerRequests {
		c, err := p.cfg.Allocate(ctx, cr.DevicesIds)
		if err != nil {
			return nil, fmt.Errorf("allocate %v of %s: %w", cr.DevicesIds, p.cfg.Resource, err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, c)
	}
	return resp, nil
}

// PreStartContainer is not used (the options do not ask for it).
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
