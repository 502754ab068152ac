package daemon

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// start puts the config in force and takes over from a previous daemon:
// what it left half done is finished or rolled back as its records say,
// the netdevs it moved into pods that still run are adopted (and those of
// gone pods brought back), the flows of its attachments are kept and
// every other xdpq flow removed (unless a record is unreadable: then
// nothing is removed), and its allocations are served again at the same
// paths, their leases resumable.
func (c *core) start(ctx context.Context) error {
	// What the records hold, before the first reconcile starts the device
	// plugins: kubelet may allocate at once, and those allocations are
	// served already.
	c.clearStaging()
	recorded := map[string]bool{}
	for _, a := range c.ledger.Allocations() {
		recorded[a.ID] = true
	}
	if err := c.rec.request(ctx, reconcileRequest{discover: true}); err != nil {
		return err
	}
	rec := c.ledger.Recovery()
	for _, a := range rec.Freeing {
		c.log.Info("finishing the free a previous daemon began", "allocation", a.ID)
		if err := c.finishFree(ctx, a, "a previous daemon began freeing it"); err != nil {
			c.log.Warn("free", "allocation", a.ID, "err", err)
		}
	}
	for _, att := range append(rec.Attaching, rec.Detaching...) {
		c.log.Info("finishing what a previous daemon began", "attachment", att.Key(), "state", att.State)
		c.finishUndo(ctx, att)
	}
	c.adoptPods(ctx)
	if err := c.syncNetdevs(ctx); err != nil { // netdevs back from pods
		return err
	}
	c.syncSteering(true)
	c.restoreAllocations(ctx, recorded)
	c.removeStrayDirs()
	c.recovered.Store(true)
	return c.syncNetdevs(ctx) // and, with kubelet, the device plugins start
}

// clearStaging removes what a killed daemon left half made in the
// broker's staging directory: no socket there is listened on any more.
// It runs before this daemon serves any allocation.
func (c *core) clearStaging() {
	staging := filepath.Join(c.opts.AllocDir, broker.StagingDir)
	left, _ := os.ReadDir(staging)
	for _, e := range left {
		if err := os.Remove(filepath.Join(staging, e.Name())); err != nil {
			c.log.Warn("a staged socket a previous daemon left", "file", e.Name(), "err", err)
		}
	}
	if len(left) > 0 {
		c.log.Info("removed what a previous daemon left in the staging directory", "dir", staging, "entries", len(left))
	}
}

// recoverRescanned does for an allocation whose record became readable
// again what start does for every record: a free or an attachment a
// crash left half done is finished, a netdev in a pod adopted, and the
// allocation served.
func (c *core) recoverRescanned(ctx context.Context, a ledger.Allocation) {
	if a.State == ledger.Ending {
		c.serveRestored(ctx, a)                                        // so that the free can stop serving it
		_ = c.finishFree(ctx, a, "a previous daemon began freeing it") // logged, and retried, by finishFree
		return
	}
	for _, att := range a.Attachments {
		switch {
		case att.State != ledger.Active:
			c.finishUndo(ctx, att)
		case att.Mode == api.ModeNetdev:
			c.adoptOrReturn(ctx, att)
		}
	}
	if a, ok := c.ledger.Get(a.ID); ok {
		c.serveRestored(ctx, a)
	}
}

// finishUndo ends an attachment a crash or a failed undo left pending (an
// ADD: rolled back) or ending (a DEL: finished). A netdev that cannot be
// brought back yet, or flows that cannot be removed, keep the record, and
// the collector tries again; the flows of a netdev not managed (yet) go
// with the next steering sync.
func (c *core) finishUndo(ctx context.Context, att ledger.Attachment) {
	if att.Mode == api.ModeNetdev && len(att.Moved) > 0 {
		if err := c.moveOut(ctx, att); err != nil {
			c.log.Error("netdev not brought back yet; tried again every collection", "netdev", att.Netdev, "attachment", att.Key(), "err", err)
			c.retryLater(att.Key(), fmt.Errorf("netdev %s not brought back yet: %w", att.Netdev, err))
			return
		}
	}
	if att.Mode == api.ModeQueue {
		// A netdev not managed (yet, at start) has its flows settled by
		// the next steering sync.
		managed := c.rec.isManaged(att.Netdev)
		if err := c.agent.Unsteer(att.Netdev, att.Key()); err != nil && managed {
			c.log.Error("flows not removed yet; tried again every collection", "netdev", att.Netdev, "attachment", att.Key(), "err", err)
			c.retryLater(att.Key(), fmt.Errorf("flows on %s not removed yet: %w", att.Netdev, err))
			return
		}
	}
	var err error
	if att.State == ledger.Pending {
		err = c.ledger.EndAttach(att, false)
	} else {
		err = c.ledger.EndDetach(att.Key())
	}
	if err != nil {
		// Gone in memory; the record on disk makes a restarted daemon
		// finish it again, which finds nothing left to undo.
		c.log.Warn("attachment undone, its record not yet removed", "attachment", att.Key(), "err", err)
	}
}

// syncSteering has the node agent take the flows of the queue-mode
// attachments (of netdevs, or every managed one), installing those that
// are missing. With removeUnowned and every record read, the flows xdpq
// installed that no attachment owns go (a crashed ADD's, a freed
// allocation's, a removed record's); with a record unreadable nothing is
// removed. The agent never takes a flow from an owner it knows, so this
// is safe while CNI calls run.
func (c *core) syncSteering(removeUnowned bool, netdevs ...string) {
	keep := map[string]map[string][]agent.Flow{}
	for _, att := range c.ledger.Attachments() {
		if att.Mode != api.ModeQueue || att.State == ledger.Ending {
			continue
		}
		flows, err := agentFlows(att.Flows, att.Queues)
		if err != nil {
			continue
		}
		if keep[att.Netdev] == nil {
			keep[att.Netdev] = map[string][]agent.Flow{}
		}
		keep[att.Netdev][att.Key()] = flows
	}
	removeUnowned = removeUnowned && len(c.ledger.Broken()) == 0
	if len(netdevs) == 0 {
		netdevs = c.rec.managedNetdevs()
	}
	for _, n := range netdevs {
		if removeUnowned {
			if removed, err := c.agent.SyncSteering(n, keep[n]); err != nil || removed > 0 {
				c.log.Info("steering synced with the attachments", "netdev", n, "removed", removed, "err", err)
			}
		} else if unknown, err := c.agent.AdoptSteering(n, keep[n]); err != nil || unknown > 0 {
			c.log.Warn("flows no readable record owns are left in place", "netdev", n, "unknown", unknown, "err", err)
		}
		// A flow its attachment lost (a NIC reset, a steering kind changed
		// while the daemon was away, an entry deleted) is installed again:
		// sync took only the flows it found.
		if _, err := c.agent.RepairSteering(n); err != nil {
			c.log.Error("flows gone from the kernel could not all be put back", "netdev", n, "err", err)
		}
		for _, key := range slices.Sorted(maps.Keys(keep[n])) {
			if att, ok := c.ledger.Attachment(key); !ok || att.State != ledger.Active {
				continue // gone meanwhile, or an ADD steering now
			}
			if added, err := c.agent.EnsureSteering(n, key, keep[n][key]); err != nil {
				c.log.Error("a flow of an attachment could not be installed again", "attachment", key, "netdev", n, "err", err)
			} else if added > 0 {
				c.log.Info("flows of an attachment installed again", "attachment", key, "netdev", n, "count", added)
			}
		}
	}
}

// restoreAllocations serves a previous daemon's allocations again. With
// kubelet, one whose devices no running container holds is freed (when
// kubelet cannot be asked, all are kept: losing a live pod's socket is
// worse).
func (c *core) restoreAllocations(ctx context.Context, recorded map[string]bool) {
	var allocs []ledger.Allocation
	for _, a := range c.ledger.Allocations() {
		if recorded[a.ID] {
			allocs = append(allocs, a)
		}
	}
	var held map[string]bool
	if !c.opts.Standalone && len(allocs) > 0 {
		var err error
		if held, err = c.kubelet.heldDevices(ctx); err != nil {
			c.log.Warn("cannot ask kubelet which devices are in use; restoring every allocation", "err", err)
		}
	}
	for _, a := range allocs {
		p, _ := c.ledger.Meta(a.Pool)
		if held != nil && a.Claim == nil && !heldBy(held, resourceOf(a, p), a.Devices) {
			c.serveRestored(ctx, a) // served, so that free can stop serving it
			if err := c.free(ctx, a.ID, "kubelet says no running container holds its devices"); err != nil {
				c.log.Warn("free", "allocation", a.ID, "err", err)
			}
			continue
		}
		c.serveRestored(ctx, a)
	}
}

// serveRestored has the broker serve a restored allocation at its path
// again, on the pod's netdev if it is in one.
func (c *core) serveRestored(ctx context.Context, a ledger.Allocation) {
	p, _ := c.ledger.Meta(a.Pool)
	ba := c.brokerAllocation(a, p.Config)
	// Served where its netdev is now, so that its lease stays resumable.
	var podAgent broker.PodDatapath
	for _, att := range a.Attachments {
		if att.Mode == api.ModeNetdev && att.State == ledger.Active {
			dev, ag, err := c.podTarget(att.Netdev)
			if err != nil {
				c.log.Warn("netdev in the pod, sockets not bound there", "allocation", a.ID, "err", err)
				continue
			}
			ba.Netdev, podAgent = dev, ag
		}
	}
	if err := c.broker.Add(ba); err != nil {
		c.log.Error("allocation not served", "allocation", a.ID, "err", err)
		return
	}
	if podAgent != nil {
		if err := c.broker.Retarget(a.ID, ba.Netdev, podAgent); err != nil {
			c.log.Warn("netdev in the pod, sockets not bound there", "allocation", a.ID, "err", err)
		}
	}
	c.log.Info("allocation restored", "allocation", a.ID, "devices", a.Devices, "resumable", len(a.Lease) > 0)
}

// removeStrayDirs removes allocation directories that no record names: an
// allocation that was being made when the daemon stopped.
func (c *core) removeStrayDirs() {
	ents, err := os.ReadDir(c.opts.AllocDir)
	if err != nil {
		return
	}
	broken := c.ledger.Broken()
	if len(broken) > 0 {
		return // an unreadable record may name any of them
	}
	links := filepath.Join(c.opts.AllocDir, dpdkLinkDir)
	linked, _ := os.ReadDir(links)
	for _, e := range linked {
		if _, ok := c.ledger.Get(strings.TrimSuffix(e.Name(), ".sock")); !ok {
			if err := os.Remove(filepath.Join(links, e.Name())); err != nil {
				c.log.Warn("a DPDK link of an allocation no record names", "file", e.Name(), "err", err)
			}
		}
	}
	for _, e := range ents {
		id := e.Name()
		if !e.IsDir() || strings.HasPrefix(id, ".") {
			continue
		}
		if _, ok := c.ledger.Get(id); ok {
			continue
		}
		c.log.Info("removing the directory of an allocation no record names", "dir", filepath.Join(c.opts.AllocDir, id))
		if err := os.RemoveAll(filepath.Join(c.opts.AllocDir, id)); err != nil {
			c.log.Warn("the directory of an allocation no record names", "dir", filepath.Join(c.opts.AllocDir, id), "err", err)
		}
	}
}

// heldBy reports whether kubelet says a container holds any of the
// devices ids of resource.
func heldBy(held map[string]bool, resource string, ids []string) bool {
	for _, id := range ids {
		if held[resource+"/"+id] {
			return true
		}
	}
	return false
}

// resourceOf is the resource kubelet knows an allocation's devices by:
// the one it was made under (a reload may have renamed the pool's since).
func resourceOf(a ledger.Allocation, p ledger.Pool) string {
	if a.Resource != "" {
		return a.Resource
	}
	return p.Resource
}
