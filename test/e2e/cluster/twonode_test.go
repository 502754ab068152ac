package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

// workerOptions are a second, isolated node's.
func workerOptions() NodeOptions {
	return NodeOptions{Name: "xdpq-e2e-worker", Dir: "/var/lib/xdpq-e2e/worker", PodCIDR: "10.244.1.0/24", Isolated: true}
}

// TestTwoNodesRunPods starts a control plane on the cluster's network,
// the first node on the host and a second, isolated one in namespaces
// of its own; each runs a pod, whose log kubectl reads through that
// node's kubelet at its InternalIP. The second node sees only its own
// links (its NIC's among them, which receives), bpffs and kubelet
// directory; its pods' cgroups are under its
// own root. Stopping it leaves the first node Ready with its pod
// running, and nothing of the second behind.
func TestTwoNodesRunPods(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireTool(t, "runc", "runc")
	testnet.RequireTool(t, "util-linux", "unshare")
	testnet.RequireTool(t, "containernetworking-plugins", filepath.Join(DefaultCNIPluginDir, "bridge"))

	cp := StartControlPlaneForTest(t, Options{Network: true})
	if want := "https://" + NetworkPrefix.Addr().Next().String() + ":"; !strings.HasPrefix(cp.URL, want) {
		t.Errorf("apiserver at %s, want on the network's host address (%s...)", cp.URL, want)
	}
	n1 := StartNodeForTest(t, cp, NodeOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := "e2e-two"
	hello := helloOn(ctx, t, cp, ns, n1)
	// A pod that runs on the first node before the second starts (whose
	// mount namespace must not copy its mounts) and across the second's
	// stop.
	waits := helloPod("waits", "-wait")
	waits.Spec.NodeName = n1.Name
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, waits, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.WaitPod(ctx, ns, waits.Name, PodRunning); err != nil {
		t.Fatal(err)
	}
	n2 := StartNodeForTest(t, cp, workerOptions())
	if err := n2.ImportImage(ctx, hello); err != nil {
		t.Fatal(err)
	}

	// What the second node sees of the machine: its NIC, not the host's
	// links; a frame from the NIC's peer arrives there.
	nic := AddNICOnForTest(t, n2, "xdpqe2etest2", 2)
	out, err := n2.Exec(ctx, "ls", "/sys/class/net")
	if err != nil {
		t.Fatal(err)
	}
	links := strings.Fields(string(out))
	if !slices.Contains(links, "eth0") || !slices.Contains(links, nic.Name) || slices.Contains(links, NetworkBridge) {
		t.Errorf("links the second node sees: %q, want its own (eth0, %s, no %s)", links, nic.Name, NetworkBridge)
	}
	if _, err := netlink.LinkByName(nic.Name); err == nil {
		t.Errorf("the second node's NIC %s shows in the host's namespace", nic.Name)
	}
	checkFrame(t, nic)
	var host syscall.Stat_t
	if err := syscall.Stat("/sys/fs/bpf", &host); err != nil {
		t.Fatal(err)
	}
	out, err = n2.Exec(ctx, "stat", "-f", "-c", "%T", "/sys/fs/bpf")
	if err != nil || strings.TrimSpace(string(out)) != "bpf_fs" {
		t.Errorf("the second node's /sys/fs/bpf: %q, %v; want a bpffs", out, err)
	}
	out, err = n2.Exec(ctx, "stat", "-c", "%d", "/sys/fs/bpf")
	if err != nil || strings.TrimSpace(string(out)) == fmt.Sprint(host.Dev) {
		t.Errorf("the second node's /sys/fs/bpf is device %s (%v), the host's is %d: want one of its own", strings.TrimSpace(string(out)), err, host.Dev)
	}
	// One mount at /run/netns and one at /sys/fs/bpf, shared (the chart
	// mounts both HostToContainer, which containerd refuses for a private
	// one); no copy of the first node's mounts (its containers' overlays,
	// its pods' volumes).
	for _, mp := range []string{"/run/netns", "/sys/fs/bpf"} {
		out, err := n2.Exec(ctx, "findmnt", "-rn", "-o", "PROPAGATION", mp)
		if err != nil || strings.TrimSpace(string(out)) != "shared" {
			t.Errorf("the second node's mounts at %s: %q (%v), want one, shared", mp, out, err)
		}
	}
	out, err = n2.Exec(ctx, "findmnt", "-rn", "-o", "TARGET")
	if err != nil {
		t.Fatal(err)
	}
	for _, mp := range strings.Fields(string(out)) {
		if strings.HasPrefix(mp, n1.Dir+"/") || strings.HasPrefix(mp, DefaultKubeletRootDir+"/") {
			t.Errorf("the second node has a copy of the first node's mount %s", mp)
		}
	}
	if _, err := n2.Exec(ctx, "touch", "/var/lib/kubelet/probe"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(n2.HostKubeletRootDir, "probe")); err != nil {
		t.Errorf("a file the second node writes in its kubelet's directory is not in %s: %v", n2.HostKubeletRootDir, err)
	}
	if _, err := os.Stat("/var/lib/kubelet/probe"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file the second node writes in its kubelet's directory shows on the host: %v", err)
	}

	for i, n := range []*Node{n1, n2} {
		cidr := netip.MustParsePrefix([]string{DefaultPodCIDR, workerOptions().PodCIDR}[i])
		pod := helloPod(fmt.Sprintf("hello-%d", i+1), "from", n.Name)
		pod.Spec.NodeName = n.Name
		if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := cp.WaitPod(ctx, ns, pod.Name, PodSucceeded)
		if err != nil {
			t.Fatal(err)
		}
		if ip, err := netip.ParseAddr(got.Status.PodIP); err != nil || !cidr.Contains(ip) {
			t.Errorf("pod on %s has IP %q, want one of %s", n.Name, got.Status.PodIP, cidr)
		}
		out, err := cp.Kubectl(ctx, "logs", "-n", ns, pod.Name)
		if err != nil {
			t.Fatal(err)
		}
		if want := "hello from " + n.Name + "\n"; string(out) != want {
			t.Errorf("kubectl logs of the pod on %s: %q, want %q", n.Name, out, want)
		}
		node, err := cp.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := internalIP(node); got != n.IP.String() {
			t.Errorf("node %s: InternalIP %q, want %s", n.Name, got, n.IP)
		}
	}
	if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/memory", n2.CgroupRoot, "kubepods")); len(m) == 0 {
		t.Errorf("no pod cgroups under the second node's root %s", n2.CgroupRoot)
	}
	before, err := cp.WaitPod(ctx, ns, waits.Name, PodRunning)
	if err != nil {
		t.Fatal(err)
	}

	if err := n2.Stop(); err != nil {
		t.Fatal(err)
	}
	assertIsolatedNodeGone(t, n2)
	after, err := cp.WaitPod(ctx, ns, waits.Name, PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := containerStates(after), containerStates(before); a != b {
		t.Errorf("the first node's pod after the second node's stop: %s, before: %s", a, b)
	}
	node, err := cp.Client.CoreV1().Nodes().Get(ctx, n1.Name, metav1.GetOptions{})
	if err != nil || !nodeReady(node) {
		t.Errorf("the first node after the second's stop: %s (%v)", nodeState(node), err)
	}
	if _, err := os.Stat(n1.ContainerdSocket); err != nil {
		t.Errorf("the first node's containerd socket after the second's stop: %v", err)
	}
}

func internalIP(node *corev1.Node) string {
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// assertIsolatedNodeGone checks that a stopped isolated node left
// nothing behind: no namespace file, host veth, cgroup root, process of
// its namespaces or with its directory in its command line, nor the
// directory.
func assertIsolatedNodeGone(t *testing.T, n *Node) {
	t.Helper()
	for _, f := range []string{n.ns.Netns, n.ns.Mnt} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace file %s after Stop: %v", f, err)
		}
	}
	if _, err := netlink.LinkByName(n.ns.HostVeth); err == nil {
		t.Errorf("host veth %s left", n.ns.HostVeth)
	}
	if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", n.CgroupRoot)); len(m) > 0 {
		t.Errorf("cgroup roots left: %q", m)
	}
	if _, err := os.Stat(n.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after Stop: %v, want removed", n.Dir, err)
	}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), n.Dir) {
			t.Errorf("process %s left: %q", e.Name(), strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	if mps, err := mountsUnder(n.Dir); err != nil || len(mps) > 0 {
		t.Errorf("host mounts under %s: %q (%v)", n.Dir, mps, err)
	}
}

// TestTwoNodesAfterKill kills (SIGKILL: no teardown runs) a child test
// process whose two nodes run a pod each, then starts both nodes again
// in the same directories: the second's StartNode removes what the
// killed one left in its namespaces (its shim and pod still running
// there, its mounts, cgroups and links) and the new nodes each run a
// pod; their Stop leaves nothing.
func TestTwoNodesAfterKill(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireTool(t, "util-linux", "unshare")
	killChild(t, "two")
	// What the killed run left: the second node's pod's shim, in its
	// namespaces.
	w := workerOptions()
	socket := filepath.Join(w.Dir, "run", "containerd.sock")
	left := nsNames(w.Dir, NetworkPrefix.Addr().Next().Next())
	// Its processes by pid and start time: a namespace's inode, like a
	// pid, is given again once it is free.
	leftProcs := map[int]string{}
	for _, pid := range left.pids() {
		leftProcs[pid] = procStart(pid)
	}
	if len(shimPids(t, socket)) == 0 || len(leftProcs) == 0 {
		t.Fatal("the killed second node left no shim and no process in its namespaces: the test would prove nothing")
	}

	cp := StartControlPlaneForTest(t, Options{Network: true})
	n1 := StartNodeForTest(t, cp, NodeOptions{})
	n2 := StartNodeForTest(t, cp, w)
	if shims := shimPids(t, socket); len(shims) != 0 {
		t.Errorf("shims of the killed second node's containerd after StartNode: %v", shims)
	}
	for pid, start := range leftProcs {
		if procStart(pid) == start {
			t.Errorf("process %d of the killed second node's namespaces still runs", pid)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	helloOn(ctx, t, cp, "e2e-two", n1, n2)
	for i, n := range []*Node{n1, n2} {
		pod := helloPod(fmt.Sprintf("hello-%d", i), "from", n.Name)
		pod.Spec.NodeName = n.Name
		if _, err := cp.Client.CoreV1().Pods("e2e-two").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cp.WaitPod(ctx, "e2e-two", pod.Name, PodSucceeded); err != nil {
			t.Fatal(err)
		}
	}
	if err := n2.Stop(); err != nil {
		t.Fatal(err)
	}
	assertIsolatedNodeGone(t, n2)
	if err := n1.Stop(); err != nil {
		t.Fatal(err)
	}
	assertNodeGone(t, n1)
}

// procStart is the start time of process pid (/proc/<pid>/stat's 22nd
// field), "" when there is no such process.
func procStart(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The command, field 2, is in parentheses and may hold spaces.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 20 {
		return ""
	}
	return f[19]
}
