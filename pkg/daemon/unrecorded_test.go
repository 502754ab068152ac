package daemon

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/xdpq/xdpq/pkg/api"
)

// TestAllocNotRecordedDecisions: when the allocation's record cannot be
// written (here its directory replaced by a file, which fails for root
// too), alloc is refused and the refused allocation leaves nothing: not
// listed, its queues free at once, no longer served by the broker, no
// directory; once the record can be written, the same queues are
// allocated. A decision of the core on a fake node (write-ahead, then
// undone without writing again); TestAllocNotRecordedLeavesNothing fills
// a real file system.
func TestAllocNotRecordedDecisions(t *testing.T) {
	n := newFakeNode(t, fakeNetdev("xa", 4))
	d := n.started("pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
	ctx := context.Background()
	records := filepath.Join(n.dir, "state", "allocations")
	if err := os.RemoveAll(records); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(records, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	n.broker.take()
	for range 3 { // more than the pool holds
		if a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 2, UID: 1000}); err == nil {
			t.Fatalf("alloc with no place for its record answered %+v", a)
		}
	}
	if l, _ := d.core.Allocations(ctx, ""); len(l.Allocations) != 0 {
		t.Errorf("allocations listed after refusals: %+v", l.Allocations)
	}
	if s, _ := d.core.Status(ctx); len(s.Pools) != 1 || s.Pools[0].Free != 2 || s.Pools[0].Allocations != 0 {
		t.Errorf("pools after refusals: %+v; want both queues free", s.Pools)
	}
	if served := n.broker.servedIDs(); len(served) != 0 {
		t.Errorf("the broker still serves %v", served)
	}
	if left, _ := filepath.Glob(filepath.Join(n.dir, "alloc", "upf-*")); len(left) != 0 {
		t.Errorf("allocation directories left: %v", left)
	}

	if err := os.Remove(records); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(records, 0o700); err != nil {
		t.Fatal(err)
	}
	a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 2, UID: 1000})
	if err != nil {
		t.Fatalf("alloc once the record can be written: %v", err)
	}
	if _, err := os.Stat(filepath.Join(records, a.ID+".json")); err != nil {
		t.Errorf("the allocation's record: %v", err)
	}
}
