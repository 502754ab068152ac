package daemon

import (
	"context"
	"time"

	"github.com/xdpq/xdpq/pkg/api"
)

// collectLoop ends, every CollectPeriod, what no one will end: the
// attachments of pods that went without a DEL (containerd never calls CNI
// GC) and, with kubelet, the allocations no running container holds.
func (d *Daemon) collectLoop(ctx context.Context) error {
	t := time.NewTicker(d.opts.CollectPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			d.collect(ctx, d.opts.CollectPeriod)
			d.core.setCollected(time.Now())
		}
	}
}

// collect runs one collection; it returns the attachments and
// allocations it ended. Allocations younger than grace stay: kubelet
// records an allocation only after Allocate returned.
func (d *Daemon) collect(ctx context.Context, grace time.Duration) (atts, allocs []string) {
	d.core.retryUndone(ctx)
	for _, att := range d.core.ledger.Attachments() {
		if !netnsGone(att.Attachment) {
			continue
		}
		if err := d.core.del(ctx, api.AttachmentRef{ContainerID: att.ContainerID, IfName: att.IfName}); err != nil {
			d.log.Warn("detach of a gone pod", "attachment", att.Key(), "err", err)
			continue
		}
		d.log.Info("attachment collected: its pod's netns is gone", "attachment", att.Key(), "netns", att.Netns)
		atts = append(atts, att.Key())
	}
	if d.opts.Standalone {
		return atts, nil
	}
	allocs = d.dra.Collect(ctx)
	held, err := d.core.kubelet.heldDevices(ctx)
	if err != nil {
		d.log.Warn("cannot ask kubelet which devices are in use; collecting no allocation of the device plugin", "err", err)
		return atts, allocs
	}
	for _, a := range d.core.ledger.Allocations() {
		p, ok := d.core.ledger.Meta(a.Pool)
		// A claim's allocation goes with its claim: kubelet unprepares
		// it (again after a restart of its own, from its checkpoint).
		if !ok || a.Claim != nil || time.Since(a.Created) < grace || heldBy(held, resourceOf(a, p), a.Devices) {
			continue
		}
		if err := d.core.free(ctx, a.ID, "no running container holds its devices"); err != nil {
			d.log.Warn("free", "allocation", a.ID, "err", err)
			continue
		}
		allocs = append(allocs, a.ID)
	}
	return atts, allocs
}
