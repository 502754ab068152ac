package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/vishvananda/netns"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/mover"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// A netdev-mode pool hands a whole netdev to one pod, like
// containernetworking's host-device: ADD moves it into the pod's network
// namespace renamed to the CNI interface name, DEL brings it back. While
// it is away an agent of its own manages it from inside that namespace
// (program, steering, XSKMAP: the daemon holds the namespace open, so its
// agent reaches it by a descriptor path that outlives the pod's bind
// mount), and the broker binds the allocation's sockets there. The node
// agent lets it go before the move and takes it back after the return
// (the reconciler leaves out netdevs that have a netdev attachment).

func (m movedRecord) netdev() string { return m.Mover.Name }
func (m movedRecord) ifName() string { return m.Mover.IfName }

func decodeMoved(b []byte) (movedRecord, error) {
	var m movedRecord
	err := json.Unmarshal(b, &m)
	return m, err
}

// podNetdev is a netdev in a pod, managed by its own agent.
type podNetdev struct {
	key   string // its attachment's
	alloc string
	rec   movedRecord
	// policy is its agent's, kept by the reconciler to the pool's.
	policy agent.Policy
	ns     netns.NsHandle // the pod's namespace, held open
	agent  *agent.Agent
	stop   context.CancelFunc
	done   chan struct{}
}

// nsPath is where code in this process reaches the pod's namespace, as
// long as the daemon holds it.
func (p *podNetdev) nsPath() string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(p.ns)) }

// prepareMove reads what the record of a netdev about to move into a
// pod holds.
func (c *core) prepareMove(netdev string, req api.CNIAddRequest, pol agent.Policy) ([]byte, error) {
	dev, ok := c.rec.netdev(netdev)
	if !ok {
		return nil, api.Errorf(api.ErrUnavailable, "netdev %s was not found on the node", netdev)
	}
	rec, err := c.mover.Prepare(netdev, req.IfName, req.MTU)
	if err != nil {
		return nil, err
	}
	return json.Marshal(movedRecord{Mover: rec, Netns: req.Netns, Device: dev, Policy: pol})
}

// moveIn moves a pending netdev attachment's netdev into its pod and
// starts its agent there; on failure the netdev is back on the node.
func (c *core) moveIn(ctx context.Context, att *ledger.Attachment, flows []agent.Flow) error {
	rec, err := decodeMoved(att.Moved)
	if err != nil {
		return err
	}
	podNS, err := mover.HoldNetNS(att.Netns)
	if err != nil {
		return fmt.Errorf("netns %s: %w", att.Netns, err)
	}
	// The node agent lets the netdev go: the ledger has it in a pod now.
	// podNS is a handle on the pod's namespace, kept while the netdev is
	// there: closing it only lets the namespace go with its pod.
	if err := c.syncNetdevs(ctx); err != nil {
		_ = podNS.Close()
		return err
	}
	l, err := c.mover.MoveIn(rec.Mover, podNS)
	if err != nil {
		_ = podNS.Close()
		return err
	}
	att.Mac = l.MAC.String()
	pn := &podNetdev{key: att.Key(), alloc: att.AllocationID, rec: rec, ns: podNS}
	if err := c.pods.start(pn, flows); err != nil {
		e := c.mover.MoveOut(ctx, rec.Mover, podNS)
		_ = podNS.Close()
		return undone(rec.netdev(), err, e)
	}
	c.pods.add(pn)
	if err := c.pinDPDKMap(pn, att.AllocationID); err != nil {
		return undone(rec.netdev(), err, c.moveOut(ctx, *att))
	}
	if err := c.retargetToPod(att.AllocationID, rec.netdev()); err != nil {
		return undone(rec.netdev(), err, c.moveOut(ctx, *att))
	}
	c.log.Info("netdev moved into the pod", "netdev", rec.netdev(), "ifname", rec.ifName(), "netns", att.Netns, "mtu", att.MTU)
	return nil
}

// strandedError is a move into a pod that failed and whose undo failed
// too: the netdev may be in the pod still, and the attachment's record
// (its Moved field) is the only way to find it again.
type strandedError struct{ err, undo error }

func (e *strandedError) Error() string {
	return fmt.Sprintf("%v; and bringing the netdev back failed (kept on record, tried again every collection): %v", e.err, e.undo)
}

func (e *strandedError) Unwrap() []error { return []error{e.err, e.undo} }

// undone is err of a failed move of netdev, whose undo ended in undo: a
// strandedError when that failed too.
func undone(netdev string, err, undo error) error {
	if undo == nil {
		return err
	}
	return &strandedError{err: err, undo: fmt.Errorf("netdev %s: %w", netdev, undo)}
}

// retargetToPod has the broker bind the allocation's sockets on its
// netdev inside the pod.
func (c *core) retargetToPod(alloc, netdev string) error {
	dev, dp, err := c.podTarget(netdev)
	if err != nil {
		return err
	}
	return c.broker.Retarget(alloc, dev, dp)
}

// podTarget is where sockets bind on a netdev in a pod, and the broker's
// datapath there.
func (c *core) podTarget(netdev string) (xsk.Netdev, broker.PodDatapath, error) {
	dev, pn, err := c.pods.target(netdev)
	if err != nil {
		return xsk.Netdev{}, nil, err
	}
	return dev, podDatapath{c, pn}, nil
}

// podDatapath is the broker's datapath of a netdev in its pod: the pod
// agent's XSKMAP, which serves that pod's allocation alone. It is the
// only datapath that can hand out a map (broker.PodDatapath).
type podDatapath struct {
	c  *core
	pn *podNetdev
}

func (p podDatapath) AddSocket(netdev string, q uint32, fd int) error {
	return p.pn.agent.AddSocket(netdev, q, fd)
}

func (p podDatapath) RemoveSocket(netdev string, q uint32, inode uint64) error {
	return p.pn.agent.RemoveSocket(netdev, q, inode)
}

// XSKMapFD hands the netdev's XSKMAP to its pod's DPDK. The sockets DPDK
// inserts are invisible to the agent, and DPDK closes the broker
// connection right after its handshake: so the attachment records first
// that the map is out, and the pod agent keeps xdpq's program attached
// from then on, for as long as the attachment lives (restarts included).
func (p podDatapath) XSKMapFD() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	att, ok := p.c.ledger.Attachment(p.pn.key)
	if !ok || att.State != ledger.Active {
		return -1, fmt.Errorf("netdev %s: its attachment %s is not active", p.pn.rec.netdev(), p.pn.key)
	}
	if !att.MapOut {
		att.MapOut = true
		if err := p.c.ledger.UpdateAttachment(att); err != nil {
			return -1, err
		}
		// The reconciler brings the pod agent to its policy with the
		// program always attached (reconcilePods).
		if err := p.c.syncNetdevs(ctx); err != nil {
			return -1, err
		}
	}
	return p.pn.agent.XSKMapFD(p.pn.rec.ifName())
}

// pinRoot is the node agent's pin directory; the pods' agents and DPDK's
// pins are under it too.
func (c *core) pinRoot() string {
	if c.opts.PinDir == "" {
		return agent.DefaultPinDir
	}
	return c.opts.PinDir
}

// moveOut brings a netdev attachment's netdev back to the node: its agent
// stops, the link returns as it was on the node (wherever a crash left
// it), and the broker binds the allocation's sockets on the node again.
func (c *core) moveOut(ctx context.Context, att ledger.Attachment) error {
	rec, err := decodeMoved(att.Moved)
	if err != nil {
		return fmt.Errorf("the record of netdev %s is unreadable: %w", att.Netdev, err)
	}
	pn := c.pods.take(rec.netdev(), att.Key())
	if pn == nil {
		// Not adopted (a restart): find it where the record says.
		pn = &podNetdev{key: att.Key(), rec: rec, ns: netns.None()}
		if h, err := mover.HoldNetNS(rec.Netns); err == nil {
			pn.ns = h
		}
	}
	var errs []error
	errs = append(errs, c.pods.stop(pn, true))
	err = c.mover.MoveOut(ctx, rec.Mover, pn.ns)
	if errors.Is(err, mover.ErrGone) {
		c.log.Warn("the netdev went with its pod's namespace", "netdev", rec.netdev(), "err", err)
		err = nil
	}
	errs = append(errs, err)
	if pn.ns.IsOpen() {
		_ = pn.ns.Close() // a namespace handle: the netdev is out of it, or its record kept
	}
	if _, ok := c.ledger.Get(att.AllocationID); ok {
		if err := c.broker.Retarget(att.AllocationID, c.nodeNetdev(rec.netdev()), nil); err != nil {
			c.log.Debug("retarget", "allocation", att.AllocationID, "err", err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.log.Info("netdev back on the node", "netdev", rec.netdev())
	return nil
}

// adoptPods takes back, at start, the netdevs a previous daemon moved
// into pods that still run; a netdev whose pod is gone comes back to the
// node and its attachment ends.
func (c *core) adoptPods(ctx context.Context) {
	for _, att := range c.ledger.Attachments() {
		if att.Mode == api.ModeNetdev && att.State == ledger.Active {
			c.adoptOrReturn(ctx, att)
		}
	}
}

// adoptOrReturn adopts a netdev in a pod; one whose pod is gone, or that
// is no longer in the pod, comes back to the node and its attachment
// ends. Any other failure (its agent could not start) leaves it in the
// pod and is tried again at the next collection: a running pod keeps its
// netdev.
func (c *core) adoptOrReturn(ctx context.Context, att ledger.Attachment) {
	err := c.adoptPod(ctx, att)
	var gone *podGoneError
	switch {
	case err == nil:
		c.log.Info("netdev in a pod adopted", "netdev", att.Netdev, "attachment", att.Key())
	case errors.As(err, &gone):
		c.log.Info("the netdev's pod is gone, or the netdev left it; bringing it back", "netdev", att.Netdev, "attachment", att.Key(), "err", err)
		if _, _, err := c.ledger.BeginDetach(att.Key()); err == nil {
			c.finishUndo(ctx, att)
		}
	default:
		c.log.Error("netdev in a pod not adopted; tried again every collection", "netdev", att.Netdev, "attachment", att.Key(), "err", err)
		c.retryLater(att.Key(), fmt.Errorf("netdev %s in a pod not adopted: %w", att.Netdev, err))
	}
}

// podGoneError says a netdev's pod namespace is gone or the netdev is no
// longer in it.
type podGoneError struct{ err error }

func (e *podGoneError) Error() string { return e.err.Error() }
func (e *podGoneError) Unwrap() error { return e.err }

func (c *core) adoptPod(ctx context.Context, att ledger.Attachment) error {
	rec, err := decodeMoved(att.Moved)
	if err != nil {
		return err
	}
	h, err := mover.HoldNetNS(rec.Netns)
	if err != nil {
		return &podGoneError{fmt.Errorf("netns %s: %w", rec.Netns, err)}
	}
	// A map handed out keeps the program attached from the first moment.
	rec.Policy.AttachAlways = rec.Policy.AttachAlways || att.MapOut
	pn := &podNetdev{key: att.Key(), alloc: att.AllocationID, rec: rec, ns: h}
	loc, err := c.mover.Recover(ctx, rec.Mover, h)
	if err == nil && loc.Place != mover.InPod {
		err = &podGoneError{fmt.Errorf("the netdev is not in the pod: %v", loc)}
	}
	if err == nil {
		var flows []agent.Flow
		if flows, err = agentFlows(att.Flows, att.Queues); err == nil {
			err = c.pods.start(pn, flows)
		}
	}
	if err != nil {
		_ = h.Close() // a namespace handle; the record is kept, and adoption tried again
		return err
	}
	c.pods.add(pn)
	if err := c.pinDPDKMap(pn, att.AllocationID); err != nil {
		c.log.Warn("netdev in a pod: its map not pinned for DPDK", "netdev", rec.netdev(), "err", err)
	}
	return nil
}

// reconcilePods brings the agents of the netdevs in pods to their pools'
// settings in force (a reload changed linger, busy polling, attach...).
// Only the reconciler calls it.
func (c *core) reconcilePods() []string {
	var problems []string
	for _, pn := range c.pods.all() {
		att, ok := c.ledger.Attachment(pn.key)
		if !ok || att.State != ledger.Active {
			continue
		}
		a, ok := c.ledger.Get(att.AllocationID)
		if !ok {
			continue
		}
		p, ok := c.ledger.Meta(a.Pool)
		if !ok || p.Resource == "" { // a pool gone before this daemon started: its settings are unknown
			continue
		}
		pol := podPolicy(p.Config, len(att.Flows) > 0, att.MapOut)
		if policyEqual(pol, pn.policy) {
			continue
		}
		if err := pn.agent.Set(pn.rec.ifName(), pol); err != nil {
			problems = append(problems, fmt.Sprintf("netdev %s in its pod: %v", pn.rec.netdev(), err))
		}
		pn.policy = pol // what could be applied is; status says the rest
	}
	return problems
}
