package daemon

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/xdpq/xdpq/internal/kubelettest"
	"github.com/xdpq/xdpq/internal/testnet"
	"github.com/xdpq/xdpq/pkg/api"
)

// fakePodResources is kubelet's PodResources List: one pod holding the
// devices set in held.
type fakePodResources struct {
	podresources.UnimplementedPodResourcesListerServer
	mu   sync.Mutex
	held []string
}

func (f *fakePodResources) set(ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = ids
}

func (f *fakePodResources) List(context.Context, *podresources.ListPodResourcesRequest) (*podresources.ListPodResourcesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := &podresources.ContainerResources{Name: "dns"}
	if len(f.held) > 0 {
		c.Devices = []*podresources.ContainerDevices{{ResourceName: "xdpq.io/dns", DeviceIds: f.held}}
	}
	return &podresources.ListPodResourcesResponse{PodResources: []*podresources.PodResources{
		{Name: "dns-0", Namespace: "default", Containers: []*podresources.ContainerResources{c}}}}, nil
}

// serveFakePodResources serves a fakePodResources at path until the test
// ends.
func serveFakePodResources(t *testing.T, path string) *fakePodResources {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	pr := &fakePodResources{}
	srv := grpc.NewServer()
	podresources.RegisterPodResourcesListerServer(srv, pr)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return pr
}

// Get is kubelet's PodResources Get: the one pod, default/dns-0.
func (f *fakePodResources) Get(ctx context.Context, req *podresources.GetPodResourcesRequest) (*podresources.GetPodResourcesResponse, error) {
	l, _ := f.List(ctx, nil)
	for _, p := range l.PodResources {
		if p.Namespace == req.PodNamespace && p.Name == req.PodName {
			return &podresources.GetPodResourcesResponse{PodResources: p}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "pod %s not found", req.PodName)
}

// TestCNIAddByPod: in Kubernetes mode, a CNI ADD that names neither an
// allocation nor a device finds the pod's queues through kubelet's
// PodResources Get by namespace and name; a pod that holds none, or that
// kubelet does not know, is refused by name.
func TestCNIAddByPod(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dir := t.TempDir()
	plugins := filepath.Join(dir, "plugins")
	os.MkdirAll(plugins, 0o755)
	regs := kubelettest.Start(t, plugins).Registrations
	prSock := filepath.Join(dir, "pod-resources.sock")
	pr := serveFakePodResources(t, prSock)
	cfg := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfg, []byte("pools: [{name: dns, steering: software, devices: {netdevs: ['xa#2-3']}}]\n"), 0o644)
	apiSock := filepath.Join(dir, "api.sock")
	runDaemon(t, Options{ConfigPath: cfg, NetNS: p.NSPath(), PinDir: filepath.Join(testPins(t), "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: filepath.Join(dir, "alloc"), APISocket: apiSock, PluginDir: plugins,
		PodResourcesSocket: prSock, CollectPeriod: time.Hour})
	<-regs
	pr.set("xa-q2", "xa-q3")
	allocateAgain(t, plugins)

	add := func(pod string) (*api.Attachment, error) {
		return api.NewClient(apiSock).CNIAdd(api.CNIAddRequest{ContainerID: "c-" + pod, IfName: "net1", PodNamespace: "default", PodName: pod,
			Flows: []api.CNIFlow{{Protocol: "udp", Dst: netip.MustParsePrefix("10.1.2.3/32"), DstPort: 53}}})
	}
	att, err := add("dns-0")
	if err != nil {
		t.Fatal(err)
	}
	if len(att.Queues) != 2 || att.Queues[0] != 2 || att.Queues[1] != 3 || att.AllocationID == "" {
		t.Errorf("attachment %+v", att)
	}
	waitStatus(t, apiSock, func(s *api.Status) bool { return len(s.Netdevs) == 1 && s.Netdevs[0].Flows == 1 })
	if _, err := add("web-0"); err == nil || !strings.Contains(err.Error(), "pod web-0 not found") {
		t.Errorf("ADD for a pod kubelet does not know: %v", err)
	}
	pr.set()
	if _, err := add("dns-0"); err == nil || !strings.Contains(err.Error(), "kubelet assigns pod default/dns-0 no xdpq device") {
		t.Errorf("ADD for a pod without devices: %v", err)
	}
}

// TestPodResources: in Kubernetes mode kubelet's PodResources says which
// allocations live: one a container holds survives collection and a
// daemon restart; once kubelet no longer reports it, it is freed; a
// restart does not bring back one that no container holds.
func TestPodResources(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dir := t.TempDir()
	plugins := filepath.Join(dir, "plugins")
	os.MkdirAll(plugins, 0o755)
	regs := kubelettest.Start(t, plugins).Registrations
	prSock := filepath.Join(dir, "pod-resources.sock")
	pr := serveFakePodResources(t, prSock)

	cfg := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfg, []byte("pools: [{name: dns, steering: hardware, devices: {netdevs: ['xa#2-3']}}]\n"), 0o644)
	pins := testPins(t)
	var d *Daemon
	start := func() (stop func()) {
		d, stop = runDaemon(t, Options{ConfigPath: cfg, NetNS: p.NSPath(), PinDir: filepath.Join(pins, "xdpq"),
			StateDir: filepath.Join(dir, "state"), AllocDir: filepath.Join(dir, "alloc"), APISocket: filepath.Join(dir, "api.sock"), PluginDir: plugins,
			PodResourcesSocket: prSock, CollectPeriod: time.Hour})
		return stop
	}
	allocate := func() string {
		t.Helper()
		<-regs
		return allocateAgain(t, plugins)
	}
	socketUp := func(path string) bool {
		_, err := os.Stat(filepath.Join(path, "xdpq.sock"))
		return err == nil
	}
	ctx := context.Background()

	stop := start()
	pr.set("xa-q2", "xa-q3")
	held := allocate()
	if _, allocs := d.collect(ctx, 0); len(allocs) != 0 || !socketUp(held) {
		t.Fatalf("an allocation a container holds was collected: %v", allocs)
	}
	stop()
	stop = start()
	if !socketUp(held) {
		t.Fatal("the held allocation was not restored at the same path")
	}
	pr.set()
	if _, allocs := d.collect(ctx, 0); len(allocs) != 1 || socketUp(held) {
		t.Fatalf("an allocation no container holds was not collected: %v", allocs)
	}

	// Not restored when kubelet says nobody holds it.
	pr.set("xa-q2", "xa-q3")
	<-regs // the restarted daemon's registration
	stale := allocateAgain(t, plugins)
	stop()
	pr.set()
	stop = start()
	defer func() { stop() }()
	if socketUp(stale) {
		t.Error("an allocation no container holds was restored")
	}
}

func allocateAgain(t *testing.T, plugins string) string {
	t.Helper()
	resp, err := kubelettest.Dial(t, filepath.Join(plugins, "xdpq-dns.sock")).Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"xa-q2", "xa-q3"}}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.ContainerResponses[0].Mounts[0].HostPath
}
