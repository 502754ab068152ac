package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/test/e2e/cluster"
)

// scenarioClass is the DeviceClass the chart makes for the scenario's
// pool.
const scenarioClass = scenarioPool + ".xdpq.io"

// The DRA scenario's netdev-mode pool, of one NIC of 2 queues.
const (
	draNetdevPool = "vf"
	draNetdevNIC  = "xdpqnic1"
)

// TestDRAScenario is xdpq as a DRA driver on the real node (containerd 2,
// CDI): helm install with the pool served by DRA (the chart's default
// where the cluster serves resource.k8s.io/v1); the node's
// ResourceSlice shows the pool's queues with their attributes; a
// restricted pod whose ResourceClaimTemplate asks for 2 queues on one
// netdev, with flows in its config, receives exactly what is sent to its
// flow; a pod whose claim's config is invalid is refused, the field
// named in its events, leaving nothing; a pod that asks for the
// extended resource, as for the device plugin, is served by DRA; the
// pods gone, the queues are free; helm uninstall while a claim is
// prepared waits for kubelet to unprepare it (its pod keeps receiving,
// and goes when deleted), then removes the slices and the class.
func TestDRAScenario(t *testing.T) {
	testnet.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute) // a fresh build included
	defer cancel()
	e := newScenarioEnv(ctx, t)
	cp, node, nic, ref := e.cp, e.node, e.nic, e.ref
	// A netdev-mode pool too: a whole NIC per claim, moved into the pod
	// through containerd's NRI.
	vf := cluster.AddNICForTest(t, draNetdevNIC, 2)
	e.install(ctx, t, "--set", "config.pools[1].name="+draNetdevPool, "--set", "config.pools[1].mode=netdev",
		"--set", "config.pools[1].devices.netdevs[0]="+draNetdevNIC)

	// 1. The ResourceSlices: the pool's 4 queues; the netdev pool's NIC.
	var slice resourceapi.ResourceSlice
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 2 {
			return false, err
		}
		var netdevs int
		for _, it := range l.Items {
			switch it.Spec.Pool.Name {
			case node.Name + "/" + scenarioPool:
				slice = it
			case node.Name + "/" + draNetdevPool:
				netdevs = len(it.Spec.Devices)
			}
		}
		return len(slice.Spec.Devices) == scenarioQueues && netdevs == 1, nil
	})
	if err != nil {
		out, _ := cp.Kubectl(ctx, "get", "resourceslices", "-o", "yaml")
		t.Fatalf("no ResourceSlice of the pool's %d queues: %v\n%s", scenarioQueues, err, out)
	}
	if slice.Spec.Driver != "xdpq.io" || slice.Spec.Pool.Name != node.Name+"/"+scenarioPool || ptr.Deref(slice.Spec.NodeName, "") != node.Name {
		t.Errorf("slice %+v", slice.Spec)
	}
	for i, d := range slice.Spec.Devices {
		want := fmt.Sprintf("%s-q%d", scenarioNIC, i)
		nd, q := d.Attributes["netdev"], d.Attributes["queue"]
		if d.Name != want || ptr.Deref(nd.StringValue, "") != scenarioNIC || ptr.Deref(q.IntValue, -1) != int64(i) || len(d.Taints) != 0 {
			t.Errorf("device %d: %+v, want %s (netdev %s, queue %d, untainted)", i, d, want, scenarioNIC, i)
		}
	}
	out, _ := cp.Kubectl(ctx, "get", "resourceslices")
	t.Logf("kubectl get resourceslices:\n%s", out)
	// The chart's DeviceClass of each DRA pool, as docs/pods.md shows
	// them.
	out, err = cp.Kubectl(ctx, "get", "deviceclasses")
	t.Logf("kubectl get deviceclasses:\n%s", out)
	if classes, want := tableNames(out), []string{scenarioPool + ".extended.xdpq.io", scenarioClass, draNetdevPool + ".extended.xdpq.io", draNetdevPool + ".xdpq.io"}; err != nil || !slices.Equal(classes, want) {
		t.Errorf("kubectl get deviceclasses: %q %v, want %q", classes, err, want)
	}

	const ns = "telco"
	if err := cp.CreateNamespace(ctx, ns, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}); err != nil {
		t.Fatal(err)
	}
	// 2. A claim template with an invalid config is refused at apply
	// (the chart's ValidatingAdmissionPolicy), the field named.
	if err := tryClaimTemplate(ctx, cp, ns, "bad", `[{"protocol": "udp", "destinationPort": "70000"}]`); err == nil ||
		!strings.Contains(err.Error(), "flows[].destinationPort") {
		t.Errorf("a claim template with port 70000: %v, want a refusal naming flows[].destinationPort", err)
	}
	// One whose fault only the driver sees (a range from high to low): its
	// pod is refused before its containers start, the field named;
	// nothing is left of it.
	claimTemplate(ctx, t, cp, ns, "bad", `[{"protocol": "udp", "destinationPort": "5001-5000"}]`)
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, draPerfPod(ns, "rx-bad", ref, 5009, "bad"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodEvent(ctx, t, cp, ns, "rx-bad", "flows[0].destinationPort")
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "rx-bad", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	if out, err := cp.Kubectl(ctx, "-n", ns, "wait", "--for=delete", "pod/rx-bad", "--timeout=60s"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	waitFreed(ctx, t, cp, node.Name)

	// 3. A pod with a claim of 2 queues on one netdev, flows in its
	// config, receives its flow.
	claimTemplate(ctx, t, cp, ns, "rx-a", `[{"protocol": "udp", "destinationPort": "5000"}]`)
	created := time.Now()
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, draPerfPod(ns, "rx-a", ref, 5000, "rx-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := followPerfPod(ctx, t, cp, ns, "rx-a", 5000)
	t.Logf("DRA pod created to its sockets: %s", a.ready.Sub(created).Round(time.Millisecond))
	// 4. A pod that asks for the extended resource, unchanged: DRA
	// serves it through the class's extendedResourceName.
	b := startPerfPod(ctx, t, cp, ns, "rx-b", ref, 5001)
	if len(a.queues) != 2 || len(b.queues) != 2 || !distinct(append(append([]int(nil), a.queues...), b.queues...), scenarioQueues) {
		t.Fatalf("queues: rx-a %v, rx-b %v; want two each, all four distinct", a.queues, b.queues)
	}
	pb, err := cp.Client.CoreV1().Pods(ns).Get(ctx, "rx-b", metav1.GetOptions{})
	if err != nil || pb.Status.ExtendedResourceClaimStatus == nil {
		t.Errorf("pod rx-b (extended resource %s) was not served by DRA: %v, %+v", scenarioResource, err, pb.Status.ExtendedResourceClaimStatus)
	}
	for _, p := range []*perfRun{a, b} {
		waitFlowsApplied(ctx, t, cp, ns, p.name)
	}
	sa, sb := openPeerSender(t, nic, a), openPeerSender(t, nic, b)
	for _, s := range []*peerSender{sa, sb} {
		if err := s.send(1000, true); err != nil {
			t.Fatal(err)
		}
	}
	out, _ = cp.Kubectl(ctx, "-n", ns, "get", "resourceclaims")
	t.Logf("kubectl get resourceclaims:\n%s", out)
	waitClaimsReady(ctx, t, cp, ns, "True")
	// kubectl get xdpqnodes counts the claims' queues as allocated (it
	// read 0 of all while claims held them), within the status's
	// coalescing of pod churn (10 s).
	var queues string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := cp.Kubectl(ctx, "get", "xdpqnode", node.Name, "-o", "jsonpath={.status.summary.queues}")
		queues = string(out)
		return err == nil && strings.HasPrefix(queues, "4/"), nil
	})
	out, _ = cp.Kubectl(ctx, "get", "xdpqnodes")
	t.Logf("kubectl get xdpqnodes:\n%s", out)
	if err != nil {
		t.Errorf("the XdpqNode's queues with rx-a's and rx-b's claims prepared: %q, want 4 allocated", queues)
	}

	// 4b. A pod with a claim of the netdev pool: its NIC is in the pod
	// (the claim's networkData says as what), it receives everything
	// sent to the NIC's queues; the pod gone, the NIC is the node's
	// again, under its own name.
	netdevClaimTemplate(ctx, t, cp, ns, "rx-v", `{"name": "net1", "addresses": ["10.77.0.2/24"]}`,
		`[{"protocol": "udp", "destinationPort": "5002"}]`)
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, draPerfPod(ns, "rx-v", ref, 5002, "rx-v"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v := followPerfPodOn(ctx, t, cp, ns, "rx-v", 5002, "net1")
	if len(v.queues) != 2 {
		t.Errorf("rx-v's queues %v, want the NIC's 2", v.queues)
	}
	waitNetworkData(ctx, t, cp, ns, "rx-v", "net1", "10.77.0.2/24")
	// Its flow is to its NIC's own address (the claim's empty
	// destination); the rest goes up the pod's stack on net1.
	v.ip = netip.MustParseAddr("10.77.0.2")
	if _, err := net.InterfaceByName(draNetdevNIC); err == nil {
		t.Errorf("%s is still on the node while its pod runs", draNetdevNIC)
	}
	sv := openPeerSender(t, vf, v)
	if err := sv.send(1000, true); err != nil {
		t.Fatal(err)
	}
	checkTotals(ctx, t, cp, ns, sv)
	if out, err := cp.Kubectl(ctx, "-n", ns, "wait", "--for=delete", "pod/rx-v", "--timeout=60s"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		i, err := net.InterfaceByName(draNetdevNIC)
		return err == nil && i.HardwareAddr.String() == vf.MAC.String(), nil
	})
	if err != nil {
		t.Errorf("%s is not back on the node as it was: %v", draNetdevNIC, err)
	}
	// 4c. An operator's program on the free NIC taints it: a new pod
	// that asks for it stays Pending, the scheduler saying why; the
	// program gone, the pod gets the NIC and receives.
	if err := cluster.OperatorXDP("", draNetdevNIC, operatorObj); err != nil {
		t.Fatal(err)
	}
	waitTainted(ctx, t, cp, draNetdevPool, "Overridden")
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, draPerfPod(ns, "rx-w", ref, 5002, "rx-v"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pending, err := cp.WaitPod(ctx, ns, "rx-w", podUnschedulable)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range pending.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			t.Logf("rx-w, its NIC tainted: %s: %s", c.Reason, c.Message)
		}
	}
	if err := cluster.OperatorXDP("", draNetdevNIC, ""); err != nil {
		t.Fatal(err)
	}
	waitTainted(ctx, t, cp, draNetdevPool, "")
	w := followPerfPodOn(ctx, t, cp, ns, "rx-w", 5002, "net1") // the template's flow
	w.ip = netip.MustParseAddr("10.77.0.2")
	// The same queues of the NIC's peer as for rx-v, now for rx-w.
	sv.r, sv.seq, sv.counted = w, 0, 0
	if err := sv.send(1000, true); err != nil {
		t.Fatal(err)
	}
	checkTotals(ctx, t, cp, ns, sv)
	if out, err := cp.Kubectl(ctx, "-n", ns, "wait", "--for=delete", "pod/rx-w", "--timeout=60s"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}

	// 5. An operator's program takes the NIC's hook: its devices are
	// tainted in the slice (new claims avoid them); what is sent
	// meanwhile is the operator's. Removed: untainted, and the pods
	// receive again.
	if err := cluster.OperatorXDP("", scenarioNIC, operatorObj); err != nil {
		t.Fatal(err)
	}
	waitTainted(ctx, t, cp, scenarioPool, "Overridden")
	waitClaimsReady(ctx, t, cp, ns, "False")
	if err := sa.send(100, false); err != nil {
		t.Fatal(err)
	}
	if err := cluster.OperatorXDP("", scenarioNIC, ""); err != nil {
		t.Fatal(err)
	}
	waitTainted(ctx, t, cp, scenarioPool, "")
	waitClaimsReady(ctx, t, cp, ns, "True")
	// The devices are well once the operator's program is gone; xdpq's
	// holds the hook again a moment later: what is sent counts from then.
	waitNetdevState(ctx, t, cp, node.Name, scenarioNIC, "Filter")
	for _, s := range []*peerSender{sa, sb} {
		if err := s.send(1000, true); err != nil {
			t.Fatal(err)
		}
	}

	// 6. The daemon's pod is deleted while frames flow: the new one
	// registers the driver again and adopts the claims' allocations;
	// nothing is lost (the totals, below). Then kubelet restarts: the
	// pods are untouched and still receive.
	untouched := containerIDs(ctx, t, cp, ns, a.name, b.name)
	old := daemonPod(ctx, t, cp)
	stop := sendWhile(sa, sb)
	if err := cp.Client.CoreV1().Pods("kube-system").Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	newPod := waitNewDaemonReady(ctx, t, cp, old.Name)
	batches, err := stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("daemon pod %s replaced by %s while %d batches of frames flowed", old.Name, newPod.Name, batches)
	waitClaimsReady(ctx, t, cp, ns, "True")
	if err := node.RestartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*peerSender{sa, sb} {
		if err := s.send(1000, true); err != nil {
			t.Fatal(err)
		}
	}
	if got := containerIDs(ctx, t, cp, ns, a.name, b.name); got != untouched {
		t.Errorf("the pods' containers changed across the restarts:\nbefore %s\nafter  %s", untouched, got)
	}
	checkTotals(ctx, t, cp, ns, sa, sb)

	// 7. The pods gone: the queues free, no CDI spec left.
	for _, p := range []string{a.name, b.name} {
		if out, err := cp.Kubectl(ctx, "-n", ns, "wait", "--for=delete", "pod/"+p, "--timeout=60s"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	waitFreed(ctx, t, cp, node.Name)
	if specs, _ := filepath.Glob("/var/run/cdi/xdpq.io-claim_*"); len(specs) != 0 {
		t.Errorf("CDI specs left: %v", specs)
	}
	sa.close()
	sb.close()

	// 8. helm uninstall while a claim is prepared: its pod keeps
	// receiving, and the daemon keeps the driver registered until
	// kubelet has unprepared the claim; the pod deleted, it goes (it
	// stayed Terminating for good when the driver went first), then the
	// daemon, leaving no CDI spec, no slice, no class.
	claimTemplate(ctx, t, cp, ns, "rx-u", `[{"protocol": "udp", "destinationPort": "5003"}]`)
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, draPerfPod(ns, "rx-u", ref, 5003, "rx-u"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	u := followPerfPod(ctx, t, cp, ns, "rx-u", 5003)
	waitFlowsApplied(ctx, t, cp, ns, u.name)
	su := openPeerSender(t, nic, u)
	if out, err := cp.Helm(ctx, "uninstall", "xdpq", "-n", "kube-system", "--wait", "--timeout=2m"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// The DaemonSet's pod is deleted by the garbage collector, soon
	// after: it stops, and stays so while the claim is prepared.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=xdpq"})
		if err != nil {
			return false, err
		}
		if len(l.Items) == 0 {
			return false, errors.New("the daemon's pod is gone while a claim is prepared")
		}
		return l.Items[0].DeletionTimestamp != nil, nil
	})
	if err != nil {
		t.Fatalf("the daemon's pod after helm uninstall with a claim prepared: %v", err)
	}
	if err := su.send(1000, true); err != nil {
		t.Fatal(err)
	}
	checkTotals(ctx, t, cp, ns, su) // deletes the pod
	if out, err := cp.Kubectl(ctx, "-n", ns, "wait", "--for=delete", "pod/rx-u", "--timeout=60s"); err != nil {
		t.Errorf("the claim's pod deleted after helm uninstall: %v\n%s", err, out)
	}
	if out, err := cp.Kubectl(ctx, "-n", "kube-system", "wait", "--for=delete", "pod", "-l", "app.kubernetes.io/name=xdpq", "--timeout=2m"); err != nil {
		t.Errorf("the daemon's pod after helm uninstall: %v\n%s", err, out)
	}
	if specs, _ := filepath.Glob("/var/run/cdi/xdpq.io-claim_*"); len(specs) != 0 {
		t.Errorf("CDI specs left by helm uninstall: %v", specs)
	}
	// The daemon deletes its node's slices as it stops, if its RBAC is
	// still there (helm deletes it at the same moment); kubelet deletes
	// them 30 s after the driver's registration went, if not.
	gone := time.Now()
	var left []string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		left = left[:0]
		for _, s := range l.Items {
			left = append(left, s.Name)
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Errorf("helm uninstall left ResourceSlices %v: %v", left, err)
	} else {
		t.Logf("the node's ResourceSlices gone %s after the daemon's pod", time.Since(gone).Round(time.Millisecond))
	}
	if l, err := cp.Client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Errorf("helm uninstall left DeviceClasses: %v %v", l, err)
	}
	if l, err := cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Errorf("helm uninstall left ValidatingAdmissionPolicies: %v %v", l, err)
	}
	if _, err := os.Stat(pinDir); !os.IsNotExist(err) {
		t.Errorf("helm uninstall left %s: %v", pinDir, err)
	}
}

// tableNames are the NAME column of kubectl get's table out, in order.
func tableNames(out []byte) []string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) == 0 || !strings.HasPrefix(lines[0], "NAME ") {
		return nil
	}
	var names []string
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

// claimTemplate makes ResourceClaimTemplate name: 2 queues of the pool
// on one netdev, with the flows (JSON) in its config.
func claimTemplate(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, name, flows string) {
	t.Helper()
	if err := tryClaimTemplate(ctx, cp, ns, name, flows); err != nil {
		t.Fatalf("create ResourceClaimTemplate %s: %v", name, err)
	}
}

// tryClaimTemplate is claimTemplate, returning the API server's refusal.
func tryClaimTemplate(ctx context.Context, cp *cluster.ControlPlane, ns, name, flows string) error {
	params := fmt.Sprintf(`{"apiVersion": "xdpq.io/v1alpha1", "kind": "QueueConfig", "flows": %s}`, flows)
	spec := claimSpec(scenarioClass, 2, params)
	spec.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{"queues"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("xdpq.io/netdev"))}}
	return createClaimTemplate(ctx, cp, ns, name, spec)
}

// netdevClaimTemplate makes ResourceClaimTemplate name: a NIC of the
// netdev pool, in the pod as the interface config (JSON) says, with
// the flows (JSON) steered to its sockets.
func netdevClaimTemplate(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, name, iface, flows string) {
	t.Helper()
	params := fmt.Sprintf(`{"apiVersion": "xdpq.io/v1alpha1", "kind": "QueueConfig", "interface": %s, "flows": %s}`, iface, flows)
	if err := createClaimTemplate(ctx, cp, ns, name, claimSpec(draNetdevPool+".xdpq.io", 1, params)); err != nil {
		t.Fatalf("create ResourceClaimTemplate %s: %v", name, err)
	}
}

// claimSpec is a claim of count devices of class (request "queues")
// with the xdpq.io parameters given.
func claimSpec(class string, count int64, params string) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{Name: "queues", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}},
		Config: []resourceapi.DeviceClaimConfiguration{{Requests: []string{"queues"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "xdpq.io", Parameters: runtime.RawExtension{Raw: []byte(params)}}}}},
	}}
}

func createClaimTemplate(ctx context.Context, cp *cluster.ControlPlane, ns, name string, spec resourceapi.ResourceClaimSpec) error {
	tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: spec}}
	_, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tpl, metav1.CreateOptions{})
	return err
}

// waitNetworkData waits for the pod's claim to say its netdev is in the
// pod as ifname with address addr.
func waitNetworkData(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, pod, ifname, addr string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range l.Items {
			if !strings.HasPrefix(c.Name, pod+"-") {
				continue
			}
			for _, d := range c.Status.Devices {
				last = fmt.Sprintf("%+v", d.NetworkData)
				if nd := d.NetworkData; nd != nil && nd.InterfaceName == ifname && len(nd.IPs) == 1 && nd.IPs[0] == addr && nd.HardwareAddress != "" {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the claim of pod %s never said its netdev is %s with %s (last: %s): %v", pod, ifname, addr, last, err)
	}
	out, _ := cp.Kubectl(ctx, "-n", ns, "get", "resourceclaims", "-o", "jsonpath={.items[*].status.devices[*].networkData}")
	t.Logf("the netdev claim's networkData: %s", out)
}

// draPerfPod is perfPod with its queues from a claim of template
// instead of the extended resource, and its flows in the claim.
func draPerfPod(ns, name, image string, port int, template string) *corev1.Pod {
	p := perfPod(ns, name, image, port)
	p.Annotations = nil
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "queues", ResourceClaimTemplateName: ptr.To(template)}}
	c := &p.Spec.Containers[0]
	c.Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "queues"}}}
	return p
}

// waitPodEvent waits for an Event of the pod whose note contains text.
func waitPodEvent(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, pod, text string) {
	t.Helper()
	var notes []string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := cp.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		notes = notes[:0]
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == pod {
				notes = append(notes, e.Reason+": "+e.Message)
				if strings.Contains(e.Message, text) {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no event of pod %s says %q: %v; its events:\n%s", pod, text, err, strings.Join(notes, "\n"))
	}
}

// waitTainted waits until every device of the node's slice has the
// taint xdpq.io/unavailable=reason, or none when reason is "".
func waitTainted(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, pool, reason string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		i := slices.IndexFunc(l.Items, func(s resourceapi.ResourceSlice) bool { return strings.HasSuffix(s.Spec.Pool.Name, "/"+pool) })
		if i < 0 {
			last = "no slice of pool " + pool
			return false, nil
		}
		last = ""
		for _, d := range l.Items[i].Spec.Devices {
			switch {
			case reason == "" && len(d.Taints) != 0:
				last += fmt.Sprintf("%s: %v; ", d.Name, d.Taints)
			case reason != "" && (len(d.Taints) != 1 || d.Taints[0].Key != "xdpq.io/unavailable" || d.Taints[0].Value != reason ||
				d.Taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule):
				last += fmt.Sprintf("%s: %v; ", d.Name, d.Taints)
			}
		}
		return last == "", nil
	})
	if err != nil {
		t.Fatalf("the slice of pool %s, want taint %q: %s (%v)", pool, reason, last, err)
	}
}

// waitClaimsReady waits until every device of every claim of namespace
// ns has the Ready condition with status.
func waitClaimsReady(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, status string) {
	t.Helper()
	waitClaimsReadyOf(ctx, t, cp, ns, status)
}

// waitClaimsReadyOf is waitClaimsReady of the claims of the pods named
// (a pod's claim from a template is named after it), all if none is.
func waitClaimsReadyOf(ctx context.Context, t *testing.T, cp *cluster.ControlPlane, ns, status string, pods ...string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		last = ""
		var n int
		for _, c := range l.Items {
			if len(pods) > 0 && !slices.ContainsFunc(pods, func(p string) bool { return strings.HasPrefix(c.Name, p+"-") }) {
				continue
			}
			n++
			if len(c.Status.Devices) == 0 {
				last += c.Name + ": no device status; "
			}
			for _, d := range c.Status.Devices {
				if len(d.Conditions) != 1 || d.Conditions[0].Type != "Ready" || string(d.Conditions[0].Status) != status {
					last += fmt.Sprintf("%s/%s: %+v; ", c.Name, d.Device, d.Conditions)
				}
			}
		}
		return last == "" && n > 0 && (len(pods) == 0 || n == len(pods)), nil
	})
	if err != nil {
		t.Fatalf("claims of %s %v, want every device Ready %s: %s (%v)", ns, pods, status, last, err)
	}
}
