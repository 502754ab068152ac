package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/dra"
	"github.com/xdpq/xdpq/pkg/kubepods"
)

// nriRuntime is NRI's runtime side, as containerd embeds it, listening
// on socket.
func nriRuntime(t *testing.T, socket string) *adaptation.Adaptation {
	t.Helper()
	sync := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	dir := filepath.Dir(socket)
	r, err := adaptation.New("test-runtime", "v0", sync, update, adaptation.WithSocketPath(socket),
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")), adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// podSandbox is the sandbox of the pod uid as the runtime tells NRI.
func podSandbox(id, uid, name string, netns ns.NetNS) *adaptation.PodSandbox {
	return &adaptation.PodSandbox{Id: id, Uid: uid, Namespace: "default", Name: name,
		Linux: &adaptation.LinuxPodSandbox{Namespaces: []*adaptation.LinuxNamespace{{Type: "network", Path: netns.Path()}}}}
}

// podLink is interface name in the pod's namespace, nil if not there.
func podLink(t *testing.T, pod ns.NetNS, name string) (netlink.Link, []netlink.Addr) {
	t.Helper()
	var l netlink.Link
	var addrs []netlink.Addr
	err := pod.Do(func(ns.NetNS) error {
		var err error
		if l, err = netlink.LinkByName(name); err != nil {
			l = nil
			return nil
		}
		addrs, err = netlink.AddrList(l, netlink.FAMILY_V4)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return l, addrs
}

// TestDRANetdevClaim: a netdev-mode pool served by DRA. kubelet's
// Prepare allocates the whole netdev to the claim's pod; when the
// runtime runs the pod's sandbox (NRI's RunPodSandbox, through NRI's
// own runtime side), the netdev moves into the pod's namespace, named,
// addressed and up as the claim's interface config says, and the
// claim's status tells it as networkData; the pod's process receives on
// it byte for byte. The sandbox's stop brings the netdev back to the
// node as it was, a new sandbox of the pod takes it again, and
// Unprepare brings it back and frees it.
func TestDRANetdevClaim(t *testing.T) {
	const uid, pod = "3c2b1a09-8f7e-4d6c-9b5a-403f2e1d0c9b", podA
	claim := allocatedClaim("vf-0", uid, pod, []string{dra.DeviceName("xa", -1)},
		`{"apiVersion": "xdpq.io/v1alpha1", "kind": "QueueConfig", "interface": {"name": "net1", "addresses": ["10.99.7.2/24"]}}`)
	for i := range claim.Status.Allocation.Devices.Results {
		claim.Status.Allocation.Devices.Results[i].Pool = dra.PoolName(draNodeName, "vf")
	}
	pods := newFakePods(kubepods.Pod{UID: pod, Namespace: "default", Name: "vf-0"})
	socket := filepath.Join(t.TempDir(), "nri.sock")
	rt := nriRuntime(t, socket)
	e := newDRAEnvWith(t, pods, "pools: [{name: vf, mode: netdev, servedBy: dra, devices: {netdevs: [xa]}}]\n",
		func(o *Options) { o.DRA.NRISocket = socket }, claim)
	ctx := context.Background()

	r := e.prepare(t, claim)
	if r.Error != "" {
		t.Fatalf("prepare: %+v", r)
	}
	var socketPath string
	for _, m := range e.cdiEdits(t, uid).Mounts {
		if m.ContainerPath == "/run/xdpq" {
			socketPath = filepath.Join(m.HostPath, "xdpq.sock")
		}
	}

	// The sandbox runs: the netdev is in the pod, as configured. (The
	// runtime lists the plugin only once it synchronized, in a goroutine
	// of its own: the first sandboxes may reach no one.)
	podNS := newPodNS(t)
	waitFor(t, "net1 in the pod", func() bool {
		if err := rt.RunPodSandbox(ctx, &adaptation.RunPodSandboxRequest{Pod: podSandbox("sb1", pod, "vf-0", podNS)}); err != nil {
			t.Fatal(err)
		}
		l, _ := podLink(t, podNS, "net1")
		return l != nil
	})
	l, addrs := podLink(t, podNS, "net1")
	if l.Attrs().Flags&1 == 0 || len(addrs) != 1 || addrs[0].IPNet.String() != "10.99.7.2/24" {
		t.Errorf("net1 in the pod: flags %v, addresses %v", l.Attrs().Flags, addrs)
	}
	mac := l.Attrs().HardwareAddr.String()
	waitFor(t, "the claim's networkData", func() bool {
		c, err := e.kube.ResourceV1().ResourceClaims("default").Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil || len(c.Status.Devices) != 1 {
			return false
		}
		nd := c.Status.Devices[0].NetworkData
		return nd != nil && nd.InterfaceName == "net1" && nd.HardwareAddress == mac && slices.Equal(nd.IPs, []string{"10.99.7.2/24"})
	})

	// The pod's process receives on its netdev's queues.
	leave := joinCgroup(t, handover.PodCgroup(t, container, pod))
	got := connectPod(t, socketPath)
	leave()
	if len(got.lease.Queues) < 2 {
		t.Fatalf("lease of queues %v", got.lease.Queues)
	}
	sent := sendFramesOn(t, e.pair, 50, got.lease.Queues[0], got.lease.Queues[1])
	for i := range 2 {
		if err := got.recv[i].Expect(sent[i], time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("queue %d: %v", got.lease.Queues[i], err)
		}
	}
	// Its device is Ready while the netdev is in the pod: the node no
	// longer has it under that name, and it is not missing.
	var seen string
	waitFor(t, "the netdev claim's device Ready", func() bool {
		c, err := e.kube.ResourceV1().ResourceClaims("default").Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil || len(c.Status.Devices) != 1 {
			return false
		}
		conds := c.Status.Devices[0].Conditions
		if s := fmt.Sprintf("%+v", conds); s != seen {
			t.Logf("the netdev claim's device: %s", s)
			seen = s
		}
		return len(conds) == 1 && conds[0].Type == "Ready" && conds[0].Status == metav1.ConditionTrue
	})
	got.lease.Close()

	// The sandbox stops: the netdev is back on the node, as it was; the
	// networkData goes. RemovePodSandbox after it finds nothing to do.
	if err := rt.StopPodSandbox(ctx, &adaptation.StopPodSandboxRequest{Pod: podSandbox("sb1", pod, "vf-0", podNS)}); err != nil {
		t.Fatal(err)
	}
	if err := rt.RemovePodSandbox(ctx, &adaptation.RemovePodSandboxRequest{Pod: podSandbox("sb1", pod, "vf-0", podNS)}); err != nil {
		t.Fatal(err)
	}
	if l, _ := podLink(t, podNS, "net1"); l != nil {
		t.Fatal("net1 still in the pod after its sandbox stopped")
	}
	back := nodeLink(t, e.pair.NSPath(), "xa")
	if back == nil || back.Attrs().HardwareAddr.String() != mac {
		t.Fatalf("xa back on the node: %+v", back)
	}
	waitFor(t, "the claim without networkData", func() bool {
		c, err := e.kube.ResourceV1().ResourceClaims("default").Get(ctx, claim.Name, metav1.GetOptions{})
		return err == nil && len(c.Status.Devices) == 1 && c.Status.Devices[0].NetworkData == nil
	})
	if n := len(e.d.core.ledger.Attachments()); n != 0 {
		t.Errorf("%d attachments after the sandbox stopped", n)
	}

	// A new sandbox of the pod (the old one died) takes it again; a CNI
	// DEL of its attachment is refused: it is the sandbox's.
	pod2 := newPodNS(t)
	if err := rt.RunPodSandbox(ctx, &adaptation.RunPodSandboxRequest{Pod: podSandbox("sb2", pod, "vf-0", pod2)}); err != nil {
		t.Fatal(err)
	}
	if l, _ := podLink(t, pod2, "net1"); l == nil {
		t.Fatal("net1 not in the new sandbox")
	}
	if err := e.d.local.CNIDel(ctx, apiRef("sandbox-sb2", "net1")); err == nil || !strings.Contains(err.Error(), "sandboxes") {
		t.Errorf("a CNI DEL of a sandbox's netdev: %v", err)
	}
	// Unprepare: back on the node, free.
	if msg := e.unprepare(t, claim); msg != "" {
		t.Fatal(msg)
	}
	if l, _ := podLink(t, pod2, "net1"); l != nil {
		t.Error("net1 still in the pod after unprepare")
	}
	if nodeLink(t, e.pair.NSPath(), "xa") == nil || len(e.d.core.ledger.Allocations()) != 0 {
		t.Errorf("after unprepare: xa on the node %v, %d allocations", nodeLink(t, e.pair.NSPath(), "xa") != nil, len(e.d.core.ledger.Allocations()))
	}

	// A claim whose flows' destination is its own address, with no
	// address in its interface: refused at Prepare, naming the field.
	bad := allocatedClaim("vf-1", "4d3c2b1a-0f9e-4d7c-8b6a-5f4e3d2c1b0a", pod, []string{dra.DeviceName("xa", -1)},
		`{"apiVersion": "xdpq.io/v1alpha1", "kind": "QueueConfig", "flows": [{"protocol": "udp", "destinationPort": "53"}]}`)
	bad.Status.Allocation.Devices.Results[0].Pool = dra.PoolName(draNodeName, "vf")
	if _, err := e.kube.ResourceV1().ResourceClaims("default").Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := e.prepare(t, bad); !strings.Contains(r.Error, "flows[0].destination") || !strings.Contains(r.Error, "interface.addresses") {
		t.Errorf("flows to an interface without addresses: %+v", r)
	}

	// A claim whose interface name the pod has already (lo): the
	// sandbox fails, saying so, and the netdev stays on the node.
	clash := allocatedClaim("vf-2", "5e4d3c2b-1a0f-4e8d-9c7b-6a5f4e3d2c1b", pod, []string{dra.DeviceName("xa", -1)},
		`{"apiVersion": "xdpq.io/v1alpha1", "kind": "QueueConfig", "interface": {"name": "lo"}}`)
	clash.Status.Allocation.Devices.Results[0].Pool = dra.PoolName(draNodeName, "vf")
	if _, err := e.kube.ResourceV1().ResourceClaims("default").Create(ctx, clash, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := e.prepare(t, clash); r.Error != "" {
		t.Fatal(r.Error)
	}
	pod3 := newPodNS(t)
	err := rt.RunPodSandbox(ctx, &adaptation.RunPodSandboxRequest{Pod: podSandbox("sb3", pod, "vf-0", pod3)})
	if err == nil || !strings.Contains(err.Error(), "claim default/vf-2") {
		t.Errorf("a sandbox whose claim's interface is named lo: %v", err)
	}
	if nodeLink(t, e.pair.NSPath(), "xa") == nil || len(e.d.core.ledger.Attachments()) != 0 {
		t.Errorf("after the refused move: xa on the node %v, attachments %v", nodeLink(t, e.pair.NSPath(), "xa") != nil, e.d.core.ledger.Attachments())
	}
	t.Logf("the runtime's error: %v", err)
}

// nodeLink is interface name in the namespace at path, nil if not there.
func nodeLink(t *testing.T, path, name string) netlink.Link {
	t.Helper()
	h, err := netlinkAt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return nil
	}
	return l
}

// netlinkAt is a netlink handle in the namespace at path.
func netlinkAt(path string) (*netlink.Handle, error) {
	n, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	return netlink.NewHandleAt(n)
}

func apiRef(container, ifname string) api.AttachmentRef {
	return api.AttachmentRef{ContainerID: container, IfName: ifname}
}
