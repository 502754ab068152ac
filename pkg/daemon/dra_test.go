package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/dra"
	"github.com/xdpq/xdpq/pkg/kubepods"
	"github.com/xdpq/xdpq/pkg/podflows"
)

const draNodeName = "node-1"

// draEnv is a daemon serving pool dns (xa#2-3, software steering) by
// DRA, with a fake API server and kubelet's side of the DRA socket.
type draEnv struct {
	pair    *testnet.Pair
	opts    Options
	d       *Daemon
	stop    func()
	kube    *fake.Clientset
	kubelet drapb.DRAPluginClient
	cdiDir  string
}

func newDRAEnv(t *testing.T, pods PodDirectory, objs ...runtime.Object) *draEnv {
	t.Helper()
	return newDRAEnvWith(t, pods, draDNSPool, nil, objs...)
}

// draDNSPool is the DRA tests' config: pool dns of two queues of xa.
const draDNSPool = "pools: [{name: dns, servedBy: dra, steering: software, devices: {netdevs: ['xa#2-3']}}]\n"

// newDRAEnvWith is newDRAEnv with the daemon's config cfg, and its
// options as mod leaves them.
func newDRAEnvWith(t *testing.T, pods PodDirectory, cfgText string, mod func(*Options), objs ...runtime.Object) *draEnv {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: draNodeName, UID: "2b7e1516-28ae-4d2a-a6f7-15880924f1c3"}}
	e := &draEnv{pair: testnet.NewPair(t, 4), kube: fake.NewClientset(append(objs, node)...)}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(cfgText), 0o644); err != nil {
		t.Fatal(err)
	}
	e.cdiDir = filepath.Join(dir, "cdi")
	plugin := filepath.Join(dir, "plugins", dra.DriverName)
	e.opts = Options{ConfigPath: cfg, NodeName: draNodeName, NetNS: e.pair.NSPath(), PinDir: filepath.Join(testPins(t), "xdpq"),
		StateDir: filepath.Join(dir, "state"), AllocDir: filepath.Join(dir, "alloc"), APISocket: filepath.Join(dir, "api.sock"),
		PluginDir: filepath.Join(dir, "device-plugins"), CollectPeriod: time.Hour, Pods: pods,
		DRA: &DRA{Kube: e.kube, RegistryDir: filepath.Join(dir, "registry"), PluginDir: plugin, CDIDir: e.cdiDir}}
	for _, d := range []string{e.opts.PluginDir, e.opts.DRA.RegistryDir, plugin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if mod != nil {
		mod(&e.opts)
	}
	e.d, e.stop = runDaemon(t, e.opts)
	e.dial(t, plugin)
	return e
}

// newFakeDRAEnv is newDRAEnvWith's environment on a fake node, which
// needs no root: the daemon's core has fake kernel parts (netdevs xa and
// xb of 4 queues), and its DRA face runs as Run runs it, registered with
// kubelet's side of the DRA socket. For what DRA decides, not what the
// kernel does.
func newFakeDRAEnv(t *testing.T, pods PodDirectory, cfgText string, objs ...runtime.Object) *draEnv {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: draNodeName, UID: "2b7e1516-28ae-4d2a-a6f7-15880924f1c3"}}
	e := &draEnv{kube: fake.NewClientset(append(objs, node)...)}
	n := newFakeNode(t, fakeNetdev("xa", 4), fakeNetdev("xb", 4))
	n.kubelet = fakeKubelet{err: errors.New("no kubelet")}
	dir := t.TempDir()
	e.cdiDir = filepath.Join(dir, "cdi")
	plugin := filepath.Join(dir, "plugins", dra.DriverName)
	n.pods = pods // the fake node's daemons are on draNodeName
	n.dra = &DRA{Kube: e.kube, RegistryDir: filepath.Join(dir, "registry"), PluginDir: plugin, CDIDir: e.cdiDir}
	d, stop := n.daemon(cfgText)
	for _, d := range []string{d.opts.DRA.RegistryDir, plugin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.core.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		err := d.dra.Run(ctx)
		if ctx.Err() == nil {
			t.Errorf("the DRA face stopped on its own: %v", err)
		}
		done <- err
	}()
	e.d, e.opts = d, d.opts
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			cancel()
			<-done // as in Run, what a part returns once stopped is no failure
			stop()
		})
	}
	t.Cleanup(e.stop)
	e.dial(t, plugin)
	return e
}

// dial connects kubelet's side to the DRA socket in plugin once the
// driver listens on it.
func (e *draEnv) dial(t *testing.T, plugin string) {
	t.Helper()
	sock := filepath.Join(plugin, "dra.sock")
	// Listening, not only bound: the socket's file exists from bind on,
	// and a dial before listen is refused.
	waitFor(t, "the DRA socket", func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.kubelet = drapb.NewDRAPluginClient(conn)
}

// waitFor waits up to 10 s for cond, polling: what it waits for (a file,
// an object in a fake API server) has no event to wait on.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 10 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// allocatedClaim is a claim the scheduler allocated devices of pool dns
// on draNodeName, reserved for pod uid, with the opaque config given.
func allocatedClaim(name, uid, pod string, devices []string, config string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(uid)}}
	a := &resourceapi.AllocationResult{}
	for _, dev := range devices {
		a.Devices.Results = append(a.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: "queues", Driver: dra.DriverName,
			Pool: dra.PoolName(draNodeName, "dns"), Device: dev})
	}
	if config != "" {
		a.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: dra.DriverName,
				Parameters: runtime.RawExtension{Raw: []byte(config)}}}}}
	}
	c.Status.Allocation = a
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "dns-0", UID: types.UID(pod)}}
	return c
}

func (e *draEnv) prepare(t *testing.T, c *resourceapi.ResourceClaim) *drapb.NodePrepareResourceResponse {
	t.Helper()
	resp, err := e.kubelet.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Claims[string(c.UID)]
}

func (e *draEnv) unprepare(t *testing.T, c *resourceapi.ResourceClaim) string {
	t.Helper()
	resp, err := e.kubelet.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Claims[string(c.UID)].Error
}

// cdiEdits reads the claim's CDI spec as containerd would.
func (e *draEnv) cdiEdits(t *testing.T, uid string) cdispec.ContainerEdits {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.cdiDir, "xdpq.io-claim_"+uid+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var s cdispec.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if s.Kind != dra.CDIKind || len(s.Devices) != 1 || s.Devices[0].Name != uid {
		t.Fatalf("CDI spec %s", b)
	}
	return s.Devices[0].ContainerEdits
}

// TestDRAClaim: a pool served by DRA is published as a ResourceSlice of
// its queues; kubelet's Prepare of a claim the scheduler allocated two of
// them makes the allocation and a CDI spec that gives the container the
// broker's socket and the environment the device plugin gives; the pod
// receives the frames of the flow its claim's config names, byte for
// byte, on its queues; Prepare again is the same allocation; another
// claim of the same queues is refused; Unprepare frees the queues,
// removes the flow and the spec; a claim whose config is invalid is
// refused naming the field and leaves nothing; a claim without flows
// steers its pod's flows annotation.
func TestDRAClaim(t *testing.T) {
	const uid, pod = "6f1c0c52-3b1e-4b8a-9b0e-5d2f8e1a7c10", podA
	good := allocatedClaim("dns-0-queues", uid, pod, []string{"xa-q2", "xa-q3"},
		`{"apiVersion": "xdpq.io/v1alpha1", "kind": "QueueConfig", "flows": [{"protocol": "udp", "destinationPort": "5000"}]}`)
	thief := allocatedClaim("other", "0d9a3c6e-2f1b-4c5d-8e7f-a0b1c2d3e4f5", podB, []string{"xa-q2"}, "")
	bad := allocatedClaim("bad", "7a8b9c0d-1e2f-4a5b-8c7d-9e0f1a2b3c4d", podB, []string{"xa-q3"},
		`{"apiVersion": "xdpq.io/v1alpha1", "kind": "QueueConfig", "flows": [{"protocol": "udp", "destinationPort": "70000"}]}`)
	pods := newFakePods(kubepods.Pod{UID: pod, Namespace: "default", Name: "dns-0", IPs: []netip.Addr{netip.MustParseAddr("10.99.0.7")}})
	e := newDRAEnv(t, pods, good, thief, bad)
	if e.pair.PodAddr.String() != "10.99.0.7" {
		t.Fatalf("the pair's pod address is %s", e.pair.PodAddr)
	}
	ctx := context.Background()

	// The slice: the pool's two queues, with what a CEL selector reads.
	var slice resourceapi.ResourceSlice
	waitFor(t, "ResourceSlice", func() bool {
		l, err := e.kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 1 {
			return false
		}
		slice = l.Items[0]
		return true
	})
	if slice.Spec.Driver != dra.DriverName || slice.Spec.Pool.Name != draNodeName+"/dns" || slice.Spec.NodeName == nil || *slice.Spec.NodeName != draNodeName {
		t.Errorf("slice %+v", slice.Spec)
	}
	var names []string
	for _, d := range slice.Spec.Devices {
		names = append(names, d.Name)
		if a := d.Attributes[dra.AttrNetdev]; a.StringValue == nil || *a.StringValue != "xa" {
			t.Errorf("device %s: netdev %v", d.Name, a)
		}
		if a := d.Attributes[dra.AttrSteering]; a.StringValue == nil || *a.StringValue != "filter" {
			t.Errorf("device %s: steering %v", d.Name, a)
		}
		if len(d.Taints) != 0 {
			t.Errorf("device %s tainted: %v", d.Name, d.Taints)
		}
	}
	if strings.Join(names, " ") != "xa-q2 xa-q3" {
		t.Errorf("devices %v", names)
	}

	// Prepare: an allocation, and its CDI spec.
	r := e.prepare(t, good)
	if r.Error != "" || len(r.Devices) != 2 || !slices.Equal(r.Devices[0].CdiDeviceIds, []string{dra.CDIKind + "=" + uid}) {
		t.Fatalf("prepare: %+v", r)
	}
	edits := e.cdiEdits(t, uid)
	var socket string
	for _, m := range edits.Mounts {
		if m.ContainerPath == "/run/xdpq" {
			socket = filepath.Join(m.HostPath, "xdpq.sock")
		}
	}
	for _, want := range []string{"XDPQ_SOCKET=/run/xdpq/xdpq.sock", "XDPQ_QUEUES_DNS=xa:2,xa:3", "XDPQ_NETDEV_DNS=xa"} {
		if !slices.Contains(edits.Env, want) {
			t.Errorf("CDI env %v lacks %s", edits.Env, want)
		}
	}
	if socket == "" {
		t.Fatalf("CDI mounts %+v", edits.Mounts)
	}
	allocs := e.d.core.ledger.Allocations()
	if len(allocs) != 1 || allocs[0].Owner.PodUID != pod || allocs[0].Claim == nil || allocs[0].Claim.UID != uid {
		t.Fatalf("allocations %+v", allocs)
	}

	// The pod's process gets the queues and the frames of its flow.
	leave := joinCgroup(t, handover.PodCgroup(t, container, pod))
	got := connectPod(t, socket)
	leave()
	waitStatus(t, e.opts.APISocket, func(s *api.Status) bool { return len(s.Netdevs) == 1 && s.Netdevs[0].Flows == 1 })
	sent := sendFramesOn(t, e.pair, 50, 2, 3)
	for i := range got.lease.Queues {
		if err := got.recv[i].Expect(sent[i], time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("queue %d: %v", got.lease.Queues[i], err)
		}
	}

	// The claim's status: each device Ready, with what the claim holds.
	cs, err := e.kube.ResourceV1().ResourceClaims("default").Get(ctx, good.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Status.Devices) != 2 {
		t.Fatalf("claim status devices %+v", cs.Status.Devices)
	}
	for _, dv := range cs.Status.Devices {
		var data dra.ClaimData
		if err := json.Unmarshal(dv.Data.Raw, &data); err != nil || data.Netdev != "xa" || data.Allocation != allocs[0].ID ||
			len(dv.Conditions) != 1 || dv.Conditions[0].Type != "Ready" || dv.Conditions[0].Status != metav1.ConditionTrue {
			t.Errorf("claim status of device %s: %+v (data %s, %v)", dv.Device, dv, dv.Data.Raw, err)
		}
	}

	// The local API (and so the XdpqNode and kubectl xdpq) names the
	// claim and its pod.
	if l, err := api.NewClient(e.opts.APISocket).Allocations(""); err != nil || len(l.Allocations) != 1 ||
		l.Allocations[0].Claim != "default/dns-0-queues" || l.Allocations[0].Pod != "default/dns-0" {
		t.Errorf("allocations %+v (%v), want the claim default/dns-0-queues of pod default/dns-0", l, err)
	}

	// The link goes down: the devices are tainted in the slice and the
	// claim's devices not Ready, saying why; up again, both undone.
	for _, st := range []struct{ updown, ready, taint string }{{"down", "False", "LinkDown"}, {"up", "True", ""}} {
		if out, err := exec.Command("ip", "-n", filepath.Base(e.pair.NSPath()), "link", "set", "xa", st.updown).CombinedOutput(); err != nil {
			t.Fatalf("%v %s", err, out)
		}
		waitFor(t, "the slice and the claim's status with the link "+st.updown, func() bool {
			l, err := e.kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
			if err != nil || len(l.Items) != 1 {
				return false
			}
			for _, d := range l.Items[0].Spec.Devices {
				if st.taint == "" && len(d.Taints) != 0 || st.taint != "" && (len(d.Taints) != 1 || d.Taints[0].Value != st.taint) {
					return false
				}
			}
			c, err := e.kube.ResourceV1().ResourceClaims("default").Get(ctx, good.Name, metav1.GetOptions{})
			if err != nil || len(c.Status.Devices) != 2 {
				return false
			}
			for _, d := range c.Status.Devices {
				if len(d.Conditions) != 1 || string(d.Conditions[0].Status) != st.ready {
					return false
				}
			}
			return true
		})
	}

	// kubelet asks again (its restart): the same allocation.
	if r := e.prepare(t, good); r.Error != "" || len(e.d.core.ledger.Allocations()) != 1 {
		t.Errorf("prepare again: %+v, %d allocations", r, len(e.d.core.ledger.Allocations()))
	}
	// Another claim of a held queue: refused, nothing made.
	if r := e.prepare(t, thief); !strings.Contains(r.Error, "in use by allocation") {
		t.Errorf("a claim of a held queue: %+v", r)
	}
	// An interface for a pool of queues: refused, naming it.
	ifaceClaim := allocatedClaim("iface", "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a8b", podB, []string{"xa-q3"},
		`{"apiVersion": "xdpq.io/v1alpha1", "kind": "QueueConfig", "interface": {"name": "net1"}}`)
	if _, err := e.kube.ResourceV1().ResourceClaims("default").Create(ctx, ifaceClaim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := e.prepare(t, ifaceClaim); !strings.Contains(r.Error, "interface applies to pools of mode netdev") {
		t.Errorf("a queue pool's claim with an interface: %+v", r)
	}
	// An invalid config: refused naming the field, nothing made.
	if r := e.prepare(t, bad); !strings.Contains(r.Error, "flows[0].destinationPort") {
		t.Errorf("a claim with an invalid config: %+v", r)
	}
	if n := len(e.d.core.ledger.Allocations()); n != 1 {
		t.Errorf("%d allocations after the refusals", n)
	}
	for _, c := range []*resourceapi.ResourceClaim{thief, bad} {
		if _, err := os.Stat(filepath.Join(e.cdiDir, "xdpq.io-claim_"+string(c.UID)+".json")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a refused claim's CDI spec: %v", err)
		}
	}

	// Unprepare: the queues are free, the flow and the spec gone.
	got.lease.Close()
	if msg := e.unprepare(t, good); msg != "" {
		t.Fatal(msg)
	}
	if n := len(e.d.core.ledger.Allocations()); n != 0 {
		t.Errorf("%d allocations after unprepare", n)
	}
	waitStatus(t, e.opts.APISocket, func(s *api.Status) bool { return len(s.Netdevs) == 1 && s.Netdevs[0].Flows == 0 })
	if _, err := os.Stat(filepath.Join(e.cdiDir, "xdpq.io-claim_"+uid+".json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the CDI spec after unprepare: %v", err)
	}
	if msg := e.unprepare(t, good); msg != "" {
		t.Errorf("unprepare again: %s", msg)
	}
	// Now the other claim gets the queue. It has no config (as the
	// claim the scheduler makes for a pod asking for the extended
	// resource): its pod's flows annotation is steered, as with the
	// device plugin.
	// Its own address: dns-0's is dns-0's still (the fake directory
	// keeps it running), which dns-1's flows may not take.
	pods.set(kubepods.Pod{UID: podB, Namespace: "default", Name: "dns-1", IPs: []netip.Addr{netip.MustParseAddr("10.99.0.8")},
		Annotations: map[string]string{podflows.Annotation: `[{"protocol": "udp", "destinationPort": "5001"}]`}})
	if r := e.prepare(t, thief); r.Error != "" {
		t.Errorf("the other claim, once the queue is free: %+v", r)
	}
	waitStatus(t, e.opts.APISocket, func(s *api.Status) bool { return len(s.Netdevs) == 1 && s.Netdevs[0].Flows == 1 })

	// /metrics timed each Prepare and Unprepare by result: the refusals
	// (the held queue, the invalid config) with their codes.
	counts := map[string]uint64{}
	fams, err := e.d.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "xdpq_dra_operation_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			var key []string
			for _, l := range m.GetLabel() {
				key = append(key, l.GetValue())
			}
			counts[strings.Join(key, " ")] += m.GetHistogram().GetSampleCount()
		}
	}
	if counts["success prepare"] < 2 || counts["success unprepare"] < 2 || len(counts) < 3 {
		t.Errorf("xdpq_dra_operation_duration_seconds counts by result and verb: %v", counts)
	}
}
