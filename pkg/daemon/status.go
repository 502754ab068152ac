package daemon

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/ledger"
)

// Status reports pools, netdevs, how many allocations and attachments
// there are, and what is wrong with the config or the records: bounded by
// the pools and netdevs, whatever the number of pods (Allocations lists
// them). It waits for no kernel call but the agents' status.
func (c *core) Status(ctx context.Context) (*api.Status, error) {
	s := &api.Status{}
	counts := c.ledger.Count()
	s.Allocations, s.Attachments = counts.Allocations, counts.Attachments
	for _, p := range c.ledger.Metas() {
		u := c.ledger.Usage(p.Name)
		ps := api.PoolStatus{Name: p.Name, Resource: p.Resource, Queues: u.Devices, Free: u.Free, Allocations: counts.ByPool[p.Name]}
		reasons := append([]string(nil), p.Problems...)
		if u.Beyond > 0 {
			reasons = append(reasons, fmt.Sprintf("%d devices held by allocations are no longer in the pool; they leave when freed", u.Beyond))
		}
		if u.Blocked != "" {
			reasons = append(reasons, u.Blocked)
		}
		ps.Reason = strings.Join(reasons, "; ")
		s.Pools = append(s.Pools, ps)
	}
	netdevs := c.netdevStatus()
	if len(netdevs) > 0 {
		s.Netdevs = make([]api.NetdevStatus, len(netdevs))
	}
	for i, n := range netdevs {
		s.Netdevs[i] = api.NetdevStatus{Netdev: n.Netdev, State: string(n.State), Mode: n.Mode.String(),
			Steering: string(n.Steering), Flows: n.Flows, UnknownFlows: n.UnknownFlows, Sockets: n.Sockets, LinkUp: n.LinkUp,
			Reason: n.Reason, PolicyError: n.PolicyError, Program: uint32(n.Program), Foreign: n.Foreign,
			RXQueues: n.RXQueues, Reserved: n.Policy.Reserved, ZeroCopy: n.ZeroCopy, NUMANode: -1}
	}
	found := c.rec.netdevs()
	for i := range s.Netdevs {
		if dev, ok := found[s.Netdevs[i].Netdev]; ok {
			s.Netdevs[i].Driver, s.Netdevs[i].PCI, s.Netdevs[i].NUMANode = dev.Driver, dev.PCI, dev.NUMANode
		}
	}
	// The agent's are in order already, the netdevs in pods after them.
	slices.SortStableFunc(s.Netdevs, func(a, b api.NetdevStatus) int { return strings.Compare(a.Netdev, b.Netdev) })
	var problems []string
	if err := c.watcher.LastError(); err != nil {
		problems = append(problems, err.Error())
	}
	problems = append(problems, c.rec.inForce()...)
	c.mu.Lock()
	s.Collected = c.collected
	c.mu.Unlock()
	s.ConfigError = strings.Join(problems, "; ")
	s.Config = api.ConfigStatus{Hash: c.watcher.Hash(), Loaded: c.watcher.Reloads().LastSuccess}
	for id, err := range c.ledger.Broken() {
		s.StateErrors = append(s.StateErrors, fmt.Sprintf("allocation %s: %v", id, err))
	}
	c.mu.Lock()
	for key, err := range c.retry {
		s.StateErrors = append(s.StateErrors, fmt.Sprintf("%s: %v", key, err))
	}
	c.mu.Unlock()
	sort.Strings(s.StateErrors)
	return s, nil
}

// Allocations lists the allocations of pool ("" for every pool), by id,
// each with who holds it, and their CNI attachments, by container and
// interface. A pool the daemon does not have is an ErrNotFound naming
// those it has.
func (c *core) Allocations(ctx context.Context, pool string) (*api.AllocationList, error) {
	var allocs []ledger.Allocation
	if pool == "" {
		allocs = c.ledger.Allocations()
	} else {
		var err error
		if allocs, err = c.ledger.AllocationsOf(pool); err != nil {
			return nil, err
		}
	}
	l := &api.AllocationList{Allocations: make([]api.Allocation, 0, len(allocs)), Attachments: []api.AttachmentStatus{}}
	for _, a := range allocs {
		al := c.apiAllocation(a)
		al.PodUID = a.Owner.PodUID
		for _, ls := range a.Lease {
			al.Lease = append(al.Lease, ls.Queue)
		}
		if p, ok := c.broker.Holder(a.ID); ok {
			al.Holder = &api.Holder{PID: p.PID, UID: p.UID, PodUID: p.Pod.PodUID}
		}
		for _, att := range a.Attachments {
			l.Attachments = append(l.Attachments, api.AttachmentStatus{Attachment: att.Attachment, State: string(att.State)})
		}
		al.Pod = c.podOf(a)
		l.Allocations = append(l.Allocations, *al)
	}
	sort.Slice(l.Attachments, func(i, j int) bool {
		a, b := l.Attachments[i], l.Attachments[j]
		return a.ContainerID < b.ContainerID || a.ContainerID == b.ContainerID && a.IfName < b.IfName
	})
	return l, nil
}

// podOf is the "namespace/name" of the pod that holds allocation a, as
// its CNI attachment named it or, for a claim's pod or one bound by its
// first connection, as the pods the daemon follows name it; "" when it
// is not known.
func (c *core) podOf(a ledger.Allocation) string {
	for _, att := range a.Attachments {
		if att.PodName != "" {
			return att.PodNamespace + "/" + att.PodName
		}
	}
	if a.Owner.PodUID != "" && c.opts.Pods != nil {
		if p, ok := c.opts.Pods.Cached(a.Owner.PodUID); ok {
			return p.Namespace + "/" + p.Name
		}
	}
	return ""
}

// netdevStatus is every netdev's agent status, a netdev in a pod under
// its node name.
func (c *core) netdevStatus() []agent.Status {
	out := c.agent.Status()
	for _, pn := range c.pods.all() {
		ag := pn.agent
		if ag == nil {
			continue
		}
		for _, s := range ag.Status() {
			s.Netdev = pn.rec.netdev()
			s.Reason = fmt.Sprintf("in pod netns %s as %s. %s", pn.rec.Netns, pn.rec.ifName(), s.Reason)
			out = append(out, s)
		}
	}
	return out
}
