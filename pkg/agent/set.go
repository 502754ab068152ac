package agent

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xdpq/xdpq/pkg/ethtool"
	"github.com/xdpq/xdpq/pkg/nic"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// Set brings the netdev to the policy p: it takes a netdev that is not
// managed under management (loading xdpq's program on the maps pinned for
// it, adopting what a previous agent left attached, finding the queues
// that still have sockets), and changes a managed one in place:
//
//   - Steering: the other program is loaded on the same XSKMAP and put in
//     place of the attached one in a single step (XDP_FLAGS_REPLACE, or
//     the exclusive link's update), so the sockets in the XSKMAP never
//     stop receiving; the owners' flows move to the other kind of
//     steering first (a flow the new kind cannot express refuses the
//     change), and the old kind's rules, flow map and RSS reservation go.
//   - Rules: flows outside the new range move into it.
//   - Reserved: the RSS table is rewritten from the NIC's own (saved), and
//     put back when no queue is reserved.
//   - Mode, Exclusive: the program is detached and attached again (native
//     and generic, or a bpf_link and netlink, cannot hold the hook at
//     once: frames reach the kernel's stack in between).
//   - AttachAlways: turned on, the program is attached now; turned off,
//     the linger period starts if no socket is left.
//   - Linger: the next check of the linger period uses it, including one
//     that runs.
//   - BusyPoll: see Policy.BusyPoll.
//
// An error with the netdev not managed before means it is not managed.
// For a managed netdev, each field that cannot be applied keeps its
// value in force and the error says why (so does Status.PolicyError);
// the others are applied.
func (a *Agent) Set(name string, p Policy) error {
	return a.set(name, p, false)
}

// Manage is Set for a netdev that must not be managed yet: it fails if it
// is.
func (a *Agent) Manage(name string, p Policy) error {
	return a.set(name, p, true)
}

func (a *Agent) set(name string, p Policy, fresh bool) error {
	op := "set"
	if fresh {
		op = "manage"
	}
	p, err := a.normalize(p)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, name, err)
	}
	a.mu.Lock()
	d := a.take(name)
	closed := a.closed
	if closed || d != nil && fresh {
		a.mu.Unlock()
		if d != nil {
			a.release(d)
		}
		if closed {
			return fmt.Errorf("%s %s: the agent is closed", op, name)
		}
		return fmt.Errorf("manage %s: it is managed already", name)
	}
	if d == nil {
		placeholder := &netdev{name: name, busy: true}
		a.netdevs[name] = placeholder
		a.mu.Unlock()
		nd, err := a.manage(name, p)
		a.mu.Lock()
		if nd == nil {
			delete(a.netdevs, name)
			a.idle.Broadcast()
			a.mu.Unlock()
			return fmt.Errorf("manage %s: %w", name, err)
		}
		nd.busy = true // the placeholder's token passes to it
		a.netdevs[name] = nd
		a.mu.Unlock()
		a.reconcile(nd)
		a.release(nd)
		if err != nil {
			return fmt.Errorf("manage %s: %w", name, err)
		}
		return nil
	}
	// The token holder works on a copy, and puts it in place under the
	// lock: Status reads the netdev meanwhile.
	nd := *d
	a.mu.Unlock()
	err = a.update(&nd, p)
	a.mu.Lock()
	nd.busy, nd.stale = true, d.stale
	*d = nd
	a.mu.Unlock()
	a.reconcile(d)
	a.release(d)
	if err != nil {
		return fmt.Errorf("set %s: %w", name, err)
	}
	return nil
}

// normalize checks p and fills in its defaults.
func (a *Agent) normalize(p Policy) (Policy, error) {
	switch p.Steering {
	case "":
		p.Steering = SteerAuto
	case SteerAuto, SteerHardware, SteerSoftware:
	default:
		return p, fmt.Errorf("steering %q: want hardware, software or auto", p.Steering)
	}
	if p.Rules.Count == 0 {
		p.Rules = DefaultRules
	}
	if uint64(p.Rules.First)+uint64(p.Rules.Count) > 1<<32 {
		return p, fmt.Errorf("rule range %d+%d goes past the last location", p.Rules.First, p.Rules.Count)
	}
	switch p.Mode {
	case xdp.ModeNone:
		p.Mode = xdp.ModeAuto
	case xdp.ModeAuto, xdp.ModeNative, xdp.ModeGeneric:
	default:
		return p, fmt.Errorf("mode %v: want auto, native or generic", p.Mode)
	}
	if p.Linger < 0 {
		return p, fmt.Errorf("linger %v is negative", p.Linger)
	}
	if p.Linger == 0 {
		p.Linger = a.cfg.Linger
	}
	p.Reserved = slices.Compact(slices.Sorted(slices.Values(p.Reserved)))
	return p, nil
}

func kindOf(s Steering) xdp.Kind {
	if s == SteerSoftware {
		return xdp.Filter
	}
	return xdp.Direct
}

// manage builds a newly managed netdev, outside the agent's lock. A nil
// netdev is a failure; a netdev with an error is managed with the fields
// the error names left at their previous value.
func (a *Agent) manage(name string, p Policy) (*netdev, error) {
	l, err := a.linkByName(name)
	if err != nil {
		return nil, err
	}
	// Before anything of the netdev is touched: another daemon's program,
	// pins and flows are not this one's to take.
	lk, err := lockNetdev(a.cfg.NetNS, name)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			lk.release()
		}
	}()
	queues := l.Attrs().NumRxQueues
	d := &netdev{name: name, ifindex: l.Attrs().Index, queues: queues, policy: p, lock: lk,
		pins: filepath.Join(a.cfg.PinDir, name), sockets: map[uint32]uint64{}, orphans: map[uint32]bool{}}
	steer, err := a.resolveSteering(name, p.Steering)
	if err != nil {
		return nil, err
	}
	d.kind = kindOf(steer)
	d.mode, d.modeWhy, d.zc = a.chooseMode(d.ifindex, p.Mode)
	predecessor, err := a.loadProgram(d)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !ok {
			_ = d.prog.Close() // not managed: its pinned maps stay for the next try
		}
	}()
	d.steer = &steering{mode: steer, dev: a.nic, ifname: name, rules: p.Rules, prog: d.prog, queues: queues,
		owners: map[string][]installed{}}
	d.steerMode = steer
	if steer == SteerHardware {
		err := reserveRSS(a.nic, name, a.rssFile(name), p.Reserved)
		switch {
		case errors.Is(err, ethtool.ErrNotSupported):
			// No indirection table to rewrite: the NIC spreads (or not) as
			// it will; status says so (hardwareGaps).
			d.policy.Reserved = nil
		case err != nil:
			return nil, err
		}
	} else if err := restoreRSS(a.nic, name, a.rssFile(name)); err != nil {
		// A predecessor with hardware steering reserved queues.
		a.log.Warn("cannot put back the rss table", "netdev", name, "err", err)
	}
	if predecessor {
		all := make([]uint32, queues)
		for q := range all {
			all[q] = uint32(q)
		}
		busy, err := xsk.BusyQueues(a.dev(d), all)
		if err != nil {
			a.log.Warn("probe queues", "netdev", name, "err", err)
		}
		for q, b := range busy {
			if b {
				d.orphans[q] = true
			}
		}
	}
	if l, err := link.LoadPinnedLink(filepath.Join(d.pins, "link"), nil); err == nil {
		d.link = l
		if !p.Exclusive {
			a.log.Info("the policy is no longer exclusive: removing the pinned link", "netdev", name)
			if err := d.detachOurs(a.cfg.Hook, a.cfg.NetNS, xdp.ModeNone); err != nil {
				a.log.Warn("remove the pinned link", "netdev", name, "err", err)
			}
		}
	}
	a.settleAttached(d)
	var errs []error
	if on, err := a.syncBusyPoll(name, name, p.BusyPoll); err != nil {
		d.policy.BusyPoll = on
		errs = append(errs, fmt.Errorf("busy poll: %w", err))
	}
	if len(errs) > 0 {
		d.policyErr = errors.Join(errs...).Error()
	}
	d.gaps = a.hardwareGaps(d, p.Reserved)
	ok = true
	a.log.Info("managing netdev", "netdev", name, "ifindex", d.ifindex, "queues", queues,
		"steering", steer, "program", d.kind, "busy_queues", slices.Sorted(maps.Keys(d.orphans)))
	return d, errors.Join(errs...)
}

// loadProgram loads the netdev's program on the maps pinned for it. With
// nothing pinned, an xdpq program attached to the netdev is taken back
// with its maps, pinned again: a predecessor that lost its pins (bpffs
// not persisted, another pin directory) left the pods' sockets in that
// program's XSKMAP. It tells whether a predecessor's sockets may be in the
// XSKMAP.
func (a *Agent) loadProgram(d *netdev) (predecessor bool, err error) {
	opts := xdp.LoadOptions{Queues: d.queues}
	if _, err := os.Stat(filepath.Join(d.pins, "xsks")); err == nil {
		d.prog, err = xdp.LoadPinned(d.kind, d.pins, opts)
		if !errors.Is(err, xdp.ErrPinsIncompatible) {
			return err == nil, err
		}
		// Pinned for another queue count: no socket of this netdev can be
		// in them, so start afresh.
		a.log.Warn("replacing incompatible pinned maps", "netdev", d.name, "err", err)
		for _, n := range []string{"xsks", "flows", "counters"} {
			if err := os.Remove(filepath.Join(d.pins, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return false, fmt.Errorf("replace incompatible pins: %w", err)
			}
		}
	} else if att, err := a.cfg.Hook.Query(a.cfg.NetNS, d.ifindex); err == nil && att != nil && att.Ours {
		err := a.adoptAttached(d, att, opts)
		if err == nil {
			return true, nil
		}
		a.log.Warn("cannot take back the xdpq program attached", "netdev", d.name, "program", att.ID, "err", err)
	}
	d.prog, err = xdp.LoadPinned(d.kind, d.pins, opts)
	return false, err
}

// adoptAttached takes the attached xdpq program's maps as the netdev's
// and pins them where the netdev's pins belong.
func (a *Agent) adoptAttached(d *netdev, att *xdp.Attached, opts xdp.LoadOptions) error {
	prev, err := xdp.Open(att.ID)
	if err != nil {
		return err
	}
	info, err := prev.XSKMap().Info()
	if err != nil {
		_ = prev.Close() // references to what stays attached
		return fmt.Errorf("xskmap info: %w", err)
	}
	if int(info.MaxEntries) != d.queues {
		_ = prev.Close() // references to what stays attached
		return fmt.Errorf("its xskmap has %d entries, the netdev %d queues", info.MaxEntries, d.queues)
	}
	p := prev
	if prev.Kind() != d.kind || att.Outdated {
		// settleAttached replaces the attached program with this one.
		p, err = xdp.LoadWith(d.kind, opts, sharedMaps(prev))
		_ = prev.Close() // p holds the XSKMAP now; the rest stays attached
		if err != nil {
			return err
		}
	}
	if err := p.Pin(d.pins); err != nil {
		// What was pinned goes, or loadProgram's next try finds it.
		return errors.Join(err, p.Unpin(), p.Close())
	}
	d.prog = p
	a.log.Info("took back the attached xdpq program without pins: its maps are pinned again", "netdev", d.name,
		"program", att.ID, "kind", att.Kind, "pins", d.pins)
	return nil
}

// sharedMaps are the maps of p that a program of either kind takes on
// (LoadWith): the XSKMAP and the counters.
func sharedMaps(p *xdp.Program) map[string]*ebpf.Map {
	m := map[string]*ebpf.Map{"xsks": p.XSKMap()}
	if c := p.CounterMap(); c != nil {
		m["counters"] = c
	}
	return m
}

// settleAttached brings an xdpq program attached on the netdev's XSKMAP
// (a predecessor's) to the policy: of the other kind, or an earlier
// version's build (the direct program before it counted), it is replaced
// in one step; in another mode than the policy's, or through netlink
// where the policy is exclusive, it is detached for reconcile to attach
// again.
func (a *Agent) settleAttached(d *netdev) {
	att, err := a.cfg.Hook.Query(a.cfg.NetNS, d.ifindex)
	if err != nil || att == nil || !att.Ours {
		return
	}
	prog, err := ebpf.NewProgramFromID(att.ID)
	if err != nil {
		return
	}
	defer func() { _ = prog.Close() }() // a reference only read, or replaced
	if uses, err := xdp.UsesMap(prog, d.prog.XSKMap()); err != nil || !uses {
		return // another agent's, or a foreign copy: reconcile reports it
	}
	if att.Kind != d.kind || att.Outdated {
		if d.link != nil {
			err = d.link.Update(d.prog.Prog())
		} else {
			err = a.cfg.Hook.Replace(a.cfg.NetNS, d.ifindex, att.Mode, d.prog.Prog(), prog)
		}
		if err != nil {
			a.log.Warn("cannot replace the attached program of the other kind", "netdev", d.name, "program", att.ID, "err", err)
			return
		}
		a.log.Info("replaced the attached program on the same xskmap", "netdev", d.name,
			"program", att.ID, "was", att.Kind, "outdated", att.Outdated, "now", d.kind)
		d.running = d.prog.Prog()
	} else {
		d.running = prog
	}
	if (d.mode == xdp.ModeNative || d.mode == xdp.ModeGeneric) && att.Mode != d.mode || d.policy.Exclusive && d.link == nil {
		a.log.Info("attaching again for the policy", "netdev", d.name, "mode", att.Mode, "want", d.mode,
			"exclusive", d.policy.Exclusive)
		if err := d.detachOurs(a.cfg.Hook, a.cfg.NetNS, att.Mode); err != nil {
			a.log.Warn("detach for the policy", "netdev", d.name, "err", err)
		}
	}
	d.running = nil // reconcile adopts what runs again
}

// detachOurs takes xdpq's program off the netdev: the pinned link is
// removed (the kernel detaches when its last reference goes), or the
// running program detached from mode. A foreign program that took the
// hook meanwhile stays.
func (d *netdev) detachOurs(h Hook, netns string, mode xdp.Mode) error {
	var err error
	switch {
	case d.link != nil:
		err = errors.Join(d.link.Unpin(), d.link.Close())
		d.link = nil
	case d.running != nil:
		err = h.Detach(netns, d.ifindex, mode, d.running)
		if errors.Is(err, xdp.ErrOccupied) {
			err = nil
		}
	}
	d.setRunning(nil)
	return err
}

// chooseMode settles an auto mode from the driver's XDP features: native
// needs native XDP_REDIRECT, else generic.
func (a *Agent) chooseMode(ifindex int, mode xdp.Mode) (xdp.Mode, string, bool) {
	f, err := nic.XDPFeatures(a.cfg.NetNS, ifindex)
	zc := err == nil && f.Has(nic.XSKZeroCopy)
	switch {
	case err != nil || !f.Known():
		return mode, "the kernel does not report XDP features: native, else generic", zc
	case mode != xdp.ModeAuto:
		return mode, "set by the pool", zc
	case f.Has(nic.XDPBasic | nic.XDPRedirect):
		return xdp.ModeNative, "the driver has native XDP_REDIRECT (" + f.String() + ")", zc
	}
	return xdp.ModeGeneric, "the driver has no native XDP_REDIRECT (" + f.String() + ")", zc
}

// resolveSteering turns auto into hardware when the NIC has ntuple
// filters and into software when it answers that it has none.
func (a *Agent) resolveSteering(name string, s Steering) (Steering, error) {
	switch s {
	case SteerHardware, SteerSoftware:
		return s, nil
	case SteerAuto, "":
		_, _, err := a.nic.RuleTable(name)
		if errors.Is(err, ethtool.ErrNotSupported) {
			return SteerSoftware, nil
		}
		if err != nil {
			return "", fmt.Errorf("probe ntuple filters: %w", err)
		}
		return SteerHardware, nil
	}
	return "", fmt.Errorf("steering %q: want hardware, software or auto", s)
}

// hardwareGaps says what hardware steering lacks on the netdev's NIC, ""
// when it lacks nothing (or the netdev steers in software): without
// ntuple filters no flow can be steered, without an RSS indirection
// table the host's traffic reaches the queues handed to pods. The netdev
// keeps hardware steering (the direct program gives each socket its
// queue's every frame), but the operator must know.
func (a *Agent) hardwareGaps(d *netdev, reserved []uint32) string {
	if d.steer.mode != SteerHardware {
		return ""
	}
	var gaps []string
	if _, _, err := a.nic.RuleTable(d.name); errors.Is(err, ethtool.ErrNotSupported) {
		gaps = append(gaps, "no ntuple filters (an ADD with flows is refused)")
	}
	if len(reserved) > 0 && len(d.policy.Reserved) == 0 {
		gaps = append(gaps, fmt.Sprintf("no RSS indirection table (the host's traffic on queues %v reaches the pods' sockets)", reserved))
	}
	if len(gaps) == 0 {
		return ""
	}
	return fmt.Sprintf("steering hardware: %s has %s; use steering software (or auto)", d.name, strings.Join(gaps, " and "))
}

func (a *Agent) rssFile(name string) string {
	return filepath.Join(a.cfg.StateDir, name+".rss.json")
}

// update brings the managed netdev d (the token holder's copy) to p,
// outside the agent's lock.
func (a *Agent) update(d *netdev, p Policy) error {
	var errs []error
	old := d.policy
	d.policy.Linger, d.policy.AttachAlways = p.Linger, p.AttachAlways
	if old.AttachAlways && !p.AttachAlways && len(d.sockets)+len(d.orphans) == 0 {
		d.lastEmpty = a.now()
	}

	steer, err := a.resolveSteering(d.name, p.Steering)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("steering %s: %w", p.Steering, err))
	case steer != d.steer.mode:
		if err := a.switchSteering(d, steer, p); err != nil {
			errs = append(errs, fmt.Errorf("steering %s: %w (the netdev keeps %s steering)", p.Steering, err, d.steer.mode))
		} else {
			d.policy.Steering, d.policy.Rules, d.policy.Reserved = p.Steering, p.Rules, p.Reserved
		}
	default:
		d.policy.Steering = p.Steering
	}
	if d.policy.Rules != p.Rules {
		if err := d.steer.setRange(p.Rules); err != nil {
			errs = append(errs, fmt.Errorf("rules: %w", err))
		} else {
			d.policy.Rules = p.Rules
		}
	}
	if !slices.Equal(d.policy.Reserved, p.Reserved) {
		err := error(nil)
		if d.steer.mode == SteerHardware {
			err = reserveRSS(a.nic, d.name, a.rssFile(d.name), p.Reserved)
		}
		switch {
		case errors.Is(err, ethtool.ErrNotSupported):
			d.policy.Reserved = nil // status says so (hardwareGaps)
		case err != nil:
			errs = append(errs, fmt.Errorf("reserved queues: %w", err))
		default:
			d.policy.Reserved = p.Reserved
		}
	}
	d.gaps = a.hardwareGaps(d, p.Reserved)
	d.flows, d.unknown, d.steerMode = d.steer.count(), len(d.steer.unknown), d.steer.mode

	mode, why, zc := a.chooseMode(d.ifindex, p.Mode)
	if mode != d.mode || p.Exclusive != d.policy.Exclusive {
		// Both need the program off the hook first; reconcile attaches it
		// again as the policy says.
		if err := d.detachOurs(a.cfg.Hook, a.cfg.NetNS, d.status.Mode); err != nil {
			errs = append(errs, fmt.Errorf("attach again (mode %v, exclusive %v): %w", p.Mode, p.Exclusive, err))
		} else {
			d.mode, d.policy.Mode, d.policy.Exclusive = mode, p.Mode, p.Exclusive
		}
	} else {
		d.policy.Mode = p.Mode
	}
	d.modeWhy, d.zc = why, zc

	ifname := d.status.Netdev
	if ifname == "" {
		ifname = d.name
	}
	on, err := a.syncBusyPoll(d.name, ifname, p.BusyPoll)
	d.policy.BusyPoll = on
	if err != nil {
		errs = append(errs, fmt.Errorf("busy poll: %w", err))
	}
	d.policyErr = ""
	if err := errors.Join(errs...); err != nil {
		d.policyErr = err.Error()
		return err
	}
	return nil
}

// switchSteering moves the netdev to the other kind of steering in place:
// the other program on the same XSKMAP, the owners' flows in the other
// form, then the program swapped in one step and the old kind's flows,
// pins and RSS reservation removed. On an error nothing changed.
func (a *Agent) switchSteering(d *netdev, to Steering, p Policy) error {
	from := d.steer
	if len(from.unknown) > 0 {
		return fmt.Errorf("%d flows installed by a previous agent have no known owner (a SyncSteering must settle them first)", len(from.unknown))
	}
	owners := map[string][]Flow{}
	for o, ins := range from.owners {
		for _, in := range ins {
			owners[o] = append(owners[o], in.flow)
			if to == SteerSoftware {
				if _, err := in.flow.softFlows(); err != nil {
					return fmt.Errorf("%w (owner %s)", err, o)
				}
			}
		}
	}
	kind := kindOf(to)
	np, err := xdp.LoadWith(kind, xdp.LoadOptions{Queues: d.queues}, sharedMaps(d.prog))
	if err != nil {
		return err
	}
	// The XSKMAP and the counters are pinned there already; the filter's
	// flow map joins them.
	err = np.Pin(d.pins)
	next := &steering{mode: to, dev: a.nic, ifname: d.name, rules: p.Rules, prog: np, queues: d.queues,
		owners: map[string][]installed{}}
	// What the undo could not undo is said with the error: the steering
	// in force stays the old one, and status says the policy's error.
	undo := func(err error) error {
		errs := []error{err}
		for o := range next.owners {
			errs = append(errs, next.removeOwner(o))
		}
		if kind == xdp.Filter {
			if err := os.Remove(filepath.Join(d.pins, "flows")); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("undo: %w", err))
			}
		}
		_ = np.Close() // unpinned or removed above: nothing else holds it
		return errors.Join(errs...)
	}
	if err != nil {
		return undo(err)
	}
	if to == SteerHardware {
		// Rules found in the range are a predecessor's leftovers: never
		// write over them.
		if rules, err := a.nic.Rules(d.name); err == nil {
			for _, r := range rules {
				if next.inRange(r.Location) {
					next.unknown = append(next.unknown, installed{flow: flowOfRule(r), loc: r.Location, ctx: r.RSSContext})
				}
			}
		}
	}
	for _, o := range slices.Sorted(maps.Keys(owners)) {
		if err := next.add(o, owners[o]); err != nil {
			return undo(err)
		}
	}
	if to == SteerHardware {
		// Without an indirection table (ErrNotSupported) status says so.
		if err := reserveRSS(a.nic, d.name, a.rssFile(d.name), p.Reserved); err != nil && !errors.Is(err, ethtool.ErrNotSupported) {
			return undo(err)
		}
	}
	switch {
	case d.link != nil:
		err = d.link.Update(np.Prog())
	case d.running != nil:
		err = a.cfg.Hook.Replace(a.cfg.NetNS, d.ifindex, d.status.Mode, np.Prog(), d.running)
		if errors.Is(err, xdp.ErrOccupied) {
			err = nil // a foreign program took the hook: ours is not there to swap
		}
	}
	if err != nil {
		if to == SteerHardware {
			if rerr := restoreRSS(a.nic, d.name, a.rssFile(d.name)); rerr != nil {
				err = errors.Join(err, fmt.Errorf("undo: %w", rerr))
			}
		}
		return undo(fmt.Errorf("swap the program: %w", err))
	}
	// The new program runs (or will): the old steering goes.
	var warn []error
	if from.mode == SteerHardware {
		for o := range from.owners {
			warn = append(warn, from.removeOwner(o))
		}
		warn = append(warn, restoreRSS(a.nic, d.name, a.rssFile(d.name)))
	} else if err := os.Remove(filepath.Join(d.pins, "flows")); err != nil && !os.IsNotExist(err) {
		warn = append(warn, err)
	}
	if err := errors.Join(warn...); err != nil {
		a.log.Warn("remove the old steering", "netdev", d.name, "steering", from.mode, "err", err)
	}
	oldProg, oldRunning := d.prog, d.running
	d.prog, d.kind, d.steer = np, kind, next
	if oldRunning != nil {
		d.running = np.Prog()
		if oldRunning != oldProg.Prog() {
			_ = oldRunning.Close() // an adopted predecessor's reference; np runs
		}
	}
	_ = oldProg.Close() // replaced by np, which holds the XSKMAP
	a.log.Info("steering changed in place", "netdev", d.name, "from", from.mode, "to", to, "program", kind,
		"flows", next.count())
	return nil
}

// Unmanage stops managing a netdev: its flows, RSS reservation and NAPI
// settings go, its program is detached (if ours) and its pins removed.
func (a *Agent) Unmanage(name string) error {
	a.mu.Lock()
	d := a.take(name)
	if d == nil {
		a.mu.Unlock()
		return fmt.Errorf("unmanage %s: it is not managed", name)
	}
	if d.lingerT != nil {
		d.lingerT.Stop()
	}
	a.mu.Unlock()
	var errs []error
	for owner := range d.steer.owners {
		errs = append(errs, d.steer.removeOwner(owner))
	}
	if d.steer.mode == SteerHardware {
		errs = append(errs, restoreRSS(a.nic, name, a.rssFile(name)))
	}
	ifname := d.status.Netdev
	if ifname == "" {
		ifname = name
	}
	if _, err := a.syncBusyPoll(name, ifname, false); err != nil {
		errs = append(errs, fmt.Errorf("busy poll: %w", err))
	}
	errs = append(errs, d.detachOurs(a.cfg.Hook, a.cfg.NetNS, d.status.Mode), d.prog.Unpin(), d.prog.Close(), os.Remove(d.pins))
	d.lock.release()
	a.mu.Lock()
	delete(a.netdevs, name)
	a.idle.Broadcast()
	a.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("unmanage %s: %w", name, err)
	}
	return nil
}
