package dra

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	k8stesting "k8s.io/client-go/testing"
)

var claimGVR = resourceapi.SchemeGroupVersion.WithResource("resourceclaims")

// gpuStatus is another driver's entry in a claim's status.
var gpuStatus = resourceapi.AllocatedDeviceStatus{Driver: "gpu.example.com", Pool: testNode, Device: "gpu-0",
	Conditions: []metav1.Condition{{Type: "Ready", Status: "True", Reason: "Up", LastTransitionTime: metav1.Unix(1, 0)}}}

// statusClaim is claim uid in the API server, with another driver's
// status entry.
func statusClaim(uid string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim-" + uid, UID: types.UID(uid)}}
	c.Status.Devices = []resourceapi.AllocatedDeviceStatus{gpuStatus}
	return c
}

func preparedClaim(uid string, devices ...string) PreparedClaim {
	return PreparedClaim{UID: uid, Namespace: "ns", Name: "claim-" + uid, Pool: "upf", Devices: devices,
		Data: ClaimData{Allocation: "a-" + uid, Netdev: "eth1", Queues: []uint32{0, 1}, Socket: "/run/xdpq/broker.sock"}}
}

// statusUpdates are the claim status writes the API server was asked.
func (c *cluster) statusUpdates() int {
	n := 0
	for _, a := range c.kube.Actions() {
		if a.GetResource() == claimGVR && a.GetVerb() == "update" && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

// waitReadiness waits (a minute at most) for claim uid's xdpq entries to
// be want: the status is written after Prepare.
func (c *cluster) waitReadiness(t *testing.T, uid string, want []string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got := c.readiness(t, uid)
		if cmp.Equal(want, got) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v, want %v", uid, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readiness is the xdpq entries of claim uid's status, as
// "<device> <status> <reason>: <message>", checking the rest of them.
func (c *cluster) readiness(t *testing.T, uid string) []string {
	t.Helper()
	claim, err := c.kube.ResourceV1().ResourceClaims("ns").Get(context.Background(), "claim-"+uid, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	others := 0
	for i, s := range claim.Status.Devices {
		if s.Driver != DriverName {
			if diff := cmp.Diff(gpuStatus, s); diff != "" {
				t.Errorf("another driver's entry changed (-want +got):\n%s", diff)
			}
			others++
			continue
		}
		if errs := metav1validation.ValidateConditions(s.Conditions, field.NewPath("status", "devices").Index(i).Child("conditions")); len(errs) > 0 {
			t.Errorf("%s: %v", s.Device, errs.ToAggregate())
		}
		if s.Pool != PoolName(testNode, "upf") || len(s.Conditions) != 1 || s.Conditions[0].Type != ConditionReady {
			t.Errorf("entry %+v", s)
			continue
		}
		var data ClaimData
		if s.Data == nil || json.Unmarshal(s.Data.Raw, &data) != nil || data.Allocation != "a-"+uid || data.Socket == "" {
			t.Errorf("%s: data %v", s.Device, s.Data)
		}
		cd := s.Conditions[0]
		out = append(out, s.Device+" "+string(cd.Status)+" "+cd.Reason+": "+cd.Message)
	}
	if others != 1 {
		t.Errorf("%d entries of another driver, want 1", others)
	}
	return out
}

func TestClaimStatus(t *testing.T) {
	fn := &fakeNode{devices: testDevices(), edits: testEdits, claims: []PreparedClaim{
		preparedClaim("uid-1", "eth1-q0", "eth1-q1"), preparedClaim("uid-2", "eth1-q2")}}
	c := startCluster(t, preparedNode{fn}, fn, fakeClientset(statusClaim("uid-1"), statusClaim("uid-2"), statusClaim("uid-4")))
	// Start published, and wrote each claim's status.
	ready := []string{"eth1-q0 True Prepared: its queues are xdpq's", "eth1-q1 True Prepared: its queues are xdpq's"}
	if diff := cmp.Diff(ready, c.readiness(t, "uid-1")); diff != "" {
		t.Errorf("uid-1 (-want +got):\n%s", diff)
	}
	if got := c.readiness(t, "uid-2"); len(got) != 1 {
		t.Errorf("uid-2: %v", got)
	}
	base := c.statusUpdates()
	if base != 2 {
		t.Errorf("%d status updates, want 2", base)
	}

	for _, step := range []struct {
		name    string
		change  func(*Device)
		device  int
		uid1    []string
		updates int
	}{
		{name: "nothing changed", uid1: ready},
		{name: "another claim's device", device: 2, updates: 1, uid1: ready,
			change: func(d *Device) { d.Unavailable, d.Reason = "netdev eth1's link is down", "LinkDown" }},
		{name: "its device unavailable", device: 1, updates: 1, change: func(d *Device) {
			d.Unavailable, d.Reason = "a foreign XDP program (xdp_dummy) holds netdev eth1's hook", "Overridden"
		}, uid1: []string{"eth1-q0 False Overridden: a foreign XDP program (xdp_dummy) holds netdev eth1's hook",
			"eth1-q1 False Overridden: a foreign XDP program (xdp_dummy) holds netdev eth1's hook"}},
		{name: "well again", device: 1, updates: 1, uid1: ready,
			change: func(d *Device) { d.Unavailable, d.Reason = "", "" }},
		{name: "a device without a claim", device: 99, uid1: ready,
			change: func(d *Device) { d.Unavailable, d.Reason = "netdev eth1's link is down", "LinkDown" }},
	} {
		base := c.statusUpdates()
		if step.change != nil {
			c.node.setDevice("upf", step.device, step.change)
		}
		if err := c.d.Publish(c.ctx); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if n := c.statusUpdates() - base; n != step.updates {
			t.Errorf("%s: %d status updates, want %d", step.name, n, step.updates)
		}
		if diff := cmp.Diff(step.uid1, c.readiness(t, "uid-1")); diff != "" {
			t.Errorf("%s: uid-1 (-want +got):\n%s", step.name, diff)
		}
	}

	// A netdev moved into its pod: the claim's networkData says where,
	// written once.
	for i, want := range []int{1, 0} {
		base := c.statusUpdates()
		c.node.mu.Lock()
		c.node.claims[1].Network = &Network{InterfaceName: "net1", HardwareAddress: "02:00:00:00:00:01", IPs: []string{"192.0.2.7/24"}}
		c.node.mu.Unlock()
		if err := c.d.Publish(c.ctx); err != nil {
			t.Fatal(err)
		}
		if n := c.statusUpdates() - base; n != want {
			t.Errorf("networkData, publish %d: %d status updates, want %d", i, n, want)
		}
	}
	cl, err := c.kube.ResourceV1().ResourceClaims("ns").Get(c.ctx, "claim-uid-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range cl.Status.Devices {
		if s.Driver != DriverName {
			continue
		}
		if nd := s.NetworkData; nd == nil || nd.InterfaceName != "net1" || nd.HardwareAddress != "02:00:00:00:00:01" ||
			!slices.Equal(nd.IPs, []string{"192.0.2.7/24"}) {
			t.Errorf("networkData of %s: %+v", s.Device, nd)
		}
	}

	// A claim prepared now has its status soon after kubelet hears it
	// is (TestPrepareWritesNoStatus: not in kubelet's call).
	c.node.mu.Lock()
	c.node.claims = append(c.node.claims, preparedClaim("uid-4", "eth1-q3"))
	c.node.mu.Unlock()
	prepare(t, c.d, "uid-4")
	c.waitReadiness(t, "uid-4", []string{"eth1-q3 True Prepared: its queues are xdpq's"})

	// Its device gone from the pool.
	c.node.mu.Lock()
	c.node.devices["upf"] = c.node.devices["upf"][1:]
	c.node.mu.Unlock()
	if err := c.d.Publish(c.ctx); err != nil {
		t.Fatal(err)
	}
	got := c.readiness(t, "uid-1")
	if len(got) != 2 || !strings.HasPrefix(got[0], "eth1-q0 False Gone: ") {
		t.Errorf("device gone: %v", got)
	}
	c.log.noWarnings(t)
}

// TestClaimStatusRetry: a status the API server refused is written at
// the next publish, though nothing changed.
func TestClaimStatusRetry(t *testing.T) {
	fn := &fakeNode{devices: testDevices(), edits: testEdits}
	kube := fakeClientset(statusClaim("uid-1"))
	var refuse atomic.Bool
	refuse.Store(true)
	kube.PrependReactor("update", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			return true, nil, apierrors.NewServiceUnavailable("etcd is away")
		}
		return false, nil, nil
	})
	c := startCluster(t, preparedNode{fn}, fn, kube)
	fn.mu.Lock()
	fn.claims = []PreparedClaim{preparedClaim("uid-1", "eth1-q0")}
	fn.mu.Unlock()
	err := c.d.Publish(c.ctx)
	if err == nil || !strings.Contains(err.Error(), "ns/claim-uid-1") || !strings.Contains(err.Error(), "etcd is away") {
		t.Errorf("publish: %v, want the claim's status refused", err)
	}
	if got := c.readiness(t, "uid-1"); len(got) != 0 {
		t.Errorf("status %v", got)
	}
	refuse.Store(false)
	if err := c.d.Publish(c.ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.readiness(t, "uid-1"); len(got) != 1 {
		t.Errorf("status %v after the retry", got)
	}

	// A claim deleted and made again under its name is not the one
	// prepared: its status is not written.
	fn.mu.Lock()
	fn.claims = []PreparedClaim{preparedClaim("uid-3", "eth1-q3"), preparedClaim("uid-1", "eth1-q0")}
	fn.claims[0].Name = "claim-uid-1"
	fn.mu.Unlock()
	err = c.d.Publish(c.ctx)
	if err == nil || !strings.Contains(err.Error(), "replaced") {
		t.Errorf("publish: %v, want the claim replaced", err)
	}
}

// TestPrepareBeforePublish: kubelet may prepare a claim before the
// driver has published (it registers first): the claim's status waits
// for the devices, not "Gone".
func TestPrepareBeforePublish(t *testing.T) {
	fn := &fakeNode{devices: testDevices(), edits: testEdits, claims: []PreparedClaim{preparedClaim("uid-1", "eth1-q0")}}
	c := &cluster{kube: fakeClientset(statusClaim("uid-1")), node: fn, log: &logRecorder{}}
	d, err := newDriver(Options{NodeName: testNode, Kube: c.kube, Node: preparedNode{fn}, CDIDir: t.TempDir(), Logger: slog.New(c.log)})
	if err != nil {
		t.Fatal(err)
	}
	prepare(t, d, "uid-1")
	if got := c.readiness(t, "uid-1"); len(got) != 0 {
		t.Errorf("status before the devices are known: %v", got)
	}
	c.log.noWarnings(t)
}

// TestPrepareWritesNoStatus: kubelet's Prepare does not wait on the API
// server: it returns while the claims' status write is held, and the
// claims prepared meanwhile are written together after, one update per
// claim. (Before, each Prepare wrote its claim's status inside kubelet's
// call: a slow API server slowed every pod's start.)
func TestPrepareWritesNoStatus(t *testing.T) {
	fn := &fakeNode{devices: testDevices(), edits: testEdits}
	kube := fakeClientset(statusClaim("uid-1"), statusClaim("uid-2"), statusClaim("uid-3"))
	held, release := make(chan struct{}, 16), make(chan struct{})
	kube.PrependReactor("update", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" {
			held <- struct{}{}
			<-release
		}
		return false, nil, nil
	})
	c := startCluster(t, preparedNode{fn}, fn, kube)
	base := c.statusUpdates()
	add := func(uid, dev string) {
		c.node.mu.Lock()
		c.node.claims = append(c.node.claims, preparedClaim(uid, dev))
		c.node.mu.Unlock()
	}
	add("uid-1", "eth1-q0")
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	prepared := make(chan error, 1)
	go func() {
		_, err := c.d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{testClaim("uid-1",
			[]resourceapi.DeviceRequestAllocationResult{result("a", DriverName, PoolName(testNode, "upf"), "eth1-q0")})})
		prepared <- err
	}()
	select {
	case err := <-prepared:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Prepare has not returned in 30 s: it waits on the claim's status write")
	}
	<-held // the write of uid-1's status, held
	add("uid-2", "eth1-q1")
	add("uid-3", "eth1-q2")
	prepare(t, c.d, "uid-2")
	prepare(t, c.d, "uid-3")
	close(release)
	released = true
	c.waitReadiness(t, "uid-1", []string{"eth1-q0 True Prepared: its queues are xdpq's"})
	c.waitReadiness(t, "uid-2", []string{"eth1-q1 True Prepared: its queues are xdpq's"})
	c.waitReadiness(t, "uid-3", []string{"eth1-q2 True Prepared: its queues are xdpq's"})
	if n := c.statusUpdates() - base; n != 3 {
		t.Errorf("%d status updates for 3 claims, want 3", n)
	}
	c.log.noWarnings(t)
}
