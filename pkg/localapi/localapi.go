// Package localapi is the daemon's local API as its Unix socket serves
// it (api.Backend): a standalone daemon's allocations (xdpqctl alloc and
// free), the status, and the CNI verbs (the CNI plugin's ADD, DEL,
// CHECK, GC). It decides what is the request's to decide (the
// allocation an ADD names, or that kubelet says the pod holds; flows
// that would take the node's or another pod's address, or an address
// another pool is granted; a netdev pool's chained or netns-less ADD)
// and calls down into the daemon's allocation core (Core) for the rest.
package localapi

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/deviceplugin"
	"github.com/xdpq/xdpq/pkg/kubepods"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// Core is the daemon's allocation core as the local API sees it.
type Core interface {
	// Closed says why the core takes nothing new (an uninstall has
	// begun); nil while it does.
	Closed() error
	// Standalone says allocations come from xdpqctl, not kubelet.
	Standalone() bool
	Allocation(id string) (ledger.Allocation, bool)
	// Holder is the allocation that holds device of pool, "" none.
	Holder(pool, device string) string
	Metas() []ledger.Pool
	Meta(pool string) (ledger.Pool, bool)
	Attachments() []ledger.Attachment
	// FreeDevices are a pool's devices no allocation holds, healthy or
	// not, for a standalone allocation's choice.
	FreeDevices(pool string) ([]deviceplugin.Device, error)
	// Allocate reserves, serves and records an allocation; Free ends one.
	Allocate(ctx context.Context, res ledger.Reservation) (ledger.Allocation, error)
	Free(ctx context.Context, id, why string) error
	// APIAllocation is how the API shows an allocation.
	APIAllocation(a ledger.Allocation) *api.Allocation
	Status(ctx context.Context) (*api.Status, error)
	Allocations(ctx context.Context, pool string) (*api.AllocationList, error)
	// Attach makes attachment att of allocation a (again says it was
	// there already); Detach ends one (none is no error); Verify reports
	// one as recorded and whether the kernel still has it so.
	Attach(ctx context.Context, a ledger.Allocation, att ledger.Attachment, pool ledger.Pool) (got ledger.Attachment, again bool, err error)
	Detach(ctx context.Context, ref api.AttachmentRef) error
	Verify(ctx context.Context, ref api.AttachmentRef) (*api.Attachment, error)
	// CheckNotNode refuses flows that would take an address of the node
	// (unless shared grants it).
	CheckNotNode(flows []api.CNIFlow, claimed []netip.Addr, shared []netip.Prefix) error
	// PodDevices are the device IDs a pod's containers hold, by
	// resource, as kubelet says.
	PodDevices(ctx context.Context, namespace, name string) (map[string][]string, error)
	// Pods are the node's pods; nil when none are known (standalone).
	Pods() Pods
}

// Pods are the node's pods as the local API asks them.
type Pods interface {
	// ByIP are the node's pods that hold address a as their own.
	ByIP(a netip.Addr) []kubepods.Pod
	// Touch has the pod looked at again: its allocation changed.
	Touch(uid string)
}

// Backend is the local API's backend.
type Backend struct {
	core Core
	log  *slog.Logger
}

var _ api.Backend = (*Backend)(nil)

// New returns the backend over core.
func New(core Core, log *slog.Logger) *Backend {
	if log == nil {
		log = slog.Default()
	}
	return &Backend{core: core, log: log}
}

// Status reports pools, netdevs and how many allocations and attachments
// there are.
func (b *Backend) Status(ctx context.Context) (*api.Status, error) { return b.core.Status(ctx) }

// Allocations lists the allocations of pool ("" for every pool).
func (b *Backend) Allocations(ctx context.Context, pool string) (*api.AllocationList, error) {
	return b.core.Allocations(ctx, pool)
}

// Alloc hands count devices of a pool to a local user (standalone mode).
func (b *Backend) Alloc(ctx context.Context, req api.AllocRequest) (*api.Allocation, error) {
	if err := b.core.Closed(); err != nil {
		return nil, err
	}
	if !b.core.Standalone() {
		return nil, api.Errorf(api.ErrNotSupported, "allocations come from kubelet on this node; xdpqctl alloc is for a standalone daemon")
	}
	if req.Count < 1 {
		return nil, api.Errorf(api.ErrInvalid, "pool %s: %d queues asked; at least 1", req.Pool, req.Count)
	}
	uid := req.UID
	owner := ledger.Owner{UID: &uid}
	// Another allocation may take a device between the choice and the
	// reservation; choose again then.
	for try := 0; ; try++ {
		free, err := b.core.FreeDevices(req.Pool)
		if err != nil {
			return nil, err
		}
		ids := deviceplugin.Prefer(free, nil, req.Count)
		if len(ids) < req.Count {
			return nil, api.Errorf(api.ErrConflict, "pool %s: %d queues asked, %d free", req.Pool, req.Count, len(ids))
		}
		a, err := b.core.Allocate(ctx, ledger.Reservation{Pool: req.Pool, Devices: ids, Owner: owner})
		if errors.Is(err, ledger.ErrConflict) && try < 3 {
			continue
		}
		if err != nil {
			return nil, err
		}
		b.log.Info("allocated", "allocation", a.ID, "pool", a.Pool, "netdev", a.Netdev, "queues", a.Queues, "uid", uid)
		return b.core.APIAllocation(a), nil
	}
}

// Free ends an allocation: its attachments end, its lease (if any) ends,
// its devices are free.
func (b *Backend) Free(ctx context.Context, id string) error {
	return b.core.Free(ctx, id, "asked")
}
