package mover

import (
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// space is a namespace a netdev may be in.
type space int

const (
	spacePod space = iota
	spaceNode
	spaceInit
)

func (s space) String() string { return [...]string{"pod", "node", "initial"}[s] }

// handles are the netlink handles of one operation, one per namespace,
// by space; nil where there is no such namespace.
type handles struct {
	h    [3]*netlink.Handle
	ns   [3]netns.NsHandle
	sock [3]*nl.SocketHandle // for requests netlink.Handle has no method for
	last *found              // where find saw the netdev last
}

func (hs *handles) close() {
	for s, h := range hs.h {
		if h != nil {
			h.Close()
		}
		if hs.sock[s] != nil {
			hs.sock[s].Socket.Close()
		}
	}
}

// request sends req, with an ack, on a socket in namespace s.
func (hs *handles) request(s space, req *nl.NetlinkRequest) error {
	if hs.sock[s] == nil {
		sock, err := nl.GetNetlinkSocketAt(hs.ns[s], netns.None(), unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		hs.sock[s] = &nl.SocketHandle{Socket: sock}
	}
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: hs.sock[s]}
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// altNames adds (or deletes) alternative names of a link in one request:
// the kernel completes a request whatever becomes of its sender, so a
// crash leaves all of them or none, not some.
func (hs *handles) altNames(f *found, add bool, names []string) error {
	cmd := unix.RTM_DELLINKPROP
	if add {
		cmd = unix.RTM_NEWLINKPROP
	}
	req := nl.NewNetlinkRequest(cmd, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(f.attrs().Index)
	req.AddData(msg)
	list := nl.NewRtAttr(unix.IFLA_PROP_LIST|unix.NLA_F_NESTED, nil)
	for _, n := range names {
		list.AddRtAttr(unix.IFLA_ALT_IFNAME, []byte(n))
	}
	req.AddData(list)
	err := hs.request(f.space, req)
	if add && errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("another link of the %s namespace has one of %v: %w", f.space, names, ErrNameTaken)
	}
	return err
}

// found is a netdev where find saw it.
type found struct {
	space space
	link  netlink.Link
}

func (f *found) attrs() *netlink.LinkAttrs { return f.link.Attrs() }

// maxDumpTries bounds the retries of a link dump the kernel interrupted
// (NLM_F_DUMP_INTR: links changed during it).
const maxDumpTries = 5

func list(h *netlink.Handle) ([]netlink.Link, error) {
	for try := 1; ; try++ {
		links, err := h.LinkList()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || try == maxDumpTries {
			return links, err
		}
	}
}

// ours reports whether a link seen in space s is the record's netdev (see
// the marks in the package documentation).
func (r *Record) ours(a *netlink.LinkAttrs, s space) bool {
	if r.hardware() {
		return (r.Parent == "" || parentOf(a) == r.Parent) &&
			(r.PermAddr == "" || a.PermHWAddr.String() == r.PermAddr)
	}
	return a.Name == r.Temp || a.Alias == r.Name || (s == spaceNode && a.Name == r.Name && a.Index == r.Index)
}

// find looks for the record's netdev: where it was last seen, by ifindex,
// and failing that in every namespace of hs (nil if in none).
func (hs *handles) find(r *Record) (*found, error) {
	if last := hs.last; last != nil {
		if l, err := hs.h[last.space].LinkByIndex(last.attrs().Index); err == nil && r.ours(l.Attrs(), last.space) {
			hs.last = &found{last.space, l}
			return hs.last, nil
		}
	}
	f, err := hs.findAll(r)
	hs.last = f
	return f, err
}

// findAll looks for the record's netdev in every namespace of hs.
func (hs *handles) findAll(r *Record) (*found, error) {
	var all []found
	for s, h := range hs.h {
		if h == nil {
			continue
		}
		links, err := list(h)
		if err != nil {
			return nil, fmt.Errorf("list links in the %s namespace: %w", space(s), err)
		}
		for _, l := range links {
			if r.ours(l.Attrs(), space(s)) {
				all = append(all, found{space(s), l})
			}
		}
	}
	if len(all) > 1 && r.hardware() {
		// Two netdevs of one device without permanent addresses: the
		// names tell them apart.
		hint := *r
		hint.Parent, hint.PermAddr = "", ""
		all = slices.DeleteFunc(all, func(f found) bool { return !hint.ours(f.attrs(), f.space) })
	}
	switch len(all) {
	case 0:
		return nil, nil
	case 1:
		return &all[0], nil
	}
	var where []string
	for _, f := range all {
		where = append(where, fmt.Sprintf("%s (ifindex %d) in the %s namespace", f.attrs().Name, f.attrs().Index, f.space))
	}
	return nil, fmt.Errorf("netdev %s is ambiguous: %d links carry its marks: %v", r.Name, len(all), where)
}

// step is one netlink call toward a goal.
type step struct {
	what string
	do   func() error
}

// nextFunc is the next step from f toward a goal, nil when there.
type nextFunc func(hs *handles, r *Record, f *found) (*step, error)

// errStopped ends a run cut short by its step limit (tests simulate a crash
// with it).
var errStopped = errors.New("stopped after the step limit")

// maxSteps bounds a run: a move takes a dozen; more means something else
// keeps changing the netdev.
const maxSteps = 64

// run takes steps toward a goal until next says it is there, or limit steps
// (0: no limit). It returns where the netdev is and the steps taken.
func (hs *handles) run(r *Record, next nextFunc, limit int) (*found, []string, error) {
	var did []string
	for {
		f, err := hs.find(r)
		if err != nil {
			return nil, did, err
		}
		if f == nil {
			return nil, did, errMissing
		}
		s, err := next(hs, r, f)
		if err != nil || s == nil {
			return f, did, err
		}
		if limit > 0 && len(did) == limit {
			return f, did, errStopped
		}
		if len(did) == maxSteps {
			return f, did, fmt.Errorf("netdev %s does not settle after %d steps (last: %s): something else keeps changing it", r.Name, maxSteps, did[len(did)-1])
		}
		if err := s.do(); err != nil {
			return f, did, fmt.Errorf("%s: %w", s.what, err)
		}
		did = append(did, s.what)
	}
}

// errMissing: find found the netdev nowhere. Callers say what that means.
var errMissing = errors.New("netdev missing")

func isUp(a *netlink.LinkAttrs) bool { return a.RawFlags&unix.IFF_UP != 0 }

func (hs *handles) down(f *found) *step {
	h, l := hs.h[f.space], f.link
	return &step{fmt.Sprintf("set %s down", f.attrs().Name), func() error { return h.LinkSetDown(l) }}
}

func (hs *handles) up(f *found) *step {
	h, l := hs.h[f.space], f.link
	return &step{fmt.Sprintf("set %s up", f.attrs().Name), func() error { return h.LinkSetUp(l) }}
}

func (hs *handles) dropAltNames(f *found, names []string) *step {
	return &step{fmt.Sprintf("drop altnames %v of %s", names, f.attrs().Name), func() error { return hs.altNames(f, false, names) }}
}

// rename gives the link a name; a name taken is ErrNameTaken, saying by
// whom and, through then, what becomes of the netdev.
func (hs *handles) rename(f *found, to, then string) *step {
	h, l, from := hs.h[f.space], f.link, f.attrs().Name
	return &step{fmt.Sprintf("rename %s to %s", from, to), func() error {
		err := h.LinkSetName(l, to)
		if !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.EBUSY) {
			return err
		}
		if other, e := h.LinkByName(to); e == nil && other.Attrs().Index != l.Attrs().Index {
			return fmt.Errorf("ifindex %d (%s) holds the name in the %s namespace%s: %w", other.Attrs().Index, other.Type(), f.space, then, ErrNameTaken)
		}
		return err
	}}
}

func (hs *handles) move(f *found, to space) *step {
	h, l, fd := hs.h[f.space], f.link, int(hs.ns[to])
	return &step{fmt.Sprintf("move %s from the %s to the %s namespace", f.attrs().Name, f.space, to), func() error {
		err := h.LinkSetNsFd(l, fd)
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("a name or alternative name of %s is taken there: %w", f.attrs().Name, ErrNameTaken)
		}
		return err
	}}
}

// restore is the next step that puts the record's node state on a link,
// up aside; nil when it has it.
func (hs *handles) restore(r *Record, f *found) *step {
	h, l, a := hs.h[f.space], f.link, f.attrs()
	name, want, have := a.Name, r.Node, stateOf(a)
	set := func(what string, do func() error) *step {
		return &step{fmt.Sprintf("set %s %s", name, what), do}
	}
	flag := func(what string, on bool, setOn, setOff func(netlink.Link) error) *step {
		if on {
			return set(what+" on", func() error { return setOn(l) })
		}
		return set(what+" off", func() error { return setOff(l) })
	}
	switch {
	case want.MAC != have.MAC && want.MAC != "":
		mac, err := net.ParseMAC(want.MAC)
		return set("address "+want.MAC, func() error {
			if err != nil {
				return err
			}
			return h.LinkSetHardwareAddr(l, mac)
		})
	case want.MTU != have.MTU:
		return set(fmt.Sprintf("mtu %d", want.MTU), func() error { return h.LinkSetMTU(l, want.MTU) })
	case want.TxQLen != have.TxQLen:
		return set(fmt.Sprintf("txqueuelen %d", want.TxQLen), func() error { return h.LinkSetTxQLen(l, want.TxQLen) })
	case want.Alias != have.Alias:
		return set(fmt.Sprintf("alias %q", want.Alias), func() error { return h.LinkSetAlias(l, want.Alias) })
	case want.Promisc != have.Promisc:
		return flag("promisc", want.Promisc, h.SetPromiscOn, h.SetPromiscOff)
	case want.AllMulti != have.AllMulti:
		return flag("allmulticast", want.AllMulti, h.LinkSetAllmulticastOn, h.LinkSetAllmulticastOff)
	case want.NoARP != have.NoARP:
		// NOARP on is ARP off.
		return flag("arp", !want.NoARP, h.LinkSetARPOn, h.LinkSetARPOff)
	case want.Multicast != have.Multicast:
		return flag("multicast", want.Multicast, h.LinkSetMulticastOn, h.LinkSetMulticastOff)
	}
	var extra, missing []string
	for _, n := range have.AltNames {
		if !slices.Contains(want.AltNames, n) {
			extra = append(extra, n)
		}
	}
	for _, n := range want.AltNames {
		if !slices.Contains(have.AltNames, n) {
			missing = append(missing, n)
		}
	}
	switch {
	case len(extra) > 0:
		return hs.dropAltNames(f, extra)
	case len(missing) > 0:
		return set(fmt.Sprintf("altnames %v", missing), func() error { return hs.altNames(f, true, missing) })
	}
	return nil
}

// inStep is the next step of MoveIn: on the node, down, alias, no
// alternative names, temporary name, into the pod; there, MTU, pod name,
// up.
func inStep(hs *handles, r *Record, f *found) (*step, error) {
	a := f.attrs()
	switch f.space {
	case spaceNode:
		switch {
		case isUp(a):
			return hs.down(f), nil
		case a.Alias != r.Name:
			h, l := hs.h[f.space], f.link
			return &step{fmt.Sprintf("set %s alias %q", a.Name, r.Name), func() error { return h.LinkSetAlias(l, r.Name) }}, nil
		case len(a.AltNames) > 0:
			return hs.dropAltNames(f, a.AltNames), nil
		case a.Name != r.Temp:
			return hs.rename(f, r.Temp, ""), nil
		}
		return hs.move(f, spacePod), nil
	case spacePod:
		if a.Name != r.Temp && a.Name != r.IfName {
			return nil, fmt.Errorf("netdev %s was renamed %s in the pod", r.Name, a.Name)
		}
		if r.MTU != 0 && a.MTU != r.MTU {
			h, l := hs.h[f.space], f.link
			return &step{fmt.Sprintf("set %s mtu %d", a.Name, r.MTU), func() error { return h.LinkSetMTU(l, r.MTU) }}, nil
		}
		if a.Name == r.Temp {
			return hs.rename(f, r.IfName, ""), nil
		}
		if !isUp(a) {
			return hs.up(f), nil
		}
		return nil, nil
	}
	return nil, fmt.Errorf("netdev %s is in the %s namespace as %s", r.Name, f.space, a.Name)
}

// outStep is the next step of MoveOut: away from the node, down, no
// alternative names, temporary name, to the node; there, under the
// temporary name, the node state, its name, up if it was. Found on the node
// under its own name, it is put right where it is.
func outStep(hs *handles, r *Record, f *found) (*step, error) {
	a := f.attrs()
	up := isUp(a)
	switch {
	case f.space != spaceNode:
		switch {
		case up:
			return hs.down(f), nil
		case len(a.AltNames) > 0:
			return hs.dropAltNames(f, a.AltNames), nil
		case a.Name != r.Temp:
			return hs.rename(f, r.Temp, ""), nil
		}
		return hs.move(f, spaceNode), nil
	case a.Name == r.Temp:
		if up {
			return hs.down(f), nil
		}
		if s := hs.restore(r, f); s != nil {
			return s, nil
		}
		return hs.rename(f, r.Name, fmt.Sprintf("; it waits as %s, restored and down, for a MoveOut once the name is free", r.Temp)), nil
	case a.Name != r.Name:
		// Named by the pod or the kernel: to the temporary name first, so
		// that the alias is cleared only under it.
		if up {
			return hs.down(f), nil
		}
		return hs.rename(f, r.Temp, ""), nil
	}
	// On the node under its own name.
	if up && r.Node.MAC != "" && r.Node.MAC != stateOf(a).MAC {
		return hs.down(f), nil // drivers refuse a new address while up
	}
	if s := hs.restore(r, f); s != nil {
		return s, nil
	}
	switch {
	case r.Node.Up && !up:
		return hs.up(f), nil
	case !r.Node.Up && up:
		return hs.down(f), nil
	}
	return nil, nil
}
