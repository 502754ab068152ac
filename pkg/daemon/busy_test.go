package daemon

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// TestVerbsWaitForWorkUnderWay: a verb that meets an operation the
// daemon already has under way on the same attachment or allocation (its
// collector ending the attachment of a pod whose netns went, a free) waits
// for it and answers as things are after it: DEL and free succeed, CHECK
// finds no attachment, a repeated ADD attaches anew. (CI on a fresh
// machine failed TestNetdevPoolNetnsGone: the plugin's DEL met the
// collector's ending and answered "an operation on it is in progress;
// try again".) Each operation is begun by hand, as the collector begins
// it, and finished only after the verb has been called. A decision of
// the daemon's, on a fake node: no kernel is asked.
func TestVerbsWaitForWorkUnderWay(t *testing.T) {
	n := newFakeNode(t, fakeNetdev("xa", 4))
	yaml := "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n"
	d, _ := n.daemon(yaml)
	n.reload(d, yaml)
	ctx := context.Background()
	// allocWithFlow allocates both queues and attaches c1/net1 with a
	// flow to the pod's address.
	allocWithFlow := func(t *testing.T) *api.Allocation {
		t.Helper()
		a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 2})
		if err != nil {
			t.Fatal(err)
		}
		pod := netip.MustParseAddr("10.99.0.7")
		f := api.CNIFlow{Protocol: "udp", Dst: netip.PrefixFrom(pod, 32), DstPort: 5000}
		if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID, Flows: []api.CNIFlow{f},
			Addresses: []netip.Addr{pod}}); err != nil {
			t.Fatal(err)
		}
		return a
	}
	ref := api.AttachmentRef{ContainerID: "c1", IfName: "net1"}
	key := ledger.Key(ref.ContainerID, ref.IfName)

	// beginEnding begins ending c1/net1 as the collector does; finish
	// ends it.
	beginEnding := func(t *testing.T) (finish func()) {
		t.Helper()
		att, found, err := d.core.ledger.BeginDetach(key)
		if !found || err != nil {
			t.Fatalf("begin detach: %v %v", found, err)
		}
		return func() {
			if err := d.core.undoAttachment(ctx, att); err != nil {
				t.Error(err)
			}
			if err := d.core.ledger.EndDetach(key); err != nil {
				t.Error(err)
			}
		}
	}
	// during calls verb while the operation is under way, and finishes
	// it once the verb waits for it.
	waiting := make(chan struct{}, 1)
	d.core.waitingHook = func() { waiting <- struct{}{} }
	during := func(t *testing.T, finish func(), verb func() error) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- verb() }()
		select {
		case err := <-done:
			t.Fatalf("answered while the operation was under way: %v", err)
		case <-waiting:
		}
		finish()
		return <-done
	}

	t.Run("DEL", func(t *testing.T) {
		a := allocWithFlow(t)
		t.Cleanup(func() { d.local.Free(ctx, a.ID) })
		finish := beginEnding(t)
		if err := during(t, finish, func() error { return d.local.CNIDel(ctx, ref) }); err != nil {
			t.Errorf("DEL of an attachment the daemon was ending: %v; want success once it ended", err)
		}
		if n := netdevOf(t, d, "xa"); n.Flows != 0 {
			t.Errorf("%d flows after DEL", n.Flows)
		}
	})
	t.Run("CHECK", func(t *testing.T) {
		a := allocWithFlow(t)
		t.Cleanup(func() { d.local.Free(ctx, a.ID) })
		finish := beginEnding(t)
		err := during(t, finish, func() error { _, err := d.local.CNICheck(ctx, ref); return err })
		if !errors.Is(err, api.ErrNotFound) {
			t.Errorf("CHECK of an attachment the daemon was ending: %v; want not found once it ended", err)
		}
	})
	t.Run("GC", func(t *testing.T) {
		a := allocWithFlow(t)
		t.Cleanup(func() { d.local.Free(ctx, a.ID) })
		finish := beginEnding(t)
		if err := during(t, finish, func() error { _, err := d.local.CNIGC(ctx, api.GCRequest{}); return err }); err != nil {
			t.Errorf("GC meeting an ending: %v", err)
		}
	})
	t.Run("free", func(t *testing.T) {
		a := allocWithFlow(t)
		finish := beginEnding(t)
		if err := during(t, finish, func() error { return d.local.Free(ctx, a.ID) }); err != nil {
			t.Errorf("free of an allocation whose attachment was ending: %v", err)
		}
		if _, ok := d.core.ledger.Get(a.ID); ok {
			t.Error("the allocation is still there")
		}
	})
	t.Run("free of one being freed", func(t *testing.T) {
		a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 2})
		if err != nil {
			t.Fatal(err)
		}
		got, err := d.core.ledger.BeginFree(a.ID)
		if err != nil {
			t.Fatal(err)
		}
		finish := func() {
			if err := d.core.finishFree(ctx, got, "test"); err != nil {
				t.Error(err)
			}
		}
		if err := during(t, finish, func() error { return d.local.Free(ctx, a.ID) }); err != nil {
			t.Errorf("free of an allocation being freed: %v; want success once it is gone", err)
		}
		if err := d.local.Free(ctx, a.ID); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("free of an allocation gone long since: %v; want not found", err)
		}
	})
	t.Run("ADD", func(t *testing.T) {
		a := allocWithFlow(t)
		t.Cleanup(func() { d.local.Free(ctx, a.ID) })
		finish := beginEnding(t)
		err := during(t, finish, func() error {
			_, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID})
			return err
		})
		if err != nil {
			t.Errorf("ADD meeting the ending of the same attachment: %v; want it attached anew", err)
		}
		if att, ok := d.core.ledger.Attachment(key); !ok || att.State != ledger.Active || len(att.Flows) != 0 {
			t.Errorf("after the ADD: %+v %v; want the new attachment, active, without flows", att, ok)
		}
	})
}
