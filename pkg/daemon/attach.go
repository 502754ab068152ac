package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/flow"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// The core's attachments: their kernel work done and undone, their
// detach, the wait for work under way on them, and the checks every face
// makes of them (the node's own addresses, the pod's netns).

// checkNotNode refuses a flow that would take the node's own traffic:
// one whose destination (among claimed, flow.Claimed's) a netdev of the
// node holds (flow.CheckNode). The
// "own" addresses CheckOwn trusts are what the network configuration's
// IPAM says, and static IPAM may name the node's. The node is asked at
// each ADD rather than kept in a cache fed by address notifications:
// ADDs are rare, one address dump is cheap, and the kernel's answer now
// has no window in which an address the node just took is missing (nor a
// goroutine and a resync to keep). It asks the kernel, so it is called
// with no lock held.
func (c *core) checkNotNode(flows []api.CNIFlow, claimed []netip.Addr, shared []netip.Prefix) error {
	if len(claimed) == 0 {
		return nil
	}
	node, err := c.nodeAddrs(claimed)
	if err != nil {
		return api.Errorf(api.ErrUnavailable, "the node's addresses, which a pod's flows may not take: %w", err)
	}
	if err := flow.CheckNode(flows, node, shared); err != nil {
		return api.Errorf(api.ErrInvalid, "%w", err)
	}
	return nil
}

// dropAttach ends a pending attachment whose kernel work was undone or
// never done. A record not rewritten is rolled back again by a restarted
// daemon, which finds nothing left to undo.
func (c *core) dropAttach(att ledger.Attachment) {
	if err := c.ledger.EndAttach(att, false); err != nil {
		c.log.Warn("a failed attachment's record not yet removed", "attachment", att.Key(), "err", err)
	}
}

// attach does a pending attachment's kernel work, all or nothing.
func (c *core) attach(ctx context.Context, att *ledger.Attachment, flows []agent.Flow) error {
	var err error
	if att.Mode == api.ModeNetdev {
		err = c.moveIn(ctx, att, flows)
	} else {
		err = c.agent.Steer(att.Netdev, att.Key(), flows)
	}
	if err != nil {
		return err
	}
	// The ledger records the pod as the owner with the attachment
	// (EndAttach): one write, not two.
	if att.PodUID != "" {
		if err = c.broker.SetOwner(att.AllocationID, brokerOwner(ledger.Owner{PodUID: att.PodUID})); err != nil {
			return undone(att.Netdev, err, c.undoAttachment(ctx, *att))
		}
	}
	return nil
}

// del is CNIDel for the CNI plugin's attachments and the daemon's own.
func (c *core) del(ctx context.Context, ref api.AttachmentRef) error {
	key := ledger.Key(ref.ContainerID, ref.IfName)
	var att ledger.Attachment
	var found bool
	err := c.whenIdle(ctx, func() (err error) {
		att, found, err = c.ledger.BeginDetach(key)
		return err
	})
	if !found || err != nil {
		return err
	}
	if err := c.undoAttachment(ctx, att); err != nil {
		if cerr := c.ledger.CancelDetach(key); cerr != nil {
			// Active in memory for the runtime's retry; a restarted
			// daemon finishes the ending its record says.
			err = errors.Join(err, cerr)
		}
		return fmt.Errorf("detach %s: %w", key, err)
	}
	if err := c.ledger.EndDetach(key); err != nil {
		return err
	}
	if att.Mode == api.ModeNetdev {
		if err := c.syncNetdevs(ctx); err != nil {
			return err
		}
	}
	c.log.Info("detached", "container", ref.ContainerID, "ifname", ref.IfName)
	return nil
}

// undoAttachment undoes an attachment's kernel work: its flows go, a
// netdev-mode pool's netdev comes back to the node.
func (c *core) undoAttachment(ctx context.Context, att ledger.Attachment) error {
	if att.Mode == api.ModeNetdev {
		return c.moveOut(ctx, att)
	}
	return c.agent.Unsteer(att.Netdev, att.Key())
}

// whenIdle calls try until it is not refused for an operation in
// progress (ledger.ErrBusy) on what it asks for, waiting for the ledger's
// next change between calls: a runtime's DEL that meets the daemon's own
// clean-up of the same attachment succeeds once that is done, instead of
// answering "try again" for work under way. It waits at most
// api.RequestTimeout, or until ctx ends; the refusal then stands.
func (c *core) whenIdle(ctx context.Context, try func() error) error {
	ctx, cancel := context.WithTimeout(ctx, api.RequestTimeout)
	defer cancel()
	for {
		changed := c.ledger.Changed()
		err := try()
		if !errors.Is(err, ledger.ErrBusy) {
			return err
		}
		if c.waitingHook != nil {
			c.waitingHook()
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("%w; still so after %v", err, api.RequestTimeout)
		}
	}
}

// netnsGone reports whether the attachment's pod netns is certainly gone:
// its path is gone or names another namespace than at ADD.
func netnsGone(att api.Attachment) bool {
	if att.Netns == "" || att.NetnsInode == 0 {
		return false // cannot tell
	}
	var st unix.Stat_t
	err := unix.Stat(att.Netns, &st)
	return (err == nil && st.Ino != att.NetnsInode) || errors.Is(err, unix.ENOENT)
}

func agentFlows(fs []api.CNIFlow, queues []uint32) ([]agent.Flow, error) {
	var out []agent.Flow
	for _, f := range fs {
		var proto xdp.Protocol
		switch f.Protocol {
		case "udp":
			proto = xdp.UDP
		case "tcp":
			proto = xdp.TCP
		default:
			return nil, api.Errorf(api.ErrInvalid, "flow protocol %q: udp or tcp", f.Protocol)
		}
		out = append(out, agent.Flow{Protocol: proto, Dst: f.Dst, DstPort: f.DstPort, Src: f.Src, SrcPort: f.SrcPort,
			VLAN: f.VLAN, Queues: slices.Clone(queues)})
	}
	return out, nil
}

// attachNew makes attachment att of allocation a of pool: recorded
// pending (after an operation under way on it, if any, is done), checked
// against the other pods' claims on its netdev, its netdev moved into the
// pod (a netdev-mode pool) or its flows steered, then recorded active;
// all or nothing. again says the same attachment was there already: it
// is answered as it is.
func (c *core) attachNew(ctx context.Context, a ledger.Allocation, att ledger.Attachment, flows []agent.Flow, pool ledger.Pool) (got ledger.Attachment, again bool, err error) {
	shared := pool.Config.SharedPrefixes()
	err = c.whenIdle(ctx, func() (err error) {
		got, again, err = c.ledger.BeginAttach(a.ID, att)
		return err
	})
	if err != nil || again {
		return got, again, err
	}
	if got.Mode == api.ModeQueue {
		if err := c.checkClaims(got, shared); err != nil {
			c.dropAttach(got)
			return got, false, err
		}
	}
	if got.Mode == api.ModeNetdev {
		// Recorded before anything moves: a restarted daemon finds the
		// netdev by it.
		// A map pinned for DPDK is out from the start.
		got.MapOut = pinsDPDKMap(pool.Config)
		got.Moved, err = c.prepareMove(a.Netdev, att.CNIAddRequest, podPolicy(pool.Config, len(flows) > 0, got.MapOut))
		if err == nil {
			err = c.ledger.UpdateAttachment(got)
		}
		if err != nil {
			c.dropAttach(got)
			return got, false, err
		}
	}
	if err := c.attach(ctx, &got, flows); err != nil {
		var stranded *strandedError
		if errors.As(err, &stranded) {
			// Its record stays, pending: the collector brings the
			// netdev back and ends it (finishUndo).
			c.retryLater(got.Key(), err)
			return got, false, err
		}
		c.dropAttach(got)
		if got.Mode == api.ModeNetdev {
			// Back on the node: its agent takes it again.
			if serr := c.syncNetdevs(ctx); serr != nil {
				c.log.Warn("netdevs", "err", serr)
			}
		}
		return got, false, flowRefusal(err)
	}
	if err := c.ledger.EndAttach(got, true); err != nil {
		return got, false, err
	}
	c.log.Info("attached", "container", att.ContainerID, "ifname", att.IfName, "allocation", a.ID, "mode", got.Mode, "flows", len(flows))
	return got, false, nil
}

// checkClaims refuses attachment att, recorded pending, whose flows
// claim as the pod's own an address that a live attachment of another
// pod on the same netdev claims: two network configurations whose IPAM
// names the same address (static IPAM names any), the later one taking
// the other pod's traffic on other ports. It runs after BeginAttach
// recorded att, so of two ADDs racing for one address the later one
// recorded sees the other: at most one stands (both may be refused;
// the runtime's retry settles it). An address the pool's
// sharedDestinations grant is no one's own.
func (c *core) checkClaims(att ledger.Attachment, shared []netip.Prefix) error {
	mine := claims(att.Attachment, shared)
	if len(mine) == 0 {
		return nil
	}
	for _, o := range c.ledger.Attachments() {
		if o.Key() == att.Key() || o.Netdev != att.Netdev || o.Mode != api.ModeQueue || samePod(o.Attachment, att.Attachment) {
			continue
		}
		for _, a := range claims(o.Attachment, shared) {
			if !slices.Contains(mine, a) {
				continue
			}
			pod := ""
			if o.PodName != "" {
				pod = fmt.Sprintf(" (pod %s/%s)", o.PodNamespace, o.PodName)
			}
			return api.Errorf(api.ErrConflict, "address %s: attachment %s%s on %s steers it as its pod's own address already: "+
				"two pods may not claim one address (a network configuration's static IPAM names any); "+
				"an operator grants an address several pods serve with the pool's sharedDestinations",
				a, o.Key(), pod, att.Netdev)
		}
	}
	return nil
}

// claims are the addresses an attachment's flows steer as its pod's
// own: its addresses that a flow names as its destination and no shared
// destination grants.
func claims(att api.Attachment, shared []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, a := range flow.Claimed(att.Flows, shared) {
		if slices.Contains(att.Addresses, a) {
			out = append(out, a)
		}
	}
	return out
}

// samePod reports whether two attachments are of one pod: the same pod
// UID, sandbox container or network namespace (a pod's attachments of
// several pools, or of two pools on one netdev, share its address).
func samePod(a, b api.Attachment) bool {
	return a.PodUID != "" && a.PodUID == b.PodUID || a.ContainerID == b.ContainerID ||
		a.NetnsInode != 0 && a.NetnsInode == b.NetnsInode
}

// flowRefusal is err as the API answers it: a flow the netdev's steering
// cannot take is the request's fault (400), one that meets another's or
// finds no room a conflict (409); anything else stands as it is.
func flowRefusal(err error) error {
	switch {
	case errors.Is(err, agent.ErrFlowInvalid):
		return api.Errorf(api.ErrInvalid, "flows: %w", err)
	case errors.Is(err, agent.ErrFlowConflict), errors.Is(err, agent.ErrFlowsFull):
		return api.Errorf(api.ErrConflict, "flows: %w", err)
	}
	return err
}

// verify reports attachment ref as recorded once no operation is under
// way on it, and whether the kernel still has it as recorded: its
// netdev managed and neither missing nor overridden, its flows installed
// (read back from the NIC's rules or the filter's flow map), a netdev-
// mode pool's netdev in its pod. nil when there is no such attachment.
func (c *core) verify(ctx context.Context, ref api.AttachmentRef) (*api.Attachment, error) {
	key := ledger.Key(ref.ContainerID, ref.IfName)
	var att ledger.Attachment
	var ok bool
	err := c.whenIdle(ctx, func() error {
		if att, ok = c.ledger.Attachment(key); ok && att.State != ledger.Active {
			return api.Errorf(api.ErrConflict, "attachment %s: %w (%s)", key, ledger.ErrBusy, att.State)
		}
		return nil
	})
	if !ok {
		return nil, api.Errorf(api.ErrNotFound, "no attachment of container %s interface %s", ref.ContainerID, ref.IfName)
	}
	if err != nil {
		return &att.Attachment, err
	}
	verify, name := c.agent.VerifySteering, att.Netdev
	if att.Mode == api.ModeNetdev {
		pn := c.pods.get(att.Netdev)
		if pn == nil || pn.key != key {
			return &att.Attachment, fmt.Errorf("netdev %s is not in the pod", att.Netdev)
		}
		verify, name = pn.agent.VerifySteering, pn.rec.ifName()
	}
	for _, s := range c.netdevStatus() {
		if s.Netdev != att.Netdev {
			continue
		}
		if s.State == agent.StateMissing || s.State == agent.StateOverridden {
			// The node's state, which may pass (the netdev comes back,
			// the foreign program goes): not the daemon failing.
			return &att.Attachment, api.Errorf(api.ErrUnavailable, "netdev %s is %s: %s", att.Netdev, s.State, s.Reason)
		}
		if len(att.Flows) > 0 {
			if err := verify(name, key); err != nil {
				return &att.Attachment, err
			}
		}
		return &att.Attachment, nil
	}
	return &att.Attachment, api.Errorf(api.ErrUnavailable, "netdev %s is not managed (the daemon's status says why)", att.Netdev)
}
