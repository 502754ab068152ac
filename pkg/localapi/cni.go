package localapi

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/flow"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/nri"
	"github.com/xdpq/xdpq/pkg/podflows"
)

// The CNI verbs: ADD, DEL, CHECK and GC of attachments.

// CNIAdd steers the attachment's flows to its allocation's queues (or, in
// a netdev pool, moves the allocation's netdev into the pod) and, given
// the pod UID, binds the allocation's socket to that pod.
func (b *Backend) CNIAdd(ctx context.Context, req api.CNIAddRequest) (*api.Attachment, error) {
	if err := checkCNIContainer(req.ContainerID); err != nil {
		return nil, err
	}
	return b.AddOwn(ctx, req)
}

// AddOwn is CNIAdd for the CNI plugin's attachments and the daemon's
// own (a pod's annotated flows, a claim's netdev in its sandbox), whose
// container ids CNIAdd refuses.
func (b *Backend) AddOwn(ctx context.Context, req api.CNIAddRequest) (*api.Attachment, error) {
	if req.ContainerID == "" || req.IfName == "" {
		return nil, api.Errorf(api.ErrInvalid, "container id and interface name are required")
	}
	req = unmapped(req)
	a, err := b.findAllocation(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := b.core.Closed(); err != nil { // after the lookup: a pod without devices passes through a chain as always
		return nil, err
	}
	pool, _ := b.core.Meta(a.Pool)
	att := ledger.Attachment{Attachment: api.Attachment{CNIAddRequest: req, Mode: pool.Mode()}}
	if req.Netns != "" {
		var err error
		if att.NetnsInode, err = netnsInode(req.Netns); err != nil {
			return nil, api.Errorf(api.ErrInvalid, "netns: %w", err)
		}
	}
	if att.Mode == api.ModeQueue && req.MTU != 0 {
		return nil, fmt.Errorf("mtu %d: pool %s shares queues of %s and gives the pod no interface; mtu applies to netdev-mode pools: %w",
			req.MTU, a.Pool, a.Netdev, api.ErrInvalid)
	}
	shared := pool.Config.SharedPrefixes()
	if att.Mode == api.ModeQueue {
		// The netdev stays the node's: a flow may take only the pod's
		// own traffic off it (a netdev-mode pool's netdev is the pod's
		// whole), and the node's own is never the pod's.
		if err := flow.CheckOwn(req.Flows, req.Addresses, shared); err != nil {
			return nil, api.Errorf(api.ErrInvalid, "pool %s: %w", a.Pool, err)
		}
		claimed := flow.Claimed(req.Flows, shared)
		if err := b.core.CheckNotNode(req.Flows, claimed, shared); err != nil {
			return nil, fmt.Errorf("pool %s: %w", a.Pool, err)
		}
		if err := b.checkNotOtherPod(req, claimed); err != nil {
			return nil, fmt.Errorf("pool %s: %w", a.Pool, err)
		}
		if err := b.checkNotGrantedElsewhere(a.Pool, claimed); err != nil {
			return nil, fmt.Errorf("pool %s: %w", a.Pool, err)
		}
	}
	if att.Mode == api.ModeNetdev && req.Chained {
		return nil, api.Errorf(api.ErrInvalid, "pool %s hands out whole netdevs, moved into the pod under the CNI interface name: "+
			"it needs an attachment of its own (a NetworkAttachmentDefinition), not a place in a chain after the plugin that made %s", a.Pool, req.IfName)
	}
	if att.Mode == api.ModeNetdev && req.Netns == "" {
		return nil, api.Errorf(api.ErrInvalid, "pool %s hands out whole netdevs: the request needs the pod's netns", a.Pool)
	}
	got, again, err := b.core.Attach(ctx, a, att, pool)
	if err != nil {
		return nil, err
	}
	if again {
		return &got.Attachment, nil
	}
	if req.PodUID != "" && b.core.Pods() != nil && !podflows.IsPodFlows(req.ContainerID) {
		b.core.Pods().Touch(req.PodUID) // bound to its pod: its flows annotation applies now
	}
	return &got.Attachment, nil
}

// unmapped is req with its v4-mapped IPv6 addresses written as the v4
// addresses they are: the XDP filter matches a v4-mapped destination as
// the v4 one, so every check (the node's addresses, another pod's) and
// the ledger must see it so. The CNI plugin and the annotation's parser
// send them so already; a client of the API may not.
func unmapped(req api.CNIAddRequest) api.CNIAddRequest {
	if slices.ContainsFunc(req.Addresses, netip.Addr.Is4In6) || slices.ContainsFunc(req.Flows, func(f api.CNIFlow) bool { return f.Dst.Addr().Is4In6() }) {
		req.Addresses = slices.Clone(req.Addresses)
		for i, a := range req.Addresses {
			req.Addresses[i] = a.Unmap()
		}
		req.Flows = slices.Clone(req.Flows)
		for i, f := range req.Flows {
			if f.Dst.Addr().Is4In6() && f.Dst.Bits() >= 96 {
				req.Flows[i].Dst = netip.PrefixFrom(f.Dst.Addr().Unmap(), f.Dst.Bits()-96)
			}
		}
	}
	return req
}

// checkNotOtherPod refuses a flow whose destination (among claimed) is the address of
// another pod of this node (its status.podIPs, as the pod directory last
// saw them): a network configuration's IPAM naming a neighbour's primary
// address as the pod's would take that pod's traffic arriving on the
// pool's netdev. Pods of other nodes are not this node's traffic; a
// hostNetwork pod's addresses are the node's (checkNotNode). Without a
// pod directory (standalone) there is nothing to ask.
func (b *Backend) checkNotOtherPod(req api.CNIAddRequest, claimed []netip.Addr) error {
	if b.core.Pods() == nil {
		return nil
	}
	for _, a := range claimed {
		for _, p := range b.core.Pods().ByIP(a) {
			if p.UID == req.PodUID || req.PodUID == "" && p.Namespace == req.PodNamespace && p.Name == req.PodName {
				continue // the pod's own
			}
			return api.Errorf(api.ErrConflict, "address %s is pod %s/%s's (its podIPs): a pod's flows may not take another pod's traffic; "+
				"an operator grants an address several pods serve with the pool's sharedDestinations", a, p.Namespace, p.Name)
		}
	}
	return nil
}

// checkNotGrantedElsewhere refuses a flow that claims as the pod's own
// (among claimed) an address another pool's sharedDestinations grant: a
// grant is its pool's, the operator's choice for that pool's pods (a VIP
// they serve), and a pod of another pool whose IPAM names the address
// would take their traffic.
func (b *Backend) checkNotGrantedElsewhere(pool string, claimed []netip.Addr) error {
	if len(claimed) == 0 {
		return nil
	}
	for _, m := range b.core.Metas() {
		if m.Name == pool {
			continue
		}
		shared := m.Config.SharedPrefixes()
		for _, a := range claimed {
			if flow.Granted(netip.PrefixFrom(a, a.BitLen()), shared) {
				return api.Errorf(api.ErrConflict, "address %s is granted to pool %s (its sharedDestinations): a grant is its pool's, "+
					"and a pod of another pool may not claim the address as its own; an operator grants it to this pool too", a, m.Name)
			}
		}
	}
	return nil
}

// findAllocation finds the allocation an ADD is for: by its id
// (standalone), by a device it holds (Multus's deviceID), or by the
// devices kubelet says the pod holds.
func (b *Backend) findAllocation(ctx context.Context, req api.CNIAddRequest) (ledger.Allocation, error) {
	get := func(id string) (ledger.Allocation, error) {
		a, ok := b.core.Allocation(id)
		if !ok {
			return a, api.Errorf(api.ErrNotFound, "no allocation %q", id)
		}
		return a, nil
	}
	pools := b.core.Metas()
	switch {
	case req.Allocation != "":
		return get(req.Allocation)
	case req.DeviceID != "":
		for _, p := range pools {
			if req.Resource != "" && p.Resource != req.Resource {
				continue
			}
			if id := b.core.Holder(p.Name, req.DeviceID); id != "" {
				return get(id)
			}
		}
		return ledger.Allocation{}, fmt.Errorf("no allocation holds device %q of %s; the pod must request the pool's resource: %w",
			req.DeviceID, req.Resource, api.ErrNotFound)
	case req.PodName == "" || b.core.Standalone():
		return ledger.Allocation{}, fmt.Errorf("no allocation id (CNI_ARGS XDPQ_ALLOCATION), device id or pod name to find the pod's queues by: %w", api.ErrNoDevices)
	}
	podDevs, err := b.core.PodDevices(ctx, req.PodNamespace, req.PodName)
	if err != nil {
		return ledger.Allocation{}, api.Errorf(api.ErrUnavailable, "%w", err)
	}
	var found []string
	for _, p := range pools {
		if req.Resource != "" && p.Resource != req.Resource {
			continue
		}
		for _, dev := range podDevs[p.Resource] {
			if id := b.core.Holder(p.Name, dev); id != "" && !slices.Contains(found, id) {
				found = append(found, id)
			}
		}
	}
	switch {
	case len(found) == 0:
		what := ""
		if req.Resource != "" {
			what = " of " + req.Resource
		}
		return ledger.Allocation{}, fmt.Errorf("kubelet assigns pod %s/%s no xdpq device%s; the pod must request the pool's resource: %w",
			req.PodNamespace, req.PodName, what, api.ErrNoDevices)
	case len(found) > 1:
		return ledger.Allocation{}, fmt.Errorf("pod %s/%s holds allocations %v; set resourceName (or deviceID) to choose one: %w",
			req.PodNamespace, req.PodName, found, api.ErrConflict)
	}
	return get(found[0])
}

// CNIDel removes an attachment's flows, or brings its netdev back. An
// attachment the daemon does not know is no error: DEL is idempotent.
// One that the daemon is already ending (its collector, a free of its
// allocation) or still making is waited for: DEL then answers as the
// attachment is after it.
func (b *Backend) CNIDel(ctx context.Context, ref api.AttachmentRef) error {
	if err := checkCNIContainer(ref.ContainerID); err != nil {
		return err
	}
	return b.core.Detach(ctx, ref)
}

// CNICheck reports whether the attachment is there, its flows installed
// (read back from the NIC's rules or the filter's flow map), its
// netdev's program state sound, and its flows still allowed by its pool.
func (b *Backend) CNICheck(ctx context.Context, ref api.AttachmentRef) (*api.Attachment, error) {
	att, err := b.core.Verify(ctx, ref)
	if err != nil || att == nil {
		return att, err
	}
	if att.Mode == api.ModeQueue {
		if err := b.stillAllowed(*att); err != nil {
			return att, err
		}
	}
	return att, nil
}

// stillAllowed refuses an attachment of a queue pool whose flows its
// pool no longer allows: a destination its sharedDestinations granted at
// ADD and no longer do (an operator revoked the grant). The flows stay
// steered until the pod's DEL (taking them from a running pod is not the
// daemon's call), and CHECK says so.
func (b *Backend) stillAllowed(att api.Attachment) error {
	a, ok := b.core.Allocation(att.AllocationID)
	if !ok {
		return nil // freed meanwhile: its attachments go with it
	}
	pool, ok := b.core.Meta(a.Pool)
	if !ok {
		return nil
	}
	if err := flow.CheckOwn(att.Flows, att.Addresses, pool.Config.SharedPrefixes()); err != nil {
		return api.Errorf(api.ErrConflict, "pool %s no longer allows the attachment's flows (its sharedDestinations changed since ADD; "+
			"they stay until the pod's DEL): %w", a.Pool, err)
	}
	return nil
}

// CNIGC removes every CNI attachment not in valid ("containerID/ifName");
// a pod's annotated flows are not the runtime's, and go with their
// allocation.
func (b *Backend) CNIGC(ctx context.Context, req api.GCRequest) ([]string, error) {
	var removed []string
	var errs []error
	for _, att := range b.core.Attachments() {
		if slices.Contains(req.Valid, att.Key()) || podflows.IsPodFlows(att.ContainerID) {
			continue
		}
		if err := b.core.Detach(ctx, api.AttachmentRef{ContainerID: att.ContainerID, IfName: att.IfName}); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, att.Key())
	}
	return removed, errors.Join(errs...)
}

// checkCNIContainer refuses a CNI verb on a container id that names the
// daemon's own attachments: a runtime (or anyone with the API socket)
// must not add or remove a pod's annotated flows.
func checkCNIContainer(id string) error {
	if podflows.IsPodFlows(id) {
		return api.Errorf(api.ErrInvalid, "container id %q: ids that begin with %q name the attachments of pods' annotated flows (%s), not a runtime's",
			id, podflows.Prefix, podflows.Annotation)
	}
	if nri.IsSandbox(id) {
		return api.Errorf(api.ErrInvalid, "container id %q: ids that begin with %q name the netdevs of DRA claims moved into pods' sandboxes, not a runtime's CNI attachments",
			id, nri.SandboxPrefix)
	}
	return nil
}

// netnsInode is the inode of the network namespace at path, 0 when the
// path cannot be read (the daemon may not see it; then it cannot judge).
// A path the daemon reads that is not a network namespace (CNI_NETNS
// naming a file, another kind of namespace) is refused.
func netnsInode(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil
	}
	defer func() { _ = f.Close() }() // read-only
	var st unix.Stat_t
	var fs unix.Statfs_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, nil
	}
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil || fs.Type != unix.NSFS_MAGIC {
		return 0, fmt.Errorf("%s is not a namespace", path)
	}
	if t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWNET {
		return 0, fmt.Errorf("%s is a namespace, but not a network namespace", path)
	}
	return st.Ino, nil
}
