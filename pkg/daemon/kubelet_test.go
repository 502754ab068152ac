package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/xdpq/xdpq/internal/testing/kubelettest"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
)

// TestKubernetesAllocate: in Kubernetes mode the daemon registers a
// plugin per pool, lists the queues as devices, and answers Allocate with
// the allocation's broker directory mounted at /run/xdpq and the
// environment the pod reads.
func TestKubernetesAllocate(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dir := t.TempDir()
	plugins := filepath.Join(dir, "device-plugins")
	os.MkdirAll(plugins, 0o755)
	regs := kubelettest.Start(t, plugins).Registrations

	cfgPath := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfgPath, []byte("resourcePrefix: example.com\npools: [{name: fast-dns, steering: software, devices: {netdevs: ['xa#2-3']}}]\n"), 0o644)
	pins := testPins(t)
	allocDir := filepath.Join(dir, "alloc")
	d, _ := runDaemon(t, Options{ConfigPath: cfgPath, NetNS: p.NSPath(), PinDir: filepath.Join(pins, "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: allocDir, PluginDir: plugins, APISocket: filepath.Join(dir, "api.sock")})
	ctx := context.Background()

	var reg *pluginapi.RegisterRequest
	select {
	case reg = <-regs:
	case <-time.After(10 * time.Second):
		t.Fatal("no registration")
	}
	if reg.ResourceName != "example.com/fast-dns" {
		t.Fatalf("registered %q", reg.ResourceName)
	}
	c := kubelettest.Dial(t, filepath.Join(plugins, reg.Endpoint))
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, dev := range list.Devices {
		ids = append(ids, dev.ID+"/"+dev.Health)
	}
	if strings.Join(ids, " ") != "xa-q2/Healthy xa-q3/Healthy" {
		t.Fatalf("devices %v", ids)
	}
	// A link going down makes its queues unhealthy, and back.
	for _, want := range []string{"Unhealthy", "Healthy"} {
		updown := map[string]string{"Unhealthy": "down", "Healthy": "up"}[want]
		if out, err := exec.Command("ip", "-n", filepath.Base(p.NSPath()), "link", "set", "xa", updown).CombinedOutput(); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		for {
			l, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if l.Devices[0].Health == want && l.Devices[1].Health == want {
				break
			}
		}
	}
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"xa-q3", "xa-q2"}}}})
	if err != nil {
		t.Fatal(err)
	}
	cr := resp.ContainerResponses[0]
	if cr.Envs["XDPQ_SOCKET"] != "/run/xdpq/xdpq.sock" || cr.Envs["XDPQ_QUEUES_FAST_DNS"] != "xa:2,xa:3" || cr.Envs["XDPQ_NETDEV_FAST_DNS"] != "xa" {
		t.Errorf("envs %v", cr.Envs)
	}
	if len(cr.Mounts) != 1 || cr.Mounts[0].ContainerPath != "/run/xdpq" {
		t.Fatalf("mounts %v", cr.Mounts)
	}
	if _, err := os.Stat(filepath.Join(cr.Mounts[0].HostPath, "xdpq.sock")); err != nil {
		t.Errorf("the mounted directory has no broker socket: %v", err)
	}
	// The pod's CNI ADD steers a flow onto its queues.
	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(pod)
	defer pod.Close()
	flow := api.CNIFlow{Protocol: "udp", Dst: netip.MustParsePrefix("10.77.0.2/32"), DstPort: 53}
	if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Netns: pod.Path(), DeviceID: "xa-q2",
		Flows: []api.CNIFlow{flow}, Addresses: []netip.Addr{flow.Dst.Addr()}}); err != nil {
		t.Fatal(err)
	}
	// kubelet calls Allocate again when it restarts the container: the old
	// allocation goes, a new one takes the devices, and the pod's flow
	// (CNI does not run again) stays, now the new allocation's.
	again, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"xa-q2", "xa-q3"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if att, err := d.local.CNICheck(ctx, api.AttachmentRef{ContainerID: "c1", IfName: "net1"}); err != nil || att.AllocationID != again.ContainerResponses[0].Envs["XDPQ_ALLOCATION"] {
		t.Errorf("after the container restart the attachment is %+v (%v), want it on the new allocation", att, err)
	}
	// A pod that is gone (its netns with it) keeps nothing at the next Allocate.
	pod.Close()
	testutils.UnmountNS(pod)
	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"xa-q2", "xa-q3"}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.local.CNICheck(ctx, api.AttachmentRef{ContainerID: "c1", IfName: "net1"}); err == nil {
		t.Error("the attachment of a gone pod went to the next Allocate of its devices")
	}
	if s, _ := d.core.Status(ctx); s.Netdevs[0].Flows != 0 {
		t.Errorf("%d flows left of the gone pod", s.Netdevs[0].Flows)
	}
	if again.ContainerResponses[0].Mounts[0].HostPath == cr.Mounts[0].HostPath {
		t.Error("the re-allocation reused the old allocation's directory")
	}
	if _, err := os.Stat(cr.Mounts[0].HostPath); !os.IsNotExist(err) {
		t.Errorf("the old allocation's directory stays: %v", err)
	}
	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"xa-q0"}}}}); err == nil {
		t.Error("a queue outside the pool was allocated")
	}
}

// TestKubernetesNetdevPool: a netdev-mode pool offers each netdev whole
// (device id: its name); Allocate gives all its queues; the Multus deviceID
// finds the allocation at ADD, the netdev moves into the pod and stays a
// healthy device while it is there, and DEL brings it back.
func TestKubernetesNetdevPool(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dir := t.TempDir()
	plugins := filepath.Join(dir, "device-plugins")
	os.MkdirAll(plugins, 0o755)
	regs := kubelettest.Start(t, plugins).Registrations
	cfgPath := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfgPath, []byte("pools: [{name: vf, mode: netdev, devices: {netdevs: [xa, xb]}}]\n"), 0o644)
	pins := testPins(t)
	d, _ := runDaemon(t, Options{ConfigPath: cfgPath, NetNS: p.NSPath(), PinDir: filepath.Join(pins, "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: filepath.Join(dir, "alloc"), PluginDir: plugins,
		APISocket: filepath.Join(dir, "api.sock")})
	var reg *pluginapi.RegisterRequest
	select {
	case reg = <-regs:
	case <-time.After(10 * time.Second):
		t.Fatal("no registration")
	}
	c := kubelettest.Dial(t, filepath.Join(plugins, reg.Endpoint))
	ctx := context.Background()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Devices) != 2 || list.Devices[0].ID != "xa" || list.Devices[1].ID != "xb" || list.Devices[0].Health != "Healthy" {
		t.Fatalf("devices %v", list.Devices)
	}
	// A device is a whole netdev: two are two netdevs, never one allocation.
	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"xa", "xb"}}}}); err == nil ||
		!strings.Contains(err.Error(), "an allocation is on one netdev") {
		t.Errorf("allocate two netdevs: %v", err)
	}
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"xa"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if q := resp.ContainerResponses[0].Envs["XDPQ_QUEUES_VF"]; q != "xa:0,xa:1,xa:2,xa:3" {
		t.Errorf("queues %q, want all of xa's", q)
	}

	pod, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(pod)
	defer pod.Close()
	att, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Netns: pod.Path(), DeviceID: "xa", Resource: "xdpq.io/vf", MTU: 1400})
	if err != nil {
		t.Fatal(err)
	}
	if att.Mode != "netdev" || att.Mac != p.A.MAC.String() {
		t.Errorf("attachment %+v", att)
	}
	if err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("net1")
		if err == nil && l.Attrs().MTU != 1400 {
			err = fmt.Errorf("mtu %d", l.Attrs().MTU)
		}
		return err
	}); err != nil {
		t.Fatalf("net1 in the pod: %v", err)
	}
	if devs := (pluginsCore{d.core}).Devices("vf"); len(devs) != 2 || devs[0].ID != "xa" || !devs[0].Healthy {
		t.Errorf("the netdev in the pod is reported %+v", devs)
	}
	if _, err := d.local.CNICheck(ctx, api.AttachmentRef{ContainerID: "c1", IfName: "net1"}); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	// A container restart (Allocate again) leaves the netdev in the pod.
	again, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"xa"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if att, err := d.local.CNICheck(ctx, api.AttachmentRef{ContainerID: "c1", IfName: "net1"}); err != nil || att.AllocationID != again.ContainerResponses[0].Envs["XDPQ_ALLOCATION"] {
		t.Errorf("after the container restart the attachment is %+v (%v), want it on the new allocation", att, err)
	}
	if err := pod.Do(func(ns.NetNS) error { _, err := netlink.LinkByName("net1"); return err }); err != nil {
		t.Errorf("net1 left the pod with the container restart: %v", err)
	}
	if err := d.local.CNIDel(ctx, api.AttachmentRef{ContainerID: "c1", IfName: "net1"}); err != nil {
		t.Fatal(err)
	}
	if err := p.NS.Do(func(ns.NetNS) error { _, err := netlink.LinkByName("xa"); return err }); err != nil {
		t.Errorf("xa not back on the node: %v", err)
	}
	if devs := (pluginsCore{d.core}).Devices("vf"); len(devs) != 2 || devs[0].ID != "xa" || !devs[0].Healthy {
		t.Errorf("the netdev back on the node is reported %+v", devs)
	}
}

// TestKubernetesReload: in Kubernetes mode a reload that adds a pool
// starts its device plugin (kubelet sees the resource), one that removes
// a pool stops its plugin once no allocation holds its devices, and a
// changed resourcePrefix re-registers the pools under the new name.
// (Before, a pool added by a reload never got a device plugin.)
func TestKubernetesReload(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dir := t.TempDir()
	plugins := filepath.Join(dir, "device-plugins")
	os.MkdirAll(plugins, 0o755)
	regs := kubelettest.Start(t, plugins).Registrations
	cfgPath := filepath.Join(dir, "config.yaml")
	write := func(s string) {
		os.WriteFile(cfgPath+".tmp", []byte(s), 0o644)
		os.Rename(cfgPath+".tmp", cfgPath)
	}
	write("pools: [{name: a, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
	d, _ := runDaemon(t, Options{ConfigPath: cfgPath, NetNS: p.NSPath(), PinDir: filepath.Join(testPins(t), "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: filepath.Join(dir, "alloc"), PluginDir: plugins,
		APISocket: filepath.Join(dir, "api.sock"), CollectPeriod: time.Hour})
	ctx := context.Background()
	registered := func(want string) {
		t.Helper()
		select {
		case r := <-regs:
			if r.ResourceName != want {
				t.Fatalf("registered %s, want %s", r.ResourceName, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not registered", want)
		}
	}
	registered("xdpq.io/a")

	write("pools: [{name: a, steering: software, devices: {netdevs: ['xa#0-1']}}, {name: b, steering: software, devices: {netdevs: ['xa#2-3']}}]\n")
	if err := d.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	registered("xdpq.io/b")
	c := kubelettest.Dial(t, filepath.Join(plugins, "xdpq-b.sock"))
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"xa-q2"}}}})
	if err != nil {
		t.Fatal(err)
	}
	alloc := resp.ContainerResponses[0].Envs["XDPQ_ALLOCATION"]

	// b goes from the config while its allocation lives: the plugin stays.
	write("pools: [{name: a, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
	if err := d.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(plugins, "xdpq-b.sock")); err != nil {
		t.Errorf("b's plugin stopped while its allocation lives: %v", err)
	}
	s, _ := d.core.Status(ctx)
	if i := slices.IndexFunc(s.Pools, func(p api.PoolStatus) bool { return p.Name == "b" }); i < 0 || s.Pools[i].Queues != 0 ||
		s.Pools[i].Free != 0 || !strings.Contains(s.Pools[i].Reason, "removed from the config") {
		t.Errorf("pool b after its removal: %+v", s.Pools)
	}
	if err := d.local.Free(ctx, alloc); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(plugins, "xdpq-b.sock")); !os.IsNotExist(err) {
		t.Errorf("b's plugin still serves after its last allocation went: %v", err)
	}
	if s, _ := d.core.Status(ctx); slices.ContainsFunc(s.Pools, func(p api.PoolStatus) bool { return p.Name == "b" }) {
		t.Errorf("pool b still listed: %+v", s.Pools)
	}

	write("resourcePrefix: example.com\npools: [{name: a, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
	if err := d.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	registered("example.com/a")
}
