package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/internal/kubectlxdpq"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/dra"
	"github.com/xdpq/xdpq/test/e2e/cluster"
	"github.com/xdpq/xdpq/test/e2e/kubebin"
)

// The second node's: its name, directory, pods' range and NIC. Its
// pool is the scenario's (upf, served by DRA), on its own NIC.
const (
	workerName    = "xdpq-e2e-worker"
	workerDir     = "/var/lib/xdpq-e2e/worker"
	workerPodCIDR = "10.244.1.0/24"
	workerNIC     = "xdpqnic2"
	twoNodeClass  = scenarioPool + ".xdpq.io"
)

// xnode is one node of the two-node test: the cluster's node, its NIC
// and what runs there.
type xnode struct {
	node *cluster.Node
	nic  *cluster.NIC
	pod  *perfRun    // the pod whose claim's selector names the node's NIC
	send *peerSender // its flow, from the NIC's peer
}

func (x *xnode) addr() string { return x.node.IP.String() }

// TestTwoNodes is issue 41's fleet: a second node joins the control
// plane with its own containerd, kubelet, NIC, bpffs and xdpq daemon
// (cluster.NodeOptions.Isolated), and one DaemonSet of the previous
// release serves both, the second node's pool on its own NIC by a
// per-node override:
//
//  1. a DRA claim whose CEL selector names a node's NIC lands on that
//     node and nowhere else (one naming no node's NIC stays
//     unschedulable); each pod receives its flow;
//  2. each node publishes only its own ResourceSlices, XdpqNode and
//     metrics;
//  3. helm upgrade to this tree, under traffic on both nodes, goes one
//     node at a time (maxUnavailable 1): a node's daemon is replaced only
//     once the other's new one is Ready; allocations, containers,
//     claims and XdpqNodes are kept;
//  4. kubectl xdpq shows both nodes, and top both pods receiving;
//  5. the second node's kubelet stopped for two minutes under traffic
//     leaves the first node's slices, XdpqNode, daemon and pod
//     untouched; started again, the second comes back as it was;
//  6. every frame of both flows, per queue, across all of it.
func TestTwoNodes(t *testing.T) {
	testnet.RequireRoot(t)
	testnet.RequireTool(t, "util-linux", "unshare")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute) // fresh builds included
	defer cancel()
	prev := previousRelease(ctx, t)
	e := newScenarioEnvWith(ctx, t, cluster.Options{Network: true})
	cp := e.cp
	w := cluster.StartNodeForTest(t, cp, cluster.NodeOptions{Name: workerName, Dir: workerDir, PodCIDR: workerPodCIDR,
		Isolated: true, AliasDir: e.node.Dir})
	x1 := &xnode{node: e.node, nic: e.nic}
	x2 := &xnode{node: w, nic: cluster.AddNICOnForTest(t, w, workerNIC, nicQueues)}
	nodes := []*xnode{x1, x2}
	for _, x := range nodes {
		for _, a := range []string{e.archive, prev.Archive} {
			if err := x.node.ImportImage(ctx, a); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.installChart(ctx, t, prev.Chart, prev.Ref,
		"--set", "config.nodes[0].names[0]="+workerName,
		"--set", "config.nodes[0].pools[0].name="+scenarioPool,
		"--set", "config.nodes[0].pools[0].devices.netdevs[0]="+workerNIC+"#0-3",
		"--set", "config.nodes[0].pools[0].steering=software",
		"--set", "config.nodes[0].pools[0].linger=5s")
	for _, x := range nodes {
		waitVersion(ctx, t, cp, x.node.Name, prev.Version)
	}

	// 1. A claim lands where its selector's NIC is.
	const ns = "fleet"
	if err := cp.CreateNamespace(ctx, ns, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}); err != nil {
		t.Fatal(err)
	}
	for i, x := range nodes {
		name, port := fmt.Sprintf("rx-%d", i+1), 5000+i
		netdevClaimSelector(ctx, t, cp, ns, name, x.nic.Name, port)
		if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, draPerfPod(ns, name, prev.Ref, port, name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	netdevClaimSelector(ctx, t, cp, ns, "nowhere", "xdpqnic9", 5009)
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, draPerfPod(ns, "nowhere", prev.Ref, 5009, "nowhere"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, x := range nodes {
		x.pod = followPerfPodOn(ctx, t, cp, ns, fmt.Sprintf("rx-%d", i+1), 5000+i, x.nic.Name)
		checkLanded(ctx, t, cp, ns, x.pod.name, x.node.Name)
		waitFlowsApplied(ctx, t, cp, ns, x.pod.name)
		x.send = openPeerSender(t, x.nic, x.pod)
		sendEach(t, 1000, x.send)
	}
	if _, err := cp.WaitPod(ctx, ns, "nowhere", podUnschedulable); err != nil {
		t.Errorf("a claim naming no node's NIC: %v", err)
	}
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "nowhere", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	senders := []*peerSender{x1.send, x2.send}

	// 2. Each node publishes only its own.
	for _, x := range nodes {
		checkOwn(ctx, t, cp, x)
	}

	// 3. A rolling upgrade to this tree, one node at a time, under
	// traffic on both.
	kept := map[string]nodeKept{}
	for _, x := range nodes {
		kept[x.node.Name] = keptOf(ctx, t, cp, ns, x)
	}
	repo, tag, _ := strings.Cut(e.ref, ":")
	rollFleet(ctx, t, cp, senders, nodes, "upgrade", "xdpq", repoRoot+"/charts/xdpq", "-n", "kube-system",
		"--reuse-values", "--set", "image.repository="+repo, "--set", "image.tag="+tag)
	for _, x := range nodes {
		waitVersion(ctx, t, cp, x.node.Name, xdpq.Version())
		checkKeptOn(ctx, t, cp, ns, x, kept[x.node.Name])
	}
	sendEach(t, 1000, senders...)

	// 4. kubectl xdpq shows both.
	k := kubectl{path: cp.Binaries[kubebin.Kubectl], kubeconfig: cp.Kubeconfig, pluginDir: buildPlugin(ctx, t)}
	status, _ := k.must(ctx, t, "xdpq", "status")
	t.Logf("kubectl xdpq status:\n%s", status)
	for _, x := range nodes {
		if !strings.Contains(status, x.node.Name) || !strings.Contains(status, x.nic.Name) {
			t.Errorf("kubectl xdpq status shows no row of %s's %s", x.node.Name, x.nic.Name)
		}
		waitPodRowsOn(ctx, t, k, x.node.Name, x.nic.Name, ns, x.pod)
	}
	stop := sendWhile(senders...)
	out, _ := k.must(ctx, t, "xdpq", "top", "-o", "json", "--interval", "1s")
	if _, err := stop(); err != nil {
		t.Fatal(err)
	}
	var top kubectlxdpq.TopList
	if err := json.Unmarshal([]byte(out), &top); err != nil {
		t.Fatalf("kubectl xdpq top -o json: %v\n%s", err, out)
	}
	for _, x := range nodes {
		receiving := 0
		for _, q := range top.Items {
			if q.Node == x.node.Name && q.Netdev == x.nic.Name && q.Pod != nil && q.Pod.Name == x.pod.name && q.RXFramesPerSecond != nil && *q.RXFramesPerSecond > 0 {
				receiving++
			}
		}
		if receiving != len(x.pod.queues) {
			t.Errorf("kubectl xdpq top shows %d of %s's queues on %s receiving, want %d:\n%s", receiving, x.pod.name, x.node.Name, len(x.pod.queues), out)
		}
	}

	// 5. The second node's kubelet away for two minutes.
	kubeletAway(ctx, t, cp, ns, x1, x2, senders)
	sendEach(t, 1000, senders...)

	// 6. Every frame, per queue; then nothing left on either node.
	checkTotals(ctx, t, cp, ns, senders...)
	for _, x := range nodes {
		waitGone(ctx, t, cp, ns, x.pod.name)
		waitFreedAt(ctx, t, cp, x.node.Name, x.addr())
	}
	if out, err := cp.Helm(ctx, "uninstall", "xdpq", "-n", "kube-system", "--wait", "--timeout=2m"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// netdevClaimSelector is a claim template of 2 queues of the pool on
// one netdev, the netdev named by a CEL selector, with a flow to port.
func netdevClaimSelector(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, name, netdev string, port int) {
	t.Helper()
	params := fmt.Sprintf(`{"apiVersion": "xdpq.io/v1alpha1", "kind": "QueueConfig", "flows": [{"protocol": "udp", "destinationPort": "%d"}]}`, port)
	spec := claimSpec(twoNodeClass, 2, params)
	spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: fmt.Sprintf(`device.attributes["xdpq.io"].netdev == %q`, netdev)}}}
	spec.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{"queues"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("xdpq.io/netdev"))}}
	if err := createClaimTemplate(ctx, cp, ns, name, spec); err != nil {
		t.Fatalf("create ResourceClaimTemplate %s: %v", name, err)
	}
}

// checkLanded checks that pod runs on node with its claim's devices from
// node's pool, allocated for node alone.
func checkLanded(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, pod, node string) {
	t.Helper()
	p, err := cp.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != node {
		t.Errorf("pod %s runs on %q, want %s, whose NIC its claim's selector names", pod, p.Spec.NodeName, node)
	}
	claims, err := cp.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, c := range claims.Items {
		if !strings.HasPrefix(c.Name, pod+"-") {
			continue
		}
		found = true
		a := c.Status.Allocation
		if a == nil {
			t.Errorf("claim %s: not allocated", c.Name)
			continue
		}
		for _, r := range a.Devices.Results {
			if r.Pool != dra.PoolName(node, scenarioPool) {
				t.Errorf("claim %s: device %s of pool %s, want of %s", c.Name, r.Device, r.Pool, dra.PoolName(node, scenarioPool))
			}
		}
		sel := a.NodeSelector
		if sel == nil || len(sel.NodeSelectorTerms) != 1 || !strings.Contains(sel.NodeSelectorTerms[0].String(), node) {
			t.Errorf("claim %s: allocated for nodes %v, want %s alone", c.Name, sel, node)
		}
	}
	if !found {
		t.Errorf("no claim of pod %s", pod)
	}
}

// checkOwn checks that the node's ResourceSlices, XdpqNode and metrics
// name only its own pool and NIC.
func checkOwn(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, x *xnode) {
	t.Helper()
	name := x.node.Name
	own := nodeSlices(ctx, t, cp, name)
	if len(own) == 0 {
		t.Errorf("node %s publishes no ResourceSlice", name)
	}
	for _, s := range own {
		if s.Spec.Pool.Name != dra.PoolName(name, scenarioPool) {
			t.Errorf("node %s's slice %s: pool %s, want %s", name, s.Name, s.Spec.Pool.Name, dra.PoolName(name, scenarioPool))
		}
		for _, d := range s.Spec.Devices {
			if v := d.Attributes["netdev"].StringValue; v == nil || *v != x.nic.Name {
				t.Errorf("node %s's slice %s: device %s of netdev %v, want %s", name, s.Name, d.Name, v, x.nic.Name)
			}
		}
	}
	out, err := cp.Kubectl(ctx, "get", "xdpqnode", name, "-o", "jsonpath={.status.netdevs[*].name}")
	if err != nil || strings.TrimSpace(string(out)) != x.nic.Name {
		t.Errorf("XdpqNode %s shows netdevs %q (%v), want only %s", name, out, err, x.nic.Name)
	}
	held := scrapeAt(ctx, t, x.addr(), "xdpq_queue_info")
	for _, sm := range held {
		if sm.labels["netdev"] != x.nic.Name {
			t.Errorf("node %s's daemon reports a queue of %s, want only %s's", name, sm.labels["netdev"], x.nic.Name)
		}
	}
	if len(held) != len(x.pod.queues) {
		t.Errorf("node %s's daemon reports %d queues held, want %s's %d", name, len(held), x.pod.name, len(x.pod.queues))
	}
}

// nodeSlices returns the ResourceSlices of node.
func nodeSlices(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node string) []resourceapi.ResourceSlice {
	t.Helper()
	l, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// sliceDevices is the node's slices' devices as pool/device, sorted: what must come back after its kubelet restarts (the
// kubelet deletes its node's slices at start, the driver makes them
// again, as new objects).
func sliceDevices(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node string) string {
	t.Helper()
	var devs []string
	for _, s := range nodeSlices(ctx, t, cp, node) {
		for _, d := range s.Spec.Devices {
			devs = append(devs, fmt.Sprintf("%s/%s", s.Spec.Pool.Name, d.Name))
		}
	}
	sort.Strings(devs)
	return strings.Join(devs, " ")
}

// sliceVersions is the node's slices' names and resourceVersions: the
// same objects, unchanged.
func sliceVersions(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node string) string {
	t.Helper()
	var vs []string
	for _, s := range nodeSlices(ctx, t, cp, node) {
		vs = append(vs, s.Name+"@"+s.ResourceVersion)
	}
	sort.Strings(vs)
	return strings.Join(vs, " ")
}

// nodeKept is what a change of release or a kubelet's absence must keep
// of a node: its allocations, its pod's containers, its XdpqNode object.
type nodeKept struct {
	allocs, containers string
	xnode              types.UID
}

func keptOf(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns string, x *xnode) nodeKept {
	t.Helper()
	return nodeKept{
		allocs:     waitAllocations(ctx, t, cp, x.node.Name, 1),
		containers: containerIDs(ctx, t, cp, ns, x.pod.name),
		xnode:      xdpqNodeUID(ctx, t, cp, x.node.Name),
	}
}

// checkKeptOn checks the node kept what k says, and its pod's claim is
// Ready.
func checkKeptOn(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns string, x *xnode, k nodeKept) {
	t.Helper()
	if got := waitAllocations(ctx, t, cp, x.node.Name, 1); got != k.allocs {
		t.Errorf("node %s: allocations %q, want the same as before %q", x.node.Name, got, k.allocs)
	}
	if got := containerIDs(ctx, t, cp, ns, x.pod.name); got != k.containers {
		t.Errorf("node %s: the pod's containers changed:\nbefore %s\nafter  %s", x.node.Name, k.containers, got)
	}
	if got := xdpqNodeUID(ctx, t, cp, x.node.Name); got != k.xnode {
		t.Errorf("node %s: the XdpqNode was made again (uid %s, was %s)", x.node.Name, got, k.xnode)
	}
	waitClaimsReadyOf(ctx, t, cp, ns, "True", x.pod.name)
}

// daemonState is a pod of the DaemonSet: its name, whether it is being
// deleted, whether it is Ready.
type daemonState struct {
	name     string
	deleting bool
	ready    bool
}

// daemonPodsByNode returns the DaemonSet's pods by node.
func daemonPodsByNode(ctx context.Context, cp *cluster.ControlPlane) (map[string][]daemonState, error) {
	pods, err := cp.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=xdpq"})
	if err != nil {
		return nil, err
	}
	out := map[string][]daemonState{}
	for _, p := range pods.Items {
		out[p.Spec.NodeName] = append(out[p.Spec.NodeName], daemonState{name: p.Name, deleting: p.DeletionTimestamp != nil, ready: podReady(p.Status.Conditions)})
	}
	return out, nil
}

// rollFleet runs helm with args (an upgrade) while the senders send, and
// follows the DaemonSet's pods every 100 ms: on each node, the moment
// its old pod was seen deleted and the moment a new one was seen Ready.
// It checks that the nodes went one at a time (a node's old pod not seen
// deleted before the node before was seen with its new one Ready; one
// look seeing both is within 100 ms) and logs how long each node had no
// daemon and what was sent meanwhile.
func rollFleet(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, senders []*peerSender, nodes []*xnode, args ...string) {
	t.Helper()
	before, err := daemonPodsByNode(ctx, cp)
	if err != nil {
		t.Fatal(err)
	}
	old := map[string]string{}
	for _, x := range nodes {
		if len(before[x.node.Name]) != 1 || !before[x.node.Name][0].ready {
			t.Fatalf("node %s's daemon pods before the upgrade: %+v, want one Ready", x.node.Name, before[x.node.Name])
		}
		old[x.node.Name] = before[x.node.Name][0].name
	}
	type window struct{ gone, ready time.Time }
	win := map[string]*window{}
	for _, x := range nodes {
		win[x.node.Name] = &window{}
	}
	stop := sendWhile(senders...)
	start := time.Now()
	if out, err := cp.Helm(ctx, args...); err != nil {
		_, _ = stop()
		t.Fatalf("helm %s: %v\n%s", args[0], err, out)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		// One time per look: what one look sees happened in the same
		// 100 ms.
		seen := time.Now()
		now, err := daemonPodsByNode(ctx, cp)
		if err != nil {
			return false, nil // the apiserver busy: ask again
		}
		done := true
		for node, w := range win {
			oldThere := false
			for _, p := range now[node] {
				if p.name == old[node] {
					oldThere = !p.deleting
				} else if !p.deleting && p.ready && w.ready.IsZero() {
					w.ready = seen
				}
			}
			if !oldThere && w.gone.IsZero() {
				w.gone = seen
			}
			done = done && !w.ready.IsZero() && !w.gone.IsZero()
		}
		return done, nil
	})
	batches, serr := stop()
	if err != nil {
		t.Fatalf("helm %s: the DaemonSet's pods were not all replaced by Ready ones: %v", args[0], err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	var order []string
	for _, x := range nodes {
		order = append(order, x.node.Name)
	}
	slices.SortFunc(order, func(a, b string) int { return win[a].gone.Compare(win[b].gone) })
	for i := 1; i < len(order); i++ {
		prev, next := win[order[i-1]], win[order[i]]
		if next.gone.Before(prev.ready) {
			t.Errorf("helm %s: node %s's daemon was deleted %s before node %s's new one was Ready: two nodes without a daemon at once",
				args[0], order[i], prev.ready.Sub(next.gone).Round(time.Millisecond), order[i-1])
		}
	}
	for _, n := range order {
		t.Logf("helm %s: node %s without a daemon for %s (from %s to %s after helm began)", args[0], n,
			win[n].ready.Sub(win[n].gone).Round(time.Millisecond), win[n].gone.Sub(start).Round(time.Millisecond), win[n].ready.Sub(start).Round(time.Millisecond))
	}
	t.Logf("helm %s: %d frames sent per queue of each pod meanwhile", args[0], batches*100)
}

// kubeletAway stops the second node's kubelet for two minutes while the
// senders send: the node turns NotReady, and the first node's slices,
// XdpqNode, daemon pod and pod stay as they were; then starts it again
// and checks the second node comes back as it was (its pod and daemon
// the same containers, its claim Ready, its XdpqNode the same object,
// its slices the same devices).
func kubeletAway(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns string, x1, x2 *xnode, senders []*peerSender) {
	t.Helper()
	const away = 2 * time.Minute
	k1, k2 := keptOf(ctx, t, cp, ns, x1), keptOf(ctx, t, cp, ns, x2)
	slices1, devices2 := sliceVersions(ctx, t, cp, x1.node.Name), sliceDevices(ctx, t, cp, x2.node.Name)
	d1, d2 := daemonContainers(ctx, t, cp, x1.node.Name), daemonContainers(ctx, t, cp, x2.node.Name)
	// 5,000 frames a second per queue, a quarter of sendWhile's: over
	// two minutes, a kubelet starting and a second node on two cores
	// keep a pod's loop away for up to 180 ms at times, more than its
	// 2,048-entry fill ring holds at 20,000 (the pod then counts
	// fill-ring-empty drops, not xdpq).
	stop := sendWhileEvery(20*time.Millisecond, senders...)
	stopped := time.Now()
	if err := x2.node.StopKubelet(); err != nil {
		_, _ = stop()
		t.Fatal(err)
	}
	var notReady time.Duration
	tick := time.NewTicker(time.Second)
	for time.Since(stopped) < away {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-tick.C:
		}
		n2, err := cp.Client.CoreV1().Nodes().Get(ctx, x2.node.Name, metav1.GetOptions{})
		if err == nil && notReady == 0 && !nodeReadyCondition(n2) {
			notReady = time.Since(stopped)
		}
		n1, err := cp.Client.CoreV1().Nodes().Get(ctx, x1.node.Name, metav1.GetOptions{})
		if err != nil || !nodeReadyCondition(n1) {
			t.Errorf("node %s while %s's kubelet is away: not Ready (%v)", x1.node.Name, x2.node.Name, err)
		}
	}
	tick.Stop()
	if notReady == 0 {
		t.Errorf("node %s stayed Ready for %s without its kubelet: the test proves nothing", x2.node.Name, away)
	}
	if got := sliceVersions(ctx, t, cp, x1.node.Name); got != slices1 {
		t.Errorf("node %s's slices changed while %s's kubelet was away:\nbefore %s\nafter  %s", x1.node.Name, x2.node.Name, slices1, got)
	}
	checkKeptOn(ctx, t, cp, ns, x1, k1)
	if got := daemonContainers(ctx, t, cp, x1.node.Name); got != d1 {
		t.Errorf("node %s's daemon changed while %s's kubelet was away:\nbefore %s\nafter  %s", x1.node.Name, x2.node.Name, d1, got)
	}

	if err := x2.node.StartKubelet(ctx); err != nil {
		_, _ = stop()
		t.Fatal(err)
	}
	back := time.Since(stopped)
	batches, err := stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %s's kubelet away %s: NotReady after %s, Ready again %s after it stopped; %d frames sent per queue of each pod meanwhile",
		x2.node.Name, away, notReady.Round(time.Second), back.Round(time.Second), batches*100)
	checkKeptOn(ctx, t, cp, ns, x2, k2)
	if got := daemonContainers(ctx, t, cp, x2.node.Name); got != d2 {
		t.Errorf("node %s's daemon changed across its kubelet's absence:\nbefore %s\nafter  %s", x2.node.Name, d2, got)
	}
	var got string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got = sliceDevices(ctx, t, cp, x2.node.Name)
		return got == devices2, nil
	})
	if err != nil {
		t.Errorf("node %s's slices after its kubelet came back:\n%s\nwant the devices of before:\n%s", x2.node.Name, got, devices2)
	}
}

// daemonContainers is the container IDs and restarts of the DaemonSet's
// pod on node.
func daemonContainers(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, node string) string {
	t.Helper()
	pods, err := cp.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=xdpq",
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "%s %s: ", p.Name, p.UID)
		for _, c := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, "%s %s restarts=%d; ", c.Name, c.ContainerID, c.RestartCount)
		}
	}
	return b.String()
}

func nodeReadyCondition(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
