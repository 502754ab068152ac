package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// apiAllocation is how the API shows an allocation.
func (c *core) apiAllocation(a ledger.Allocation) *api.Allocation {
	out := &api.Allocation{ID: a.ID, Pool: a.Pool, Netdev: a.Netdev, Queues: a.Queues, Socket: c.brokerSocket(a.ID),
		UID: a.Owner.UID, Created: a.Created, Devices: a.Devices}
	if a.Claim != nil {
		out.Claim = a.Claim.Namespace + "/" + a.Claim.Name
	}
	return out
}

func (c *core) brokerSocket(id string) string {
	return c.allocDir(id) + "/" + broker.SocketName
}

// serveNew has the broker serve a reserved allocation; on failure the
// reservation is dropped.
func (c *core) serveNew(a ledger.Allocation) error {
	p, _ := c.ledger.Meta(a.Pool)
	if err := c.broker.Add(c.brokerAllocation(a, p.Config)); err != nil {
		c.ledger.Abort(a.ID)
		if rerr := os.RemoveAll(c.allocDir(a.ID)); rerr != nil {
			c.log.Warn("directory of an allocation not served left; removed at the next start", "allocation", a.ID, "err", rerr)
		}
		return err
	}
	return nil
}

// free ends allocation id for the reason why (logged). An allocation the daemon is already freeing (or whose attachment it is
// making or ending) is waited for; one that is gone once the wait is over
// was freed as asked.
func (c *core) free(ctx context.Context, id, why string) error {
	var a ledger.Allocation
	waited := false
	err := c.whenIdle(ctx, func() (err error) {
		a, err = c.ledger.BeginFree(id)
		waited = waited || errors.Is(err, ledger.ErrBusy)
		return err
	})
	if waited && errors.Is(err, ledger.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return c.finishFree(ctx, a, why)
}

// finishFree undoes what an ending allocation has in the kernel and
// removes it from the ledger.
func (c *core) finishFree(ctx context.Context, a ledger.Allocation, why string) error {
	var errs []error
	for _, att := range a.Attachments {
		if err := c.undoAttachment(ctx, att); err != nil {
			errs = append(errs, fmt.Errorf("attachment %s: %w", att.Key(), err))
			continue
		}
		c.log.Info("detached with its allocation", "attachment", att.Key(), "allocation", a.ID)
	}
	if len(errs) > 0 {
		// The record stays (ending): dropping it would leave its flows
		// steering to queues the next allocation gets, or a netdev
		// stranded. The collector tries again.
		err := fmt.Errorf("allocation %s not freed yet (tried again every collection): %w", a.ID, errors.Join(errs...))
		c.retryLater(a.ID, err)
		c.log.Error("free", "err", err)
		return err
	}
	c.unserve(a)
	if err := c.ledger.EndFree(a.ID); err != nil {
		errs = append(errs, err)
	}
	c.publish(change{kind: allocationFreed, alloc: a})
	// A pool removed from the config may go with its last allocation, a
	// netdev back from a pod is managed on the node again.
	if err := c.syncNetdevs(ctx); err != nil {
		errs = append(errs, err)
	}
	c.log.Info("freed", "allocation", a.ID, "why", why)
	return errors.Join(errs...)
}

// retryLater has the collector finish something a failed undo left (err
// says what): an ending allocation's free, or a pending or ending
// attachment's undo. Status reports it until it is done.
func (c *core) retryLater(key string, err error) {
	c.mu.Lock()
	c.retry[key] = err
	c.mu.Unlock()
}

// retryUndone finishes what failed undos left (see retryLater); each try
// that fails again says so again.
func (c *core) retryUndone(ctx context.Context) {
	c.mu.Lock()
	keys := slices.Sorted(maps.Keys(c.retry))
	c.mu.Unlock()
	for _, key := range keys {
		c.mu.Lock()
		delete(c.retry, key)
		c.mu.Unlock()
		if a, ok := c.ledger.Get(key); ok && a.State == ledger.Ending {
			_ = c.finishFree(ctx, a, "retried after a failed undo") // logged, and retried again, by finishFree
			continue
		}
		att, ok := c.ledger.Attachment(key)
		switch {
		case !ok:
		case att.State != ledger.Active:
			c.finishUndo(ctx, att)
			if _, left := c.ledger.Attachment(key); !left && att.Mode == api.ModeNetdev {
				// Back from the pod: the node agent manages it again.
				if err := c.syncNetdevs(ctx); err != nil {
					c.log.Warn("netdevs", "err", err)
				}
			}
		case att.Mode == api.ModeNetdev && c.pods.get(att.Netdev) == nil:
			c.adoptOrReturn(ctx, att)
		}
	}
}

// unserve stops serving an allocation: its lease ends, its directory
// goes, and the subscribers are told (the device plugins remove its
// device-info files).
func (c *core) unserve(a ledger.Allocation) {
	_ = c.broker.Remove(a.ID) // its only error: an allocation not served, which is what is wanted
	if err := os.RemoveAll(c.allocDir(a.ID)); err != nil {
		c.log.Warn("directory of a freed allocation left; removed at the next start", "allocation", a.ID, "err", err)
	}
	c.publish(change{kind: allocationUnserved, alloc: a})
}

// carry says whether a restarted container's new allocation a keeps an
// attachment of the old one: the same netdev and queues, and the pod's
// netns still the one ADD saw.
func carry(att ledger.Attachment, a ledger.Allocation) bool {
	return att.Netdev == a.Netdev && slices.Equal(att.Queues, a.Queues) && att.NetnsInode != 0 && !netnsGone(att.Attachment)
}

// setOwner records who may use an allocation, in the ledger and the
// broker.
func (c *core) setOwner(id string, o ledger.Owner) error {
	if err := c.broker.SetOwner(id, brokerOwner(o)); err != nil {
		return err
	}
	return c.ledger.SetOwner(id, o)
}

// allocate reserves res's devices, has the broker serve them and records
// the allocation: all of it, or nothing. An allocation it replaces
// (res.Replace: kubelet allocates a restarted container's devices again)
// is no longer served; its attachments the new allocation can keep (the
// same netdev and queues, the pod's netns still there: CNI does not run
// again for a container restart) it keeps, with the pod as its owner and
// its netdev in the pod, and the others are undone.
func (c *core) allocate(ctx context.Context, res ledger.Reservation) (ledger.Allocation, error) {
	a, err := c.ledger.Reserve(res)
	if err != nil {
		return a, err
	}
	if err := c.serveNew(a); err != nil {
		return a, err
	}
	var carried []ledger.Attachment
	var podUID string
	netdevs := false
	for _, oldID := range a.Replaces {
		old, ok := c.ledger.Get(oldID)
		if !ok {
			continue
		}
		c.unserve(old)
		for _, att := range old.Attachments {
			if carry(att, a) {
				carried = append(carried, att)
				if att.PodUID != "" {
					podUID = att.PodUID
				}
				c.log.Info("attachment kept for the restarted container", "attachment", att.Key(), "allocation", a.ID, "was", oldID)
				continue
			}
			c.log.Info("attachment ended: its allocation was given to a new container", "attachment", att.Key(), "allocation", a.ID)
			if err := c.undoAttachment(ctx, att); err != nil {
				c.log.Warn("detach", "attachment", att.Key(), "err", err)
			}
			netdevs = netdevs || att.Mode == api.ModeNetdev
		}
	}
	if err := c.ledger.Commit(a.ID, carried); err != nil {
		// The ledger dropped it; the allocations it was to replace are
		// as their records say, and kubelet's next Allocate replaces
		// them again.
		c.unserve(a)
		return a, fmt.Errorf("pool %s: the allocation could not be recorded, and was not made: %w", res.Pool, err)
	}
	// The restarted container's pod keeps its netdev and its lease's
	// owner; a failure leaves the allocation unusable to it, so the
	// Allocate fails and kubelet's next one replaces it again.
	for _, att := range carried {
		if att.Mode != api.ModeNetdev {
			continue
		}
		if err := c.retargetToPod(a.ID, att.Netdev); err != nil {
			return a, fmt.Errorf("allocation %s: its netdev %s in the pod: %w", a.ID, att.Netdev, err)
		}
	}
	if podUID != "" {
		if err := c.setOwner(a.ID, ledger.Owner{PodUID: podUID}); err != nil {
			return a, fmt.Errorf("allocation %s: its pod %s as owner: %w", a.ID, podUID, err)
		}
	}
	if netdevs {
		if err := c.syncNetdevs(ctx); err != nil {
			c.log.Warn("netdevs", "err", err)
		}
	}
	return a, nil
}
