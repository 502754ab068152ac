package daemon

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/mover"
)

// refusingBroker is the broker, but setting an owner fails while refuse
// is set.
type refusingBroker struct {
	socketBroker
	refuse *atomic.Bool
}

func (b refusingBroker) SetOwner(id string, o broker.Owner) error {
	if b.refuse.Load() {
		return errors.New("injected: owner not set")
	}
	return b.socketBroker.SetOwner(id, o)
}

// stuckMover is the mover, but bringing a netdev back fails while stuck
// is set (a NIC that does not answer).
type stuckMover struct {
	netdevMover
	stuck *atomic.Bool
}

func (m stuckMover) MoveOut(ctx context.Context, r mover.Record, pod netns.NsHandle) error {
	if m.stuck.Load() {
		return errors.New("injected: the netdev does not move")
	}
	return m.netdevMover.MoveOut(ctx, r, pod)
}

// TestFailedUndoKeepsTheRecord: an ADD in a netdev pool moves the netdev
// into the pod, then fails (the broker takes no owner), and bringing the
// netdev back fails too. The attachment's record, the only way to find
// the netdev again, stays (pending), status says why, and the collector
// brings the netdev back and ends the record once it can. (Before, the
// record was deleted: a NIC stranded in a pod's namespace with no record
// of it.)
func TestFailedUndoKeepsTheRecord(t *testing.T) {
	pair := testnet.NewPair(t, 2)
	var refuse, stuck atomic.Bool
	refuse.Store(true)
	stuck.Store(true)
	d, _ := runDaemon(t, standaloneOpts(t, pair, t.TempDir(), testPins(t), "pools: [{name: vf, mode: netdev, devices: {netdevs: [xa]}}]\n"),
		func(d *Daemon) {
			d.core.broker = refusingBroker{d.core.broker, &refuse}
			d.core.mover = stuckMover{d.core.mover, &stuck}
		})
	ctx := context.Background()
	a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "vf", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	pod := newPodNS(t)
	_, err = d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Netns: pod.Path(), Allocation: a.ID, PodUID: "u1"})
	if err == nil || !strings.Contains(err.Error(), "kept on record") {
		t.Fatalf("ADD: %v; want the failure and the failed undo", err)
	}
	att, ok := d.core.ledger.Attachment("c1/net1")
	if !ok || att.State != ledger.Pending || len(att.Moved) == 0 {
		t.Fatalf("the attachment's record: %+v %v; want it kept, pending, with where the netdev is", att, ok)
	}
	s, _ := d.core.Status(ctx)
	if !strings.Contains(strings.Join(s.StateErrors, "\n"), "c1/net1: ") {
		t.Errorf("status does not say what is left to undo: %v", s.StateErrors)
	}
	// Still stuck: the collector tries, and keeps the record.
	d.collect(ctx, 0)
	if _, ok := d.core.ledger.Attachment("c1/net1"); !ok {
		t.Fatal("a collection whose undo failed dropped the record")
	}
	// The NIC answers again: the next collection brings it back.
	stuck.Store(false)
	d.collect(ctx, 0)
	if att, ok := d.core.ledger.Attachment("c1/net1"); ok {
		t.Fatalf("after the netdev came back the record is still there: %+v", att)
	}
	if n := netdevOf(t, d, "xa"); n.State == "Missing" {
		t.Errorf("xa after the collection: %+v; want it back on the node", n)
	}
	if s, _ := d.core.Status(ctx); len(s.StateErrors) != 0 {
		t.Errorf("status after the undo: %v", s.StateErrors)
	}
	// And the allocation works: the same ADD, the broker taking owners.
	refuse.Store(false)
	if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Netns: pod.Path(), Allocation: a.ID, PodUID: "u1"}); err != nil {
		t.Errorf("ADD once all works: %v", err)
	}
}
