package agent

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/xdpq/xdpq/pkg/ethtool"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// Steering says how a netdev's flows reach their queues.
type Steering string

// Steering modes of a pool.
const (
	// SteerAuto uses ntuple rules where the NIC has them, else software.
	SteerAuto Steering = "auto"
	// SteerHardware uses ntuple rules and the direct program; a NIC without
	// ntuple rules is an error.
	SteerHardware Steering = "hardware"
	// SteerSoftware uses the filter program's flow map.
	SteerSoftware Steering = "software"
)

// RuleRange is the block of ntuple rule locations xdpq owns on a NIC.
// xdpq never touches a rule outside it.
type RuleRange struct {
	First, Count uint32
}

// DefaultRules is the rule range used when a policy names none.
var DefaultRules = RuleRange{First: 0, Count: 256}

// NtupleDevice is what steering needs of a NIC; *ethtool.Handle is one.
type NtupleDevice interface {
	RuleTable(ifname string) (size uint32, special bool, err error)
	AddRule(ifname string, r ethtool.Rule) error
	DeleteRule(ifname string, loc uint32) error
	Rules(ifname string) ([]ethtool.Rule, error)
	Indirection(ifname string) ([]uint32, error)
	SetIndirection(ifname string, table []uint32) error
	Channels(ifname string) (ethtool.Channels, error)
	CreateRSSContext(ifname string, queues []uint32) (uint32, error)
	DeleteRSSContext(ifname string, ctx uint32) error
}

var _ NtupleDevice = (*ethtool.Handle)(nil)

// Flow is traffic a pod wants on one of its queues.
type Flow struct {
	Protocol xdp.Protocol // TCP or UDP
	Dst      netip.Prefix // a destination address (software steering) or prefix
	DstPort  uint16       // 0: any port
	Src      netip.Prefix // hardware steering only; zero: any
	SrcPort  uint16       // hardware steering only; 0: any
	VLAN     uint16       // 0: untagged (software) or any (hardware)
	// Queues receive the flow. With several, hardware steering spreads the
	// flow over them with an RSS context; software steering takes the
	// flow on whichever of them the NIC's RSS delivers it to.
	Queues []uint32
}

func (f Flow) String() string {
	s := fmt.Sprintf("%v %v port %d", f.Protocol, f.Dst, f.DstPort)
	if f.Src.IsValid() || f.SrcPort != 0 {
		s += fmt.Sprintf(" from %v port %d", f.Src, f.SrcPort)
	}
	if f.VLAN != 0 {
		s += fmt.Sprintf(" vlan %d", f.VLAN)
	}
	return s + fmt.Sprintf(" -> queues %v", f.Queues)
}

// overlaps reports whether some frame could match both flows.
func (f Flow) overlaps(g Flow) bool {
	anyOr := func(a, b uint16) bool { return a == 0 || b == 0 || a == b }
	prefixes := func(a, b netip.Prefix) bool { return !a.IsValid() || !b.IsValid() || a.Overlaps(b) }
	return f.Protocol == g.Protocol && anyOr(f.VLAN, g.VLAN) && anyOr(f.DstPort, g.DstPort) &&
		anyOr(f.SrcPort, g.SrcPort) && prefixes(f.Dst, g.Dst) && prefixes(f.Src, g.Src)
}

// rule is f as an ntuple rule at loc, to its queue or to RSS context ctx.
func (f Flow) rule(loc, ctx uint32) (ethtool.Rule, error) {
	r := ethtool.Rule{Location: loc, Dst: f.Dst, Src: f.Src, DstPort: f.DstPort, SrcPort: f.SrcPort,
		VLAN: f.VLAN, RSSContext: ctx}
	if ctx == 0 {
		r.Queue = f.Queues[0]
	}
	v6 := f.Dst.Addr().Is6()
	switch {
	case f.Protocol == xdp.UDP && !v6:
		r.Type = ethtool.UDP4
	case f.Protocol == xdp.TCP && !v6:
		r.Type = ethtool.TCP4
	case f.Protocol == xdp.UDP:
		r.Type = ethtool.UDP6
	case f.Protocol == xdp.TCP:
		r.Type = ethtool.TCP6
	default:
		return r, fmt.Errorf("flow %v: protocol must be tcp or udp", f)
	}
	return r, nil
}

// softFlows is the filter program's form of f, one entry per queue.
func (f Flow) softFlows() ([]xdp.Flow, error) {
	if f.Src.IsValid() || f.SrcPort != 0 {
		return nil, fmt.Errorf("flow %v: software steering matches destination address and port only, not the source", f)
	}
	if !f.Dst.IsSingleIP() {
		return nil, fmt.Errorf("flow %v: software steering needs one destination address, not a prefix", f)
	}
	var out []xdp.Flow
	for _, q := range f.Queues {
		out = append(out, xdp.Flow{Queue: q, VLAN: f.VLAN, Protocol: f.Protocol, Dst: f.Dst.Addr(), Port: f.DstPort})
	}
	return out, nil
}

func (f Flow) validate(queues int) error {
	if f.Protocol != xdp.TCP && f.Protocol != xdp.UDP {
		return fmt.Errorf("flow %v: protocol must be tcp or udp", f)
	}
	if !f.Dst.IsValid() {
		return fmt.Errorf("flow %v: no destination address", f)
	}
	if f.Src.IsValid() && f.Src.Addr().Is4() != f.Dst.Addr().Is4() {
		return fmt.Errorf("flow %v: source and destination of different IP versions", f)
	}
	if f.VLAN > 4094 {
		return fmt.Errorf("flow %v: vlan out of range 1..4094", f)
	}
	if len(f.Queues) == 0 {
		return fmt.Errorf("flow %v: no queue", f)
	}
	for i, q := range f.Queues {
		if int(q) >= queues {
			return fmt.Errorf("flow %v: the netdev has %d queues", f, queues)
		}
		if slices.Contains(f.Queues[:i], q) {
			return fmt.Errorf("flow %v: queue %d given twice", f, q)
		}
	}
	return nil
}

type installed struct {
	flow Flow
	loc  uint32 // hardware steering
	ctx  uint32 // hardware steering: the flow's RSS context, 0 for none
}

// steering holds what xdpq installed on one netdev, by owner.
type steering struct {
	mode   Steering // resolved: hardware or software
	dev    NtupleDevice
	ifname string
	rules  RuleRange
	prog   *xdp.Program
	queues int
	owners map[string][]installed
	// unknown are flows xdpq installed that no owner claimed when
	// AdoptSteering took the others: they keep their place (a rule
	// location, a flow map entry) until a SyncSteering removes them.
	unknown []installed
}

func (s *steering) inRange(loc uint32) bool {
	return loc >= s.rules.First && uint64(loc) < uint64(s.rules.First)+uint64(s.rules.Count)
}

func (s *steering) count() int {
	n := 0
	for _, fs := range s.owners {
		n += len(fs)
	}
	return n
}

func (s *steering) usedLocs() map[uint32]bool {
	used := map[uint32]bool{}
	for _, fs := range s.owners {
		for _, f := range fs {
			used[f.loc] = true
		}
	}
	for _, f := range s.unknown {
		used[f.loc] = true
	}
	return used
}

// Errors a refused flow wraps, beside its reason.
var (
	// ErrFlowInvalid: the flow is not one the netdev's steering can take
	// (a prefix or a source under software steering, a queue the netdev
	// lacks).
	ErrFlowInvalid = errors.New("flow not steerable")
	// ErrFlowConflict: the flow overlaps another owner's.
	ErrFlowConflict = errors.New("flow overlaps another's")
	// ErrFlowsFull: the netdev has no room for more flows (its rule
	// locations, the filter's flow map).
	ErrFlowsFull = errors.New("no room for more flows")
)

// add installs the owner's flows, all or none.
//
// A rollback that cannot remove what it installed says so with the error,
// and keeps what is left as flows of no owner (unknown): they hold their
// places until a SyncSteering settles them.
func (s *steering) add(owner string, flows []Flow) (err error) {
	var undoErrs []error
	defer func() {
		if len(undoErrs) > 0 {
			err = errors.Join(err, fmt.Errorf("and undoing it: %w", errors.Join(undoErrs...)))
		}
	}()
	if owner == "" {
		return errors.New("steer: no owner")
	}
	for i, f := range flows {
		if err := f.validate(s.queues); err != nil {
			return fmt.Errorf("steer %s on %s: %w: %w", owner, s.ifname, ErrFlowInvalid, err)
		}
		if s.mode == SteerSoftware {
			if _, err := f.softFlows(); err != nil {
				return fmt.Errorf("steer %s on %s: %w: %w", owner, s.ifname, ErrFlowInvalid, err)
			}
		}
		for other, fs := range s.owners {
			if other == owner {
				continue
			}
			for _, g := range fs {
				if f.overlaps(g.flow) {
					return fmt.Errorf("steer %s on %s: flow %v overlaps flow %v of %s: %w", owner, s.ifname, f, g.flow, other, ErrFlowConflict)
				}
			}
		}
		for _, g := range s.unknown {
			if g.flow.Protocol != 0 && f.overlaps(g.flow) {
				return fmt.Errorf("steer %s on %s: flow %v overlaps flow %v, installed by a previous agent for an owner not known now: %w", owner, s.ifname, f, g.flow, ErrFlowConflict)
			}
		}
		for _, g := range flows[:i] {
			if f.overlaps(g) && !slices.Equal(f.Queues, g.Queues) {
				return fmt.Errorf("steer %s on %s: flows %v and %v overlap on different queues: %w", owner, s.ifname, g, f, ErrFlowInvalid)
			}
		}
	}
	var done []installed
	rollback := func() {
		for _, in := range done {
			if err := s.remove(in); err != nil {
				s.unknown = append(s.unknown, in)
				undoErrs = append(undoErrs, err)
			}
		}
	}
	used := s.usedLocs()
	next := s.rules.First
	for _, f := range flows {
		in := installed{flow: f}
		switch s.mode {
		case SteerHardware:
			for used[next] && s.inRange(next) {
				next++
			}
			if !s.inRange(next) {
				rollback()
				return fmt.Errorf("steer %s on %s: all %d rule locations from %d are in use: %w", owner, s.ifname, s.rules.Count, s.rules.First, ErrFlowsFull)
			}
			if len(f.Queues) > 1 {
				ctx, err := s.dev.CreateRSSContext(s.ifname, f.Queues)
				if err != nil {
					rollback()
					if errors.Is(err, ethtool.ErrNotSupported) {
						return fmt.Errorf("steer %s on %s: flow %v: %w (spreading a flow over several queues needs RSS contexts)", owner, s.ifname, f, err)
					}
					return fmt.Errorf("steer %s on %s: %w", owner, s.ifname, err)
				}
				in.ctx = ctx
			}
			r, err := f.rule(next, in.ctx)
			if err == nil {
				err = s.dev.AddRule(s.ifname, r)
			}
			if err != nil {
				if in.ctx != 0 {
					if err := s.dev.DeleteRSSContext(s.ifname, in.ctx); err != nil {
						undoErrs = append(undoErrs, fmt.Errorf("rss context %d: %w", in.ctx, err))
					}
				}
				rollback()
				if errors.Is(err, ethtool.ErrNotSupported) {
					return fmt.Errorf("steer %s on %s: %w (the NIC has no ntuple filters; a pool with steering software or auto uses xdpq's filter program)", owner, s.ifname, err)
				}
				return fmt.Errorf("steer %s on %s: %w", owner, s.ifname, err)
			}
			in.loc = next
			used[next] = true
		default:
			sfs, err := f.softFlows()
			for i, sf := range sfs {
				if err = s.prog.AddFlow(sf, 1); err != nil {
					for _, undo := range sfs[:i] {
						if err := s.prog.DeleteFlow(undo); err != nil {
							undoErrs = append(undoErrs, err)
						}
					}
					break
				}
			}
			if err != nil {
				rollback()
				if errors.Is(err, xdp.ErrFlowMapFull) {
					err = fmt.Errorf("%w: %w", ErrFlowsFull, err)
				}
				return fmt.Errorf("steer %s on %s: %w", owner, s.ifname, err)
			}
		}
		done = append(done, in)
	}
	s.owners[owner] = append(s.owners[owner], done...)
	return nil
}

func (s *steering) remove(in installed) error {
	if s.mode == SteerHardware {
		err := s.dev.DeleteRule(s.ifname, in.loc)
		if in.ctx != 0 {
			err = errors.Join(err, s.dev.DeleteRSSContext(s.ifname, in.ctx))
		}
		return err
	}
	sfs, err := in.flow.softFlows()
	if err != nil {
		return err
	}
	var errs []error
	for _, sf := range sfs {
		errs = append(errs, s.prog.DeleteFlow(sf))
	}
	return errors.Join(errs...)
}

// verify checks that every flow of owner is installed as xdpq put it:
// its rule at its location (hardware), its entries in the flow map
// (software). It reads the NIC or the map, not xdpq's own record.
func (s *steering) verify(owner string) error {
	ins, ok := s.owners[owner]
	if !ok {
		return fmt.Errorf("%s has no flows of %s", s.ifname, owner)
	}
	if s.mode == SteerHardware {
		rules, err := s.dev.Rules(s.ifname)
		if err != nil {
			return fmt.Errorf("verify steering on %s: %w", s.ifname, err)
		}
		at := map[uint32]ethtool.Rule{}
		for _, r := range rules {
			at[r.Location] = r
		}
		for _, in := range ins {
			want, err := in.flow.rule(in.loc, in.ctx)
			if err != nil {
				return err
			}
			if r, ok := at[in.loc]; !ok || !ruleEqual(want, r) {
				return fmt.Errorf("%s: the rule of %s's flow %v at location %d is missing or changed", s.ifname, owner, in.flow, in.loc)
			}
		}
		return nil
	}
	have, err := s.prog.Flows()
	if err != nil {
		return fmt.Errorf("verify steering on %s: %w", s.ifname, err)
	}
	for _, in := range ins {
		sfs, err := in.flow.softFlows()
		if err != nil {
			return err
		}
		for _, sf := range sfs {
			if _, ok := have[sf]; !ok {
				return fmt.Errorf("%s: %s's flow %v is missing from the filter's flow map", s.ifname, owner, in.flow)
			}
		}
	}
	return nil
}

// repair puts back, where xdpq put them, the owners' flows that are gone
// from the NIC's rules or the filter's flow map (deleted behind xdpq's
// back: an operator's ethtool or bpftool, another daemon), and returns
// how many flows of each owner it put back. A rule of someone else at a
// location of xdpq's range in an owner's place is replaced: the range is
// xdpq's.
func (s *steering) repair() (map[string]int, error) {
	back := map[string]int{}
	var errs []error
	if s.mode == SteerHardware {
		rules, err := s.dev.Rules(s.ifname)
		if err != nil {
			return nil, fmt.Errorf("read the rules of %s: %w", s.ifname, err)
		}
		at := map[uint32]ethtool.Rule{}
		for _, r := range rules {
			at[r.Location] = r
		}
		for _, owner := range slices.Sorted(maps.Keys(s.owners)) {
			for _, in := range s.owners[owner] {
				want, err := in.flow.rule(in.loc, in.ctx)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				r, ok := at[in.loc]
				if ok && ruleEqual(want, r) {
					continue
				}
				if ok {
					err = s.dev.DeleteRule(s.ifname, in.loc)
				}
				if err == nil {
					err = s.dev.AddRule(s.ifname, want)
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("put back %s's flow %v at location %d of %s: %w", owner, in.flow, in.loc, s.ifname, err))
					continue
				}
				back[owner]++
			}
		}
		return back, errors.Join(errs...)
	}
	have, err := s.prog.Flows()
	if err != nil {
		return nil, fmt.Errorf("read the flow map of %s: %w", s.ifname, err)
	}
	for _, owner := range slices.Sorted(maps.Keys(s.owners)) {
		for _, in := range s.owners[owner] {
			sfs, err := in.flow.softFlows()
			if err != nil {
				errs = append(errs, err)
				continue
			}
			put := false
			for _, sf := range sfs {
				if _, ok := have[sf]; ok {
					continue
				}
				if err := s.prog.AddFlow(sf, 1); err != nil {
					errs = append(errs, fmt.Errorf("put back %s's flow %v in the flow map of %s: %w", owner, in.flow, s.ifname, err))
					continue
				}
				put = true
			}
			if put {
				back[owner]++
			}
		}
	}
	return back, errors.Join(errs...)
}

// ensure installs those of flows that owner does not hold, all or
// none, and returns how many: sync takes only the flows it finds
// installed, so an attachment that lost one of its flows while no daemon
// ran holds the others and not that one.
func (s *steering) ensure(owner string, flows []Flow) (int, error) {
	held := map[string]bool{}
	for _, in := range s.owners[owner] {
		held[in.flow.String()] = true
	}
	var missing []Flow
	for _, f := range flows {
		if !held[f.String()] {
			missing = append(missing, f)
		}
	}
	if len(missing) == 0 {
		return 0, nil
	}
	if err := s.add(owner, missing); err != nil {
		return 0, err
	}
	return len(missing), nil
}

// removeOwner removes every flow of owner; an unknown owner is no error.
func (s *steering) removeOwner(owner string) error {
	var errs []error
	for _, in := range s.owners[owner] {
		if err := s.remove(in); err != nil {
			errs = append(errs, err)
		}
	}
	delete(s.owners, owner)
	return errors.Join(errs...)
}

// sync takes ownership of the installed flows that keep lists, for the
// owners the agent does not know yet (after a restart, or a record read
// again). Flows of owners it knows stay theirs: a sync while CNI calls
// steer never takes a flow from its owner. The other flows xdpq installed
// (hardware rules in its range, software flows in its map) are removed,
// or with keepUnknown left in place as unknown. Rules outside the range
// are never touched.
func (s *steering) sync(keep map[string][]Flow, keepUnknown bool) (removed int, err error) {
	s.unknown = nil
	known := map[string]bool{}
	for owner := range s.owners {
		known[owner] = true
	}
	var errs []error
	if s.mode == SteerHardware {
		owned := map[uint32]bool{}
		for _, ins := range s.owners {
			for _, in := range ins {
				owned[in.loc] = true
			}
		}
		rules, err := s.dev.Rules(s.ifname)
		if err != nil {
			return 0, fmt.Errorf("sync steering on %s: %w", s.ifname, err)
		}
	rules:
		for _, r := range rules {
			if !s.inRange(r.Location) || owned[r.Location] {
				continue
			}
			for owner, fs := range keep {
				if known[owner] {
					continue // its flows are owned already
				}
				for _, f := range fs {
					// A flow over several queues matches a rule to any RSS
					// context: the context's queues are the kernel's to keep.
					if (len(f.Queues) > 1) != (r.RSSContext != 0) {
						continue
					}
					if want, err := f.rule(r.Location, r.RSSContext); err == nil && ruleEqual(want, r) {
						s.owners[owner] = append(s.owners[owner], installed{flow: f, loc: r.Location, ctx: r.RSSContext})
						continue rules
					}
				}
			}
			in := installed{flow: flowOfRule(r), loc: r.Location, ctx: r.RSSContext}
			if keepUnknown {
				s.unknown = append(s.unknown, in)
				continue
			}
			if err := s.remove(in); err != nil {
				errs = append(errs, err)
				continue
			}
			removed++
		}
		return removed, errors.Join(errs...)
	}
	have, err := s.prog.Flows()
	if err != nil {
		return 0, err
	}
	wanted := map[xdp.Flow]string{}
	for owner, ins := range s.owners {
		for _, in := range ins {
			sfs, _ := in.flow.softFlows()
			for _, sf := range sfs {
				wanted[sf] = owner
			}
		}
	}
	for owner, fs := range keep {
		if known[owner] {
			continue
		}
		for _, f := range fs {
			sfs, err := f.softFlows()
			if err != nil {
				continue
			}
			all := true
			for _, sf := range sfs {
				wanted[sf] = owner
				_, ok := have[sf]
				all = all && ok
			}
			if all {
				s.owners[owner] = append(s.owners[owner], installed{flow: f})
			}
		}
	}
	for _, sf := range slices.SortedFunc(maps.Keys(have), func(a, b xdp.Flow) int { return strings.Compare(a.String(), b.String()) }) {
		if _, ok := wanted[sf]; ok {
			continue
		}
		if keepUnknown {
			s.unknown = append(s.unknown, installed{flow: flowOfSoft(sf)})
			continue
		}
		if err := s.prog.DeleteFlow(sf); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

// flowOfRule is the flow an ntuple rule steers; a zero Protocol for a
// rule that is not of a TCP or UDP flow.
func flowOfRule(r ethtool.Rule) Flow {
	f := Flow{Dst: r.Dst, DstPort: r.DstPort, Src: r.Src, SrcPort: r.SrcPort, VLAN: r.VLAN, Queues: []uint32{r.Queue}}
	switch r.Type {
	case ethtool.UDP4, ethtool.UDP6:
		f.Protocol = xdp.UDP
	case ethtool.TCP4, ethtool.TCP6:
		f.Protocol = xdp.TCP
	}
	return f
}

// flowOfSoft is the flow of one entry of the filter's flow map.
func flowOfSoft(sf xdp.Flow) Flow {
	return Flow{Protocol: sf.Protocol, Dst: netip.PrefixFrom(sf.Dst, sf.Dst.BitLen()), DstPort: sf.Port, VLAN: sf.VLAN,
		Queues: []uint32{sf.Queue}}
}

// setRange makes r the rule range, moving the rules outside it into it:
// each is added at its new location first, then removed from the old.
// On an error nothing moved.
func (s *steering) setRange(r RuleRange) error {
	if s.mode != SteerHardware {
		s.rules = r
		return nil
	}
	next := &steering{rules: r}
	for _, in := range s.unknown {
		if !next.inRange(in.loc) {
			return fmt.Errorf("the rule at location %d, installed by a previous agent for an owner not known now, is outside %d+%d (a SyncSteering must settle it first)", in.loc, r.First, r.Count)
		}
	}
	used := map[uint32]bool{}
	type move struct {
		owner string
		i     int
		loc   uint32
	}
	var moves []move
	for owner, ins := range s.owners {
		for i, in := range ins {
			if next.inRange(in.loc) {
				used[in.loc] = true
			} else {
				moves = append(moves, move{owner: owner, i: i})
			}
		}
	}
	for _, in := range s.unknown {
		used[in.loc] = true
	}
	loc := r.First
	for i := range moves {
		for used[loc] && next.inRange(loc) {
			loc++
		}
		if !next.inRange(loc) {
			return fmt.Errorf("%d+%d has no room for the %d flows installed on %s", r.First, r.Count, s.count()+len(s.unknown), s.ifname)
		}
		moves[i].loc = loc
		used[loc] = true
	}
	for i, m := range moves {
		in := s.owners[m.owner][m.i]
		rule, err := in.flow.rule(m.loc, in.ctx)
		if err == nil {
			err = s.dev.AddRule(s.ifname, rule)
		}
		if err != nil {
			for _, undo := range moves[:i] {
				if uerr := s.dev.DeleteRule(s.ifname, undo.loc); uerr != nil {
					err = errors.Join(err, fmt.Errorf("and the copy at location %d stays: %w", undo.loc, uerr))
				}
			}
			return fmt.Errorf("move %s's flow %v to location %d on %s: %w", m.owner, in.flow, m.loc, s.ifname, err)
		}
	}
	var errs []error
	for _, m := range moves {
		in := &s.owners[m.owner][m.i]
		if err := s.dev.DeleteRule(s.ifname, in.loc); err != nil {
			errs = append(errs, fmt.Errorf("remove the rule at old location %d on %s: %w", in.loc, s.ifname, err))
		}
		in.loc = m.loc
	}
	s.rules = r
	return errors.Join(errs...)
}

func ruleEqual(a, b ethtool.Rule) bool {
	return a.Type == b.Type && a.Src == b.Src && a.Dst == b.Dst && a.SrcPort == b.SrcPort &&
		a.DstPort == b.DstPort && a.VLAN == b.VLAN && a.Queue == b.Queue && a.L4Proto == b.L4Proto &&
		a.RSSContext == b.RSSContext && a.Drop == b.Drop && a.Location == b.Location
}
