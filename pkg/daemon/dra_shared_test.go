package daemon

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/xdpq/xdpq/internal/testing/handover"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/kubepods"
)

// TestSharedClaim: one ResourceClaim reserved for two pods of the node
// is prepared once for both. Its queues serve one pod: the first of the
// claim's status.reservedFor to connect, checked against the claim
// (kubelet's PodResources lists no DRA device). Of two pods claiming at
// the same moment, one wins, whichever; the other is refused naming the
// claim and the pod that holds the queues, and so it stays across
// connections; a pod the claim is not reserved for is refused. Once the
// holder is gone from the node and from the claim, the claim's other
// pod takes the queues. (Before, both pods were refused, "kubelet says
// pod ... does not hold xdpq.io/dns xa-q2", and a claim prepared for one
// pod was freed when that pod went, under the pod still using it.)
func TestSharedClaim(t *testing.T) {
	const uid, podC = "5ad0c1a1-7e0f-4c3b-9a52-3d8e6f0b1c2d", "cccccccc-2222-4333-8444-555555555555"
	shared := allocatedClaim("shared", uid, podA, []string{"xa-q2"}, "")
	shared.Status.ReservedFor = append(shared.Status.ReservedFor,
		resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "dns-1", UID: types.UID(podB)})
	names := map[string]string{podA: "dns-0", podB: "dns-1", podC: "dns-2"}
	pods := newFakePods()
	for uid, name := range names {
		pods.pods[uid] = kubepods.Pod{UID: uid, Namespace: "default", Name: name}
	}
	e := newDRAEnv(t, pods, shared)
	if r := e.prepare(t, shared); r.Error != "" {
		t.Fatal(r.Error)
	}
	a, ok := e.d.core.ledger.ByClaim(uid)
	if !ok || !a.Owner.AnyPod {
		t.Fatalf("the shared claim's allocation %+v: want one, for any of its pods", a)
	}
	socket := filepath.Join(e.opts.AllocDir, a.ID, "xdpq.sock")
	connect := func(pod string) (*client.Lease, error) {
		defer joinCgroup(t, handover.PodCgroup(t, container, pod))()
		return client.Connect(socket, client.Options{Ring: 256, Timeout: 5 * time.Second})
	}
	if _, err := connect(podC); err == nil || !strings.Contains(err.Error(), "claim default/shared is not reserved for this pod") {
		t.Fatalf("a pod the claim is not reserved for: %v", err)
	}

	// Both pods of the claim at the same moment: one wins.
	ctx := context.Background()
	errs := make(map[string]error)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, pod := range []string{podA, podB} {
		wg.Go(func() {
			err := e.d.claimPod(ctx, a.ID, broker.PodIdentity{PodUID: pod})
			mu.Lock()
			errs[pod] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	winner, loser := podA, podB
	if errs[podA] != nil {
		winner, loser = podB, podA
	}
	if errs[winner] != nil || errs[loser] == nil {
		t.Fatalf("two pods claiming at once: %v; want one of them refused", errs)
	}
	holds := "claim default/shared is shared, and its queues serve one pod at a time: pod default/" + names[winner] + " (" + winner + ") connected first"
	if !strings.Contains(errs[loser].Error(), holds) {
		t.Errorf("the pod that came second: %v; want %q", errs[loser], holds)
	}
	if _, err := connect(loser); err == nil || !strings.Contains(err.Error(), holds) {
		t.Errorf("the pod that came second, connecting: %v; want %q", err, holds)
	}
	l, err := connect(winner)
	if err != nil {
		t.Fatalf("the pod that came first: %v", err)
	}
	l.Close()
	if _, err := connect(loser); err == nil || !strings.Contains(err.Error(), "belongs to pod "+winner) {
		t.Errorf("the pod that came second, once the first connected: %v", err)
	}

	// The holder goes: kubelet keeps the claim prepared for the other
	// pod, which now takes the queues.
	pods.remove(winner)
	claims := e.kube.ResourceV1().ResourceClaims("default")
	c, err := claims.Get(ctx, "shared", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: names[loser], UID: types.UID(loser)}}
	if _, err := claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		e.d.collect(ctx, time.Hour)
	}
	if a, ok := e.d.core.ledger.ByClaim(uid); !ok || !a.Owner.AnyPod {
		t.Fatalf("the claim's allocation once its holder is gone: %+v %v; want it kept, for the claim's other pod", a, ok)
	}
	l, err = connect(loser)
	if err != nil {
		t.Fatalf("the claim's other pod once the holder is gone: %v", err)
	}
	l.Close()
	if a, _ := e.d.core.ledger.ByClaim(uid); a.Owner.PodUID != loser {
		t.Errorf("owner %+v, want pod %s", a.Owner, loser)
	}
}

// TestPrepareRefusesTwoNetdevs: a claim the scheduler gave queues of two
// netdevs (a request without matchAttribute on xdpq.io/netdev, as the
// claim it makes for the extended resource is) is refused at Prepare,
// naming both netdevs and both ways out, and holds nothing; a claim of
// queues of one netdev of the same pool prepares. (Before, the ledger's
// "span netdevs" was all the pod's events said.)
func TestPrepareRefusesTwoNetdevs(t *testing.T) {
	split := allocatedClaim("split", "d1000000-0000-4000-8000-000000000001", podA, []string{"xa-q3", "xb-q0"}, "")
	one := allocatedClaim("one", "d1000000-0000-4000-8000-000000000002", podA, []string{"xb-q0", "xb-q1"}, "")
	e := newFakeDRAEnv(t, newFakePods(kubepods.Pod{UID: podA, Namespace: "default", Name: "dns-0"}),
		"pools: [{name: dns, servedBy: dra, steering: software, devices: {netdevs: ['xa#2-3', 'xb#0-1']}}]\n", split, one)
	r := e.prepare(t, split)
	for _, want := range []string{"claim default/split was given queues of netdevs xa and xb", "matchAttribute: xdpq.io/netdev",
		"the extended resource of pool dns"} {
		if !strings.Contains(r.Error, want) {
			t.Errorf("prepare of a claim of two netdevs: %q; want %q", r.Error, want)
		}
	}
	if a := e.d.core.ledger.Allocations(); len(a) != 0 {
		t.Errorf("the refused claim holds %+v", a)
	}
	if r := e.prepare(t, one); r.Error != "" {
		t.Errorf("a claim of one netdev: %s", r.Error)
	}
}
