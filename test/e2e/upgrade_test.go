package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/internal/testing/release"
	"github.com/xdpq/xdpq/internal/testing/testbin"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/test/e2e/cluster"
	"github.com/xdpq/xdpq/test/e2e/images"
	"github.com/xdpq/xdpq/test/e2e/kubebin"
)

// The upgrade's pools: the scenario's NIC split between a pool the
// device plugin serves and one DRA serves, and the DRA scenario's
// netdev-mode pool.
const (
	upgradeDRAPool  = "q"
	upgradeDRAClass = upgradeDRAPool + ".xdpq.io"
)

// TestUpgradeRollback is issue 41's upgrade and rollback under traffic,
// between the previous release (PREVIOUS_RELEASE, built from this
// repository's history with its own tools) and this tree:
//
//  1. helm install of the previous release's chart and image, with a
//     pod served by the device plugin, one with a DRA claim of queues and
//     one with a DRA claim of a whole netdev, all three running the
//     previous release's client and receiving their flows;
//  2. helm upgrade to this tree's chart and image while frames flow: the
//     DaemonSet replaces its pod, the new daemon reads the records and
//     pins, the claims stay prepared, the allocations and the XdpqNode
//     are the same objects, and its version says the new release;
//  3. a pod of the previous release's client leases and receives from
//     this daemon;
//  4. helm rollback while frames flow: the same, back to the previous
//     release;
//  5. a pod of this tree's client leases and receives from the previous
//     daemon;
//  6. the three pods report, per queue, every frame of their flow sent
//     across both changes.
func TestUpgradeRollback(t *testing.T) {
	testnet.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute) // fresh builds included
	defer cancel()
	prev := previousRelease(ctx, t)
	e := newScenarioEnv(ctx, t)
	cp, node, nic := e.cp, e.node, e.nic
	if err := node.ImportImage(ctx, prev.Archive); err != nil {
		t.Fatal(err)
	}
	vf := cluster.AddNICForTest(t, draNetdevNIC, 2)
	pools := []string{
		"--set", "config.pools[0].devices.netdevs[0]=" + scenarioNIC + "#0-1",
		"--set", "config.pools[0].servedBy=devicePlugin",
		"--set", "config.pools[1].name=" + upgradeDRAPool,
		"--set", "config.pools[1].devices.netdevs[0]=" + scenarioNIC + "#2-5",
		"--set", "config.pools[1].steering=software",
		"--set", "config.pools[1].linger=5s",
		"--set", "config.pools[2].name=" + draNetdevPool,
		"--set", "config.pools[2].mode=netdev",
		"--set", "config.pools[2].devices.netdevs[0]=" + draNetdevNIC,
	}

	// 1. The previous release, with three pods of its client.
	e.installChart(ctx, t, prev.Chart, prev.Ref, pools...)
	waitVersion(ctx, t, cp, node.Name, prev.Version)
	waitAllocatable(ctx, t, cp, node.Name, 2)
	const ns = "telco"
	if err := cp.CreateNamespace(ctx, ns, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}); err != nil {
		t.Fatal(err)
	}
	dp := startPerfPod(ctx, t, cp, ns, "rx-dp", prev.Ref, 5000)
	queueClaimTemplate(ctx, t, cp, ns, "rx-q", 5001)
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, draPerfPod(ns, "rx-q", prev.Ref, 5001, "rx-q"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	q := followPerfPod(ctx, t, cp, ns, "rx-q", 5001)
	netdevClaimTemplate(ctx, t, cp, ns, "rx-v", `{"name": "net1", "addresses": ["10.77.0.2/24"]}`,
		`[{"protocol": "udp", "destinationPort": "5002"}]`)
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, draPerfPod(ns, "rx-v", prev.Ref, 5002, "rx-v"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v := followPerfPodOn(ctx, t, cp, ns, "rx-v", 5002, "net1")
	v.ip = netip.MustParseAddr("10.77.0.2")
	if !slices.Equal(dp.queues, []int{0, 1}) || len(q.queues) != 2 || len(v.queues) != 2 {
		t.Fatalf("queues: rx-dp %v (want [0 1]), rx-q %v, rx-v %v (want two each)", dp.queues, q.queues, v.queues)
	}
	for _, p := range []*perfRun{dp, q} {
		waitFlowsApplied(ctx, t, cp, ns, p.name)
	}
	sdp, sq, sv := openPeerSender(t, nic, dp), openPeerSender(t, nic, q), openPeerSender(t, vf, v)
	all := []*peerSender{sdp, sq, sv}
	sendEach(t, 1000, all...)
	// 0.1.0 calls a netdev in its pod missing (its claim not Ready):
	// fixed since, and checked once this tree's daemon runs.
	prevReady, nowReady := []string{q.name, v.name}, []string{q.name, v.name}
	if prev.Version == "0.1.0" {
		prevReady = []string{q.name}
	}
	waitClaimsReadyOf(ctx, t, cp, ns, "True", prevReady...)

	// 2. helm upgrade to this tree, under traffic.
	allocs := waitAllocations(ctx, t, cp, node.Name, 3)
	untouched := containerIDs(ctx, t, cp, ns, dp.name, q.name, v.name)
	xnode := xdpqNodeUID(ctx, t, cp, node.Name)
	repo, tag, _ := strings.Cut(e.ref, ":")
	change(ctx, t, cp, "upgrade", xdpq.Version(), all, "upgrade", "xdpq", repoRoot+"/charts/xdpq", "-n", "kube-system",
		"--reuse-values", "--set", "image.repository="+repo, "--set", "image.tag="+tag)
	checkKept(ctx, t, cp, node.Name, ns, allocs, untouched, xnode, nowReady, dp, q, v)
	sendEach(t, 1000, all...)

	// 3. The previous release's client against this daemon.
	queueClaimTemplate(ctx, t, cp, ns, "skew", 5003)
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, draPerfPod(ns, "rx-old", prev.Ref, 5003, "skew"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	old := followPerfPod(ctx, t, cp, ns, "rx-old", 5003)
	waitFlowsApplied(ctx, t, cp, ns, old.name)
	sk := openPeerSender(t, nic, old)
	sendEach(t, 1000, sk)
	checkTotals(ctx, t, cp, ns, sk)
	waitGone(ctx, t, cp, ns, old.name)

	// 4. helm rollback to the previous release, under traffic.
	change(ctx, t, cp, "rollback", prev.Version, all, "rollback", "xdpq", "-n", "kube-system")
	checkKept(ctx, t, cp, node.Name, ns, allocs, untouched, xnode, prevReady, dp, q, v)
	sendEach(t, 1000, all...)

	// 5. This tree's client against the previous daemon, on the queues
	// rx-old had.
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, draPerfPod(ns, "rx-new", e.ref, 5003, "skew"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n := followPerfPod(ctx, t, cp, ns, "rx-new", 5003)
	if !slices.Equal(n.queues, old.queues) {
		t.Fatalf("rx-new has queues %v, want rx-old's %v (the pool's only free ones)", n.queues, old.queues)
	}
	waitFlowsApplied(ctx, t, cp, ns, n.name)
	sk.r, sk.seq, sk.counted = n, 0, 0
	sendEach(t, 1000, sk)
	checkTotals(ctx, t, cp, ns, sk)

	// 5b. This tree's CNI plugin against the previous daemon, as during
	// an upgrade's first moments (the chart's installer replaces the
	// plugin on the host before the new daemon is up): STATUS, then
	// ADD, CHECK and DEL of an attachment of rx-dp chained after its
	// bridge, a flow to a port no frame is sent to.
	cniSkew(ctx, t, cp, node, ns, dp)

	// 6. Every frame of every flow, per queue, across both.
	checkTotals(ctx, t, cp, ns, all...)
	for _, p := range []string{n.name, dp.name, q.name, v.name} {
		waitGone(ctx, t, cp, ns, p)
	}
	waitFreed(ctx, t, cp, node.Name)
	if out, err := cp.Helm(ctx, "uninstall", "xdpq", "-n", "kube-system", "--wait", "--timeout=2m"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// previousRelease builds (or finds in kubebin's cache) the previous
// release's image and chart, PREVIOUS_RELEASE's.
func previousRelease(ctx context.Context, t *testing.T) images.Release {
	t.Helper()
	version, commit, err := release.Previous(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	built := time.Now()
	prev, err := images.BuildRelease(ctx, repoRoot, version, commit, kubebin.CacheDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("previous release %s (%s): image and chart in %s", prev.Version, prev.Commit[:12], time.Since(built).Round(time.Second))
	if prev.Version == xdpq.Version() {
		t.Fatalf("the previous release is this tree's %s", prev.Version)
	}
	return prev
}

// change runs helm with args (an upgrade or a rollback) while the
// senders send, waits until the DaemonSet's new pod is Ready and the
// XdpqNode says release version, and logs how long the node had no
// daemon and what was sent meanwhile.
func change(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, what, version string, senders []*peerSender, args ...string) {
	t.Helper()
	old := daemonPod(ctx, t, cp)
	stop := sendWhile(senders...)
	start := time.Now()
	if out, err := cp.Helm(ctx, args...); err != nil {
		_, _ = stop()
		t.Fatalf("helm %s: %v\n%s", what, err, out)
	}
	away, ready := waitReplaced(ctx, t, cp, old.Name)
	waitVersion(ctx, t, cp, old.Spec.NodeName, version)
	batches, err := stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("helm %s to %s: daemon pod %s gone, %s Ready %s later (%s after helm began); %d frames sent per queue meanwhile",
		what, version, old.Name, ready.Name, away.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), batches*100)
}

// waitReplaced waits until the daemon's pod old is gone and another is
// Ready, and returns how long the node had no daemon running: from the
// moment old was seen deleted to the moment the new pod was seen Ready.
func waitReplaced(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, old string) (time.Duration, *podRef) {
	t.Helper()
	var deleted time.Time
	var ready *podRef
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=xdpq"})
		if err != nil {
			return false, nil
		}
		oldThere := false
		for _, p := range pods.Items {
			if p.Name == old {
				oldThere = p.DeletionTimestamp == nil
				continue
			}
			if p.DeletionTimestamp == nil && podReady(p.Status.Conditions) {
				ready = &podRef{Name: p.Name, UID: p.UID}
			}
		}
		if !oldThere && deleted.IsZero() {
			deleted = time.Now()
		}
		return !deleted.IsZero() && ready != nil, nil
	})
	if err != nil {
		t.Fatalf("the daemon's pod %s was not replaced by a Ready one: %v", old, err)
	}
	return time.Since(deleted), ready
}

type podRef struct {
	Name string
	UID  types.UID
}

// waitVersion waits until the node's XdpqNode says its daemon runs
// release version.
func waitVersion(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node, version string) {
	t.Helper()
	var got string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := cp.Kubectl(ctx, "get", "xdpqnode", node, "-o", "jsonpath={.status.summary.version}")
		got = string(out)
		return err == nil && got == version, nil
	})
	if err != nil {
		t.Fatalf("the XdpqNode's version is %q, want %s: %v", got, version, err)
	}
}

// checkKept checks what a change of release must keep: the allocations,
// the pods' containers, the XdpqNode object, the claims of the pods
// ready Ready, the device plugin's capacity.
func checkKept(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node, ns, allocs, containers string, xnode types.UID, ready []string, runs ...*perfRun) {
	t.Helper()
	if got := allocationIDs(ctx, t, cp, node); got != allocs {
		t.Errorf("allocations %q, want the same as before %q", got, allocs)
	}
	names := make([]string, len(runs))
	for i, r := range runs {
		names[i] = r.name
	}
	if got := containerIDs(ctx, t, cp, ns, names...); got != containers {
		t.Errorf("the pods' containers changed:\nbefore %s\nafter  %s", containers, got)
	}
	if got := xdpqNodeUID(ctx, t, cp, node); got != xnode {
		t.Errorf("the XdpqNode was made again (uid %s, was %s)", got, xnode)
	}
	waitClaimsReadyOf(ctx, t, cp, ns, "True", ready...)
	waitAllocatable(ctx, t, cp, node, 2)
}

func xdpqNodeUID(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node string) types.UID {
	t.Helper()
	out, err := cp.Kubectl(ctx, "get", "xdpqnode", node, "-o", "jsonpath={.metadata.uid}")
	if err != nil || len(out) == 0 {
		t.Fatalf("the XdpqNode of %s: %v %s", node, err, out)
	}
	return types.UID(out)
}

// queueClaimTemplate is a claim template of 2 queues of the upgrade's
// DRA pool on one netdev, with a flow to port.
func queueClaimTemplate(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, name string, port int) {
	t.Helper()
	params := fmt.Sprintf(`{"apiVersion": "xdpq.io/v1alpha1", "kind": "QueueConfig", "flows": [{"protocol": "udp", "destinationPort": "%d"}]}`, port)
	spec := claimSpec(upgradeDRAClass, 2, params)
	spec.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{"queues"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("xdpq.io/netdev"))}}
	if err := createClaimTemplate(ctx, cp, ns, name, spec); err != nil {
		t.Fatalf("create ResourceClaimTemplate %s: %v", name, err)
	}
}

// sendEach sends n frames of each sender's flow, counted.
func sendEach(t *testing.T, n int, senders ...*peerSender) {
	t.Helper()
	for _, s := range senders {
		if err := s.send(n, true); err != nil {
			t.Fatal(err)
		}
	}
}

// waitGone waits until the pod is deleted.
func waitGone(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, pod string) {
	t.Helper()
	if out, err := cp.Kubectl(ctx, "-n", ns, "wait", "--for=delete", "pod/"+pod, "--timeout=60s"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// waitAllocations waits until the node's XdpqNode lists n allocations
// (its status is written coalesced, a moment after a change) and
// returns them as allocationIDs does.
func waitAllocations(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node string, n int) string {
	t.Helper()
	var ids string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		ids = allocationIDs(ctx, t, cp, node)
		return len(strings.Fields(ids)) == n, nil
	})
	if err != nil {
		t.Fatalf("the XdpqNode lists allocations %q, want %d: %v", ids, n, err)
	}
	return ids
}

// cniSkew runs this tree's CNI plugin, as a runtime would, against the
// daemon on the node: STATUS; ADD of an attachment of pod r (chained
// after the node's bridge: its address from the previous result) with a
// flow to UDP port 6000 of its address; CHECK; DEL.
func cniSkew(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node *cluster.Node, ns string, r *perfRun) {
	t.Helper()
	plugin := filepath.Join(t.TempDir(), "xdpq")
	testbin.Build(t, plugin, "github.com/xdpq/xdpq/cmd/cni")
	pod, err := cp.Client.CoreV1().Pods(ns).Get(ctx, r.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	netns := podNetns(t, string(pod.UID))
	conf := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": "skew", "type": "xdpq", "resourceName": %q, "daemonSocket": "/run/xdpq/xdpq-api.sock",
		"flows": [{"protocol": "udp", "destination": "ipam", "destinationPort": "6000"}],
		"prevResult": {"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "sandbox": %q}], "ips": [{"address": "%s/24", "interface": 0}]}}`,
		scenarioResource, netns, r.ip)
	args := fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_UID=%s", ns, r.name, pod.UID)
	for _, verb := range []string{"STATUS", "ADD", "CHECK", "DEL"} {
		cmd := exec.CommandContext(ctx, plugin)
		cmd.Env = append(os.Environ(), "CNI_COMMAND="+verb, "CNI_CONTAINERID=skew-"+string(pod.UID), "CNI_NETNS="+netns,
			"CNI_IFNAME=eth0", "CNI_ARGS="+args, "CNI_PATH="+node.CNIBinDir)
		cmd.Stdin = strings.NewReader(conf)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("this tree's CNI plugin, %s against the node's daemon: %v\n%s", verb, err, out)
		}
		t.Logf("this tree's CNI plugin, %s against the node's daemon: ok %s", verb, bytes.TrimSpace(out))
	}
}

// podNetns is the network namespace of the pod uid's processes, as
// /proc/<pid>/ns/net of one of them.
func podNetns(t *testing.T, uid string) string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err == nil && bytes.Contains(cg, []byte("pod"+uid)) {
			return filepath.Join("/proc", e.Name(), "ns", "net")
		}
	}
	t.Fatalf("no process of pod %s", uid)
	return ""
}

// podReady is whether conds has Ready True.
func podReady(conds []corev1.PodCondition) bool {
	for _, c := range conds {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
