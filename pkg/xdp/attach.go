package xdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/bpf"
)

// Mode is where an XDP program runs.
type Mode int

const (
	// ModeNone: no program attached (only in Attached).
	ModeNone Mode = iota
	// ModeAuto asks Attach for native mode, else generic.
	ModeAuto
	// ModeNative runs the program in the driver (XDP_FLAGS_DRV_MODE).
	ModeNative
	// ModeGeneric runs it after the skb is built (XDP_FLAGS_SKB_MODE).
	ModeGeneric
	// ModeOffload runs it on the NIC (only reported).
	ModeOffload
)

func (m Mode) String() string {
	switch m {
	case ModeNone:
		return "none"
	case ModeAuto:
		return "auto"
	case ModeNative:
		return "native"
	case ModeGeneric:
		return "generic"
	case ModeOffload:
		return "offload"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

func (m Mode) flags() (uint32, error) {
	switch m {
	case ModeNative:
		return unix.XDP_FLAGS_DRV_MODE, nil
	case ModeGeneric:
		return unix.XDP_FLAGS_SKB_MODE, nil
	}
	return 0, fmt.Errorf("mode %v cannot be attached", m)
}

// ErrOccupied is returned by Attach when the netdev has an XDP program
// already: xdpq never replaces one.
var ErrOccupied = errors.New("netdev has an XDP program already")

// Attach attaches prog to the netdev ifindex in the network namespace at
// netns ("" for the caller's) and returns the mode it got. ModeAuto tries
// native, then generic when the driver has no native XDP. A program that
// is already attached, in any mode, is never replaced: Attach fails with
// ErrOccupied.
func Attach(netns string, ifindex int, prog *ebpf.Program, mode Mode) (Mode, error) {
	try := []Mode{mode}
	if mode == ModeAuto {
		try = []Mode{ModeNative, ModeGeneric}
	}
	var err error
	for _, m := range try {
		err = inNetNS(netns, func() error {
			return setXDP(ifindex, prog.FD(), -1, m, unix.XDP_FLAGS_UPDATE_IF_NOEXIST)
		})
		switch {
		case err == nil:
			return m, nil
		case errors.Is(err, unix.EBUSY), errors.Is(err, unix.EEXIST):
			return ModeNone, fmt.Errorf("attach xdp to ifindex %d (%v): %w", ifindex, m, ErrOccupied)
		case mode == ModeAuto && errors.Is(err, unix.EOPNOTSUPP):
			continue
		}
		return ModeNone, fmt.Errorf("attach xdp to ifindex %d (%v): %w", ifindex, m, err)
	}
	return ModeNone, fmt.Errorf("attach xdp to ifindex %d: %w", ifindex, err)
}

// Detach removes the program attached in mode from ifindex. With expected
// set, it removes only that program: when another is attached, it fails
// with ErrOccupied and leaves it alone. Detaching from a netdev without a
// program is not an error.
func Detach(netns string, ifindex int, mode Mode, expected *ebpf.Program) error {
	flags := uint32(0)
	expectedFD := -1
	if expected != nil {
		flags |= unix.XDP_FLAGS_REPLACE
		expectedFD = expected.FD()
	}
	err := inNetNS(netns, func() error { return setXDP(ifindex, -1, expectedFD, mode, flags) })
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("detach xdp from ifindex %d (%v): another program is attached: %w", ifindex, mode, ErrOccupied)
	}
	if err != nil {
		return fmt.Errorf("detach xdp from ifindex %d (%v): %w", ifindex, mode, err)
	}
	return nil
}

// Replace puts prog in place of expected, attached in mode to ifindex, in
// one step: no frame sees the netdev without a program. When expected is
// no longer the program attached (another took its place), it fails with
// ErrOccupied and changes nothing. A program attached through a bpf_link
// is replaced with the link's Update instead.
func Replace(netns string, ifindex int, mode Mode, prog, expected *ebpf.Program) error {
	err := inNetNS(netns, func() error {
		return setXDP(ifindex, prog.FD(), expected.FD(), mode, unix.XDP_FLAGS_REPLACE)
	})
	if errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("replace xdp on ifindex %d (%v): another program is attached: %w", ifindex, mode, ErrOccupied)
	}
	if err != nil {
		return fmt.Errorf("replace xdp on ifindex %d (%v): %w", ifindex, mode, err)
	}
	return nil
}

// Attached describes the XDP program on a netdev.
type Attached struct {
	ID   ebpf.ProgramID
	Mode Mode
	Name string
	Tag  string
	// Ours is true when the program is xdpq's direct or filter program
	// (by name and instruction tag), whoever loaded it; Kind says which.
	Ours bool
	Kind Kind
	// Outdated is true for xdpq's program as an earlier version built it
	// (the direct program before it counted frames), which a daemon of
	// that version left attached: Ours, and to be replaced by the
	// program of its kind as Load gives it now.
	Outdated bool
}

// Query reports the XDP program attached to ifindex, or nil for none.
// When programs are attached in more than one mode, it reports the native
// one.
func Query(netns string, ifindex int) (*Attached, error) {
	var st xdpState
	err := inNetNS(netns, func() (err error) {
		st, err = getXDP(ifindex)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("query xdp on ifindex %d: %w", ifindex, err)
	}
	a := &Attached{}
	switch {
	case st.drvID != 0:
		a.ID, a.Mode = ebpf.ProgramID(st.drvID), ModeNative
	case st.skbID != 0:
		a.ID, a.Mode = ebpf.ProgramID(st.skbID), ModeGeneric
	case st.hwID != 0:
		a.ID, a.Mode = ebpf.ProgramID(st.hwID), ModeOffload
	default:
		return nil, nil
	}
	prog, err := ebpf.NewProgramFromID(a.ID)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil // detached and freed since the dump
	}
	if err != nil {
		return nil, fmt.Errorf("query xdp on ifindex %d: program %d: %w", ifindex, a.ID, err)
	}
	defer func() { _ = prog.Close() }() // a handle on a kernel object: closing drops our reference only
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("query xdp on ifindex %d: program %d info: %w", ifindex, a.ID, err)
	}
	a.Name, a.Tag = info.Name, info.Tag
	tags, err := ourTags()
	if err != nil {
		return nil, err
	}
	a.Kind, a.Outdated, a.Ours = tags.lookup(a.Name, a.Tag)
	return a, nil
}

type progID struct {
	name, tag string
	kind      Kind
	outdated  bool // an earlier version's build
}

// knownPrograms are xdpq's programs, those of this version and of
// earlier ones, by name and instruction tag.
type knownPrograms []progID

// lookup tells which of xdpq's programs the one of name and tag is.
func (k knownPrograms) lookup(name, tag string) (kind Kind, outdated, ok bool) {
	for _, p := range k {
		if p.name == name && p.tag == tag {
			return p.kind, p.outdated, true
		}
	}
	return Kind(-1), false, false
}

// ourTags are the names and instruction tags of xdpq's programs, of this
// version and the earlier direct program (bpf.LoadDirectV0). The tag of a
// spec is not the kernel's until map loads are resolved, so it is read
// from a copy loaded once. Map sizes do not change it.
var ourTags = sync.OnceValues(func() (knownPrograms, error) {
	var out knownPrograms
	for _, k := range []Kind{Direct, Filter} {
		p, err := Load(k, LoadOptions{Queues: 1, MaxFlows: 1})
		if err != nil {
			return nil, fmt.Errorf("learn the tag of the %v program: %w", k, err)
		}
		info, err := p.prog.Info()
		_ = p.Close() // a copy loaded for its tag, never attached or pinned
		if err != nil {
			return nil, fmt.Errorf("learn the tag of the %v program: %w", k, err)
		}
		out = append(out, progID{info.Name, info.Tag, k, false})
	}
	v0, err := loadDirectV0()
	if err != nil {
		return nil, fmt.Errorf("learn the tag of the earlier direct program: %w", err)
	}
	info, err := v0.Info()
	_ = v0.Close() // a copy loaded for its tag, never attached or pinned
	if err != nil {
		return nil, fmt.Errorf("learn the tag of the earlier direct program: %w", err)
	}
	return append(out, progID{info.Name, info.Tag, Direct, true}), nil
})

// loadDirectV0 loads the direct program of earlier versions (without
// BPF_F_XDP_HAS_FRAGS: the tag is the instructions' alone).
func loadDirectV0() (*ebpf.Program, error) {
	cs, err := bpf.LoadDirectV0()
	if err != nil {
		return nil, err
	}
	for _, ps := range cs.Programs {
		ps.Flags &^= unix.BPF_F_XDP_HAS_FRAGS
	}
	cs.Maps["xsks"].Key, cs.Maps["xsks"].Value = nil, nil
	coll, err := ebpf.NewCollection(cs)
	if err != nil {
		return nil, err
	}
	defer coll.Close()
	return coll.DetachProgram(DirectName), nil
}

func inNetNS(path string, f func() error) error {
	if path == "" {
		return f()
	}
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return f() })
}

// setXDP sends RTM_SETLINK with IFLA_XDP { FD, FLAGS, EXPECTED_FD }.
func setXDP(ifindex, fd, expectedFD int, mode Mode, flags uint32) error {
	mf, err := mode.flags()
	if err != nil {
		return err
	}
	flags |= mf
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	attr := nl.NewRtAttr(unix.IFLA_XDP|unix.NLA_F_NESTED, nil)
	attr.AddRtAttr(unix.IFLA_XDP_FD, u32(uint32(int32(fd))))
	attr.AddRtAttr(unix.IFLA_XDP_FLAGS, u32(flags))
	if flags&unix.XDP_FLAGS_REPLACE != 0 {
		attr.AddRtAttr(unix.IFLA_XDP_EXPECTED_FD, u32(uint32(int32(expectedFD))))
	}
	req.AddData(attr)
	_, err = req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

type xdpState struct {
	attached           uint8
	drvID, skbID, hwID uint32
}

func getXDP(ifindex int) (xdpState, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return xdpState{}, err
	}
	if len(msgs) != 1 || len(msgs[0]) < unix.SizeofIfInfomsg {
		return xdpState{}, fmt.Errorf("unexpected RTM_GETLINK reply (%d messages)", len(msgs))
	}
	return parseLinkXDP(msgs[0][unix.SizeofIfInfomsg:])
}

// parseLinkXDP reads IFLA_XDP out of a link message's attributes.
func parseLinkXDP(b []byte) (xdpState, error) {
	var st xdpState
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return st, fmt.Errorf("parse link attributes: %w", err)
	}
	for _, a := range attrs {
		if a.Attr.Type&^unix.NLA_F_NESTED != unix.IFLA_XDP {
			continue
		}
		inner, err := nl.ParseRouteAttr(a.Value)
		if err != nil {
			return st, fmt.Errorf("parse IFLA_XDP: %w", err)
		}
		var single uint32
		for _, x := range inner {
			switch x.Attr.Type {
			case unix.IFLA_XDP_ATTACHED:
				if len(x.Value) >= 1 {
					st.attached = x.Value[0]
				}
			case unix.IFLA_XDP_PROG_ID:
				single = le32(x.Value)
			case unix.IFLA_XDP_DRV_PROG_ID:
				st.drvID = le32(x.Value)
			case unix.IFLA_XDP_SKB_PROG_ID:
				st.skbID = le32(x.Value)
			case unix.IFLA_XDP_HW_PROG_ID:
				st.hwID = le32(x.Value)
			}
		}
		// With one program the kernel sends only IFLA_XDP_PROG_ID.
		switch st.attached {
		case nl.XDP_ATTACHED_DRV:
			st.drvID = single
		case nl.XDP_ATTACHED_SKB:
			st.skbID = single
		case nl.XDP_ATTACHED_HW:
			st.hwID = single
		}
	}
	return st, nil
}

func u32(v uint32) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, v)
	return b
}

func le32(b []byte) uint32 {
	if len(b) < 4 {
		return 0
	}
	return binary.NativeEndian.Uint32(b)
}

// AttachLink attaches prog through a bpf_link (BPF_LINK_CREATE) instead of
// netlink. While the link exists the kernel refuses any other XDP program
// on the netdev, even one attached with force; closing the last reference
// to the link (its fd, or its pin) detaches the program. ModeAuto tries
// native, then generic.
func AttachLink(netns string, ifindex int, prog *ebpf.Program, mode Mode) (link.Link, Mode, error) {
	try := []Mode{mode}
	if mode == ModeAuto {
		try = []Mode{ModeNative, ModeGeneric}
	}
	var err error
	for _, m := range try {
		flags := link.XDPDriverMode
		if m == ModeGeneric {
			flags = link.XDPGenericMode
		} else if m != ModeNative {
			return nil, ModeNone, fmt.Errorf("attach link to ifindex %d: mode %v cannot be attached", ifindex, m)
		}
		var l link.Link
		err = inNetNS(netns, func() (err error) {
			l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: flags})
			return err
		})
		switch {
		case err == nil:
			return l, m, nil
		case errors.Is(err, unix.EBUSY), errors.Is(err, unix.EEXIST):
			return nil, ModeNone, fmt.Errorf("attach link to ifindex %d (%v): %w", ifindex, m, ErrOccupied)
		case mode == ModeAuto && errors.Is(err, unix.EOPNOTSUPP):
			continue
		}
		return nil, ModeNone, fmt.Errorf("attach link to ifindex %d (%v): %w", ifindex, m, err)
	}
	return nil, ModeNone, fmt.Errorf("attach link to ifindex %d: %w", ifindex, err)
}
