package deviceplugin

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/xdpq/xdpq/internal/testing/kubelettest"
)

// fakeCore is the allocation core as the face sees it: pools, devices,
// and an allocation it records (or the error it is told to answer).
type fakeCore struct {
	mu     sync.Mutex
	pools  map[string]string
	alloc  Allocation
	err    error
	asked  [][]string // each Allocate's pool and ids
	health bool
}

func (f *fakeCore) Pools() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.pools)
}

func (f *fakeCore) Devices(pool string) []Device {
	f.mu.Lock()
	defer f.mu.Unlock()
	return []Device{{ID: pool + "-q0", Netdev: pool, NUMA: -1, Healthy: f.health}}
}

func (f *fakeCore) Allocate(_ context.Context, pool string, ids []string) (Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, append([]string{pool}, ids...))
	return f.alloc, f.err
}

// TestPluginsAllocate: kubelet's Allocate through the face is the
// core's allocation, the container's environment and mounts as the core
// says, and device-info files for a PCI NIC's devices (none for a
// virtual one), which Unserved removes; the core's refusal is kubelet's
// answer as it is.
func TestPluginsAllocate(t *testing.T) {
	info := t.TempDir()
	core := &fakeCore{alloc: Allocation{ID: "upf-1", Resource: "xdpq.io/upf", Devices: []string{"eth1-q2", "eth1-q3"}, PCI: "0000:3b:00.1",
		Env: map[string]string{"XDPQ_ALLOCATION": "upf-1"}, Mounts: []*pluginapi.Mount{{ContainerPath: "/run/xdpq", HostPath: "/run/xdpq/alloc/upf-1"}}}}
	ps := NewPlugins(PluginsConfig{DeviceInfoDir: info, Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}, core)
	ctx := context.Background()
	resp, err := ps.Allocate(ctx, "upf", []string{"eth1-q2", "eth1-q3"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Envs["XDPQ_ALLOCATION"] != "upf-1" || len(resp.Mounts) != 1 || resp.Mounts[0].HostPath != "/run/xdpq/alloc/upf-1" {
		t.Errorf("response %+v; want the core's environment and mounts", resp)
	}
	if !slices.Equal(core.asked[0], []string{"upf", "eth1-q2", "eth1-q3"}) {
		t.Errorf("the core was asked %v", core.asked)
	}
	files := func() []string {
		var out []string
		for _, dev := range []string{"eth1-q2", "eth1-q3"} {
			if _, err := os.Stat(DeviceInfoPath(info, "xdpq.io/upf", dev)); err == nil {
				out = append(out, dev)
			}
		}
		return out
	}
	if got := files(); !slices.Equal(got, []string{"eth1-q2", "eth1-q3"}) {
		t.Errorf("device-info files of %v; want both devices'", got)
	}
	ps.Unserved("xdpq.io/upf", []string{"eth1-q2", "eth1-q3"})
	if got := files(); len(got) > 0 {
		t.Errorf("unserved, and the device-info files of %v remain", got)
	}

	core.alloc.PCI = "" // a veth
	if _, err := ps.Allocate(ctx, "upf", []string{"eth1-q2"}); err != nil {
		t.Fatal(err)
	}
	if got := files(); len(got) > 0 {
		t.Errorf("a virtual netdev's devices got device-info files %v", got)
	}
	refused := errors.New("pool upf: 2 queues asked, 1 free")
	core.err = refused
	if _, err := ps.Allocate(ctx, "upf", []string{"eth1-q2"}); !errors.Is(err, refused) {
		t.Errorf("allocate the core refuses: %v; want its refusal", err)
	}
}

// TestPluginsSync: one plugin per pool the core has them serve, each
// registered with kubelet under its resource; a pool gone stops its
// plugin (its socket goes), a renamed resource gets a new one, and a
// plugin serves the core's devices.
func TestPluginsSync(t *testing.T) {
	dir := t.TempDir()
	k := kubelettest.Start(t, dir)
	core := &fakeCore{pools: map[string]string{"upf": "xdpq.io/upf", "dns": "xdpq.io/dns"}, health: true}
	ps := NewPlugins(PluginsConfig{Dir: dir, DeviceInfoDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}, core)
	ctx, cancel := context.WithCancel(context.Background())
	g, gctx := errgroup.WithContext(ctx)
	ps.Use(gctx, g)
	defer func() {
		cancel()
		if err := g.Wait(); err != nil {
			t.Error(err)
		}
	}()
	registered := func(n int) []string {
		t.Helper()
		var got []string
		for range n {
			select {
			case r := <-k.Registrations:
				got = append(got, r.ResourceName)
			case <-time.After(10 * time.Second):
				t.Fatalf("registrations %v; want %d", got, n)
			}
		}
		slices.Sort(got)
		return got
	}
	ps.Sync()
	if got := registered(2); !slices.Equal(got, []string{"xdpq.io/dns", "xdpq.io/upf"}) {
		t.Fatalf("registered %v; want both pools' resources", got)
	}
	stream, err := kubelettest.Dial(t, filepath.Join(dir, "xdpq-upf.sock")).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := stream.Recv(); err != nil || len(l.Devices) != 1 || l.Devices[0].ID != "upf-q0" || l.Devices[0].Health != pluginapi.Healthy {
		t.Fatalf("upf's devices %v (%v); want the core's", l, err)
	}
	core.mu.Lock()
	core.pools = map[string]string{"upf": "xdpq.io/upf-v2"}
	core.health = false
	core.mu.Unlock()
	ps.Sync()
	if got := registered(1); !slices.Equal(got, []string{"xdpq.io/upf-v2"}) {
		t.Fatalf("registered %v after the rename; want the new resource alone", got)
	}
	for _, gone := range []string{"xdpq-dns.sock", "xdpq-upf.sock"} {
		if _, err := os.Stat(filepath.Join(dir, gone)); err == nil {
			t.Errorf("%s is still there: its plugin was to stop", gone)
		}
	}
	ps.Changed()
	stream, err = kubelettest.Dial(t, filepath.Join(dir, "xdpq-upf-v2.sock")).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := stream.Recv(); err != nil || len(l.Devices) != 1 || l.Devices[0].Health != pluginapi.Unhealthy {
		t.Fatalf("upf's devices after the change %v (%v); want the core's, unhealthy now", l, err)
	}
}
