// Package coretest is the daemon's allocation core as the faces' tests
// fake it: a real ledger (plain Go, in a temporary directory) whose
// verbs do no kernel work, with what every face's Core reads of it.
// A face's test embeds Records in its fake and adds what its own Core
// has more.
package coretest

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// Records is a ledger of pools and allocations, and the verbs over it.
type Records struct {
	L *ledger.Ledger
	// NodeAddrs are the node's addresses: CheckNotNode refuses a flow
	// to one of them.
	NodeAddrs []netip.Addr

	mu     sync.Mutex
	served map[string]bool
}

// New is a ledger in a temporary directory with pools.
func New(t *testing.T, pools ...ledger.Pool) *Records {
	t.Helper()
	l, err := ledger.Open(ledger.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	l.SetPools(pools)
	return &Records{L: l, served: map[string]bool{}}
}

// Queues are the devices of n queues of netdev, from queue 0.
func Queues(netdev string, n int) []ledger.Device {
	var out []ledger.Device
	for q := range uint32(n) {
		out = append(out, ledger.Device{ID: ledger.DeviceID(netdev, q), Netdev: netdev, Queues: []uint32{q}, NUMA: -1})
	}
	return out
}

func (r *Records) Allocations() []ledger.Allocation               { return r.L.Allocations() }
func (r *Records) Allocation(id string) (ledger.Allocation, bool) { return r.L.Get(id) }
func (r *Records) ByClaim(uid string) (ledger.Allocation, bool)   { return r.L.ByClaim(uid) }
func (r *Records) Holder(pool, device string) string              { return r.L.Holder(pool, device) }
func (r *Records) Metas() []ledger.Pool                           { return r.L.Metas() }
func (r *Records) Meta(pool string) (ledger.Pool, bool)           { return r.L.Meta(pool) }
func (r *Records) Pool(pool string) (ledger.Pool, bool)           { return r.L.Pool(pool) }
func (r *Records) Device(pool, id string) (ledger.Device, bool)   { return r.L.Device(pool, id) }
func (r *Records) Attachments() []ledger.Attachment               { return r.L.Attachments() }
func (r *Records) SetOwner(id string, o ledger.Owner) error       { return r.L.SetOwner(id, o) }

// Allocate reserves and records an allocation, served at once.
func (r *Records) Allocate(_ context.Context, res ledger.Reservation) (ledger.Allocation, error) {
	a, err := r.L.Reserve(res)
	if err != nil {
		return a, err
	}
	if err := r.L.Commit(a.ID, nil); err != nil {
		return a, err
	}
	r.mu.Lock()
	r.served[a.ID] = true
	r.mu.Unlock()
	return a, nil
}

// Free ends an allocation; it is served no more.
func (r *Records) Free(_ context.Context, id, _ string) error {
	if _, err := r.L.BeginFree(id); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.served, id)
	r.mu.Unlock()
	return r.L.EndFree(id)
}

// Served are the allocations served now, sorted.
func (r *Records) Served() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id := range r.served {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// CheckNotNode refuses a flow to one of NodeAddrs.
func (r *Records) CheckNotNode(flows []api.CNIFlow, _ []netip.Addr, _ []netip.Prefix) error {
	for _, fl := range flows {
		if slices.Contains(r.NodeAddrs, fl.Dst.Addr()) {
			return api.Errorf(api.ErrInvalid, "destination %s is an address of the node", fl.Dst.Addr())
		}
	}
	return nil
}
