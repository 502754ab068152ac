package daemon

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xdpq/xdpq/pkg/kubepods"
)

// remove has a pod go from the node, as its deletion from the API
// server would.
func (f *fakePods) remove(uid string) {
	f.mu.Lock()
	delete(f.pods, uid)
	f.mu.Unlock()
}

// TestClaimGoneWithoutUnprepare: the collector frees the allocation of
// a claim kubelet never unprepares once its pod is gone from the node
// and the claim is deleted or no longer reserved for the pod, found so
// at two collections in a row; it keeps the allocation while the pod
// is on the node (kubelet's to unprepare), or while the claim is
// reserved for it.
func TestClaimGoneWithoutUnprepare(t *testing.T) {
	const podGone = "99999999-8888-4777-8666-555555555555"
	onNode := allocatedClaim("on-node", "a0000000-0000-4000-8000-000000000001", podA, []string{"xa-q2"}, "")
	reserved := allocatedClaim("reserved", "a0000000-0000-4000-8000-000000000002", podGone, []string{"xa-q3"}, "")
	pods := newFakePods(kubepods.Pod{UID: podA, Namespace: "default", Name: "dns-0"})
	e := newFakeDRAEnv(t, pods, draDNSPool, onNode, reserved)
	ctx := context.Background()
	claims := e.kube.ResourceV1().ResourceClaims("default")
	for _, c := range []string{"on-node", "reserved"} {
		cl, err := claims.Get(ctx, c, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if r := e.prepare(t, cl); r.Error != "" {
			t.Fatalf("prepare %s: %s", c, r.Error)
		}
	}
	held := func() []string {
		var out []string
		for _, a := range e.d.core.ledger.Allocations() {
			out = append(out, a.Claim.Name)
		}
		slices.Sort(out)
		return out
	}
	collectTwice := func() {
		for range 2 {
			e.d.collect(ctx, time.Hour)
		}
	}

	// The claim of a pod still on the node is deleted: kubelet will
	// unprepare it once the pod has stopped, so it stays. A claim whose
	// pod is gone but which is still reserved for it stays too.
	if err := claims.Delete(ctx, "on-node", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	collectTwice()
	if got := held(); !slices.Equal(got, []string{"on-node", "reserved"}) {
		t.Fatalf("held %v, want both claims", got)
	}

	// The reservation goes (the claim controller saw the pod gone): kept
	// at the first collection, freed at the second.
	cl, err := claims.Get(ctx, "reserved", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cl.Status.ReservedFor = nil
	if _, err := claims.UpdateStatus(ctx, cl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.d.collect(ctx, time.Hour)
	if got := held(); !slices.Equal(got, []string{"on-node", "reserved"}) {
		t.Fatalf("held %v after one collection, want both", got)
	}
	e.d.collect(ctx, time.Hour)
	if got := held(); !slices.Equal(got, []string{"on-node"}) {
		t.Fatalf("held %v after two collections, want on-node only", got)
	}

	// The pod of the deleted claim goes from the node: freed too.
	pods.remove(podA)
	collectTwice()
	if got := held(); len(got) != 0 {
		t.Fatalf("held %v once the pod is gone", got)
	}
	// kubelet's Unprepare, late, finds nothing to do.
	if msg := e.unprepare(t, onNode); msg != "" {
		t.Errorf("a late unprepare: %s", msg)
	}
}

// TestPrepareTakesDevicesOfADeallocatedClaim: a pod deleted at once
// leaves its claim prepared while the API server has deallocated it and
// given its queue to the next claim: that claim's Prepare frees the old
// allocation and is served, instead of failing until kubelet's
// Unprepare of the old claim comes. While the old claim still holds the
// queue in the API server, the new one is refused as before.
func TestPrepareTakesDevicesOfADeallocatedClaim(t *testing.T) {
	old := allocatedClaim("old", "b0000000-0000-4000-8000-000000000001", podA, []string{"xa-q2"}, "")
	next := allocatedClaim("next", "b0000000-0000-4000-8000-000000000002", podB, []string{"xa-q2"}, "")
	pods := newFakePods(kubepods.Pod{UID: podA, Namespace: "default", Name: "dns-0"}, kubepods.Pod{UID: podB, Namespace: "default", Name: "dns-1"})
	e := newFakeDRAEnv(t, pods, draDNSPool, old, next)
	ctx := context.Background()
	if r := e.prepare(t, old); r.Error != "" {
		t.Fatal(r.Error)
	}
	if r := e.prepare(t, next); !strings.Contains(r.Error, "in use by allocation") {
		t.Fatalf("the next claim while the old one holds the queue: %+v", r)
	}
	claims := e.kube.ResourceV1().ResourceClaims("default")
	c, err := claims.Get(ctx, "old", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation, c.Status.ReservedFor = nil, nil
	if _, err := claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := e.prepare(t, next); r.Error != "" {
		t.Fatalf("the next claim once the old one is deallocated: %s", r.Error)
	}
	allocs := e.d.core.ledger.Allocations()
	if len(allocs) != 1 || allocs[0].Claim.Name != "next" {
		t.Fatalf("allocations %+v", allocs)
	}
	if msg := e.unprepare(t, old); msg != "" {
		t.Errorf("the old claim's late unprepare: %s", msg)
	}
	if n := len(e.d.core.ledger.Allocations()); n != 1 {
		t.Errorf("%d allocations after the old claim's unprepare", n)
	}
}
