package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresources "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/internal/testing/kubelettest"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/kubepods"
	"github.com/xdpq/xdpq/pkg/podflows"
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
			Flows:     []api.CNIFlow{{Protocol: "udp", Dst: netip.MustParsePrefix("10.1.2.3/32"), DstPort: 53}},
			Addresses: []netip.Addr{netip.MustParseAddr("10.1.2.3")}})
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

// fakePods is a PodDirectory of pods set by the test.
type fakePods struct {
	mu      sync.Mutex
	pods    map[string]kubepods.Pod
	changed chan string
}

func newFakePods(pods ...kubepods.Pod) *fakePods {
	f := &fakePods{pods: map[string]kubepods.Pod{}, changed: make(chan string, 64)}
	for _, p := range pods {
		f.pods[p.UID] = p
	}
	return f
}

// set changes a pod, as an update from the API server would.
func (f *fakePods) set(p kubepods.Pod) {
	f.mu.Lock()
	f.pods[p.UID] = p
	f.mu.Unlock()
	f.Touch(p.UID)
}

func (f *fakePods) Cached(uid string) (kubepods.Pod, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pods[uid]
	return p, ok
}

func (f *fakePods) PodByUID(_ context.Context, uid string) (kubepods.Pod, error) {
	if p, ok := f.Cached(uid); ok {
		return p, nil
	}
	return kubepods.Pod{}, fmt.Errorf("no pod %s on this node", uid)
}

func (f *fakePods) Next(ctx context.Context) (string, bool) {
	select {
	case uid := <-f.changed:
		return uid, true
	case <-ctx.Done():
		return "", false
	}
}

func (f *fakePods) ByIP(a netip.Addr) []kubepods.Pod {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []kubepods.Pod
	for _, p := range f.pods {
		if slices.Contains(p.IPs, a) {
			out = append(out, p)
		}
	}
	return out
}

func (f *fakePods) Done(string)      {}
func (f *fakePods) Touch(uid string) { f.changed <- uid }

// joinCgroup moves this process into the cgroup of procs until the test
// ends (or the returned function is called).
func joinCgroup(t *testing.T, procs string) (leave func()) {
	t.Helper()
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	// Back to where this process was in procs's hierarchy.
	root := filepath.Dir(procs)
	for filepath.Base(root) != "kubepods" && filepath.Base(root) != "kubepods.slice" && root != "/" {
		root = filepath.Dir(root)
	}
	root = filepath.Dir(root)
	var back string
	for _, l := range strings.Split(strings.TrimSpace(string(self)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) == 3 && (root == "/sys/fs/cgroup" && f[0] == "0" || strings.HasSuffix(root, "/"+f[1])) {
			back = filepath.Join(root, f[2], "cgroup.procs")
		}
	}
	if back == "" {
		t.Fatalf("this process's cgroup under %s not found in %q", root, self)
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(procs, pid, 0o644); err != nil {
		t.Fatal(err)
	}
	left := false
	leave = func() {
		if !left {
			left = true
			if err := os.WriteFile(back, pid, 0o644); err != nil {
				t.Errorf("back to %s: %v", back, err)
			}
		}
	}
	t.Cleanup(leave)
	return leave
}

// podTestUIDs are the pods and container of the tests of pod identity.
const (
	podA      = "0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f"
	podB      = "11111111-2222-3333-4444-555555555555"
	container = "4b825dc642cb6eb9a060e54bf8d69288fbee4904abcdef0123456789abcdef01"
)

// kubeEnv is a daemon in Kubernetes mode on pool dns (xa#2-3, with
// steering) with a fake PodResources whose pod default/dns-0 holds both
// queues once allocated, and pods as its PodDirectory.
type kubeEnv struct {
	pair    *testnet.Pair
	opts    Options
	d       *Daemon
	stop    func()
	regs    <-chan *pluginapi.RegisterRequest
	plugins string
	socket  string // the allocation's
}

func newKubeEnv(t *testing.T, steering string, pods PodDirectory) *kubeEnv {
	t.Helper()
	e := &kubeEnv{pair: testnet.NewPair(t, 4)}
	dir := t.TempDir()
	e.plugins = filepath.Join(dir, "plugins")
	os.MkdirAll(e.plugins, 0o755)
	e.regs = kubelettest.Start(t, e.plugins).Registrations
	prSock := filepath.Join(dir, "pod-resources.sock")
	pr := serveFakePodResources(t, prSock)
	cfg := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfg, []byte("pools: [{name: dns, steering: "+steering+", devices: {netdevs: ['xa#2-3']}}]\n"), 0o644)
	e.opts = Options{ConfigPath: cfg, NetNS: e.pair.NSPath(), PinDir: filepath.Join(testPins(t), "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: filepath.Join(dir, "alloc"), APISocket: filepath.Join(dir, "api.sock"), PluginDir: e.plugins,
		PodResourcesSocket: prSock, CollectPeriod: time.Hour, Pods: pods}
	e.d, e.stop = runDaemon(t, e.opts)
	<-e.regs
	pr.set("xa-q2", "xa-q3") // held by default/dns-0
	e.socket = filepath.Join(allocateAgain(t, e.plugins), "xdpq.sock")
	return e
}

// TestClaimPod: in Kubernetes mode with an API server, kubelet's Allocate
// does not say which pod an allocation is for; the first process of a pod
// that kubelet says holds its devices binds it to that pod, for good
// (also across a restart), and a process of another pod is refused,
// before and after. (Before, a process of any pod that reached the
// socket got the queues until CNI ADD named the pod.)
func TestClaimPod(t *testing.T) {
	e := newKubeEnv(t, "hardware", newFakePods(
		kubepods.Pod{UID: podA, Namespace: "default", Name: "dns-0"}, kubepods.Pod{UID: podB, Namespace: "default", Name: "web-0"}))
	d, socket := e.d, e.socket
	procsA, procsB := handover.PodCgroup(t, container, podA), handover.PodCgroup(t, container, podB)

	connect := func(procs string) (*client.Lease, error) {
		defer joinCgroup(t, procs)()
		return client.Connect(socket, client.Options{Ring: 256, Timeout: 5 * time.Second})
	}
	if _, err := connect(procsB); err == nil || !strings.Contains(err.Error(), "forbidden: pod "+podB+": kubelet pod resources") {
		t.Fatalf("a process of another pod, first: %v", err)
	}
	l, err := connect(procsA)
	if err != nil {
		t.Fatalf("a process of the pod that holds it: %v", err)
	}
	l.Close()
	if a := d.core.ledger.Allocations(); len(a) != 1 || a[0].Owner.PodUID != podA || a[0].Owner.AnyPod {
		t.Errorf("the allocation's owner is not the pod: %+v", a)
	}
	e.stop()
	runDaemon(t, e.opts)
	<-e.regs
	if _, err := connect(procsB); err == nil || !strings.Contains(err.Error(), "belongs to pod "+podA+", not to pod "+podB) {
		t.Fatalf("a process of another pod, once bound and after a restart: %v", err)
	}
}

// TestPodFlowsAnnotation: a pod's xdpq.io/flows annotation is steered to
// its allocation once the allocation is bound to it (no
// NetworkAttachmentDefinition, no CNI ADD): the pod receives the frames
// of its flow, byte for byte, on its queues (software steering: nothing
// else reaches them). Changed to a destination that is not the pod's own
// address, it is refused and its flows are removed; removed, nothing is
// steered.
func TestPodFlowsAnnotation(t *testing.T) {
	pod := kubepods.Pod{UID: podA, Namespace: "default", Name: "dns-0", IPs: []netip.Addr{netip.MustParseAddr("10.99.0.7")},
		Annotations: map[string]string{podflows.Annotation: `[{"protocol": "udp", "destinationPort": "5000"}]`}}
	pods := newFakePods(pod)
	e := newKubeEnv(t, "software", pods)
	p, socket, apiSock := e.pair, e.socket, e.opts.APISocket
	if pod.IPs[0] != p.PodAddr {
		t.Fatalf("the pair's pod address is %s", p.PodAddr)
	}
	leave := joinCgroup(t, handover.PodCgroup(t, container, podA))
	got := connectPod(t, socket)
	leave()
	flows := func(n int) {
		t.Helper()
		waitStatus(t, apiSock, func(s *api.Status) bool { return len(s.Netdevs) == 1 && s.Netdevs[0].Flows == n })
	}
	flows(1)
	sent := sendFramesOn(t, p, 50, 2, 3)
	for i := range got.lease.Queues {
		if err := got.recv[i].Expect(sent[i], time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("queue %d: %v", got.lease.Queues[i], err)
		}
	}
	l, err := api.NewClient(apiSock).Allocations("")
	if err != nil || len(l.Attachments) != 1 || l.Attachments[0].ContainerID != "pod-"+podA || l.Attachments[0].PodName != "dns-0" {
		t.Errorf("attachments %+v %v", l, err)
	}
	// The annotated flows are the daemon's, not a runtime's: a CNI GC
	// that lists no attachment leaves them, and the CNI verbs cannot
	// name them.
	c := api.NewClient(apiSock)
	if _, err := c.CNIGC(nil); err != nil {
		t.Fatal(err)
	}
	flows(1)
	if err := c.CNIDel("pod-"+podA, "flows.dns"); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("a CNI DEL of the pod's annotated flows: %v", err)
	}
	if _, err := c.CNIAdd(api.CNIAddRequest{ContainerID: "pod-" + podA, IfName: "net9", PodNamespace: "default", PodName: "dns-0"}); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("a CNI ADD as the pod's annotated flows: %v", err)
	}
	flows(1)

	// Another pod's address: refused, and the flow goes.
	pod.Annotations = map[string]string{podflows.Annotation: `[{"protocol": "udp", "destination": "10.99.0.2", "destinationPort": "5000"}]`}
	pods.set(pod)
	flows(0)
	// Back, then the annotation removed.
	pod.Annotations = map[string]string{podflows.Annotation + ".dns": `[{"protocol": "udp", "destination": "ipam", "destinationPort": "5000"}]`}
	pods.set(pod)
	flows(1)
	pod.Annotations = nil
	pods.set(pod)
	flows(0)
	// What was told of the pod's flows goes with its allocation.
	for _, a := range e.d.core.ledger.Allocations() {
		if err := e.d.local.Free(context.Background(), a.ID); err != nil {
			t.Fatal(err)
		}
	}
	if said := e.d.flows.Remembered(); said != 0 {
		t.Errorf("%d pods' flows still remembered after their allocations went", said)
	}
}
