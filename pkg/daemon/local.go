package daemon

import (
	"context"
	"net/netip"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/deviceplugin"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/localapi"
)

// localCore is the core as the local API (localapi.Backend) sees it.
type localCore struct{ d *Daemon }

var _ localapi.Core = localCore{}

func (l localCore) Closed() error {
	if l.d.core.isUninstalling() {
		return errUninstalling
	}
	return nil
}

func (l localCore) Standalone() bool                               { return l.d.opts.Standalone }
func (l localCore) Allocation(id string) (ledger.Allocation, bool) { return l.d.core.ledger.Get(id) }
func (l localCore) Holder(pool, device string) string              { return l.d.core.ledger.Holder(pool, device) }
func (l localCore) Metas() []ledger.Pool                           { return l.d.core.ledger.Metas() }
func (l localCore) Meta(pool string) (ledger.Pool, bool)           { return l.d.core.ledger.Meta(pool) }
func (l localCore) Attachments() []ledger.Attachment               { return l.d.core.ledger.Attachments() }
func (l localCore) APIAllocation(a ledger.Allocation) *api.Allocation {
	return l.d.core.apiAllocation(a)
}

func (l localCore) FreeDevices(pool string) ([]deviceplugin.Device, error) {
	free, err := l.d.core.ledger.FreeDevices(pool)
	if err != nil {
		return nil, err
	}
	return pluginDevices(l.d.core, free), nil
}

func (l localCore) Allocate(ctx context.Context, res ledger.Reservation) (ledger.Allocation, error) {
	return l.d.core.allocate(ctx, res)
}

func (l localCore) Free(ctx context.Context, id, why string) error {
	return l.d.core.free(ctx, id, why)
}

func (l localCore) Status(ctx context.Context) (*api.Status, error) { return l.d.core.Status(ctx) }

func (l localCore) Allocations(ctx context.Context, pool string) (*api.AllocationList, error) {
	return l.d.core.Allocations(ctx, pool)
}

func (l localCore) Attach(ctx context.Context, a ledger.Allocation, att ledger.Attachment, pool ledger.Pool) (ledger.Attachment, bool, error) {
	flows, err := agentFlows(att.Flows, a.Queues)
	if err != nil {
		return att, false, err
	}
	return l.d.core.attachNew(ctx, a, att, flows, pool)
}

func (l localCore) Detach(ctx context.Context, ref api.AttachmentRef) error {
	return l.d.core.del(ctx, ref)
}

func (l localCore) Verify(ctx context.Context, ref api.AttachmentRef) (*api.Attachment, error) {
	return l.d.core.verify(ctx, ref)
}

func (l localCore) CheckNotNode(flows []api.CNIFlow, claimed []netip.Addr, shared []netip.Prefix) error {
	return l.d.core.checkNotNode(flows, claimed, shared)
}

func (l localCore) PodDevices(ctx context.Context, namespace, name string) (map[string][]string, error) {
	return l.d.core.kubelet.podDevices(ctx, namespace, name)
}

// Pods are the node's pods (Options.Pods, which New sets to its pod
// directory when it makes one).
func (l localCore) Pods() localapi.Pods {
	if l.d.opts.Pods == nil {
		return nil
	}
	return l.d.opts.Pods
}
