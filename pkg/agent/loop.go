// The agent's loop: link notifications and the periodic look, and the
// reconcile of each netdev's XDP hook (attach, adopt, take back, detach).

package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// Run follows link notifications of the netdevs' namespace and reconciles
// on each, on kicks and on every resync period, until ctx ends. Its
// errors do not say "agent": its caller names what ran it.
func (a *Agent) Run(ctx context.Context) error {
	ch := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	opts := netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) {
			if ctx.Err() == nil { // closing the subscription makes it fail
				a.log.Error("link notifications", "err", err)
			}
		},
	}
	if a.cfg.NetNS != "" {
		h, err := netns.GetFromPath(a.cfg.NetNS)
		if err != nil {
			return fmt.Errorf("netns %s: %w", a.cfg.NetNS, err)
		}
		defer func() { _ = h.Close() }() // a namespace handle only read
		opts.Namespace = &h
	}
	if err := netlink.LinkSubscribeWithOptions(ch, done, opts); err != nil {
		return fmt.Errorf("subscribe to link notifications: %w", err)
	}
	// Whatever changed before the subscription is caught by this pass.
	a.reconcileAll(false)
	a.listeningOnce.Do(func() { close(a.listening) })
	tick := time.NewTicker(a.cfg.Resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-ch:
			if !ok {
				return errors.New("link notifications ended")
			}
			a.onLink(u)
		case <-a.kick:
			a.reconcileAll(false)
		case <-tick.C:
			a.reconcileAll(true)
		}
	}
}

func (a *Agent) onLink(u netlink.LinkUpdate) {
	attrs := u.Attrs()
	a.mu.Lock()
	var names []string
	for name, d := range a.netdevs {
		if d.ifindex != attrs.Index && d.name != attrs.Name {
			continue
		}
		if d.ifindex == attrs.Index && d.name != attrs.Name && attrs.Name != "" {
			a.log.Warn("managed netdev renamed", "netdev", d.name, "new_name", attrs.Name)
		}
		names = append(names, name)
	}
	a.mu.Unlock()
	for _, name := range names {
		a.reconcileNetdev(name, false)
	}
}

func (a *Agent) reconcileAll(probe bool) {
	a.mu.Lock()
	names := slices.Collect(maps.Keys(a.netdevs))
	a.mu.Unlock()
	for _, name := range names {
		a.reconcileNetdev(name, probe)
	}
}

// reconcileNetdev reconciles the netdev with its token, each netdev in
// turn: a netdev whose token is held is marked stale, and its holder
// reconciles it before giving the token back.
func (a *Agent) reconcileNetdev(name string, probe bool) {
	a.mu.Lock()
	d := a.netdevs[name]
	if d == nil || d.prog == nil {
		a.mu.Unlock()
		return // gone, or its first Set under way
	}
	if d.busy {
		d.stale = true
		a.mu.Unlock()
		return
	}
	d.busy = true
	a.mu.Unlock()
	if probe {
		a.probeOrphans(d)
	}
	a.reconcile(d)
	a.release(d)
}

// probeOrphans drops the queues found busy at start whose sockets are gone.
func (a *Agent) probeOrphans(d *netdev) {
	if len(d.orphans) == 0 {
		return
	}
	busy, err := xsk.BusyQueues(a.dev(d), slices.Sorted(maps.Keys(d.orphans)))
	if err != nil {
		a.log.Warn("probe queues", "netdev", d.name, "err", err)
	}
	for q, b := range busy {
		if !b { // answered free; a queue the probe failed on stays
			delete(d.orphans, q)
		}
	}
	if len(d.sockets)+len(d.orphans) == 0 {
		d.lastEmpty = a.now()
	}
}

// reconcile converges one netdev, and publishes what it found. Called by
// the holder of the netdev's token, without a.mu: the kernel work is
// done outside the agent's lock.
func (a *Agent) reconcile(d *netdev) {
	began := time.Now()
	prev := d.status // the token holder alone writes it
	var st Status
	failed := false     // the kernel refused what the netdev needs: a warning, not news
	reattached := false // xdpq's program is back after a foreign one left
	defer func() {
		// What it found is published at once, for Status and the metrics:
		// the sockets with the state they brought about, so that a socket
		// reported means its program attached (or why not).
		if len(d.sockets) > 0 {
			st.Sockets = slices.Sorted(maps.Keys(d.sockets))
		}
		a.mu.Lock()
		d.status = st
		if reattached {
			// From this reconcile's start (a link notification, mostly)
			// to the program attached.
			d.reattach.observe(time.Since(began).Seconds())
		}
		a.mu.Unlock()
		if st.State != prev.State || st.Reason != prev.Reason {
			level := slog.LevelInfo
			if failed {
				level = slog.LevelWarn
			}
			a.log.Log(context.Background(), level, "netdev state", "netdev", d.name, "state", st.State, "mode", st.Mode,
				"program", st.Program, "foreign", st.Foreign, "reason", st.Reason)
		}
		if a.cfg.OnChange != nil && (st.State != prev.State || st.LinkUp != prev.LinkUp ||
			st.RXQueues != prev.RXQueues || st.Netdev != prev.Netdev) {
			go a.cfg.OnChange()
		}
	}()
	l, err := a.linkByIndex(d.ifindex)
	if err != nil {
		// Gone; one of its name in its place is it re-created (a driver
		// reload, a VF re-made, an SR-IOV reset): managed from now on.
		// A lookup that failed for another reason finds it under its
		// own ifindex: nothing to forget.
		if nl, nerr := a.linkByName(d.name); nerr == nil {
			if nl.Attrs().Index != d.ifindex {
				a.recreated(d, nl.Attrs().Index)
			}
			l, err = nl, nil
		}
	}
	st = Status{Netdev: d.name, Ifindex: d.ifindex}
	if err != nil {
		st.State, st.Reason = StateMissing, err.Error()
		d.setRunning(nil)
		return
	}
	st.Netdev = l.Attrs().Name
	st.LinkUp = l.Attrs().OperState == netlink.OperUp || l.Attrs().OperState == netlink.OperUnknown
	st.ModeReason, st.ZeroCopy = d.modeWhy, d.zc
	d.rxNow = d.queues
	if ch, err := a.nic.Channels(d.name); err == nil {
		d.rxNow = int(max(ch.RX, ch.Combined))
	}
	st.RXQueues = d.rxNow
	var beyond []uint32
	for q := range d.sockets {
		if int(q) >= d.rxNow {
			beyond = append(beyond, q)
		}
	}
	defer func() {
		if len(beyond) > 0 {
			slices.Sort(beyond)
			st.Reason = strings.TrimPrefix(st.Reason+fmt.Sprintf("; sockets on queues %v, beyond the %d rx queues the netdev has now", beyond, d.rxNow), "; ")
		}
	}()
	att, err := a.cfg.Hook.Query(a.cfg.NetNS, d.ifindex)
	if err != nil {
		st.State, st.Reason = StateNone, err.Error()
		failed = true
		return
	}
	lingering, left := d.lingering(a.now())
	want := len(d.sockets) > 0 || len(d.orphans) > 0 || d.policy.AttachAlways || lingering
	if d.lingerT != nil {
		d.lingerT.Stop()
		d.lingerT = nil
	}
	if lingering {
		// Come back when the linger period ends.
		d.lingerT = time.AfterFunc(left+time.Millisecond, a.Kick)
	}
	state := map[xdp.Kind]State{xdp.Direct: StateDirect, xdp.Filter: StateFilter}[d.kind]

	switch {
	case att != nil && a.isOurs(d, att):
		if !want && d.link == nil {
			if err := a.cfg.Hook.Detach(a.cfg.NetNS, d.ifindex, att.Mode, d.running); err != nil {
				st.State, st.Reason = state, "detach: "+err.Error()
				failed = true
				return
			}
			d.setRunning(nil)
			st.State, st.Reason = StateNone, "no socket bound"
			return
		}
		st.State, st.Mode, st.Program = state, att.Mode, att.ID
	case att != nil:
		d.setRunning(nil)
		st.State, st.Mode, st.Program, st.Foreign = StateOverridden, att.Mode, att.ID, att.Name
		st.Reason = fmt.Sprintf("foreign program %q (id %d) has precedence; xsks pinned at %s", att.Name, att.ID, filepath.Join(d.pins, "xsks"))
	case want:
		// xdpq takes its program off only through detachOurs (and a
		// re-created netdev drops it), which forget it: one still running
		// here was taken off by someone else.
		behindItsBack := d.running != nil
		mode, err := a.attach(d)
		if errors.Is(err, xdp.ErrOccupied) {
			// A program appeared since the query; its notification follows.
			st.State, st.Reason = StateOverridden, "a program appeared while attaching"
			return
		}
		if err != nil {
			st.State, st.Reason = StateNone, "attach: "+err.Error()
			failed = true
			return
		}
		d.setRunning(d.prog.Prog())
		info, _ := d.running.Info()
		id, _ := info.ID()
		st.State, st.Mode, st.Program = state, mode, id
		reattached = prev.State == StateOverridden
		if behindItsBack {
			a.log.Warn("xdpq's program was taken off the netdev behind its back: attached again", "netdev", d.name,
				"program", id, "mode", mode)
		}
	default:
		st.State, st.Reason = StateNone, "no socket bound"
	}
}

// recreated makes d the netdev now at ifindex, which has d's name in the
// place of the one that went: what the kernel had of the old one (the
// attached program, a pinned link, bound sockets) went with it. Sockets
// bound to the old netdev are unbound and never receive again: their
// XSKMAP slots are emptied, and their holders lease anew. The pinned
// maps (the XSKMAP, the filter's flows) stay; the program is attached
// to the new netdev as soon as a socket needs it. Called by the holder of
// the netdev's token, without a.mu.
func (a *Agent) recreated(d *netdev, ifindex int) {
	a.log.Warn("managed netdev re-created: managing the new one; sockets bound to the old one must be leased anew",
		"netdev", d.name, "ifindex", ifindex, "was", d.ifindex, "sockets", len(d.sockets))
	if d.link != nil {
		if err := d.link.Unpin(); err != nil {
			a.log.Warn("unpin the old netdev's link", "netdev", d.name, "err", err)
		}
		_ = d.link.Close() // the netdev it held went with its link
		d.link = nil
	}
	d.setRunning(nil)
	for q := range d.sockets {
		if err := d.prog.DeleteSocket(q); err != nil {
			a.log.Warn("delete socket from xskmap", "netdev", d.name, "queue", q, "err", err)
		}
	}
	clear(d.orphans)
	d.lastEmpty = time.Time{}
	a.mu.Lock()
	clear(d.sockets)
	d.ifindex = ifindex
	a.mu.Unlock()
	d.mode, d.modeWhy, d.zc = a.chooseMode(ifindex, d.policy.Mode)
}

func (a *Agent) attach(d *netdev) (xdp.Mode, error) {
	if !d.policy.Exclusive {
		return a.cfg.Hook.Attach(a.cfg.NetNS, d.ifindex, d.prog.Prog(), d.mode)
	}
	l, mode, err := a.cfg.Hook.AttachLink(a.cfg.NetNS, d.ifindex, d.prog.Prog(), d.mode)
	if err != nil {
		return xdp.ModeNone, err
	}
	if err := l.Pin(filepath.Join(d.pins, "link")); err != nil {
		// Unpinned, closing the link detaches the program: the attach
		// is undone, and reconcile tries again.
		if cerr := l.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("detach: %w", cerr))
		}
		return xdp.ModeNone, fmt.Errorf("pin link: %w", err)
	}
	d.link = l
	return mode, nil
}

// isOurs tells whether the attached program is this agent's: the program
// it loaded, or an xdpq program (a predecessor's) that uses its XSKMAP.
// Another xdpq program, with other maps, is treated as foreign.
func (a *Agent) isOurs(d *netdev, att *xdp.Attached) bool {
	if d.running != nil {
		if info, err := d.running.Info(); err == nil {
			if id, _ := info.ID(); id == att.ID {
				return true
			}
		}
	}
	if !att.Ours || att.Kind != d.kind {
		return false
	}
	prog, err := ebpf.NewProgramFromID(att.ID)
	if err != nil {
		return false
	}
	if uses, err := xdp.UsesMap(prog, d.prog.XSKMap()); err != nil || !uses {
		_ = prog.Close() // a reference only read
		return false
	}
	d.setRunning(prog)
	a.log.Info("adopted attached program", "netdev", d.name, "program", att.ID)
	return true
}
