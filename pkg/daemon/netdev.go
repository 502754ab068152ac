package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/nic"
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

// movedRecord is what the daemon records of a netdev in a pod, in its
// attachment, before it moves it: enough for a restarted daemon to find
// it and bring it back.
type movedRecord struct {
	Netdev string       `json:"netdev"` // its name on the node
	Netns  string       `json:"netns"`
	IfName string       `json:"ifName"`
	MTU    int          `json:"mtu"` // on the node, put back on return
	Device nic.Netdev   `json:"device"`
	Policy agent.Policy `json:"policy"`
}

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
	ns    netns.NsHandle // the pod's namespace, held open
	agent *agent.Agent
	stop  context.CancelFunc
	done  chan struct{}
}

// nsPath is where code in this process reaches the pod's namespace, as
// long as the daemon holds it.
func (p *podNetdev) nsPath() string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(p.ns)) }

func (d *Daemon) pod(netdev string) *podNetdev {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pods[netdev]
}

// holdNetNS opens the network namespace at path through procfs, from a
// thread inside it: a descriptor of the path itself would keep the
// runtime's bind mount busy, and runtimes that unmount without MNT_DETACH
// would fail to remove the pod's netns.
func holdNetNS(path string) (netns.NsHandle, error) {
	h := netns.None()
	err := ns.WithNetNSPath(path, func(ns.NetNS) error {
		var err error
		h, err = netns.GetFromPath("/proc/thread-self/ns/net")
		return err
	})
	return h, err
}

func (d *Daemon) hostNS() (netns.NsHandle, error) {
	path := d.opts.NetNS
	if path == "" {
		path = "/proc/self/ns/net" // the main thread's: the daemon's own
	}
	return netns.GetFromPath(path)
}

// prepareMove reads what the record of a netdev about to move into a pod
// needs.
func (d *Daemon) prepareMove(netdev string, req api.CNIAddRequest, pol agent.Policy) ([]byte, error) {
	d.mu.Lock()
	dev, ok := d.found[netdev]
	d.mu.Unlock()
	if !ok {
		return nil, api.Errorf(api.ErrUnavailable, "netdev %s was not found on the node", netdev)
	}
	host, err := d.hostNS()
	if err != nil {
		return nil, err
	}
	defer host.Close()
	h, err := netlink.NewHandleAt(host)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	l, err := h.LinkByName(netdev)
	if err != nil {
		return nil, fmt.Errorf("netdev %s: %w", netdev, err)
	}
	return json.Marshal(movedRecord{Netdev: netdev, Netns: req.Netns, IfName: req.IfName, MTU: l.Attrs().MTU, Device: dev, Policy: pol})
}

// moveIn moves a pending netdev attachment's netdev into its pod and
// starts its agent there; on failure the netdev is back on the node.
func (d *Daemon) moveIn(ctx context.Context, att *ledger.Attachment, flows []agent.Flow) error {
	rec, err := decodeMoved(att.Moved)
	if err != nil {
		return err
	}
	podNS, err := holdNetNS(att.Netns)
	if err != nil {
		return fmt.Errorf("netns %s: %w", att.Netns, err)
	}
	// The node agent lets the netdev go: the ledger has it in a pod now.
	if err := d.syncNetdevs(ctx); err != nil {
		podNS.Close()
		return err
	}
	host, err := d.hostNS()
	if err != nil {
		podNS.Close()
		return err
	}
	defer host.Close()
	l, err := moveLink(host, podNS, rec.Netdev, rec.IfName, rec.Netdev, att.MTU)
	if err != nil {
		podNS.Close()
		return err
	}
	att.Mac = l.Attrs().HardwareAddr.String()
	pn := &podNetdev{key: att.Key(), alloc: att.AllocationID, rec: rec, ns: podNS}
	if err := d.startPodAgent(pn, flows); err != nil {
		d.returnLink(host, pn)
		podNS.Close()
		return err
	}
	d.mu.Lock()
	d.pods[rec.Netdev] = pn
	d.mu.Unlock()
	if err := d.retargetToPod(att.AllocationID, rec.Netdev); err != nil {
		d.moveOut(ctx, *att)
		return err
	}
	d.log.Info("netdev moved into the pod", "netdev", rec.Netdev, "ifname", rec.IfName, "netns", att.Netns, "mtu", att.MTU)
	return nil
}

// retargetToPod has the broker bind the allocation's sockets on its
// netdev inside the pod.
func (d *Daemon) retargetToPod(alloc, netdev string) error {
	pn := d.pod(netdev)
	if pn == nil {
		return fmt.Errorf("netdev %s is not in a pod", netdev)
	}
	h, err := netlink.NewHandleAt(pn.ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(pn.rec.IfName)
	if err != nil {
		return fmt.Errorf("netdev %s in the pod as %s: %w", netdev, pn.rec.IfName, err)
	}
	return d.broker.Retarget(alloc, xsk.Netdev{Name: pn.rec.IfName, Ifindex: l.Attrs().Index, NetNS: pn.nsPath()}, pn.agent)
}

func (d *Daemon) podPinDir(netdev string) string {
	pins := d.opts.PinDir
	if pins == "" {
		pins = agent.DefaultPinDir
	}
	return filepath.Join(pins, "pods", netdev)
}

func (d *Daemon) podStateDir(netdev string) string {
	return filepath.Join(d.opts.StateDir, "pods", netdev)
}

func (d *Daemon) startPodAgent(pn *podNetdev, flows []agent.Flow) error {
	ag, err := agent.New(agent.Config{NetNS: pn.nsPath(), PinDir: d.podPinDir(pn.rec.Netdev), StateDir: d.podStateDir(pn.rec.Netdev),
		Logger: d.log.With("pod_netdev", pn.rec.Netdev), OnChange: d.devicesChanged})
	if err != nil {
		return err
	}
	if err := ag.Manage(pn.rec.IfName, pn.rec.Policy); err != nil {
		ag.Close()
		return err
	}
	if len(flows) > 0 {
		if err := ag.Steer(pn.rec.IfName, pn.key, flows); err != nil {
			ag.Unmanage(pn.rec.IfName)
			ag.Close()
			return err
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	pn.agent, pn.stop, pn.done = ag, stop, make(chan struct{})
	go func() {
		defer close(pn.done)
		if err := ag.Run(ctx); err != nil {
			d.log.Error("pod netdev agent", "netdev", pn.rec.Netdev, "err", err)
		}
	}()
	return nil
}

// stopPodAgent stops the pod's agent; with unmanage it takes xdpq's
// program and pins off the netdev, else they stay (the daemon stops).
func (d *Daemon) stopPodAgent(pn *podNetdev, unmanage bool) error {
	if pn.agent == nil {
		return nil
	}
	pn.stop()
	<-pn.done
	var err error
	if unmanage {
		err = pn.agent.Unmanage(pn.rec.IfName)
	}
	pn.agent.Close()
	if unmanage {
		os.RemoveAll(d.podPinDir(pn.rec.Netdev))
		os.RemoveAll(d.podStateDir(pn.rec.Netdev))
	}
	return err
}

// moveOut brings a netdev attachment's netdev back to the node: its agent
// stops, the link returns under its node name and MTU, and the broker
// binds the allocation's sockets on the node again. A netdev no longer in
// the pod (returned by the kernel when the namespace went) is looked for
// on the node by its alias.
func (d *Daemon) moveOut(ctx context.Context, att ledger.Attachment) error {
	rec, err := decodeMoved(att.Moved)
	if err != nil {
		return fmt.Errorf("the record of netdev %s is unreadable: %w", att.Netdev, err)
	}
	d.mu.Lock()
	pn := d.pods[rec.Netdev]
	if pn != nil && pn.key == att.Key() {
		delete(d.pods, rec.Netdev)
	} else {
		pn = nil
	}
	d.mu.Unlock()
	host, err := d.hostNS()
	if err != nil {
		return err
	}
	defer host.Close()
	var errs []error
	if pn == nil {
		// Not adopted (a restart): find it where the record says.
		pn = &podNetdev{key: att.Key(), rec: rec, ns: netns.None()}
		if h, err := holdNetNS(rec.Netns); err == nil {
			pn.ns = h
		}
	}
	errs = append(errs, d.stopPodAgent(pn, true))
	errs = append(errs, d.returnLink(host, pn))
	if pn.ns.IsOpen() {
		pn.ns.Close()
	}
	if _, ok := d.ledger.Get(att.AllocationID); ok {
		if err := d.broker.Retarget(att.AllocationID, d.nodeNetdev(rec.Netdev), nil); err != nil {
			d.log.Debug("retarget", "allocation", att.AllocationID, "err", err)
		}
	}
	d.log.Info("netdev back on the node", "netdev", rec.Netdev)
	return errors.Join(errs...)
}

// returnLink moves the netdev back from the pod, or finds it on the node.
func (d *Daemon) returnLink(host netns.NsHandle, pn *podNetdev) error {
	var err error
	if pn.ns.IsOpen() {
		if _, err = moveLink(pn.ns, host, pn.rec.IfName, pn.rec.Netdev, "", pn.rec.MTU); err == nil {
			return clearAlias(host, pn.rec.Netdev)
		}
	}
	if e := renameReturned(host, pn.rec.Netdev, pn.rec.MTU); e != nil {
		return fmt.Errorf("netdev %s: not in the pod (%v) nor on the node: %w", pn.rec.Netdev, err, e)
	}
	return clearAlias(host, pn.rec.Netdev)
}

// adoptPods takes back, at start, the netdevs a previous daemon moved
// into pods that still run; a netdev whose pod is gone comes back to the
// node and its attachment ends.
func (d *Daemon) adoptPods(ctx context.Context) {
	for _, att := range d.ledger.Attachments() {
		if att.Mode != api.ModeNetdev || att.State != ledger.Active {
			continue
		}
		err := d.adoptPod(att)
		if err == nil {
			d.log.Info("netdev in a pod adopted", "netdev", att.Netdev, "attachment", att.Key())
			continue
		}
		d.log.Info("the pod of a netdev is gone; bringing it back", "netdev", att.Netdev, "attachment", att.Key(), "err", err)
		if _, _, err := d.ledger.BeginDetach(att.Key()); err == nil {
			if err := d.moveOut(ctx, att); err != nil {
				d.log.Warn("netdev not brought back", "netdev", att.Netdev, "err", err)
			}
			d.ledger.EndDetach(att.Key())
		}
	}
}

func (d *Daemon) adoptPod(att ledger.Attachment) error {
	rec, err := decodeMoved(att.Moved)
	if err != nil {
		return err
	}
	h, err := holdNetNS(rec.Netns)
	if err != nil {
		return err
	}
	pn := &podNetdev{key: att.Key(), alloc: att.AllocationID, rec: rec, ns: h}
	nh, err := netlink.NewHandleAt(h)
	if err == nil {
		_, err = nh.LinkByName(rec.IfName)
		nh.Close()
	}
	if err == nil {
		var flows []agent.Flow
		if flows, err = agentFlows(att.Flows, att.Queues); err == nil {
			err = d.startPodAgent(pn, flows)
		}
	}
	if err != nil {
		h.Close()
		return err
	}
	d.mu.Lock()
	d.pods[rec.Netdev] = pn
	d.mu.Unlock()
	return nil
}

// releasePods lets go of the pods' netdevs when the daemon stops: their
// agents' handles close; what they attached stays (a restarted daemon
// adopts it), and so do the netdevs.
func (d *Daemon) releasePods() {
	d.mu.Lock()
	pods := d.pods
	d.pods = map[string]*podNetdev{}
	d.mu.Unlock()
	for _, pn := range pods {
		d.stopPodAgent(pn, false)
		pn.ns.Close()
	}
}
