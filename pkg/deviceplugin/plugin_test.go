package deviceplugin

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/xdpq/xdpq/internal/testing/kubelettest"
)

func devs(netdev string, numa int, queues ...uint32) []Device {
	var out []Device
	for _, q := range queues {
		out = append(out, Device{ID: fmt.Sprintf("%s-q%d", netdev, q), Netdev: netdev, Queue: q, NUMA: numa, Healthy: true})
	}
	return out
}

func TestPrefer(t *testing.T) {
	eth1 := devs("eth1", 0, 8, 9, 10, 11, 12, 13, 14, 15)
	eth2 := devs("eth2", 1, 8, 9, 10, 11)
	eth3 := devs("eth3", 1, 0, 1, 5, 6, 7)
	all := append(append(append([]Device{}, eth1...), eth2...), eth3...)
	for _, c := range []struct {
		name  string
		avail []Device
		must  []Device
		size  int
		want  []string
	}{
		{"one netdev, contiguous, the biggest", all, nil, 3, []string{"eth1-q8", "eth1-q9", "eth1-q10"}},
		{"must include pulls its netdev", all, eth2[1:2], 3, []string{"eth2-q9", "eth2-q8", "eth2-q10"}},
		{"around what must be included", eth3, eth3[3:4], 3, []string{"eth3-q6", "eth3-q5", "eth3-q7"}},
		{"then its NUMA node", all, eth2[3:4], 6, []string{"eth2-q11", "eth2-q8", "eth2-q9", "eth2-q10", "eth3-q0", "eth3-q1"}},
		{"smallest span in a gapped netdev", eth3, nil, 3, []string{"eth3-q5", "eth3-q6", "eth3-q7"}},
		{"spills over", eth2, nil, 5, []string{"eth2-q8", "eth2-q9", "eth2-q10", "eth2-q11"}},
		{"skips unhealthy", append([]Device{{ID: "eth9-q0", Netdev: "eth9", NUMA: -1}}, eth2[:1]...), nil, 1, []string{"eth2-q8"}},
	} {
		if got := Prefer(c.avail, c.must, c.size); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestPluginWithFakeKubelet: registration after serving, ListAndWatch with
// updates, preferred allocation, Allocate of owned and foreign ids, and
// registering again after a kubelet restart that wiped the directory.
func TestPluginWithFakeKubelet(t *testing.T) {
	dir := t.TempDir()
	k := kubelettest.Start(t, dir)
	regs := k.Registrations
	var mu sync.Mutex
	devices := devs("eth1", 0, 8, 9, 10)
	p := New(Config{Resource: "xdpq.io/upf", Dir: dir, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		Devices: func() []Device { mu.Lock(); defer mu.Unlock(); return append([]Device(nil), devices...) },
		Allocate: func(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
			if !strings.HasPrefix(ids[0], "eth1-") { // the daemon's ledger refuses devices of no pool
				return nil, fmt.Errorf("device %s is not in the pool", ids[0])
			}
			return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"XDPQ_DEVICES": ids[0]}}, nil
		}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	var r *pluginapi.RegisterRequest
	select {
	case r = <-regs:
	case <-time.After(5 * time.Second):
		t.Fatal("the plugin did not register")
	}
	if r.ResourceName != "xdpq.io/upf" || r.Version != "v1beta1" || r.Endpoint != "xdpq-upf.sock" || !r.Options.GetPreferredAllocationAvailable {
		t.Fatalf("register request %v", r)
	}
	c := kubelettest.Dial(t, filepath.Join(dir, r.Endpoint))
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Devices) != 3 || first.Devices[0].ID != "eth1-q8" || first.Devices[0].Health != pluginapi.Healthy ||
		first.Devices[0].Topology.Nodes[0].ID != 0 {
		t.Fatalf("first list %v", first.Devices)
	}
	mu.Lock()
	devices[1].Healthy = false
	mu.Unlock()
	p.Changed()
	second, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if second.Devices[1].Health != pluginapi.Unhealthy {
		t.Errorf("after a change: %v", second.Devices)
	}
	pref, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"eth1-q8", "eth1-q9", "eth1-q10"}, AllocationSize: 2}}})
	if err != nil || !reflect.DeepEqual(pref.ContainerResponses[0].DeviceIDs, []string{"eth1-q8", "eth1-q10"}) {
		t.Errorf("preferred: %v, %v (q9 is unhealthy)", pref, err)
	}
	alloc, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"eth1-q8"}}}})
	if err != nil || alloc.ContainerResponses[0].Envs["XDPQ_DEVICES"] != "eth1-q8" {
		t.Errorf("allocate: %v, %v", alloc, err)
	}
	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"eth7-q1"}}}}); err == nil {
		t.Error("a device the Allocate callback refuses was allocated")
	}

	// A kubelet restart: it stops, wipes the directory, serves again.
	k.Stop()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		os.Remove(filepath.Join(dir, e.Name()))
	}
	start := time.Now()
	kubelettest.StartWith(t, dir, regs)
	select {
	case r = <-regs:
		t.Logf("registered again %v after kubelet came back", time.Since(start))
	case <-time.After(5 * time.Second):
		t.Fatal("the plugin did not register with the new kubelet")
	}
	if _, err := os.Stat(filepath.Join(dir, r.Endpoint)); err != nil {
		t.Errorf("the plugin's socket is not back: %v", err)
	}
}
