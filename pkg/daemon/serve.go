package daemon

import (
	"errors"
	"slices"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// How the broker serves the ledger's allocations: their settings, where
// their sockets bind, their directories, and their leases recorded.

// brokerLimits are what one lease of pool p may ask for.
func brokerLimits(p config.Pool) wire.Limits {
	l := p.Limits
	return wire.Limits{MaxUMEM: l.MaxUMEMBytes, MaxRing: l.MaxRing, AllowTX: p.AllowTX, MaxQueue: l.MaxQueuesPerPod}
}

func brokerOwner(o ledger.Owner) broker.Owner {
	return broker.Owner{UID: o.UID, PodUID: o.PodUID, AnyPod: o.AnyPod}
}

// brokerBusyPoll is the busy polling pool p's sockets get, nil for none.
func brokerBusyPoll(p config.Pool) *wire.BusyPoll {
	if p.BusyPoll == nil {
		return nil
	}
	return &wire.BusyPoll{TimeoutMicros: p.BusyPoll.TimeoutMicros, Budget: p.BusyPoll.Budget}
}

// brokerAllocation is how the broker serves allocation a of pool p, on
// the node's netdev (retargeted to a pod's by the caller), with the lease
// a previous daemon recorded resumable.
func (c *core) brokerAllocation(a ledger.Allocation, p config.Pool) broker.Allocation {
	ba := broker.Allocation{ID: a.ID, Netdev: c.nodeNetdev(a.Netdev), Queues: slices.Clone(a.Queues), Owner: brokerOwner(a.Owner),
		Limits: brokerLimits(p), BusyPoll: brokerBusyPoll(p), Dir: c.allocDir(a.ID)}
	if p.DPDK != nil {
		ba.Links = c.dpdkLinks(a.ID)
	}
	for _, s := range a.Lease {
		ba.Resumable = append(ba.Resumable, broker.LeaseSocket{Queue: s.Queue, Inode: s.Inode})
	}
	return ba
}

// onLease records the sockets of an allocation's lease as the broker
// reports them (nil: the lease ended), for a restarted daemon to let the
// pod resume it.
func (c *core) onLease(id string, socks []broker.LeaseSocket) {
	var rec []ledger.LeaseSocket
	for _, s := range socks {
		rec = append(rec, ledger.LeaseSocket{Queue: s.Queue, Inode: s.Inode})
	}
	if err := c.ledger.SetLease(id, rec); err != nil && !errors.Is(err, api.ErrNotFound) {
		c.log.Error("lease not recorded: after a restart the pod cannot resume it", "allocation", id, "err", err)
	}
}

// allocDir is allocation id's broker directory. (Status asks for every
// allocation's socket: filepath.Join, cleaning what is clean, was a
// tenth of its time.)
func (c *core) allocDir(id string) string { return c.opts.AllocDir + "/" + id }

// nodeNetdev names a netdev of the node for a bind: by the ifindex the
// node agent manages it under now (a netdev re-created with its name has
// a new one), else the one discovery found.
func (c *core) nodeNetdev(name string) xsk.Netdev {
	dev := xsk.Netdev{Name: name, NetNS: c.opts.NetNS}
	if ifindex, ok := c.agent.Ifindex(name); ok {
		dev.Ifindex = ifindex
		return dev
	}
	n, ok := c.rec.netdev(name)
	if ok {
		dev.Ifindex = n.Ifindex
	}
	return dev
}

// updateLimits gives the live allocations their pools' limits and busy
// polling, for their next lease.
func (c *core) updateLimits() {
	for _, a := range c.ledger.Allocations() {
		p, ok := c.ledger.Meta(a.Pool)
		if !ok || p.Resource == "" { // a pool gone before this daemon started: its settings are unknown
			continue
		}
		if err := c.broker.SetLimits(a.ID, brokerLimits(p.Config), brokerBusyPoll(p.Config)); err != nil {
			c.log.Debug("limits", "allocation", a.ID, "err", err)
		}
	}
}
