package daemon

import (
	"context"
	"errors"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/deviceplugin"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// localAPI is the daemon's local API (api.Backend): a standalone
// daemon's allocations, the status, and the CNI verbs.
type localAPI struct {
	*cniFace
	core *core
}

var _ api.Backend = (*localAPI)(nil)

// Status reports pools, netdevs and how many allocations and attachments
// there are.
func (l *localAPI) Status(ctx context.Context) (*api.Status, error) { return l.core.Status(ctx) }

// Allocations lists the allocations of pool ("" for every pool).
func (l *localAPI) Allocations(ctx context.Context, pool string) (*api.AllocationList, error) {
	return l.core.Allocations(ctx, pool)
}

// cniFace is the CNI verbs of the local API: a runtime's ADD, DEL, CHECK
// and GC of attachments, and the daemon's own attachments' ADD (add).
type cniFace struct{ core *core }

// Alloc hands count devices of a pool to a local user (standalone mode).
func (l *localAPI) Alloc(ctx context.Context, req api.AllocRequest) (*api.Allocation, error) {
	if l.core.isUninstalling() {
		return nil, errUninstalling
	}
	if !l.core.opts.Standalone {
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
		free, err := l.core.ledger.FreeDevices(req.Pool)
		if err != nil {
			return nil, err
		}
		ids := deviceplugin.Prefer(pluginDevices(l.core, free), nil, req.Count)
		if len(ids) < req.Count {
			return nil, api.Errorf(api.ErrConflict, "pool %s: %d queues asked, %d free", req.Pool, req.Count, len(ids))
		}
		a, err := l.core.allocate(ctx, ledger.Reservation{Pool: req.Pool, Devices: ids, Owner: owner})
		if errors.Is(err, ledger.ErrConflict) && try < 3 {
			continue
		}
		if err != nil {
			return nil, err
		}
		l.core.log.Info("allocated", "allocation", a.ID, "pool", a.Pool, "netdev", a.Netdev, "queues", a.Queues, "uid", uid)
		return l.core.apiAllocation(a), nil
	}
}

// Free ends an allocation: its attachments end, its lease (if any) ends,
// its devices are free.
func (l *localAPI) Free(ctx context.Context, id string) error {
	return l.core.free(ctx, id, "asked")
}
