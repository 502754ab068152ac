// Package devicemanager tests xdpq's device plugins against the device
// manager of kubelet v1.37.2 itself (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager).
// It is in the e2e module, not the main one, so that the main module does
// not depend on k8s.io/kubernetes; there it shares the versions, and so
// the build cache, of the e2e cluster's kubelet: make test builds it as
// make e2e-binaries builds kubelet (CGO_ENABLED=0, -trimpath), so the
// kubelet's packages are compiled once for both. It needs root: the
// device manager serves on the fixed /var/lib/kubelet/device-plugins and
// removes the sockets there on Start. make e2e leaves it to make test.
package devicemanager

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/daemon"
	"github.com/xdpq/xdpq/pkg/xdp"
)

type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

const resourceName = "xdpq.io/dns"

func startManager(t *testing.T, pods func() []*v1.Pod) *devicemanager.ManagerImpl {
	t.Helper()
	logger := klog.Background()
	m, err := devicemanager.NewManagerImpl(logger, nil, topologymanager.NewFakeManager(logger))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(logger, pods, sourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		t.Fatal(err)
	}
	return m
}

// waitCapacity waits until the manager reports n allocatable devices.
func waitCapacity(t *testing.T, m *devicemanager.ManagerImpl, n int64, what string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		_, alloc, _ := m.GetCapacity(klog.Background())
		if q, ok := alloc[v1.ResourceName(resourceName)]; ok && q.Value() == n {
			return time.Since(start)
		}
		if time.Since(start) > 15*time.Second {
			t.Fatalf("%s: allocatable %v, want %s: %d", what, alloc, resourceName, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// setup makes the node (a veth NIC in a netns), a pin directory on
// bpffs, a scratch directory, and a device-plugins directory without a
// checkpoint: the manager restores allocations from it.
func setup(t *testing.T) (*testnet.Pair, string, string) {
	t.Helper()
	testnet.RequireRoot(t)
	p := testnet.NewPair(t, 4)
	if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
		t.Fatal(err)
	}
	pins, err := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-kubelet-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pins) })
	if err := os.MkdirAll(pluginapi.DevicePluginPath, 0o755); err != nil {
		t.Fatal(err)
	}
	checkpoint := filepath.Join(pluginapi.DevicePluginPath, "kubelet_internal_checkpoint")
	os.Remove(checkpoint)
	t.Cleanup(func() { os.Remove(checkpoint) })
	return p, t.TempDir(), pins
}

func startDaemon(t *testing.T, p *testnet.Pair, dir, pinDir string) context.CancelFunc {
	t.Helper()
	cfg := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfg, []byte("pools: [{name: dns, steering: hardware, devices: {netdevs: ['xa#2-3']}}]\n"), 0o644)
	d, err := daemon.New(daemon.Options{ConfigPath: cfg, NetNS: p.NSPath(), PinDir: filepath.Join(pinDir, "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: filepath.Join(dir, "alloc"), APISocket: filepath.Join(dir, "api.sock"),
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	return func() { cancel(); <-done }
}

func TestKubeletDeviceManager(t *testing.T) {
	p, dir, pins := setup(t)

	pod := &v1.Pod{}
	pod.UID, pod.Name, pod.Namespace = types.UID(fmt.Sprintf("5d1e0f2a-0000-4000-8000-%012d", time.Now().UnixNano()%1e12)), "dns-0", "default"
	pod.Spec.Containers = []v1.Container{{Name: "dns", Resources: v1.ResourceRequirements{
		Limits: v1.ResourceList{resourceName: resource.MustParse("2")}}}}
	pods := func() []*v1.Pod { return []*v1.Pod{pod} }

	// The plugin serves and registers; kubelet's manager starts after it,
	// wiping the directory: the plugin must notice and register again.
	stopDaemon := startDaemon(t, p, dir, pins)
	m := startManager(t, pods)
	t.Logf("registered, devices healthy after %v", waitCapacity(t, m, 2, "first registration"))

	ctx := context.Background()
	if err := m.Allocate(ctx, pod, &pod.Spec.Containers[0], lifecycle.AddOperation); err != nil {
		t.Fatal(err)
	}
	opts, err := m.GetDeviceRunContainerOptions(ctx, pod, &pod.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, e := range opts.Envs {
		env[e.Name] = e.Value
	}
	if env["XDPQ_SOCKET"] != "/run/xdpq/xdpq.sock" || env["XDPQ_QUEUES_DNS"] != "xa:2,xa:3" || env["XDPQ_NETDEV_DNS"] != "xa" {
		t.Errorf("container env %v", env)
	}
	if len(opts.Mounts) != 1 || opts.Mounts[0].ContainerPath != "/run/xdpq" {
		t.Fatalf("mounts %+v", opts.Mounts)
	}
	if _, err := os.Stat(filepath.Join(opts.Mounts[0].HostPath, "xdpq.sock")); err != nil {
		t.Errorf("the container's /run/xdpq has no broker socket: %v", err)
	}
	if !strings.HasPrefix(opts.Mounts[0].HostPath, filepath.Join(dir, "alloc")) {
		t.Errorf("mount from %s", opts.Mounts[0].HostPath)
	}

	// Plugin restart: the daemon goes and comes back; kubelet sees the
	// same devices (their ids do not depend on the daemon's life).
	stopDaemon()
	stopDaemon = startDaemon(t, p, dir, pins)
	t.Logf("after a plugin restart, devices back after %v", waitCapacity(t, m, 2, "plugin restart"))

	// Kubelet restart: the manager stops, a new one wipes the sockets.
	m.Stop(klog.Background())
	m = startManager(t, pods)
	t.Logf("after a kubelet restart, registered again after %v", waitCapacity(t, m, 2, "kubelet restart"))
	m.Stop(klog.Background())
	stopDaemon()
}

// TestKubeletPluginWatcher: where kubelet has a plugin watcher directory,
// the plugin serves there and kubelet's own plugin manager finds it,
// asks GetInfo and hands it to the device manager, with no kubelet.sock
// registration.
func TestKubeletPluginWatcher(t *testing.T) {
	p, dir, pins := setup(t)
	registry := filepath.Join(dir, "plugins_registry")
	os.MkdirAll(registry, 0o755)

	pod := &v1.Pod{}
	pod.UID, pod.Name, pod.Namespace = types.UID(fmt.Sprintf("5d1e0f2a-0000-4000-9000-%012d", time.Now().UnixNano()%1e12)), "dns-1", "default"
	pod.Spec.Containers = []v1.Container{{Name: "dns", Resources: v1.ResourceRequirements{
		Limits: v1.ResourceList{resourceName: resource.MustParse("1")}}}}
	m := startManager(t, func() []*v1.Pod { return []*v1.Pod{pod} })
	defer m.Stop(klog.Background())
	pm := pluginmanager.NewPluginManager(registry, &record.FakeRecorder{})
	pm.AddHandler(registerapi.DevicePlugin, m.GetWatcherHandler())
	ctx, cancel := context.WithCancel(context.Background())
	stopCh := make(chan struct{})
	go pm.Run(ctx, sourcesReady{}, stopCh)
	defer func() { close(stopCh); cancel() }()

	cfg := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfg, []byte("pools: [{name: dns, steering: hardware, devices: {netdevs: ['xa#2-3']}}]\n"), 0o644)
	d, err := daemon.New(daemon.Options{ConfigPath: cfg, NetNS: p.NSPath(), PinDir: filepath.Join(pins, "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: filepath.Join(dir, "alloc"), APISocket: filepath.Join(dir, "api.sock"), RegistryDir: registry,
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(dctx) }()
	defer func() { dcancel(); <-done }()

	t.Logf("found through the plugin watcher after %v", waitCapacity(t, m, 2, "plugin watcher"))
	if err := m.Allocate(ctx, pod, &pod.Spec.Containers[0], lifecycle.AddOperation); err != nil {
		t.Fatal(err)
	}
	opts, err := m.GetDeviceRunContainerOptions(ctx, pod, &pod.Spec.Containers[0])
	if err != nil || len(opts.Mounts) != 1 {
		t.Fatalf("run options %+v, %v", opts, err)
	}
	if _, err := os.Stat(filepath.Join(pluginapi.DevicePluginPath, "xdpq-dns.sock")); err == nil {
		t.Error("the plugin also served in the device-plugins directory")
	}
}
