package dra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const testNode = "node-1"

// fakeNode is the daemon as the driver sees it: what it was asked, and
// the devices and edits it is told to give.
type fakeNode struct {
	mu           sync.Mutex
	devices      map[string][]Device
	edits        Edits
	prepareErr   error
	unprepareErr map[string]error // by claim UID
	prepared     []Claim
	unprepared   []string
	claims       []PreparedClaim // what preparedNode says it holds
}

// preparedNode is a fakeNode that tells its prepared claims, whose
// status the driver then writes.
type preparedNode struct{ *fakeNode }

var _ PreparedClaims = preparedNode{}

func (n preparedNode) Prepared() []PreparedClaim {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.claims)
}

var _ Node = (*fakeNode)(nil)

func (n *fakeNode) PrepareClaim(_ context.Context, c Claim) (Edits, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.prepared = append(n.prepared, c)
	return n.edits, n.prepareErr
}

func (n *fakeNode) UnprepareClaim(_ context.Context, uid string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.unprepared = append(n.unprepared, uid)
	return n.unprepareErr[uid]
}

// Devices are a copy: the driver keeps what it is given.
func (n *fakeNode) Devices() map[string][]Device {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string][]Device{}
	for k, v := range n.devices {
		out[k] = slices.Clone(v)
	}
	return out
}

// setDevice changes device i of pool.
func (n *fakeNode) setDevice(pool string, i int, f func(*Device)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f(&n.devices[pool][i])
}

func (n *fakeNode) asked() ([]Claim, []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.prepared), slices.Clone(n.unprepared)
}

// logRecorder keeps the driver's warnings and errors, which a test
// that expects none checks.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *logRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler           { return r }
func (r *logRecorder) WithGroup(string) slog.Handler                { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, b.String())
	return nil
}

func (r *logRecorder) logged() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// noWarnings fails t if the driver warned or failed.
func (r *logRecorder) noWarnings(t *testing.T) {
	t.Helper()
	for _, m := range r.logged() {
		t.Errorf("logged: %s", m)
	}
}

// newTestDriver is a driver of node writing its CDI specs to a
// directory of its own, not registered with kubelet.
func newTestDriver(t *testing.T, node Node) (*Driver, *logRecorder) {
	t.Helper()
	log := &logRecorder{}
	d, err := newDriver(Options{NodeName: testNode, Node: node, CDIDir: t.TempDir(), Logger: slog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	return d, log
}

// result is an allocation result of request for a device of pool.
func result(request, driver, pool, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: request, Driver: driver, Pool: pool, Device: device}
}

// testClaim is claim uid allocated these results, reserved for pod
// "pod-<uid>" (and a consumer that is not a pod).
func testClaim(uid string, results []resourceapi.DeviceRequestAllocationResult, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim-" + uid, UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results, Config: configs}}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{
		{Resource: "pods", Name: "upf-0", UID: types.UID("pod-" + uid)},
		{APIGroup: "example.com", Resource: "pods", Name: "not-a-pod", UID: "not-a-pod"},
	}
	return c
}

var testEdits = Edits{
	Env: map[string]string{"XDPQ_SOCKET": "/run/xdpq/broker.sock", "XDPQ_QUEUES": "eth1:0,1", "XDPQ_ALLOCATION": "a-1"},
	Mounts: []Mount{
		{HostPath: "/run/xdpq/pods/a-1", ContainerPath: "/run/xdpq", ReadOnly: false},
		{HostPath: "/etc/xdpq/flows", ContainerPath: "/etc/xdpq/flows", ReadOnly: true},
	},
}

// cdiDevice is the CDI device id resolves to in dir, as containerd
// reads it, failing t if the dir's specs do not load.
func cdiDevice(t *testing.T, dir, id string) *cdiapi.Device {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	for path, errs := range cache.GetErrors() {
		t.Errorf("CDI spec %s: %v", path, errs)
	}
	return cache.GetDevice(id)
}

func TestPrepare(t *testing.T) {
	node := &fakeNode{edits: testEdits}
	d, log := newTestDriver(t, node)
	pool := PoolName(testNode, "upf")
	claim := testClaim("uid-1", []resourceapi.DeviceRequestAllocationResult{
		result("queues", DriverName, pool, "eth1-q0"),
		result("gpu", "gpu.example.com", testNode, "gpu-0"),
		result("queues", DriverName, pool, "eth1-q1"),
		result("more/sub", DriverName, pool, "eth2-q7"),
	}, classConfig(params(gtpFlows)), claimConfig(params(dnsFlows), "gpu"))

	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatal(err)
	}
	prepared, _ := node.asked()
	want := []Claim{{UID: "uid-1", Namespace: "ns", Name: "claim-uid-1", Pods: []string{"pod-uid-1"}, Pool: "upf",
		Devices: []string{"eth1-q0", "eth1-q1", "eth2-q7"}, Flows: json.RawMessage(gtpFlows)}}
	if diff := cmp.Diff(want, prepared); diff != "" {
		t.Errorf("the node was asked (-want +got):\n%s", diff)
	}

	id := "xdpq.io/claim=uid-1"
	wantRes := map[types.UID]kubeletplugin.PrepareResult{"uid-1": {Devices: []kubeletplugin.Device{
		{Requests: []string{"queues"}, PoolName: pool, DeviceName: "eth1-q0", CDIDeviceIDs: []string{id}},
		{Requests: []string{"queues"}, PoolName: pool, DeviceName: "eth1-q1", CDIDeviceIDs: []string{id}},
		{Requests: []string{"more/sub"}, PoolName: pool, DeviceName: "eth2-q7", CDIDeviceIDs: []string{id}},
	}}}
	if diff := cmp.Diff(wantRes, res, cmpopts.EquateErrors()); diff != "" {
		t.Errorf("PrepareResourceClaims (-want +got):\n%s", diff)
	}

	dev := cdiDevice(t, d.opts.CDIDir, id)
	if dev == nil {
		t.Fatalf("CDI device %s not found in %s", id, d.opts.CDIDir)
	}
	wantEdits := cdispec.ContainerEdits{
		Env: []string{"XDPQ_ALLOCATION=a-1", "XDPQ_QUEUES=eth1:0,1", "XDPQ_SOCKET=/run/xdpq/broker.sock"},
		Mounts: []*cdispec.Mount{
			{HostPath: "/run/xdpq/pods/a-1", ContainerPath: "/run/xdpq", Type: "bind", Options: []string{"rbind", "nosuid", "nodev", "rw"}},
			{HostPath: "/etc/xdpq/flows", ContainerPath: "/etc/xdpq/flows", Type: "bind", Options: []string{"rbind", "nosuid", "nodev", "ro"}},
		},
	}
	if diff := cmp.Diff(wantEdits, dev.ContainerEdits); diff != "" {
		t.Errorf("CDI device edits (-want +got):\n%s", diff)
	}
	if got := dev.GetSpec().GetPath(); filepath.Base(got) != "xdpq.io-claim_uid-1.json" {
		t.Errorf("spec file %s", got)
	}

	// kubelet asks again (after its restart): the same answer, the spec
	// rewritten.
	again, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(res, again, cmpopts.EquateErrors()); diff != "" {
		t.Errorf("prepared again (-first +again):\n%s", diff)
	}
	if cdiDevice(t, d.opts.CDIDir, id) == nil {
		t.Errorf("no CDI device after preparing again")
	}
	log.noWarnings(t)
}

// TestPrepareRefused: a claim the driver cannot prepare gets an error
// of its own, the node is not asked and no spec written; the others of
// the call are prepared.
func TestPrepareRefused(t *testing.T) {
	upf := PoolName(testNode, "upf")
	for _, c := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		err   string
	}{
		{name: "two pools", claim: testClaim("bad", []resourceapi.DeviceRequestAllocationResult{
			result("a", DriverName, upf, "eth1-q0"), result("b", DriverName, PoolName(testNode, "dns"), "eth2")}),
			err: "pools upf and dns"},
		{name: "another node's pool", claim: testClaim("bad", []resourceapi.DeviceRequestAllocationResult{
			result("a", DriverName, PoolName("node-2", "upf"), "eth1-q0")}),
			err: "not of node " + testNode},
		{name: "a node whose name starts as ours", claim: testClaim("bad", []resourceapi.DeviceRequestAllocationResult{
			result("a", DriverName, PoolName(testNode+"0", "upf"), "eth1-q0")}),
			err: "not of node " + testNode},
		{name: "not allocated", claim: func() *resourceapi.ResourceClaim {
			c := testClaim("bad", nil)
			c.Status.Allocation = nil
			return c
		}(), err: "not allocated"},
		{name: "config refused", claim: testClaim("bad", []resourceapi.DeviceRequestAllocationResult{
			result("a", DriverName, upf, "eth1-q0")}, claimConfig(params(`[{"protocol":"icmp"}]`))),
			err: "flows[0].protocol"},
	} {
		t.Run(c.name, func(t *testing.T) {
			node := &fakeNode{edits: testEdits}
			d, _ := newTestDriver(t, node)
			good := testClaim("good", []resourceapi.DeviceRequestAllocationResult{result("a", DriverName, upf, "eth1-q3")})
			res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c.claim, good})
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 2 {
				t.Fatalf("%d results, want 2: %v", len(res), res)
			}
			bad := res["bad"]
			if bad.Err == nil || !strings.Contains(bad.Err.Error(), c.err) || !strings.Contains(bad.Err.Error(), "ns/claim-bad") {
				t.Errorf("error %v, want one about ns/claim-bad saying %q", bad.Err, c.err)
			}
			if len(bad.Devices) != 0 {
				t.Errorf("devices %v", bad.Devices)
			}
			if g := res["good"]; g.Err != nil || len(g.Devices) != 1 {
				t.Errorf("the good claim: %+v", g)
			}
			prepared, _ := node.asked()
			if len(prepared) != 1 || prepared[0].UID != "good" {
				t.Errorf("the node was asked to prepare %+v, want the good claim only", prepared)
			}
			if dev := cdiDevice(t, d.opts.CDIDir, "xdpq.io/claim=bad"); dev != nil {
				t.Errorf("a CDI spec for the refused claim: %s", dev.GetSpec().GetPath())
			}
		})
	}
}

// TestPrepareOthers: a claim whose devices are all another driver's
// is none of xdpq's business.
func TestPrepareOthers(t *testing.T) {
	node := &fakeNode{edits: testEdits}
	d, log := newTestDriver(t, node)
	claim := testClaim("gpu", []resourceapi.DeviceRequestAllocationResult{
		result("gpu", "gpu.example.com", testNode, "gpu-0"),
		result("nic", "sriov.example.com", PoolName(testNode, "upf"), "eth1-q0"),
	}, claimConfig(`{"other":"driver's"}`))
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := res["gpu"]; !ok || r.Err != nil || len(r.Devices) != 0 {
		t.Errorf("result %+v (%v), want no devices and no error", r, ok)
	}
	if prepared, _ := node.asked(); len(prepared) != 0 {
		t.Errorf("the node was asked to prepare %+v", prepared)
	}
	if ents, _ := os.ReadDir(d.opts.CDIDir); len(ents) != 0 {
		t.Errorf("CDI dir holds %v", ents)
	}
	log.noWarnings(t)
}

// TestPrepareNodeError: the node's refusal is the claim's error, and
// no spec is written.
func TestPrepareNodeError(t *testing.T) {
	node := &fakeNode{edits: testEdits, prepareErr: errors.New("pool upf: device eth1-q0 is another claim's")}
	d, _ := newTestDriver(t, node)
	claim := testClaim("uid-1", []resourceapi.DeviceRequestAllocationResult{result("a", DriverName, PoolName(testNode, "upf"), "eth1-q0")})
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatal(err)
	}
	if r := res["uid-1"]; r.Err == nil || !errors.Is(r.Err, node.prepareErr) || len(r.Devices) != 0 {
		t.Errorf("result %+v, want the node's error", r)
	}
	if ents, _ := os.ReadDir(d.opts.CDIDir); len(ents) != 0 {
		t.Errorf("CDI dir holds %v", ents)
	}
}

func prepare(t *testing.T, d *Driver, uids ...string) {
	t.Helper()
	var claims []*resourceapi.ResourceClaim
	for i, uid := range uids {
		claims = append(claims, testClaim(uid, []resourceapi.DeviceRequestAllocationResult{
			result("a", DriverName, PoolName(testNode, "upf"), fmt.Sprintf("eth1-q%d", i))}))
	}
	res, err := d.PrepareResourceClaims(context.Background(), claims)
	if err != nil {
		t.Fatal(err)
	}
	for uid, r := range res {
		if r.Err != nil {
			t.Fatalf("prepare %s: %v", uid, r.Err)
		}
	}
}

func namespaced(uid string) kubeletplugin.NamespacedObject {
	return kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "claim-" + uid}, UID: types.UID(uid)}
}

func TestUnprepare(t *testing.T) {
	node := &fakeNode{edits: testEdits, unprepareErr: map[string]error{"uid-2": errors.New("allocation a-2: detach: netdev eth1 is busy")}}
	d, _ := newTestDriver(t, node)
	prepare(t, d, "uid-1", "uid-2")

	res, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{
		namespaced("uid-1"), namespaced("uid-2"), namespaced("never-prepared")})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 {
		t.Errorf("%d results, want 3: %v", len(res), res)
	}
	for uid, want := range map[types.UID]error{"uid-1": nil, "uid-2": node.unprepareErr["uid-2"], "never-prepared": nil} {
		got, ok := res[uid]
		switch {
		case !ok:
			t.Errorf("%s: no result", uid)
		case want == nil && got != nil:
			t.Errorf("%s: %v", uid, got)
		case want != nil && (!errors.Is(got, want) || !strings.Contains(got.Error(), "ns/claim-"+string(uid))):
			t.Errorf("%s: %v, want the node's error naming the claim", uid, got)
		}
	}
	if _, unprepared := node.asked(); !cmp.Equal(unprepared, []string{"uid-1", "uid-2", "never-prepared"}) {
		t.Errorf("the node was asked to unprepare %v", unprepared)
	}
	if dev := cdiDevice(t, d.opts.CDIDir, "xdpq.io/claim=uid-1"); dev != nil {
		t.Errorf("uid-1's CDI spec stays: %s", dev.GetSpec().GetPath())
	}
	// The node still holds uid-2's allocation: its spec stays, and
	// kubelet asks again.
	if cdiDevice(t, d.opts.CDIDir, "xdpq.io/claim=uid-2") == nil {
		t.Errorf("uid-2's CDI spec is gone while the node holds its allocation")
	}
	delete(node.unprepareErr, "uid-2")
	res, err = d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{namespaced("uid-2"), namespaced("uid-1")})
	if err != nil || res["uid-2"] != nil || res["uid-1"] != nil {
		t.Errorf("again: %v, %v", res, err)
	}
	if ents, _ := os.ReadDir(d.opts.CDIDir); len(ents) != 0 {
		t.Errorf("CDI dir holds %v", ents)
	}
}

func TestRemoveSpecsExcept(t *testing.T) {
	d, _ := newTestDriver(t, &fakeNode{edits: testEdits})
	prepare(t, d, "keep", "gone-1", "gone-2")
	dir := d.opts.CDIDir
	unrelated := []string{"nvidia.com-gpu_uid-1.json", "xdpq.io-claim.json", "xdpq.io-claim_notes.txt", "xdpq.io-claim_x.yaml", "spec.123.tmp"}
	for _, f := range unrelated {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.RemoveSpecsExcept(map[string]bool{"keep": true, "absent": true}); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	want := append(slices.Clone(unrelated), specName("keep"))
	if diff := cmp.Diff(want, got, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("CDI dir (-want +got):\n%s", diff)
	}

	// A CDI dir not made yet holds no spec to remove.
	if err := removeSpecsExcept(filepath.Join(dir, "absent"), nil); err != nil {
		t.Errorf("absent dir: %v", err)
	}
}

// healthOf is the health of each device of a report, by pool/device.
func healthOf(r kubeletplugin.DeviceHealthReport) map[string]string {
	out := map[string]string{}
	for _, h := range r.Devices {
		out[h.PoolName+"/"+h.DeviceName] = string(h.Health) + " " + h.Message
	}
	return out
}

// wantHealth is the health report of devs.
func wantHealth(devs map[string][]Device) map[string]string {
	out := map[string]string{}
	for _, pool := range slices.Sorted(maps.Keys(devs)) {
		for _, d := range devs[pool] {
			h := string(kubeletplugin.HealthStatusHealthy) + " "
			if d.Unavailable != "" {
				h = string(kubeletplugin.HealthStatusUnhealthy) + " " + d.Unavailable
			}
			out[PoolName(testNode, pool)+"/"+DeviceName(d.Netdev, d.Queue)] = h
		}
	}
	return out
}

// cluster is a driver started against a fake API server, and the
// registration and plugin directories kubelet would give it.
type cluster struct {
	kube *fake.Clientset
	node *fakeNode
	d    *Driver
	log  *logRecorder
	ctx  context.Context
	dir  string // registry/ and plugin/, kubelet's directories
}

var sliceGVR = resourceapi.SchemeGroupVersion.WithResource("resourceslices")

// startDriver starts a driver of node testNode with devices.
func startDriver(t *testing.T, devices map[string][]Device) *cluster {
	t.Helper()
	node := &fakeNode{devices: devices, edits: testEdits}
	return startCluster(t, node, node, fakeClientset())
}

// startCluster starts a driver of node (which is fn, or wraps it) with
// the API server kube, whose reactors are all set: the fake adds one
// unlocked.
func startCluster(t *testing.T, node Node, fn *fakeNode, kube *fake.Clientset) *cluster {
	t.Helper()
	// Unix socket paths are short: not under t.TempDir().
	dir, err := os.MkdirTemp("", "xdpq-dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for _, sub := range []string{"registry", "plugin"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	c := &cluster{kube: kube, node: fn, log: &logRecorder{}, dir: dir}
	ctx, cancel := context.WithCancel(context.Background())
	c.ctx = ctx
	c.d, err = Start(ctx, Options{NodeName: testNode, Kube: kube, Node: node, RegistryDir: filepath.Join(dir, "registry"),
		PluginDir: filepath.Join(dir, "plugin"), CDIDir: filepath.Join(dir, "cdi"), Logger: slog.New(c.log)})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.d.Stop()
		cancel()
	})
	for _, sock := range []string{"registry/xdpq.io-reg.sock", "plugin/dra.sock"} {
		if _, err := os.Stat(filepath.Join(dir, sock)); err != nil {
			t.Errorf("kubelet finds no socket: %v", err)
		}
	}
	return c
}

// fakeClientset is an API server holding node testNode and objs.
func fakeClientset(objs ...runtime.Object) *fake.Clientset {
	kube := fake.NewClientset(append([]runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-uid-1"}}}, objs...)...)
	// The fake API server makes no names of generateName, and keeps no
	// resourceVersion in the objects it stores: without one the
	// controller's mutation cache takes its own writes for older than
	// its informer's copy, and writes again what it just wrote.
	var n, rv atomic.Int64
	kube.PrependReactor("*", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		o, ok := a.(interface{ GetObject() runtime.Object })
		if !ok || a.GetVerb() != "create" && a.GetVerb() != "update" {
			return false, nil, nil
		}
		s, ok := o.GetObject().(*resourceapi.ResourceSlice)
		if !ok {
			return false, nil, nil
		}
		if s.Name == "" {
			s.Name = fmt.Sprintf("%s%05d", s.GenerateName, n.Add(1))
		}
		s.ResourceVersion = strconv.FormatInt(rv.Add(1), 10)
		return false, nil, nil
	})
	return kube
}

// slices are the ResourceSlices in the API server.
func (c *cluster) slices(t *testing.T) []resourceapi.ResourceSlice {
	t.Helper()
	l, err := c.kube.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// describe is what actions did, one line each.
func describe(actions []k8stesting.Action) string {
	var b strings.Builder
	for _, a := range actions {
		fmt.Fprintf(&b, "\n\t%s %s", a.GetVerb(), a.GetResource().Resource)
		switch a := a.(type) {
		case k8stesting.CreateAction:
			if s, ok := a.GetObject().(*resourceapi.ResourceSlice); ok {
				fmt.Fprintf(&b, " %s%s pool %s", s.Name, s.GenerateName, s.Spec.Pool.Name)
			}
		case k8stesting.DeleteAction:
			fmt.Fprintf(&b, " %s", a.GetName())
		case k8stesting.DeleteCollectionAction:
			fmt.Fprintf(&b, " %s", a.GetListRestrictions().Fields)
		}
	}
	return b.String()
}

// writes are the writes of ResourceSlices the API server was asked.
func (c *cluster) writes() []k8stesting.Action {
	var out []k8stesting.Action
	for _, a := range c.kube.Actions() {
		if a.GetResource() == sliceGVR && a.GetVerb() != "get" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			out = append(out, a)
		}
	}
	return out
}

// differs says how the node's ResourceSlices differ from what want
// publishes, "" when they do not.
func differs(got []resourceapi.ResourceSlice, want resourceslice.DriverResources) string {
	byPool := map[string][]resourceapi.ResourceSlice{}
	for _, s := range got {
		byPool[s.Spec.Pool.Name] = append(byPool[s.Spec.Pool.Name], s)
	}
	for pool := range byPool {
		if _, ok := want.Pools[pool]; !ok {
			return fmt.Sprintf("pool %s is published", pool)
		}
	}
	for pool, p := range want.Pools {
		ss := byPool[pool]
		if len(ss) != len(p.Slices) {
			return fmt.Sprintf("pool %s: %d slices, want %d", pool, len(ss), len(p.Slices))
		}
		for _, s := range ss {
			i, err := strconv.ParseInt(s.Name[:strings.Index(s.Name, "-")], 16, 0)
			if err != nil || int(i) >= len(p.Slices) {
				return fmt.Sprintf("pool %s: slice %s", pool, s.Name)
			}
			switch {
			case s.Spec.Driver != DriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != testNode:
				return fmt.Sprintf("slice %s: driver %s, node %v", s.Name, s.Spec.Driver, s.Spec.NodeName)
			case s.Spec.Pool.ResourceSliceCount != int64(len(p.Slices)) || s.Spec.Pool.Generation != ss[0].Spec.Pool.Generation:
				return fmt.Sprintf("slice %s: pool %+v", s.Name, s.Spec.Pool)
			case len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Node" || s.OwnerReferences[0].UID != "node-uid-1":
				return fmt.Sprintf("slice %s: owners %+v", s.Name, s.OwnerReferences)
			case !resourceslice.DevicesDeepEqual(s.Spec.Devices, p.Slices[i].Devices):
				return fmt.Sprintf("slice %s: devices differ: %s", s.Name, cmp.Diff(p.Slices[i].Devices, s.Spec.Devices))
			}
		}
	}
	return ""
}

// waitSlices waits until the node's ResourceSlices publish the node's
// devices now.
func (c *cluster) waitSlices(t *testing.T) {
	t.Helper()
	want := Resources(testNode, c.node.Devices())
	var last string
	err := wait.PollUntilContextTimeout(c.ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = differs(c.slices(t), want)
		return last == "", nil
	})
	if err != nil {
		t.Fatalf("the ResourceSlices are not the devices': %s (%v)", last, err)
	}
}

// testDevices are a queue pool of 130 queues (3 slices), a netdev
// pool and a pool without devices.
func testDevices() map[string][]Device {
	upf := append(queueDevices("eth1", 0, 100), queueDevices("eth2", 0, 30)...)
	upf[5].Unavailable, upf[5].Reason = "netdev eth1's link is down", "LinkDown"
	return map[string][]Device{
		"upf":  upf,
		"dns":  {{ID: "veth0", Netdev: "veth0", Queue: -1, Queues: 4, NUMA: -1}, {ID: "ens1f0.100", Netdev: "ens1f0.100", Queue: -1, Queues: 8, NUMA: 0}},
		"idle": {},
	}
}

func TestPublish(t *testing.T) {
	c := startDriver(t, testDevices())
	c.waitSlices(t)
	if n := len(c.slices(t)); n != 5 {
		t.Errorf("%d slices, want 5", n)
	}

	// Nothing changed: nothing written.
	base := len(c.writes())
	if err := c.d.Publish(c.ctx); err != nil {
		t.Fatal(err)
	}
	// A device of the second slice becomes unavailable: that slice,
	// and only it, is updated.
	c.node.setDevice("upf", 70, func(d *Device) {
		d.Unavailable, d.Reason = "a foreign XDP program (xdp_dummy) holds netdev eth1's hook", "Overridden"
	})
	if err := c.d.Publish(c.ctx); err != nil {
		t.Fatal(err)
	}
	c.waitSlices(t)
	var holding string
	for _, s := range c.slices(t) {
		if s.Spec.Pool.Name == PoolName(testNode, "upf") && slices.ContainsFunc(s.Spec.Devices, func(d resourceapi.Device) bool { return d.Name == "eth1-q70" }) {
			holding = s.Name
		}
	}
	w := c.writes()[base:]
	if len(w) != 1 || w[0].GetVerb() != "update" || w[0].(k8stesting.UpdateAction).GetObject().(*resourceapi.ResourceSlice).Name != holding {
		t.Errorf("writes:%s\nwant an update of %s", describe(w), holding)
	}

	// A pool no longer served: its slice is deleted, the others stay.
	base = len(c.writes())
	c.node.mu.Lock()
	delete(c.node.devices, "idle")
	c.node.mu.Unlock()
	if err := c.d.Publish(c.ctx); err != nil {
		t.Fatal(err)
	}
	c.waitSlices(t)
	if w := c.writes()[base:]; len(w) != 1 || w[0].GetVerb() != "delete" {
		t.Errorf("writes:%s\nwant a delete", describe(w))
	}
	c.log.noWarnings(t)
}

func TestWithdraw(t *testing.T) {
	kube := fakeClientset()

	// The fake API server deletes no collection: this does, by the
	// field selector as the API server reads it.
	sliceFields := func(s *resourceapi.ResourceSlice) fields.Set {
		return fields.Set{resourceapi.ResourceSliceSelectorNodeName: ptr.Deref(s.Spec.NodeName, ""),
			resourceapi.ResourceSliceSelectorDriver: s.Spec.Driver, resourceapi.ResourceSliceSelectorPoolName: s.Spec.Pool.Name}
	}
	var sel fields.Selector
	kube.PrependReactor("delete-collection", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sel = a.(k8stesting.DeleteCollectionAction).GetListRestrictions().Fields
		l, err := kube.Tracker().List(sliceGVR, resourceapi.SchemeGroupVersion.WithKind("ResourceSlice"), "")
		if err != nil {
			return true, nil, err
		}
		for _, s := range l.(*resourceapi.ResourceSliceList).Items {
			if sel.Matches(sliceFields(&s)) {
				if err := kube.Tracker().Delete(sliceGVR, "", s.Name); err != nil {
					return true, nil, err
				}
			}
		}
		return true, nil, nil
	})
	fn := &fakeNode{devices: testDevices(), edits: testEdits}
	c := startCluster(t, fn, fn, kube)
	c.waitSlices(t)
	if err := c.d.Withdraw(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := c.slices(t); len(s) != 0 {
		t.Errorf("%d slices stay", len(s))
	}
	if sel == nil {
		t.Fatal("no collection deleted")
	}
	// Another node's slices, another driver's: not selected.
	for _, s := range []resourceapi.ResourceSlice{
		{Spec: resourceapi.ResourceSliceSpec{Driver: DriverName, NodeName: ptr.To("node-2"), Pool: resourceapi.ResourcePool{Name: PoolName("node-2", "upf")}}},
		{Spec: resourceapi.ResourceSliceSpec{Driver: DriverName, AllNodes: ptr.To(true), Pool: resourceapi.ResourcePool{Name: "shared"}}},
		{Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: ptr.To(testNode), Pool: resourceapi.ResourcePool{Name: testNode}}},
	} {
		if sel.Matches(sliceFields(&s)) {
			t.Errorf("selector %s deletes %+v", sel, s.Spec)
		}
	}
}

// recv is the next report, failing t when none comes within limit.
func recv(t *testing.T, reports <-chan kubeletplugin.DeviceHealthReport, limit time.Duration) kubeletplugin.DeviceHealthReport {
	t.Helper()
	select {
	case r := <-reports:
		return r
	case <-time.After(limit):
		t.Fatalf("no health report in %v", limit)
		return kubeletplugin.DeviceHealthReport{}
	}
}

func TestWatchHealthStatus(t *testing.T) {
	c := startDriver(t, testDevices())
	// A report comes at a change, or after a time no test waits.
	c.d.healthEvery = time.Hour
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	const watchers = 2 // kubelet may watch again before its first watch ends
	var reports [watchers]chan kubeletplugin.DeviceHealthReport
	var done [watchers]chan error
	for i := range watchers {
		reports[i], done[i] = make(chan kubeletplugin.DeviceHealthReport), make(chan error, 1)
		go func() { done[i] <- c.d.WatchHealthStatus(ctx, reports[i]) }()
	}
	for i := range watchers {
		r := recv(t, reports[i], 30*time.Second)
		if diff := cmp.Diff(wantHealth(testDevices()), healthOf(r)); diff != "" {
			t.Errorf("watcher %d: first report (-want +got):\n%s", i, diff)
		}
		for _, h := range r.Devices {
			if h.HealthCheckTimeout < healthResend || h.LastUpdated.IsZero() {
				t.Errorf("%s/%s: timeout %v, updated %v", h.PoolName, h.DeviceName, h.HealthCheckTimeout, h.LastUpdated)
			}
		}
	}

	for step, change := range []func(*Device){
		func(d *Device) { d.Unavailable, d.Reason = "netdev eth1 is missing", "Missing" },
		func(d *Device) { d.Unavailable, d.Reason = "", "" },
	} {
		c.node.setDevice("upf", 0, change)
		if err := c.d.Publish(c.ctx); err != nil {
			t.Fatal(err)
		}
		for i := range watchers {
			r := recv(t, reports[i], 30*time.Second)
			if diff := cmp.Diff(wantHealth(c.node.Devices()), healthOf(r)); diff != "" {
				t.Errorf("change %d, watcher %d (-want +got):\n%s", step, i, diff)
			}
		}
	}

	cancel()
	for i := range watchers {
		select {
		case err := <-done[i]:
			if err != nil {
				t.Errorf("watcher %d: %v", i, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("watcher %d goes on after its context ends", i)
		}
	}
	c.log.noWarnings(t)
}

// TestWatchHealthStatusResend: without a change the report comes again.
func TestWatchHealthStatusResend(t *testing.T) {
	c := startDriver(t, testDevices())
	c.d.healthEvery = time.Millisecond
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	reports := make(chan kubeletplugin.DeviceHealthReport)
	go func() { _ = c.d.WatchHealthStatus(ctx, reports) }()
	for range 3 {
		if r := recv(t, reports, 30*time.Second); len(r.Devices) != 132 {
			t.Errorf("%d devices", len(r.Devices))
		}
	}
}
