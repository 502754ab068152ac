package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/test/e2e/cluster"
	"github.com/xdpq/xdpq/test/e2e/images"
	"github.com/xdpq/xdpq/test/e2e/kubebin"
)

// The scenario's pool, its resource and the NIC's name and queues.
const (
	scenarioPool     = "upf"
	scenarioResource = "xdpq.io/" + scenarioPool
	scenarioNIC      = "xdpqnic0"
	// The NIC has 6 queues; the pool takes 4 of them, then all 6 (step 7).
	nicQueues      = 6
	scenarioQueues = 4
	// metricsPort is the chart's metrics.port.
	metricsPort = 9476
	// pinDir is the chart's daemon's pin directory (hostPaths.bpffs/xdpq).
	pinDir = "/sys/fs/bpf/xdpq"
)

// TestScenario is issue 14's scenario on a real node: xdpq installed by
// its Helm chart on a kubelet with containerd, a pool on a veth "NIC"'s
// four queues (software steering: veth has no ntuple filters), pods of
// a restricted namespace receiving the frames of their flows annotation
// through a real container runtime, and kubectl's view of them.
//
// xdpq's CNI plugin is installed by the chart but not in the node's
// conflist: the pods' flows come from their xdpq.io/flows annotation,
// their addresses from bridge.
func TestScenario(t *testing.T) {
	testnet.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute) // a fresh build included
	defer cancel()
	e := newScenarioEnv(ctx, t)
	cp, node, nic, ref := e.cp, e.node, e.nic, e.ref
	k := kubectl{path: cp.Binaries[kubebin.Kubectl], kubeconfig: cp.Kubeconfig, pluginDir: buildPlugin(ctx, t)}

	// 1. helm install: the DaemonSet Ready, the node advertising the
	// pool's 4 queues, the XdpqNode showing the netdev and the pool.
	installed := time.Now()
	// The device plugin's scenario: the pool served by the device
	// plugin although the cluster serves DRA (TestDRAScenario is DRA's).
	e.install(ctx, t, "--set", "dra.servedBy=devicePlugin")
	t.Logf("helm install to DaemonSet Ready: %s", time.Since(installed).Round(time.Millisecond))
	waitAllocatable(ctx, t, cp, node.Name, scenarioQueues)
	out, err := cp.Kubectl(ctx, "get", "xdpqnodes", "-o", "wide")
	if err != nil || !strings.Contains(string(out), node.Name) {
		t.Fatalf("kubectl get xdpqnodes: %v\n%s", err, out)
	}
	t.Logf("kubectl get xdpqnodes -o wide:\n%s", out)
	out, err = cp.Kubectl(ctx, "get", "xdpqnode", node.Name, "-o", "yaml")
	if err != nil || !strings.Contains(string(out), "name: "+scenarioNIC) || !strings.Contains(string(out), "name: "+scenarioPool) {
		t.Errorf("the XdpqNode lacks netdev %s or pool %s: %v\n%s", scenarioNIC, scenarioPool, err, out)
	}

	// 2. Pods of a restricted namespace, two queues each.
	const ns = "telco"
	if err := cp.CreateNamespace(ctx, ns, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}); err != nil {
		t.Fatal(err)
	}
	a := startPerfPod(ctx, t, cp, ns, "rx-a", ref, 5000)
	b := startPerfPod(ctx, t, cp, ns, "rx-b", ref, 5001)
	t.Logf("helm install to the first pod's sockets: %s", a.ready.Sub(installed).Round(time.Millisecond))
	if got := append(append([]int(nil), a.queues...), b.queues...); len(a.queues) != 2 || len(b.queues) != 2 || !distinct(got, scenarioQueues) {
		t.Fatalf("queues: rx-a %v, rx-b %v; want two each, all four distinct", a.queues, b.queues)
	}
	third := perfPod(ns, "rx-c", ref, 5002)
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, third, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.WaitPod(ctx, ns, "rx-c", podUnschedulable); err != nil {
		t.Errorf("a third pod asking for 2 of no free queue: %v", err)
	}

	// Each pod's flow, sent on its queues from the NIC's peer, and a
	// frame of no pod's flow on each queue.
	for _, p := range []*perfRun{a, b} {
		waitFlowsApplied(ctx, t, cp, ns, p.name)
	}
	sa, sb := openPeerSender(t, nic, a), openPeerSender(t, nic, b)
	const perQueue = 1000
	firstFrame := time.Now()
	if err := sa.send(perQueue, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install to the first frames sent to a pod: %s", firstFrame.Sub(installed).Round(time.Millisecond))
	if err := sb.send(perQueue, true); err != nil {
		t.Fatal(err)
	}

	// 3. kubectl shows both pods' queues; /metrics their per-queue
	// counters.
	// The XdpqNode's status is written coalesced, a moment after the
	// second pod's allocation: waited for.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		out, err = cp.Kubectl(ctx, "get", "xdpqnodes")
		return err == nil && strings.Contains(string(out), "4/4"), nil
	})
	t.Logf("kubectl get xdpqnodes:\n%s", out)
	if err != nil {
		t.Errorf("kubectl get xdpqnodes, want 4/4 queues allocated: %v\n%s", err, out)
	}
	waitPodRows(ctx, t, k, node.Name, ns, a, b)
	// A user with the cluster's view role reads them too (the chart's
	// xdpq-view is aggregated into it); one with no role may not.
	if _, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-view"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "alice"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, _, err := k.run(ctx, "xdpq", "status", "--as", "alice")
		return err == nil, nil // the aggregation controller fills view in a moment
	})
	if err != nil {
		t.Errorf("kubectl xdpq status as a user with the view role: %v", err)
	}
	if _, stderr, err := k.run(ctx, "xdpq", "status", "--as", "bob"); err == nil || !strings.Contains(stderr, "forbidden") {
		t.Errorf("kubectl xdpq status as a user with no role: %v, %s; want forbidden", err, stderr)
	}
	red := redirected(ctx, t, scenarioNIC)
	for _, p := range []*perfRun{a, b} {
		for _, q := range p.queues {
			if red[q] != perQueue {
				t.Errorf("/metrics: queue %d (%s) redirected %d frames, sent %d of the pod's flow", q, p.name, red[q], perQueue)
			}
		}
	}
	t.Logf("/metrics: xdpq_agent_program_packets_total{result=\"redirected\"} per queue of %s: %v", scenarioNIC, red)

	// 4. An operator's program takes the NIC's hook: the XdpqNode says
	// Overridden and an Event says so; what is sent meanwhile is the
	// operator's (its program passes it to the kernel). Removed: xdpq's
	// program is back and the pods receive again.
	if err := cluster.OperatorXDP("", scenarioNIC, operatorObj); err != nil {
		t.Fatal(err)
	}
	took := waitNetdevState(ctx, t, cp, node.Name, scenarioNIC, "Overridden")
	t.Logf("operator's program attached: the XdpqNode showed Overridden within %s", took.Round(time.Millisecond))
	waitEventReason(ctx, t, cp, "NetdevOverridden", scenarioNIC)
	if err := sa.send(100, false); err != nil {
		t.Fatal(err)
	}
	if err := cluster.OperatorXDP("", scenarioNIC, ""); err != nil {
		t.Fatal(err)
	}
	took = waitNetdevState(ctx, t, cp, node.Name, scenarioNIC, "Filter")
	t.Logf("operator's program removed: the XdpqNode showed Filter again within %s", took.Round(time.Millisecond))
	waitEventReason(ctx, t, cp, "NetdevReclaimed", scenarioNIC)
	for _, s := range []*peerSender{sa, sb} {
		if err := s.send(perQueue, true); err != nil {
			t.Fatal(err)
		}
	}

	// 5. The daemon's pod is deleted while traffic flows: the pods keep
	// receiving (every frame: checked at the end), the new daemon adopts
	// the allocations (the same ones) and the pods' leases.
	allocs := allocationIDs(ctx, t, cp, node.Name)
	untouched := containerIDs(ctx, t, cp, ns, a.name, b.name)
	old := daemonPod(ctx, t, cp)
	stop := sendWhile(sa, sb)
	deleted := time.Now()
	if err := cp.Client.CoreV1().Pods("kube-system").Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	newPod := waitNewDaemonReady(ctx, t, cp, old.Name)
	t.Logf("daemon pod %s deleted; %s Ready %s later", old.Name, newPod.Name, time.Since(deleted).Round(time.Millisecond))
	waitPodRows(ctx, t, k, node.Name, ns, a, b)
	batches, err := stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sent %d batches of 100 frames per queue to each pod while the daemon was replaced", batches)
	if got := allocationIDs(ctx, t, cp, node.Name); got != allocs {
		t.Errorf("allocations after the daemon's restart %q, want the same as before %q", got, allocs)
	}

	// 6. kubelet restarts: the plugin registers again, the capacity is
	// right, the running pods are untouched and still receive.
	if err := node.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	waitAllocatable(ctx, t, cp, node.Name, scenarioQueues)
	for _, s := range []*peerSender{sa, sb} {
		if err := s.send(perQueue, true); err != nil {
			t.Fatal(err)
		}
	}

	// 7. helm upgrade: the pool grows to the NIC's 6 queues with another
	// linger, applied in place (the DaemonSet's pod stays, the running
	// pods too): the Pending pod gets the two new queues. A value the
	// schema refuses changes nothing; a broken ConfigMap edit is refused
	// by the daemon and shown in the XdpqNode, and undone by the next
	// upgrade.
	daemonBefore := daemonPod(ctx, t, cp).UID
	upgraded := time.Now()
	// A values file with the whole pool: --set on a list's element
	// replaces the list, as Helm merges lists.
	poolValues := func(linger string) string {
		f := filepath.Join(t.TempDir(), "pools.yaml")
		v := fmt.Sprintf("config:\n  pools:\n    - name: %s\n      steering: software\n      linger: %s\n      devices:\n        netdevs: ['%s#0-5']\n",
			scenarioPool, linger, scenarioNIC)
		if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	if out, err := cp.Helm(ctx, "upgrade", "xdpq", repoRoot+"/charts/xdpq", "-n", "kube-system", "--reuse-values",
		"-f", poolValues("30s")); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	waitAllocatable(ctx, t, cp, node.Name, nicQueues)
	t.Logf("helm upgrade to the node advertising %d queues: %s", nicQueues, time.Since(upgraded).Round(time.Millisecond))
	c := followPerfPod(ctx, t, cp, ns, "rx-c", 5002)
	if !slices.Equal(c.queues, []int{4, 5}) {
		t.Errorf("the pod that was Pending got queues %v, want the new [4 5]", c.queues)
	}
	if got := daemonPod(ctx, t, cp).UID; got != daemonBefore {
		t.Error("helm upgrade replaced the daemon's pod: the config should apply in place")
	}
	out, err = cp.Helm(ctx, "upgrade", "xdpq", repoRoot+"/charts/xdpq", "-n", "kube-system", "--reuse-values",
		"-f", poolValues("soon"))
	if err == nil || !strings.Contains(err.Error()+string(out), "linger") {
		t.Errorf("helm upgrade with linger=soon: %v, want the schema's refusal naming linger\n%s", err, out)
	}
	cms := cp.Client.CoreV1().ConfigMaps("kube-system")
	cm, err := cms.Get(ctx, "xdpq", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	good := cm.Data["config.yaml"]
	cm.Data["config.yaml"] = "pools: [{name: upf, devices: {netdevs: ['" + scenarioNIC + "#0-5']}, linger: -5s}]\n"
	if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCondition(ctx, t, cp, node.Name, "ConfigValid", "False")
	t.Logf("a ConfigMap edited to a negative linger: the XdpqNode shows ConfigValid False")
	cm.Data["config.yaml"] = good // the operator undoes the edit
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCondition(ctx, t, cp, node.Name, "ConfigValid", "True")
	if got := containerIDs(ctx, t, cp, ns, a.name, b.name); got != untouched {
		t.Errorf("the running pods' containers changed:\nbefore %s\nafter  %s", untouched, got)
	}
	for _, s := range []*peerSender{sa, sb} {
		if err := s.send(perQueue, true); err != nil {
			t.Fatal(err)
		}
	}

	// The pods stop (SIGTERM) and report what they received: every frame
	// of their flow sent while xdpq held the hook (none lost while the
	// daemon was replaced or kubelet restarted), nothing else.
	checkTotals(ctx, t, cp, ns, sa, sb)

	// 8. The pods gone: the queues are free, the flows removed, the
	// leases ended.
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "rx-c", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{a.name, b.name, c.name} {
		if out, err := cp.Kubectl(ctx, "-n", ns, "wait", "--for=delete", "pod/"+p, "--timeout=60s"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	waitFreed(ctx, t, cp, node.Name)
	// helm uninstall: no program on the NIC, no pin, no CNI plugin left.
	if out, err := cp.Helm(ctx, "uninstall", "xdpq", "-n", "kube-system", "--wait", "--timeout=2m"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := cp.Kubectl(ctx, "-n", "kube-system", "wait", "--for=delete", "pod", "-l", "app.kubernetes.io/name=xdpq", "--timeout=2m"); err != nil {
		t.Errorf("the daemon's pod after helm uninstall: %v\n%s", err, out)
	}
	// The daemon saw its DaemonSet deleted and removed its datapath.
	if l, err := netlink.LinkByIndex(nic.Index); err != nil {
		t.Error(err)
	} else if x := l.Attrs().Xdp; x != nil && x.Attached {
		t.Errorf("helm uninstall left XDP program %d on %s", x.ProgId, nic.Name)
	}
	for _, dir := range []string{pinDir, "/run/xdpq/agent", "/run/xdpq/alloc"} {
		if ents, err := os.ReadDir(dir); !os.IsNotExist(err) {
			t.Errorf("helm uninstall left %s (%d entries, %v)", dir, len(ents), err)
		}
	}
	if _, err := os.Stat(filepath.Join(node.CNIBinDir, "xdpq")); !os.IsNotExist(err) {
		t.Errorf("helm uninstall left the CNI plugin in %s: %v", node.CNIBinDir, err)
	}
	// What docs/install.md says it leaves: the CRD (Helm keeps crds/),
	// and the node's XdpqNode unless the daemon deleted it before Helm
	// took its RBAC away. kubectl delete xdpqnodes --all, as the docs
	// show, leaves none.
	if out, err := cp.Kubectl(ctx, "get", "crd", "xdpqnodes.xdpq.io", "-o", "name"); err != nil {
		t.Errorf("helm uninstall deleted the XdpqNode CRD, which Helm keeps: %v\n%s", err, out)
	}
	out, err = cp.Kubectl(ctx, "get", "xdpqnodes", "-o", "name")
	t.Logf("XdpqNodes left by helm uninstall: %q %v", out, err)
	if out, err := cp.Kubectl(ctx, "delete", "xdpqnodes", "--all"); err != nil {
		t.Errorf("%v\n%s", err, out)
	}
	if out, err := cp.Kubectl(ctx, "get", "xdpqnodes", "-o", "name"); err != nil || len(out) != 0 {
		t.Errorf("after kubectl delete xdpqnodes --all: XdpqNodes %q %v, want none", out, err)
	}
}

// scenarioEnv is a node with the scenario's NIC and the xdpq image.
type scenarioEnv struct {
	cp   *cluster.ControlPlane
	node *cluster.Node
	nic  *cluster.NIC
	ref  string // the xdpq image
	// archive is the xdpq image's docker-archive, for another node.
	archive string
}

// newScenarioEnv starts a control plane and a node, adds the NIC and
// imports the xdpq image; everything goes when the test ends.
func newScenarioEnv(ctx context.Context, tb testing.TB) *scenarioEnv {
	tb.Helper()
	return newScenarioEnvWith(ctx, tb, cluster.Options{})
}

// newScenarioEnvWith is newScenarioEnv with the control plane's options.
func newScenarioEnvWith(ctx context.Context, tb testing.TB, opts cluster.Options) *scenarioEnv {
	tb.Helper()
	sharedMounts(tb) // undone after the node's teardown
	if _, err := os.Stat(pinDir); err == nil {
		tb.Fatalf("%s exists: a daemon or a killed run left it; remove it first", pinDir)
	}
	clearHostState(tb)
	tb.Cleanup(func() {
		// After the node's teardown (cleanups run last first): what a
		// daemon that was not uninstalled left.
		if err := os.RemoveAll(pinDir); err != nil {
			tb.Errorf("remove the daemon's pins: %v", err)
		}
		clearHostState(tb)
	})
	e := &scenarioEnv{cp: cluster.StartControlPlaneForTest(tb, opts)}
	e.node = cluster.StartNodeForTest(tb, e.cp, cluster.NodeOptions{})
	e.nic = cluster.AddNICForTest(tb, scenarioNIC, nicQueues)
	archive, ref, err := images.Xdpq(ctx, "0.0.0-e2e", e.node.Dir+"/images")
	if err != nil {
		tb.Fatal(err)
	}
	e.archive = archive
	if err := e.node.ImportImage(ctx, archive); err != nil {
		log, _ := os.ReadFile(filepath.Join(e.node.Dir, "containerd.log"))
		tb.Fatalf("%v; containerd's log ends:\n%s", err, tail(log, 4000))
	}
	e.ref = ref
	return e
}

// install runs helm install of the chart with the scenario's pool (4 of
// the NIC's queues, software steering) and waits for the DaemonSet. On
// failure the test's end shows the daemon's pods and logs.
func (e *scenarioEnv) install(ctx context.Context, tb testing.TB, extra ...string) {
	tb.Helper()
	e.installChart(ctx, tb, repoRoot+"/charts/xdpq", e.ref, extra...)
}

// installChart is install of the chart in directory chart, with the
// image ref.
func (e *scenarioEnv) installChart(ctx context.Context, tb testing.TB, chart, ref string, extra ...string) {
	tb.Helper()
	repo, tag, _ := strings.Cut(ref, ":")
	api, err := url.Parse(e.cp.URL)
	if err != nil {
		tb.Fatal(err)
	}
	args := append([]string{}, "install", "xdpq", chart, "-n", "kube-system",
		"--set", "image.repository="+repo, "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never",
		"--set", "cni.binDir="+e.node.CNIBinDir,
		"--set", "kubelet.rootDir="+e.node.KubeletRootDir,
		// /var/run is a symlink to /run; containerd looks for the mount
		// of the path as given and finds this machine's private root
		// (on a systemd node / is shared and /var/run/netns works).
		"--set", "hostPaths.netns=/run/netns",
		// No kube-proxy on this node: the kubernetes Service's address
		// leads nowhere from the host network.
		"--set", "apiServer.host="+api.Hostname(), "--set-string", "apiServer.port="+api.Port(),
		"--set", "config.pools[0].name="+scenarioPool,
		"--set", "config.pools[0].devices.netdevs[0]="+scenarioNIC+"#0-3",
		"--set", "config.pools[0].linger=5s",
		"--set", "config.pools[0].steering=software",
		// Where DRA's netdev-mode pools meet the node's containerd.
		"--set", "dra.nriSocket="+e.node.NRISocket,
		"--set", "debug=true")
	args = append(args, extra...)
	out, err := e.cp.Helm(ctx, args...)
	if err != nil {
		tb.Fatalf("%v\n%s", err, out)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			for _, args := range [][]string{
				{"-n", "kube-system", "describe", "pods"},
				{"-n", "kube-system", "logs", "daemonset/xdpq", "--all-containers", "--tail=200"},
			} {
				out, _ := e.cp.Kubectl(context.Background(), args...)
				tb.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
			}
		}
	})
	if out, err := e.cp.Kubectl(ctx, "-n", "kube-system", "rollout", "status", "daemonset/xdpq", "--timeout=150s"); err != nil {
		tb.Fatalf("the DaemonSet never became Ready: %v\n%s", err, out)
	}
}

// tail is b's last n bytes.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// sharedMounts makes the node's bpffs and /run/netns shared mounts, as
// systemd makes every mount on a real node: the chart mounts both
// HostToContainer, which containerd refuses for a private mount ("is
// mounted on ... but it is not a shared or slave mount"). This machine's
// mounts are private. The test's cleanup makes them private again.
func sharedMounts(t testing.TB) {
	t.Helper()
	if err := unix.Mount("", "/sys/fs/bpf", "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("make /sys/fs/bpf shared: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Mount("", "/sys/fs/bpf", "", unix.MS_PRIVATE, ""); err != nil {
			t.Errorf("make /sys/fs/bpf private again: %v", err)
		}
	})
	const netns = "/run/netns"
	if err := os.MkdirAll(netns, 0o755); err != nil {
		t.Fatal(err)
	}
	// A bind mount of itself, as iproute2's `ip netns add` makes it;
	// recursive, so that namespaces already mounted there (another node's
	// pods) stay visible.
	if err := unix.Mount(netns, netns, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatalf("bind-mount %s: %v", netns, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(netns, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", netns, err)
		}
	})
	if err := unix.Mount("", netns, "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("make %s shared: %v", netns, err)
	}
}

// perfPod is a restricted pod of the xdpq image running xdpqperf on two
// queues of the pool, its flows annotation UDP to its own address and
// port.
func perfPod(ns, name, image string, port int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Annotations: map[string]string{"xdpq.io/flows": fmt.Sprintf(`[{"protocol":"udp","destinationPort":"%d"}]`, port)}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To[int64](65534),
				RunAsGroup:     ptr.To[int64](65534),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "xdpqperf",
				Image:           image,
				ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/usr/local/bin/xdpqperf", "-mode", "rxdrop"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					scenarioResource: resource.MustParse("2"),
				}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// perfRun is a running xdpqperf pod: its queues, address and port, and
// its log, followed.
type perfRun struct {
	name   string
	ip     netip.Addr
	port   int
	queues []int
	ready  time.Time // when it said it had its sockets
	lines  chan string
	// counters are the pod's last words on where frames went: its
	// sockets' drops and its loop's longest absence (totals fills it).
	counters []string
}

var perfStart = regexp.MustCompile(`^xdpqperf rxdrop: allocation \S+, (\S+) queues \[([0-9 ]*)\]`)

// startPerfPod creates a perfPod, waits until it runs and has its
// sockets (its first line says so), and follows its log.
func startPerfPod(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, name, image string, port int) *perfRun {
	t.Helper()
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, perfPod(ns, name, image, port), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	return followPerfPod(ctx, t, cp, ns, name, port)
}

// followPerfPod waits until the perfPod name runs and has its sockets,
// and follows its log.
func followPerfPod(ctx context.Context, t testing.TB, cp *cluster.ControlPlane, ns, name string, port int) *perfRun {
	t.Helper()
	return followPerfPodOn(ctx, t, cp, ns, name, port, scenarioNIC)
}

// followPerfPodOn is followPerfPod of a pod whose queues are netdev's
// (as the pod names it).
func followPerfPodOn(ctx context.Context, t testing.TB, cp *cluster.ControlPlane, ns, name string, port int, netdev string) *perfRun {
	t.Helper()
	pod, err := cp.WaitPod(ctx, ns, name, cluster.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	r := &perfRun{name: name, port: port, lines: make(chan string, 64)}
	if r.ip, err = netip.ParseAddr(pod.Status.PodIP); err != nil {
		t.Fatalf("pod %s's IP %q: %v", name, pod.Status.PodIP, err)
	}
	go followLog(ctx, cp, ns, name, r.lines)
	var m []string
	var before []string
	for m == nil {
		select {
		case l, ok := <-r.lines:
			if !ok {
				t.Fatalf("pod %s ended before it said it had its sockets; its log:\n%s", name, strings.Join(before, "\n"))
			}
			if m = perfStart.FindStringSubmatch(l); m == nil {
				before = append(before, l)
			}
		case <-ctx.Done():
			t.Fatalf("pod %s never said it had its sockets", name)
		}
	}
	r.ready = time.Now()
	for _, f := range strings.Fields(m[2]) {
		q, _ := strconv.Atoi(f)
		r.queues = append(r.queues, q)
	}
	if m[1] != netdev {
		t.Errorf("pod %s's queues are on %s, want %s", name, m[1], netdev)
	}
	return r
}

// followLog sends the lines of the pod's log to lines until the
// container has ended and its log has been read to the end, then closes
// lines. A log stream that ends while the container runs (kubelet, which
// serves it, restarted) is opened again, its lines already sent skipped.
func followLog(ctx context.Context, cp *cluster.ControlPlane, ns, name string, lines chan<- string) {
	defer close(lines)
	pods := cp.Client.CoreV1().Pods(ns)
	sent := 0
	for ctx.Err() == nil {
		if logs, err := pods.GetLogs(name, &corev1.PodLogOptions{Follow: true}).Stream(ctx); err == nil {
			s := bufio.NewScanner(logs)
			for n := 0; s.Scan(); n++ {
				if n >= sent {
					lines <- s.Text()
					sent++
				}
			}
			logs.Close()
		}
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			continue // the API server away too: try again
		}
		if err != nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Terminated != nil {
			return
		}
		select { // kubelet restarting: ask again in a moment
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

var perfTotal = regexp.MustCompile(`^total q(\d+): rx (\d+) tx \d+$`)

// totals reads the pod's log to its end and returns its per-queue rx
// totals.
func (r *perfRun) totals(t *testing.T) map[int]uint64 {
	t.Helper()
	rx := map[int]uint64{}
	var all []string
	for l := range r.lines {
		all = append(all, l)
		if m := perfTotal.FindStringSubmatch(l); m != nil {
			q, _ := strconv.Atoi(m[1])
			rx[q], _ = strconv.ParseUint(m[2], 10, 64)
		}
		if strings.HasPrefix(l, "drops q") || strings.HasPrefix(l, "away q") {
			r.counters = append(r.counters, l) // the kernel's drops at its sockets, its loop's longest absence
		}
	}
	if len(rx) == 0 {
		t.Errorf("pod %s reported no totals; its log:\n%s", r.name, strings.Join(all, "\n"))
	}
	return rx
}

// waitAllocatable waits until the node's allocatable has want of the
// scenario's resource.
func waitAllocatable(ctx context.Context, t testing.TB, cp *cluster.ControlPlane, node string, want int64) {
	t.Helper()
	waitAllocatableOf(ctx, t, cp, node, scenarioResource, want)
}

// waitAllocatableOf is waitAllocatable of extended resource res.
func waitAllocatableOf(ctx context.Context, t testing.TB, cp *cluster.ControlPlane, node string, res corev1.ResourceName, want int64) {
	t.Helper()
	var got resource.Quantity
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got = n.Status.Allocatable[res]
		return got.Value() == want, nil
	})
	if err != nil {
		t.Fatalf("node %s's allocatable %s is %s, want %d: %v", node, res, got.String(), want, err)
	}
}

// waitFlowsApplied waits for the daemon's FlowsApplied Event on the pod.
func waitFlowsApplied(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, pod string) {
	t.Helper()
	waitFlowsEvent(ctx, t, cp, ns, pod, "FlowsApplied", "FlowsRefused")
}

// podUnschedulable is true when the scheduler found no node for the pod.
func podUnschedulable(p *corev1.Pod) (bool, error) {
	if p.Status.Phase != corev1.PodPending {
		return false, fmt.Errorf("pod %s is %s, want Pending", p.Name, p.Status.Phase)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true, nil
		}
	}
	return false, nil
}

// distinct reports whether qs are distinct queues below n.
func distinct(qs []int, n int) bool {
	seen := map[int]bool{}
	for _, q := range qs {
		if q < 0 || q >= n || seen[q] {
			return false
		}
		seen[q] = true
	}
	return true
}

// queueList is kubectl xdpq's QUEUES cell of consecutive or listed
// queues.
func queueList(qs []int) string {
	if len(qs) == 2 && qs[1] == qs[0]+1 {
		return fmt.Sprintf("%d-%d", qs[0], qs[1])
	}
	s := make([]string, len(qs))
	for i, q := range qs {
		s[i] = strconv.Itoa(q)
	}
	return strings.Join(s, ",")
}

// clearHostState removes what a previous run's daemon left in /run/xdpq
// (the chart's host path for its state and sockets), unless a daemon runs
// there: then the test cannot run.
func clearHostState(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile("/run/xdpq/agent/daemon.lock", os.O_RDWR, 0)
	if err == nil {
		defer f.Close()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			t.Fatalf("an xdpq daemon runs on /run/xdpq/agent (%v): stop it first", err)
		}
	}
	for _, dir := range []string{"/run/xdpq/agent", "/run/xdpq/alloc"} {
		if _, err := os.Stat(dir); err == nil {
			t.Logf("removing %s, left by an earlier daemon", dir)
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
		}
	}
}
