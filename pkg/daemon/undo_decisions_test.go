package daemon

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// TestFailedUndoDecisions: an ADD that fails after its flows were
// steered (the broker refusing the pod as owner) is undone; when the
// undo fails too (the NIC refusing to remove the flows), the record of
// what is left stays, pending, the ADD's error says so, and status says
// what is left to undo. Every collection tries again and keeps the
// record while the undo fails; once it succeeds the record, the flows
// and the status' word go, and the same ADD works. A decision of the
// core on a fake node (a queue pool); TestFailedUndoKeepsTheRecord has
// a netdev stuck in a pod's namespace, as root.
func TestFailedUndoDecisions(t *testing.T) {
	n := newFakeNode(t, fakeNetdev("xa", 4))
	d := n.started("pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-3']}}]\n")
	ctx := context.Background()
	a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 1, UID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	pod := netip.MustParseAddr("10.77.0.4")
	add := api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID, PodUID: "u1", Addresses: []netip.Addr{pod},
		Flows: []api.CNIFlow{{Protocol: "udp", Dst: netip.PrefixFrom(pod, 32), DstPort: 2152}}}
	n.broker.mu.Lock()
	n.broker.failOwner = errors.New("the broker is closing")
	n.broker.mu.Unlock()
	n.agent.setFail("unsteer", "xa", errors.New("the NIC refused"))
	steered := func() bool {
		n.agent.mu.Lock()
		defer n.agent.mu.Unlock()
		_, ok := n.agent.flows["xa"]["c1/net1"]
		return ok
	}

	_, err = d.local.CNIAdd(ctx, add)
	if err == nil || !strings.Contains(err.Error(), "the broker is closing") || !strings.Contains(err.Error(), "kept on record") {
		t.Fatalf("ADD: %v; want the failure and the failed undo, kept on record", err)
	}
	if att, ok := d.core.ledger.Attachment("c1/net1"); !ok || att.State != ledger.Pending {
		t.Fatalf("the attachment's record: %+v %v; want it kept, pending", att, ok)
	}
	if s, _ := d.core.Status(ctx); !strings.Contains(strings.Join(s.StateErrors, "\n"), "c1/net1: ") {
		t.Errorf("status does not say what is left to undo: %v", s.StateErrors)
	}
	d.collect(ctx, 0)
	if _, ok := d.core.ledger.Attachment("c1/net1"); !ok || !steered() {
		t.Fatal("a collection whose undo failed dropped the record")
	}

	n.agent.setFail("unsteer", "xa", nil)
	d.collect(ctx, 0)
	if att, ok := d.core.ledger.Attachment("c1/net1"); ok {
		t.Fatalf("after the undo worked the record is still there: %+v", att)
	}
	if steered() {
		t.Error("the flows outlived their undone attachment")
	}
	if s, _ := d.core.Status(ctx); len(s.StateErrors) != 0 {
		t.Errorf("status after the undo: %v", s.StateErrors)
	}
	n.broker.mu.Lock()
	n.broker.failOwner = nil
	n.broker.mu.Unlock()
	if _, err := d.local.CNIAdd(ctx, add); err != nil {
		t.Errorf("ADD once all works: %v", err)
	}
}
