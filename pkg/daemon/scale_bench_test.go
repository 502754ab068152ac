package daemon

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/xdpq/xdpq/internal/kubelettest"
	"github.com/xdpq/xdpq/internal/testnet"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// BenchmarkScale64x64 runs the daemon (cmd/deviceplugin, a process of its
// own) on 64 netdevs of 64 queues each, one pool of all 4096 queues, with a
// fake kubelet, and reports: the time from start to the first
// ListAndWatch response carrying every device, Allocate latency (p50,
// p99) over 100 single-queue allocations, and the daemon's RSS. Run it
// with -benchtime 1x.
func BenchmarkScale64x64(b *testing.B) {
	testnet.RequireRoot(b)
	const netdevs, queues = 64, 64
	netns, err := testutils.NewNS()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { netns.Close(); testutils.UnmountNS(netns) }()
	var entries []string
	err = netns.Do(func(ns.NetNS) error {
		for i := range netdevs {
			name := fmt.Sprintf("n%d", i)
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, NumTxQueues: queues, NumRxQueues: queues},
				PeerName: fmt.Sprintf("p%d", i), PeerNumTxQueues: queues, PeerNumRxQueues: queues}
			if err := netlink.LinkAdd(v); err != nil {
				return err
			}
			for _, n := range []string{name, v.PeerName} {
				l, _ := netlink.LinkByName(n)
				netlink.LinkSetUp(l)
			}
			entries = append(entries, fmt.Sprintf("'%s#0-%d'", name, queues-1))
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfg, []byte("pools: [{name: big, steering: software, devices: {netdevs: ["+strings.Join(entries, ",")+"]}}]\n"), 0o644)
	bin := filepath.Join(dir, "deviceplugin")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/xdpq/xdpq/cmd/deviceplugin").CombinedOutput(); err != nil {
		b.Fatalf("build: %v\n%s", err, out)
	}
	plugins := filepath.Join(dir, "plugins")
	os.MkdirAll(plugins, 0o755)
	regs := kubelettest.Start(b, plugins).Registrations
	xdp.MountBPFFS(xdp.DefaultBPFFS)
	pins, _ := os.MkdirTemp(xdp.DefaultBPFFS, "xdpq-bench-")
	defer os.RemoveAll(pins)

	b.ResetTimer()
	start := time.Now()
	cmd := exec.Command(bin, "--config", cfg, "--netns", netns.Path(), "--pin-dir", filepath.Join(pins, "xdpq"),
		"--state-dir", filepath.Join(dir, "state"), "--alloc-dir", filepath.Join(dir, "alloc"), "--plugin-dir", plugins, "--registry-dir", "", "--api-socket", filepath.Join(dir, "api.sock"))
	logf, _ := os.Create(filepath.Join(dir, "daemon.log"))
	defer logf.Close()
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() }()
	var reg *pluginapi.RegisterRequest
	select {
	case reg = <-regs:
	case <-time.After(5 * time.Minute):
		b.Fatal("no registration")
	}
	c := kubelettest.Dial(b, filepath.Join(plugins, reg.Endpoint))
	ctx := context.Background()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		b.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		b.Fatal(err)
	}
	firstList := time.Since(start)
	if len(list.Devices) != netdevs*queues {
		b.Fatalf("%d devices, want %d", len(list.Devices), netdevs*queues)
	}
	var lat []time.Duration
	for i := range 100 {
		id := fmt.Sprintf("n%d-q%d", i%netdevs, i/netdevs)
		t0 := time.Now()
		if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{id}}}}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	var rssKB float64
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			rssKB, _ = strconv.ParseFloat(strings.Fields(v)[0], 64)
		}
	}
	b.ReportMetric(firstList.Seconds(), "s-to-first-list")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "alloc-p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "alloc-p99-µs")
	b.ReportMetric(rssKB/1024, "rss-MiB")
}
