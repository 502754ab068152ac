package ledger

import (
	"encoding/json"
	"errors"
	"testing"
)

// TestClaimAllocation: an allocation made for a DRA claim records the
// claim (its flows too) and is found by the claim's UID, also by a
// restarted daemon; a claim holds one allocation; the pool counts its
// claims' allocations apart from the others; a device is found by its
// id alone.
func TestClaimAllocation(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	pools := []Pool{queuePool("upf", []string{"eth1"}, 0, 1, 2, 3)}
	l.SetPools(pools)
	claim := &Claim{UID: "c-1", Namespace: "telco", Name: "upf-0-queues", Flows: json.RawMessage(`[{"protocol":"udp"}]`),
		Interface: json.RawMessage(`{"name":"net1"}`)}
	a, err := l.Reserve(Reservation{Pool: "upf", Devices: []string{"eth1-q0", "eth1-q1"}, Owner: Owner{PodUID: "p"}, Claim: claim})
	if err != nil {
		t.Fatal(err)
	}
	claim.Flows[0] = 'x' // the ledger keeps its own copy
	if _, err := l.Reserve(Reservation{Pool: "upf", Devices: []string{"eth1-q2"}, Claim: &Claim{UID: "c-1"}}); !errors.Is(err, ErrConflict) {
		t.Errorf("a second allocation of the claim while the first is pending: %v", err)
	}
	if err := l.Commit(a.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Reserve(Reservation{Pool: "upf", Devices: []string{"eth1-q2"}, Claim: &Claim{UID: "c-1"}}); !errors.Is(err, ErrConflict) {
		t.Errorf("a second allocation of the claim: %v", err)
	}
	if _, err := l.Reserve(Reservation{Pool: "upf", Devices: []string{"eth1-q2"}, Claim: &Claim{}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a claim without a UID: %v", err)
	}
	other := alloc(t, l, "upf", "eth1-q3")
	if c, o := l.ClaimsHeld("upf"); c != 1 || o != 1 {
		t.Errorf("ClaimsHeld: %d claims, %d others; want 1 and 1", c, o)
	}
	l2 := open(t, dir) // restarted
	l2.SetPools(pools)
	got, ok := l2.ByClaim("c-1")
	if !ok || got.ID != a.ID || got.Claim == nil || got.Claim.Name != "upf-0-queues" || string(got.Claim.Flows) != `[{"protocol":"udp"}]` ||
		string(got.Claim.Interface) != `{"name":"net1"}` {
		t.Fatalf("ByClaim after a restart: %+v %v", got, ok)
	}
	if _, ok := l2.ByClaim("c-2"); ok {
		t.Error("ByClaim found a claim that has no allocation")
	}
	if d, ok := l2.Device("upf", "eth1-q2"); !ok || d.Netdev != "eth1" || len(d.Queues) != 1 || d.Queues[0] != 2 {
		t.Errorf("Device: %+v %v", d, ok)
	}
	if _, ok := l2.Device("upf", "eth1-q9"); ok {
		t.Error("Device found a queue outside the pool")
	}
	free(t, l2, a.ID)
	free(t, l2, other.ID)
	if _, ok := l2.ByClaim("c-1"); ok {
		t.Error("the claim's allocation is found once freed")
	}
}
