package xdp

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/bpf"
)

// Kind says which of xdpq's programs a Program is.
type Kind int

const (
	// Direct redirects every frame to the socket of its queue.
	Direct Kind = iota
	// Filter redirects only frames of flows in its flow map.
	Filter
)

func (k Kind) String() string {
	switch k {
	case Direct:
		return "direct"
	case Filter:
		return "filter"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Program names as the kernel reports them.
const (
	DirectName = "xdpq_direct"
	FilterName = "xdpq_filter"
)

// DefaultMaxFlows is the size of the filter program's flow map.
const DefaultMaxFlows = 4096

// LoadOptions size a program's maps at load time.
type LoadOptions struct {
	// Queues is the netdev's queue count: the size of the XSKMAP and the
	// counters. Required.
	Queues int
	// MaxFlows sizes the filter program's flow map; 0 means DefaultMaxFlows.
	MaxFlows int

	// noFrags loads the program without BPF_F_XDP_HAS_FRAGS, as on a
	// kernel that does not take the flag (tests).
	noFrags bool
}

// haveFrags says whether the kernel takes XDP programs that handle
// multi-buffer frames (BPF_F_XDP_HAS_FRAGS, Linux 5.18). xdpq's programs
// are built for it (section xdp.frags); a kernel without it refuses the
// flag (EINVAL), so there they are loaded without it: they work as they
// did before jumbo frames, and a netdev whose MTU does not fit one buffer
// refuses them (ERANGE on veth).
var haveFrags = sync.OnceValue(func() bool {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL", Flags: unix.BPF_F_XDP_HAS_FRAGS,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()}})
	if err != nil {
		return !errors.Is(err, unix.EINVAL) // another error (EPERM) is the real load's to report
	}
	_ = p.Close() // a probe, never attached or pinned
	return true
})

// Program is a loaded direct or filter program with its maps.
type Program struct {
	kind     Kind
	prog     *ebpf.Program
	xsks     *ebpf.Map
	flows    *ebpf.Map // Filter only
	counters *ebpf.Map // nil only for an earlier version's direct program (Open)
	pinDir   string    // where the maps are pinned, if they are
}

func spec(kind Kind) (*ebpf.CollectionSpec, string, error) {
	switch kind {
	case Direct:
		s, err := bpf.LoadDirect()
		return s, DirectName, err
	case Filter:
		s, err := bpf.LoadFilter()
		return s, FilterName, err
	}
	return nil, "", fmt.Errorf("unknown program kind %d", int(kind))
}

// Load loads the program of the given kind with its maps sized by opts.
func Load(kind Kind, opts LoadOptions) (*Program, error) {
	return load(kind, opts, nil)
}

// ErrPinsIncompatible is returned by LoadPinned when a map pinned in the
// directory does not fit the program (sized for a different queue count,
// or not one of xdpq's maps).
var ErrPinsIncompatible = errors.New("pinned maps do not fit the program")

// LoadPinned loads the program of the given kind on the maps pinned in
// dir and pins there the maps it had to create. A program loaded this way
// by a restarted process shares the XSKMAP (and the sockets in it), the
// flows and the counters of the one loaded before.
//
// Both kinds have the same XSKMAP and counter map, so those pins are taken
// whichever kind pinned them: a netdev whose program changes kind keeps
// its sockets and its counts. The filter program takes the pinned flow
// map; the direct program has none, so its pin is removed.
func LoadPinned(kind Kind, dir string, opts LoadOptions) (*Program, error) {
	names := []string{"xsks", "flows", "counters"}
	pinned := map[string]*ebpf.Map{}
	defer func() {
		for _, m := range pinned {
			_ = m.Close() // the program holds its own references; this drops ours only
		}
	}()
	for _, n := range names {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, n), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("load pinned %s map: %w", n, err)
		}
		pinned[n] = m
	}
	if m := pinned["flows"]; m != nil && kind == Direct {
		_ = m.Close() // a handle on a kernel object: closing drops our reference only; its pin is removed next
		delete(pinned, "flows")
		if err := os.Remove(filepath.Join(dir, "flows")); err != nil {
			return nil, fmt.Errorf("remove the pin of the unused flows map: %w", err)
		}
	}
	p, err := load(kind, opts, pinned)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return nil, fmt.Errorf("load %s program from %s: %w: %w", kind, dir, ErrPinsIncompatible, err)
	}
	if err != nil {
		return nil, err
	}
	if err := p.Pin(dir); err != nil {
		_ = p.Close() // never attached; the pin's error is the one to tell
		return nil, err
	}
	return p, nil
}

// LoadWith loads the program of the given kind on the maps given by name
// ("xsks", "counters", and for the filter program "flows"), creating the
// others. Loading the other kind on a program's XSKMAP gives a program
// that can replace it on the netdev (see Replace) without a socket
// noticing; on its counter map too, the counts go on.
func LoadWith(kind Kind, opts LoadOptions, maps map[string]*ebpf.Map) (*Program, error) {
	for n := range maps {
		if n != "xsks" && n != "counters" && (kind != Filter || n != "flows") {
			return nil, fmt.Errorf("load %s program: it has no %s map", kind, n)
		}
	}
	p, err := load(kind, opts, maps)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return nil, fmt.Errorf("load %s program: %w: %w", kind, ErrPinsIncompatible, err)
	}
	return p, err
}

// Open returns the loaded xdpq program with the given id, with its maps,
// as a Program: a process that lost the pins of a program still attached
// to a netdev (bpffs not persisted, another pin directory) takes it back
// this way and pins its maps again. A program that is not xdpq's (by name
// and instruction tag) is an error. The direct program of an earlier
// version (Attached.Outdated) has no counter map: Counters fails.
func Open(id ebpf.ProgramID) (*Program, error) {
	prog, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return nil, fmt.Errorf("open program %d: %w", id, err)
	}
	p := &Program{prog: prog}
	ok := false
	defer func() {
		if !ok {
			_ = p.Close() // our handles on a program attached elsewhere: it lives on
		}
	}()
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("open program %d: info: %w", id, err)
	}
	tags, err := ourTags()
	if err != nil {
		return nil, err
	}
	kind, _, found := tags.lookup(info.Name, info.Tag)
	if !found {
		return nil, fmt.Errorf("open program %d: %q (tag %s) is not an xdpq program", id, info.Name, info.Tag)
	}
	p.kind = kind
	ids, ok2 := info.MapIDs()
	if !ok2 {
		return nil, fmt.Errorf("open program %d: the kernel does not report a program's maps", id)
	}
	for _, mid := range ids {
		m, err := ebpf.NewMapFromID(mid)
		if err != nil {
			return nil, fmt.Errorf("open program %d: map %d: %w", id, mid, err)
		}
		mi, err := m.Info()
		if err != nil {
			_ = m.Close() // a handle on a kernel object: closing drops our reference only
			return nil, fmt.Errorf("open program %d: map %d info: %w", id, mid, err)
		}
		slot := map[string]**ebpf.Map{"xsks": &p.xsks, "flows": &p.flows, "counters": &p.counters}[mi.Name]
		if slot == nil || *slot != nil {
			_ = m.Close() // not one of the program's named maps (.rodata, say); the program keeps it
			continue
		}
		*slot = m
	}
	if p.xsks == nil || kind == Filter && (p.flows == nil || p.counters == nil) {
		return nil, fmt.Errorf("open program %d: the %s program's maps are not all there", id, kind)
	}
	ok = true
	return p, nil
}

func load(kind Kind, opts LoadOptions, replace map[string]*ebpf.Map) (*Program, error) {
	if opts.Queues < 1 || opts.Queues > 1<<16 {
		return nil, fmt.Errorf("load %s program: queue count %d out of range 1..65536", kind, opts.Queues)
	}
	cs, name, err := spec(kind)
	if err != nil {
		return nil, fmt.Errorf("load %s program: %w", kind, err)
	}
	if opts.noFrags || !haveFrags() {
		for _, ps := range cs.Programs {
			ps.Flags &^= unix.BPF_F_XDP_HAS_FRAGS
		}
	}
	cs.Maps["xsks"].MaxEntries = uint32(opts.Queues)
	// The kernel takes no BTF for an XSKMAP's key and value: it refuses
	// the map with ENOTSUPP (after an RCU grace period, 10-20 ms) and
	// cilium/ebpf tries again without. Without BTF from the start, a
	// program loads in 1 ms instead of 14: it counts on 64 netdevs.
	cs.Maps["xsks"].Key, cs.Maps["xsks"].Value = nil, nil
	cs.Maps["counters"].MaxEntries = uint32(opts.Queues)
	if kind == Filter {
		if opts.MaxFlows > 0 {
			cs.Maps["flows"].MaxEntries = uint32(opts.MaxFlows)
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(cs, ebpf.CollectionOptions{MapReplacements: replace})
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load %s program: %+v", kind, ve)
		}
		return nil, fmt.Errorf("load %s program: %w", kind, err)
	}
	p := &Program{
		kind:     kind,
		prog:     coll.DetachProgram(name),
		xsks:     coll.DetachMap("xsks"),
		flows:    coll.DetachMap("flows"),
		counters: coll.DetachMap("counters"),
	}
	coll.Close()
	return p, nil
}

// Kind returns the program's kind.
func (p *Program) Kind() Kind { return p.kind }

// Prog returns the loaded program, for Attach.
func (p *Program) Prog() *ebpf.Program { return p.prog }

// XSKMap returns the program's XSKMAP (queue index to socket).
func (p *Program) XSKMap() *ebpf.Map { return p.xsks }

// CounterMap returns the program's per-queue counters (nil for an earlier
// version's direct program), to load the other kind on (LoadWith).
func (p *Program) CounterMap() *ebpf.Map { return p.counters }

// SetSocket puts the AF_XDP socket fd at the queue's slot of the XSKMAP;
// from then on frames the program redirects on that queue go to it.
func (p *Program) SetSocket(queue uint32, fd int) error {
	if err := p.xsks.Update(queue, uint32(fd), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("xskmap: set queue %d: %w", queue, err)
	}
	return nil
}

// DeleteSocket empties the queue's slot of the XSKMAP. An empty slot is
// not an error. The kernel also empties the slot when the socket closes.
func (p *Program) DeleteSocket(queue uint32) error {
	if err := p.xsks.Delete(queue); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("xskmap: delete queue %d: %w", queue, err)
	}
	return nil
}

// Protocol is an L4 protocol a flow matches.
type Protocol uint8

// Protocols the filter program matches.
const (
	TCP Protocol = 6
	UDP Protocol = 17
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	}
	return fmt.Sprintf("proto %d", uint8(p))
}

// Flow is what the filter program matches: frames on Queue, with VLAN id
// VLAN (0: untagged), of Protocol to Dst, port Port (0: any port).
type Flow struct {
	Queue    uint32
	VLAN     uint16
	Protocol Protocol
	Dst      netip.Addr
	Port     uint16
}

func (f Flow) String() string {
	s := fmt.Sprintf("q%d %s %s", f.Queue, f.Protocol, netip.AddrPortFrom(f.Dst, f.Port))
	if f.VLAN != 0 {
		s += fmt.Sprintf(" vlan %d", f.VLAN)
	}
	return s
}

func (f Flow) key() (bpf.FilterXdpqFlow, error) {
	var k bpf.FilterXdpqFlow
	if f.Protocol != TCP && f.Protocol != UDP {
		return k, fmt.Errorf("flow %v: protocol must be tcp or udp", f)
	}
	if f.VLAN > 4094 {
		return k, fmt.Errorf("flow %v: vlan %d out of range 0..4094", f, f.VLAN)
	}
	k.Queue, k.Vlan, k.Proto, k.Port = f.Queue, f.VLAN, uint8(f.Protocol), f.Port
	switch {
	case f.Dst.Is4() || f.Dst.Is4In6():
		k.Family = 4
		a := f.Dst.Unmap().As4()
		copy(k.Addr[:], a[:])
	case f.Dst.Is6():
		k.Family = 6
		k.Addr = f.Dst.As16()
	default:
		return k, fmt.Errorf("flow %v: no destination address", f)
	}
	return k, nil
}

// flowOfKey is the flow of a flow map key, as key made it.
func flowOfKey(k bpf.FilterXdpqFlow) Flow {
	f := Flow{Queue: k.Queue, VLAN: k.Vlan, Protocol: Protocol(k.Proto), Port: k.Port}
	if k.Family == 4 {
		f.Dst = netip.AddrFrom4([4]byte(k.Addr[:4]))
	} else {
		f.Dst = netip.AddrFrom16(k.Addr)
	}
	return f
}

// AddFlow steers f to its queue's socket. cookie is stored with the flow
// for its owner's bookkeeping.
func (p *Program) AddFlow(f Flow, cookie uint32) error {
	if p.flows == nil {
		return fmt.Errorf("add flow %v: the %s program has no flow map", f, p.kind)
	}
	k, err := f.key()
	if err != nil {
		return err
	}
	if err := p.flows.Update(&k, cookie, ebpf.UpdateAny); err != nil {
		if errors.Is(err, unix.E2BIG) {
			// The kernel's word for a hash map with no free entry.
			return fmt.Errorf("add flow %v: the flow map is full (%d entries, a flow takes one per queue): %w", f, p.flows.MaxEntries(), ErrFlowMapFull)
		}
		return fmt.Errorf("add flow %v: %w", f, err)
	}
	return nil
}

// ErrFlowMapFull is returned by AddFlow when the filter's flow map has no
// room left.
var ErrFlowMapFull = errors.New("flow map full")

// DeleteFlow removes f; a flow that is not there is not an error.
func (p *Program) DeleteFlow(f Flow) error {
	if p.flows == nil {
		return fmt.Errorf("delete flow %v: the %s program has no flow map", f, p.kind)
	}
	k, err := f.key()
	if err != nil {
		return err
	}
	if err := p.flows.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete flow %v: %w", f, err)
	}
	return nil
}

// Counters are a program's per-queue counters, summed over CPUs.
type Counters struct {
	// Redirected frames were handed to the queue's socket (the filter:
	// of a flow in its map).
	Redirected uint64
	// Passed frames were given to the kernel: the filter's matched no
	// flow, the direct program's arrived on a queue without a socket.
	Passed uint64
	// RedirectFailed frames (the filter's only) matched a flow of a
	// queue that had no socket; they went to the kernel too.
	RedirectFailed uint64
}

// Both programs count in the same layout: a conversion compiles only
// while their generated types are the same.
var _ = bpf.FilterXdpqCounters(bpf.DirectXdpqCounters{})

// Counters returns the queue's counters.
func (p *Program) Counters(queue uint32) (Counters, error) {
	if p.counters == nil {
		return Counters{}, fmt.Errorf("counters q%d: the %s program has none", queue, p.kind)
	}
	var per []bpf.FilterXdpqCounters
	if err := p.counters.Lookup(queue, &per); err != nil {
		return Counters{}, fmt.Errorf("counters q%d: %w", queue, err)
	}
	var c Counters
	for _, v := range per {
		c.Redirected += v.Redirected
		c.Passed += v.Passed
		c.RedirectFailed += v.RedirectFailed
	}
	return c, nil
}

// Pin pins the program's maps in dir (on a bpffs), creating it: the
// XSKMAP as dir/xsks, the counters as dir/counters, and the filter
// program's flows as dir/flows. Another program (an operator's own) can redirect into a
// pinned XSKMAP. A pin that is there already is kept when it is the same
// map, and is an error when it is another.
func (p *Program) Pin(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pin maps: %w", err)
	}
	for name, m := range p.maps() {
		path := filepath.Join(dir, name)
		err := m.Pin(path)
		if errors.Is(err, os.ErrExist) {
			err = samePin(path, m)
		}
		if err != nil {
			return fmt.Errorf("pin %s map: %w", name, err)
		}
	}
	p.pinDir = dir
	return nil
}

// samePin tells (with a nil error) that the map pinned at path is m.
func samePin(path string, m *ebpf.Map) error {
	pinned, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return err
	}
	defer func() { _ = pinned.Close() }() // a handle on a kernel object: closing drops our reference only; the pin stays
	a, err := mapID(pinned)
	if err != nil {
		return err
	}
	b, err := mapID(m)
	if err != nil {
		return err
	}
	if a != b {
		return fmt.Errorf("%s holds another map (id %d, not %d): %w", path, a, b, os.ErrExist)
	}
	return nil
}

func mapID(m *ebpf.Map) (ebpf.MapID, error) {
	mi, err := m.Info()
	if err != nil {
		return 0, fmt.Errorf("map info: %w", err)
	}
	id, ok := mi.ID()
	if !ok {
		return 0, errors.New("the kernel does not report map ids")
	}
	return id, nil
}

func (p *Program) maps() map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{"xsks": p.xsks}
	if p.flows != nil {
		out["flows"] = p.flows
	}
	if p.counters != nil {
		out["counters"] = p.counters
	}
	return out
}

// Unpin removes the pins of the program's maps, made by Pin or found by
// LoadPinned.
func (p *Program) Unpin() error {
	if p.pinDir == "" {
		return nil
	}
	var errs []error
	for name := range p.maps() {
		if err := os.Remove(filepath.Join(p.pinDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s map: %w", name, err))
		}
	}
	p.pinDir = ""
	return errors.Join(errs...)
}

// Close releases the program and its maps. What is attached or pinned
// stays in the kernel.
func (p *Program) Close() error {
	var errs []error
	if p.prog != nil {
		errs = append(errs, p.prog.Close())
	}
	for _, m := range []*ebpf.Map{p.xsks, p.flows, p.counters} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// UsesMap reports whether prog uses the map m (by map id).
func UsesMap(prog *ebpf.Program, m *ebpf.Map) (bool, error) {
	pi, err := prog.Info()
	if err != nil {
		return false, fmt.Errorf("program info: %w", err)
	}
	ids, ok := pi.MapIDs()
	if !ok {
		return false, errors.New("the kernel does not report a program's maps")
	}
	id, err := mapID(m)
	if err != nil {
		return false, err
	}
	return slices.Contains(ids, id), nil
}

// Flows returns the filter program's flows with their cookies.
func (p *Program) Flows() (map[Flow]uint32, error) {
	if p.flows == nil {
		return nil, fmt.Errorf("list flows: the %s program has no flow map", p.kind)
	}
	out := map[Flow]uint32{}
	var k bpf.FilterXdpqFlow
	var cookie uint32
	it := p.flows.Iterate()
	for it.Next(&k, &cookie) {
		out[flowOfKey(k)] = cookie
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list flows: %w", err)
	}
	return out, nil
}
