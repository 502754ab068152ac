package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/xdpq/xdpq/internal/testing/kubelettest"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/dra"
)

// BenchmarkPrepare64x64: kubelet's call that hands a pod two queues, as
// kubelet makes it, on a daemon of 64 netdevs of 64 queues (half served
// by DRA, half by the device plugin), side by side in one run: DRA's
// NodePrepareResources (the helper reads the claim from the API server,
// a fake in process here; the daemon makes the allocation and its CDI
// spec), the device plugin's Allocate, and NodeUnprepareResources.
// p50 and p99 of b.N claims each. Goal: Prepare ≤ 1 ms p50, ≤ 5 ms p99.
func BenchmarkPrepare64x64(b *testing.B) {
	testnet.RequireRoot(b)
	const half = scaleNetdevs / 2
	if b.N > half*scaleQueues/2 {
		b.Fatalf("at most %d claims of two queues fit the pools", half*scaleQueues/2)
	}
	netns := scaleNetdevsNS(b)
	dir := b.TempDir()
	var viaDRA, viaDP []string
	for i := range scaleNetdevs {
		e := fmt.Sprintf("'n%d#0-%d'", i, scaleQueues-1)
		if i < half {
			viaDRA = append(viaDRA, e)
		} else {
			viaDP = append(viaDP, e)
		}
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("pools: [{name: dra, servedBy: dra, steering: software, devices: {netdevs: [%s]}},"+
		" {name: dp, servedBy: devicePlugin, steering: software, devices: {netdevs: [%s]}}]\n",
		strings.Join(viaDRA, ","), strings.Join(viaDP, ","))), 0o644); err != nil {
		b.Fatal(err)
	}
	plugins, registry, draDir := filepath.Join(dir, "plugins"), filepath.Join(dir, "registry"), filepath.Join(dir, "dra")
	for _, d := range []string{plugins, registry, draDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	// State and allocation directories on a tmpfs, as /run is on a node
	// (an fsync costs nothing there), as BenchmarkScale64x64 has them.
	run, err := os.MkdirTemp("/run", "xdpq-bench-")
	if err != nil {
		b.Fatal(err)
	}
	if err := unix.Mount("tmpfs", run, "tmpfs", 0, "size=64m,mode=0755"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Unmount(run, unix.MNT_DETACH); os.Remove(run) })
	kubelet := kubelettest.Start(b, plugins)
	kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: draNodeName, UID: "9f0c1e2d-3b4a-4c5d-8e6f-7a8b9c0d1e2f"}})
	d, _ := runDaemon(b, Options{ConfigPath: cfg, NodeName: draNodeName, NetNS: netns.Path(), PinDir: filepath.Join(testPins(b), "xdpq"),
		StateDir: filepath.Join(run, "state"), AllocDir: filepath.Join(run, "alloc"), APISocket: filepath.Join(dir, "api.sock"),
		PluginDir: plugins, PodResourcesSocket: filepath.Join(dir, "no-kubelet.sock"), CollectPeriod: time.Hour,
		DRA: &DRA{Kube: kube, RegistryDir: registry, PluginDir: draDir, CDIDir: filepath.Join(dir, "cdi")}})

	ctx := context.Background()
	// Timed once the agents have settled every netdev (their first
	// reconcile loads and pins a program per netdev).
	waitFor(b, "every netdev settled", func() bool {
		st := d.core.agent.Status()
		return len(st) == scaleNetdevs && !slices.ContainsFunc(st, func(s agent.Status) bool { return s.Steering == "" || s.RXQueues != scaleQueues })
	})
	reg := <-kubelet.Registrations
	dp := pluginapi.NewDevicePluginClient(dial(b, filepath.Join(plugins, reg.Endpoint)))
	sock := filepath.Join(draDir, "dra.sock")
	waitFor(b, "the DRA socket", func() bool { _, err := os.Stat(sock); return err == nil })
	kl := drapb.NewDRAPluginClient(dial(b, sock))

	claims := make([]*resourceapi.ResourceClaim, b.N)
	for i := range claims {
		nd, q := i/(scaleQueues/2), 2*(i%(scaleQueues/2))
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("c%d", i),
			UID: types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", i))}}
		c.Status.Allocation = &resourceapi.AllocationResult{}
		for _, qq := range []int{q, q + 1} {
			c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
				Request: "queues", Driver: dra.DriverName, Pool: dra.PoolName(draNodeName, "dra"), Device: fmt.Sprintf("n%d-q%d", nd, qq)})
		}
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: c.Name, UID: types.UID(fmt.Sprintf("10000000-0000-4000-8000-%012d", i))}}
		if _, err := kube.ResourceV1().ResourceClaims("default").Create(ctx, c, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		claims[i] = c
	}
	var prep, alloc, unprep, inDaemon []time.Duration
	b.ResetTimer()
	for i, c := range claims {
		ref := []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}
		t0 := time.Now()
		r, err := kl.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: ref})
		prep = append(prep, time.Since(t0))
		if err != nil || r.Claims[string(c.UID)].Error != "" {
			b.Fatalf("prepare %s: %v %v", c.Name, err, r)
		}
		nd, q := half+i/(scaleQueues/2), 2*(i%(scaleQueues/2))
		t0 = time.Now()
		_, err = dp.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{fmt.Sprintf("n%d-q%d", nd, q), fmt.Sprintf("n%d-q%d", nd, q+1)}}}})
		alloc = append(alloc, time.Since(t0))
		if err != nil {
			b.Fatalf("allocate: %v", err)
		}
	}
	// The daemon's own part, without gRPC and the claim's read: the
	// claims again, once unprepared, straight to the daemon.
	for _, c := range claims {
		if r, err := kl.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}}); err != nil || r.Claims[string(c.UID)].Error != "" {
			b.Fatalf("unprepare %s: %v %v", c.Name, err, r)
		}
		var devs []string
		for _, r := range c.Status.Allocation.Devices.Results {
			devs = append(devs, r.Device)
		}
		t0 := time.Now()
		if _, err := d.dra.PrepareClaim(ctx, dra.Claim{UID: string(c.UID), Namespace: c.Namespace, Name: c.Name, Pool: "dra",
			Devices: devs, Pods: []string{string(c.Status.ReservedFor[0].UID)}}); err != nil {
			b.Fatal(err)
		}
		inDaemon = append(inDaemon, time.Since(t0))
	}
	for _, c := range claims {
		t0 := time.Now()
		r, err := kl.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
		unprep = append(unprep, time.Since(t0))
		if err != nil || r.Claims[string(c.UID)].Error != "" {
			b.Fatalf("unprepare %s: %v %v", c.Name, err, r)
		}
	}
	b.StopTimer()
	fmt.Printf("\n%d netdevs x %d queues (half by DRA, half by the device plugin), %d claims of 2 queues, one at a time\n", scaleNetdevs, scaleQueues, b.N)
	fmt.Printf("| call | p50 | p99 | goal |\n|---|---|---|---|\n")
	for _, row := range []struct {
		name, goal string
		lat        []time.Duration
	}{
		{"DRA NodePrepareResources (gRPC, the claim read from a fake API server, CDI spec)", "", prep},
		{"the daemon's part of it (dra.Face.PrepareClaim: the allocation recorded and served)", "≤ 1 ms / ≤ 5 ms", inDaemon},
		{"device plugin Allocate", "", alloc},
		{"DRA NodeUnprepareResources", "", unprep},
	} {
		fmt.Printf("| %s | %s | %s | %s |\n", row.name, ms(pct(row.lat, 50)), ms(pct(row.lat, 99)), row.goal)
	}
	b.ReportMetric(float64(pct(prep, 50).Microseconds()), "prepare-p50-µs")
	b.ReportMetric(float64(pct(prep, 99).Microseconds()), "prepare-p99-µs")
	b.ReportMetric(float64(pct(inDaemon, 50).Microseconds()), "daemon-p50-µs")
	b.ReportMetric(float64(pct(inDaemon, 99).Microseconds()), "daemon-p99-µs")
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d.Microseconds())/1000) }

func dial(b testing.TB, path string) *grpc.ClientConn {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return conn
}
