package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/deviceplugin"
	"github.com/xdpq/xdpq/pkg/nic"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// A netdev-mode pool hands a whole netdev to one pod, like containernetworking's
// host-device: ADD moves it into the pod's network namespace, renamed to the
// CNI interface name (its node name kept as its alias), with the MTU asked
// for; DEL brings it back. While it is away, an agent of its own manages it
// from inside that namespace (program, steering, XSKMAP: the daemon holds the
// namespace open, so its agent reaches it by a descriptor path that outlives
// the pod's bind mount), and the broker binds the allocation's sockets there.
// The node agent stops managing it on the way out and takes it back on return.

// moved is a netdev-mode pool's netdev inside a pod.
type moved struct {
	movedRecord
	ns    netns.NsHandle // the pod's namespace, held open
	agent *agent.Agent   // manages the netdev inside it
	stop  context.CancelFunc
	done  chan struct{}
}

// movedRecord is what a restarted daemon needs to find a moved netdev.
type movedRecord struct {
	Key    string       `json:"key"` // the attachment's
	Netns  string       `json:"netns"`
	IfName string       `json:"ifName"`
	MTU    int          `json:"mtu"` // the node MTU, put back on return
	Device nic.Netdev   `json:"device"`
	Policy agent.Policy `json:"policy"`
}

// nsPath is where code in this process reaches the pod's namespace, as long
// as the daemon holds it: the pod's own path may go before DEL comes.
func (m *moved) nsPath() string { return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(m.ns)) }

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

// closeMoved lets go of the pods' netdevs when the daemon stops: their
// agents' handles close, what they attached stays (a restarted daemon
// adopts it), and so do the netdevs.
func (d *Daemon) closeMoved() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, m := range d.moved {
		if m.agent != nil {
			m.stop()
			<-m.done
			m.agent.Close()
		}
		m.ns.Close()
		delete(d.moved, name)
	}
}

func (d *Daemon) hostNS() (netns.NsHandle, error) {
	path := d.opts.NetNS
	if path == "" {
		path = "/proc/self/ns/net" // the main thread's: the daemon's own
	}
	return netns.GetFromPath(path)
}

func (d *Daemon) podPinDir(m *moved) string {
	pins := d.opts.PinDir
	if pins == "" {
		pins = agent.DefaultPinDir
	}
	return filepath.Join(pins, "pods", m.Device.Name)
}

func (d *Daemon) podStateDir(m *moved) string {
	dir := d.opts.StateDir
	if dir == "" {
		dir = agent.DefaultStateDir
	}
	return filepath.Join(dir, "pods", m.Device.Name)
}

// moveLink moves the link named from in src into dst, renamed to and with
// the alias and MTU (if not zero) given, and sets it up there. It goes
// through a temporary name so that a namesake in dst cannot stop it.
func moveLink(src, dst netns.NsHandle, from, to, alias string, mtu int) (netlink.Link, error) {
	hs, err := netlink.NewHandleAt(src)
	if err != nil {
		return nil, err
	}
	defer hs.Close()
	hd, err := netlink.NewHandleAt(dst)
	if err != nil {
		return nil, err
	}
	defer hd.Close()
	l, err := hs.LinkByName(from)
	if err != nil {
		return nil, fmt.Errorf("netdev %s: %w", from, err)
	}
	tmp := fmt.Sprintf("xdpq%d", l.Attrs().Index)
	if err := hs.LinkSetDown(l); err != nil {
		return nil, fmt.Errorf("set %s down: %w", from, err)
	}
	if err := hs.LinkSetName(l, tmp); err != nil {
		return nil, fmt.Errorf("rename %s: %w", from, err)
	}
	if err := hs.LinkSetNsFd(l, int(dst)); err != nil {
		hs.LinkSetName(l, from)
		return nil, fmt.Errorf("move %s: %w", from, err)
	}
	back := func(err error) (netlink.Link, error) {
		if l, e := hd.LinkByName(tmp); e == nil {
			hd.LinkSetNsFd(l, int(src))
			if l, e := hs.LinkByName(tmp); e == nil {
				hs.LinkSetName(l, from)
			}
		}
		return nil, err
	}
	if l, err = hd.LinkByName(tmp); err != nil {
		return back(fmt.Errorf("find %s after the move: %w", from, err))
	}
	if err := hd.LinkSetName(l, to); err != nil {
		return back(fmt.Errorf("rename %s to %s: %w", from, to, err))
	}
	if err := hd.LinkSetAlias(l, alias); err != nil {
		return back(fmt.Errorf("alias of %s: %w", to, err))
	}
	if mtu != 0 && mtu != l.Attrs().MTU {
		if err := hd.LinkSetMTU(l, mtu); err != nil {
			return back(fmt.Errorf("mtu %d on %s: %w", mtu, to, err))
		}
	}
	if err := hd.LinkSetUp(l); err != nil {
		return back(fmt.Errorf("set %s up: %w", to, err))
	}
	return hd.LinkByName(to)
}

// moveIn moves the allocation's netdev into the pod and starts its agent
// there; on failure the netdev is back under the node agent.
func (d *Daemon) moveInLocked(att *Attachment, a *Allocation, p *pool, flows []agent.Flow) error {
	if att.Netns == "" {
		return fmt.Errorf("pool %s hands out whole netdevs: the request needs the pod's netns", p.cfg.Name)
	}
	if m := d.moved[a.Netdev]; m != nil {
		return fmt.Errorf("netdev %s is in use by attachment %s", a.Netdev, m.Key)
	}
	dev, ok := d.discovered[a.Netdev]
	if !ok {
		return fmt.Errorf("netdev %s was not found on the node", a.Netdev)
	}
	podNS, err := holdNetNS(att.Netns)
	if err != nil {
		return fmt.Errorf("netns %s: %w", att.Netns, err)
	}
	host, err := d.hostNS()
	if err != nil {
		podNS.Close()
		return err
	}
	defer host.Close()
	pol := netdevPolicy(p, len(flows) > 0)
	m := &moved{movedRecord: movedRecord{Key: key(*att), Netns: att.Netns, IfName: att.IfName, Device: dev, Policy: pol}, ns: podNS}
	hl, err := netlink.NewHandleAt(host)
	if err == nil {
		var l netlink.Link
		if l, err = hl.LinkByName(a.Netdev); err == nil {
			m.MTU = l.Attrs().MTU
		}
		hl.Close()
	}
	if err != nil {
		podNS.Close()
		return fmt.Errorf("netdev %s: %w", a.Netdev, err)
	}
	if err := d.agent.Unmanage(a.Netdev); err != nil {
		d.log.Warn("unmanage before the move", "netdev", a.Netdev, "err", err)
	}
	d.managed[a.Netdev] = false
	fail := func(err error) error {
		if l, e := moveLink(podNS, host, att.IfName, a.Netdev, "", m.MTU); e != nil && l == nil {
			d.log.Warn("netdev not brought back", "netdev", a.Netdev, "err", e)
		}
		podNS.Close()
		d.manageBackLocked(a.Netdev, p)
		return err
	}
	l, err := moveLink(host, podNS, a.Netdev, att.IfName, a.Netdev, att.MTU)
	if err != nil {
		podNS.Close()
		d.manageBackLocked(a.Netdev, p)
		return err
	}
	att.Mac = l.Attrs().HardwareAddr.String()
	if err := d.startPodAgent(m, flows); err != nil {
		return fail(err)
	}
	if err := d.retargetMovedLocked(m, a.ID); err != nil {
		d.stopPodAgent(m)
		return fail(err)
	}
	d.moved[a.Netdev] = m
	d.saveMovedLocked()
	d.log.Info("netdev moved into the pod", "netdev", a.Netdev, "ifname", att.IfName, "netns", att.Netns, "mtu", att.MTU)
	return nil
}

// netdevPolicy is how a pod's netdev is managed: the pool's policy, and with
// no flows the direct program (every packet of a queue with a socket goes
// to it: the netdev is the pod's).
func netdevPolicy(p *pool, flows bool) agent.Policy {
	pol := agent.Policy{Steering: agent.Steering(p.cfg.Steering), AttachAlways: p.cfg.Attach == "always", Exclusive: p.cfg.Exclusive}
	if !flows {
		pol.Steering = agent.SteerHardware
	}
	return pol
}

func (d *Daemon) startPodAgent(m *moved, flows []agent.Flow) error {
	ag, err := agent.New(agent.Config{NetNS: m.nsPath(), PinDir: d.podPinDir(m), StateDir: d.podStateDir(m),
		Logger: d.log.With("pod_netdev", m.Device.Name), OnChange: d.devicesChanged})
	if err != nil {
		return err
	}
	if err := ag.Manage(m.IfName, m.Policy); err != nil {
		ag.Close()
		return err
	}
	if len(flows) > 0 {
		if err := ag.Steer(m.IfName, m.Key, flows); err != nil {
			ag.Unmanage(m.IfName)
			ag.Close()
			return err
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	m.agent, m.stop, m.done = ag, stop, make(chan struct{})
	go func() {
		defer close(m.done)
		if err := ag.Run(ctx); err != nil {
			d.log.Error("pod netdev agent", "netdev", m.Device.Name, "err", err)
		}
	}()
	return nil
}

// stopPodAgent stops the pod's agent and takes xdpq's program and pins off
// the netdev.
func (d *Daemon) stopPodAgent(m *moved) error {
	m.stop()
	<-m.done
	err := m.agent.Unmanage(m.IfName)
	m.agent.Close()
	os.RemoveAll(d.podPinDir(m))
	os.RemoveAll(d.podStateDir(m))
	return err
}

// manageBackLocked has the node agent manage a netdev again.
func (d *Daemon) manageBackLocked(name string, p *pool) {
	pol := agent.Policy{Steering: agent.Steering(p.cfg.Steering), AttachAlways: p.cfg.Attach == "always", Exclusive: p.cfg.Exclusive}
	if err := d.agent.Manage(name, pol); err != nil {
		d.log.Error("netdev back on the node but not managed", "netdev", name, "err", err)
		return
	}
	d.managed[name] = true
}

// moveOutLocked brings a pod's netdev back to the node: its agent stops,
// the broker's sockets bind on the node again, and the node agent manages
// it. A netdev no longer in the pod (deleted with it, or returned by the
// kernel when the namespace went) is looked for on the node by its alias.
func (d *Daemon) moveOutLocked(name string) error {
	m := d.moved[name]
	if m == nil {
		return nil
	}
	var errs []error
	if m.agent != nil {
		errs = append(errs, d.stopPodAgent(m))
	}
	host, err := d.hostNS()
	if err != nil {
		return err
	}
	defer host.Close()
	if _, err := moveLink(m.ns, host, m.IfName, name, "", m.MTU); err != nil {
		if e := d.renameReturned(host, name, m.MTU); e != nil {
			errs = append(errs, fmt.Errorf("netdev %s: not in the pod (%v) nor on the node: %w", name, err, e))
		}
	}
	if err := d.clearAlias(host, name); err != nil {
		errs = append(errs, err)
	}
	m.ns.Close()
	delete(d.moved, name)
	d.saveMovedLocked()
	for _, p := range d.pools {
		if slices.ContainsFunc(p.devices, func(dv deviceplugin.Device) bool { return dv.Netdev == name }) {
			d.manageBackLocked(name, p)
			break
		}
	}
	for _, a := range d.allocs {
		if a.Netdev == name {
			errs = append(errs, d.broker.Retarget(a.ID, d.netdev(name), nil))
		}
	}
	d.log.Info("netdev back on the node", "netdev", name)
	return errors.Join(errs...)
}

// renameReturned finds a netdev the kernel gave back to the node (its
// alias is its node name) and renames it.
func (d *Daemon) renameReturned(host netns.NsHandle, name string, mtu int) error {
	h, err := netlink.NewHandleAt(host)
	if err != nil {
		return err
	}
	defer h.Close()
	if _, err := h.LinkByName(name); err == nil {
		return nil
	}
	links, err := h.LinkList()
	if err != nil {
		return err
	}
	for _, l := range links {
		if l.Attrs().Alias != name {
			continue
		}
		h.LinkSetDown(l)
		if err := h.LinkSetName(l, name); err != nil {
			return err
		}
		if mtu != 0 {
			h.LinkSetMTU(l, mtu)
		}
		return h.LinkSetUp(l)
	}
	return fmt.Errorf("no netdev %s (or aliased %s) on the node", name, name)
}

func (d *Daemon) clearAlias(host netns.NsHandle, name string) error {
	h, err := netlink.NewHandleAt(host)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return nil // gone: nothing to clear
	}
	if l.Attrs().Alias != "" {
		return h.LinkSetAlias(l, "")
	}
	return nil
}

func (d *Daemon) movedPath() string {
	dir := d.opts.StateDir
	if dir == "" {
		dir = agent.DefaultStateDir
	}
	return filepath.Join(dir, "moved-netdevs.json")
}

func (d *Daemon) saveMovedLocked() {
	recs := map[string]movedRecord{}
	for name, m := range d.moved {
		recs[name] = m.movedRecord
	}
	b, _ := json.Marshal(recs)
	os.MkdirAll(filepath.Dir(d.movedPath()), 0o700)
	if err := os.WriteFile(d.movedPath(), b, 0o600); err != nil {
		d.log.Error("save moved netdevs", "err", err)
	}
}

// loadMoved runs before the first config: a netdev a previous daemon moved
// into a pod that still runs stays there (apply counts it as found, and
// adoptMovedLocked starts its agent); one whose pod namespace is gone is
// brought back to the node under its own name.
func (d *Daemon) loadMoved() {
	b, err := os.ReadFile(d.movedPath())
	if err != nil {
		return
	}
	var recs map[string]movedRecord
	if err := json.Unmarshal(b, &recs); err != nil {
		d.log.Warn("moved netdevs not restored", "err", err)
		return
	}
	host, err := d.hostNS()
	if err != nil {
		return
	}
	defer host.Close()
	for name, r := range recs {
		m := &moved{movedRecord: r}
		m.ns, err = holdNetNS(r.Netns)
		if err == nil {
			var h *netlink.Handle
			if h, err = netlink.NewHandleAt(m.ns); err == nil {
				_, err = h.LinkByName(r.IfName)
				h.Close()
			}
			if err != nil {
				m.ns.Close()
			}
		}
		if err != nil {
			d.log.Info("the pod of a moved netdev is gone; bringing it back", "netdev", name, "netns", r.Netns, "err", err)
			if err := d.renameReturned(host, name, r.MTU); err != nil {
				d.log.Warn("moved netdev not found", "netdev", name, "err", err)
			}
			d.clearAlias(host, name)
			continue
		}
		d.moved[name] = m
	}
	d.saveMovedLocked()
}

// adoptMovedLocked starts the agents of the netdevs loadMoved kept in
// their pods and points their allocations' sockets there.
func (d *Daemon) adoptMovedLocked() {
	for name, m := range d.moved {
		if m.agent != nil {
			continue
		}
		att, ok := d.attachments[m.Key]
		var flows []agent.Flow
		var err error
		if ok {
			flows, err = agentFlows(att.Flows, att.Queues)
		} else {
			err = fmt.Errorf("no attachment %s", m.Key)
		}
		if err == nil {
			err = d.startPodAgent(m, flows)
		}
		if err == nil {
			err = d.retargetMovedLocked(m, att.AllocationID)
		}
		if err != nil {
			d.log.Warn("moved netdev not adopted; bringing it back", "netdev", name, "err", err)
			d.moveOutLocked(name)
			delete(d.attachments, m.Key)
			d.saveAttachmentsLocked()
			continue
		}
		d.log.Info("moved netdev adopted", "netdev", name, "ifname", m.IfName, "netns", m.Netns)
	}
}

// retargetMovedLocked has the broker bind the allocation's sockets on the
// netdev inside the pod.
func (d *Daemon) retargetMovedLocked(m *moved, alloc string) error {
	h, err := netlink.NewHandleAt(m.ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(m.IfName)
	if err != nil {
		return err
	}
	return d.broker.Retarget(alloc, xsk.Netdev{Name: m.IfName, Ifindex: l.Attrs().Index, NetNS: m.nsPath()}, m.agent)
}

// statusLocked is every netdev's agent status, a moved netdev's under its
// node name.
func (d *Daemon) statusLocked() []agent.Status {
	out := d.agent.Status()
	for name, m := range d.moved {
		if m.agent == nil {
			continue
		}
		for _, s := range m.agent.Status() {
			s.Netdev = name
			s.Reason = fmt.Sprintf("in pod netns %s as %s. %s", m.Netns, m.IfName, s.Reason)
			out = append(out, s)
		}
	}
	return out
}
