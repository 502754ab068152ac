package daemon

import (
	"context"

	"github.com/xdpq/xdpq/pkg/api"
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
