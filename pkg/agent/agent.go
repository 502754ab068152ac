package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/ethtool"
	"github.com/xdpq/xdpq/pkg/nic"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// State is what a managed netdev has on its XDP hook.
type State string

// States a netdev is reported in.
const (
	StateNone       State = "None"       // no xdpq program (no bound socket)
	StateDirect     State = "Direct"     // xdpq's direct program
	StateFilter     State = "Filter"     // xdpq's filter program
	StateOverridden State = "Overridden" // a foreign program owns the hook
	StateMissing    State = "Missing"    // the netdev does not exist
)

// Policy is how a netdev is managed; it comes from its pool.
type Policy struct {
	// Steering picks the program: hardware steering gets the direct
	// program, software steering the filter program; auto (or empty)
	// probes the NIC for ntuple filters.
	Steering Steering
	// Rules is the block of ntuple locations xdpq owns (hardware steering);
	// zero means DefaultRules.
	Rules RuleRange
	// Reserved are queues to keep RSS off (hardware steering), so that the
	// host's own traffic never lands on a queue handed to a pod.
	Reserved []uint32
	// Mode is where the program runs; ModeAuto (or zero): native, else generic.
	Mode xdp.Mode
	// AttachAlways keeps the program attached while the netdev is managed.
	AttachAlways bool
	// Exclusive attaches through a pinned bpf_link that refuses foreign programs.
	Exclusive bool
}

// Config configures an Agent.
type Config struct {
	// NetNS is the path of the network namespace of the netdevs; empty for
	// the agent's own.
	NetNS string
	// PinDir is where maps (and exclusive links) are pinned, per netdev.
	PinDir string
	// Linger is how long the program stays after the last socket went.
	Linger time.Duration
	// Resync is the period of the safety-net reconcile of every netdev.
	Resync time.Duration
	// StateDir holds what the agent must put back later (RSS tables).
	StateDir string
	// NIC steers in hardware; nil means ethtool in NetNS.
	NIC NtupleDevice
	// OnChange, if set, is called (without the agent's lock held, on a
	// goroutine of its own) whenever a netdev's reported status changes.
	OnChange func()
	Logger   *slog.Logger
}

// DefaultStateDir is where the agent keeps its state files.
const DefaultStateDir = "/run/xdpq/agent"

// DefaultPinDir is where the agent pins under the default bpffs.
const DefaultPinDir = "/sys/fs/bpf/xdpq"

// Status reports a managed netdev.
type Status struct {
	Netdev   string
	Ifindex  int
	State    State
	Steering Steering // hardware or software, as resolved
	Flows    int      // flows xdpq steers on the netdev
	Mode     xdp.Mode // where the attached program runs
	// ModeReason says why the agent asks for the mode it asks for.
	ModeReason string
	// ZeroCopy is whether the driver offers AF_XDP zero-copy.
	ZeroCopy bool
	// RXQueues is the netdev's rx queue count now (ethtool channels).
	RXQueues int
	// LinkUp is whether the netdev's carrier is up (operstate up or unknown).
	LinkUp  bool
	Program ebpf.ProgramID
	Foreign string   // the foreign program's name, when Overridden
	Sockets []uint32 // queues with an xdpq socket
	Reason  string   // why the netdev is in this state, or the last error
}

// Agent reconciles the managed netdevs. Create it with New, manage netdevs
// with Manage, and run its event loop with Run.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	kick chan struct{}
	nic  NtupleDevice
	own  io.Closer // the ethtool handle the agent opened, if any

	mu      sync.Mutex // guards netdevs and every netdev in it
	netdevs map[string]*netdev
}

type netdev struct {
	name    string
	ifindex int
	queues  int // the XSKMAP's size: the most rx queues the netdev can have
	rxNow   int // rx queues now
	policy  Policy
	kind    xdp.Kind
	modeWhy string
	zc      bool
	steer   *steering
	pins    string
	prog    *xdp.Program  // ours, on the pinned maps
	running *ebpf.Program // the xdpq program attached: prog's, or an adopted earlier instance
	link    link.Link     // Exclusive only
	sockets map[uint32]bool
	// orphans are queues found busy on start whose sockets the agent did
	// not hand out in this life; they are probed again on every resync.
	orphans   map[uint32]bool
	lastEmpty time.Time // when the last socket went
	lingerT   *time.Timer
	status    Status
}

// New returns an agent; it mounts bpffs under PinDir's parent if needed.
func New(cfg Config) (*Agent, error) {
	if cfg.PinDir == "" {
		cfg.PinDir = DefaultPinDir
	}
	if cfg.Linger == 0 {
		cfg.Linger = 5 * time.Second
	}
	if cfg.Resync == 0 {
		cfg.Resync = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir
	}
	// Only the standard bpffs is mounted when missing; anything else must
	// be a bpffs already (mounting one elsewhere would hide what is there).
	if strings.HasPrefix(filepath.Clean(cfg.PinDir)+"/", xdp.DefaultBPFFS+"/") {
		if err := xdp.MountBPFFS(xdp.DefaultBPFFS); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(cfg.PinDir, 0o700); err != nil {
		return nil, fmt.Errorf("agent: pin dir: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(cfg.PinDir, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		return nil, fmt.Errorf("agent: pin dir %s is not on a bpffs (mount -t bpf bpf %s)", cfg.PinDir, xdp.DefaultBPFFS)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, kick: make(chan struct{}, 1), netdevs: map[string]*netdev{}, nic: cfg.NIC}
	if a.nic == nil {
		h, err := ethtool.Open(cfg.NetNS)
		if err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		a.nic, a.own = h, h
	}
	return a, nil
}

func (a *Agent) dev(d *netdev) xsk.Netdev {
	return xsk.Netdev{Name: d.name, Ifindex: d.ifindex, NetNS: a.cfg.NetNS}
}

// Manage takes a netdev under management: it loads xdpq's program on the
// maps pinned for it (pinning new ones the first time), adopts what a
// previous agent left attached, finds the queues that still have sockets,
// and reconciles.
func (a *Agent) Manage(name string, p Policy) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.netdevs[name]; ok {
		return fmt.Errorf("agent: %s is managed already", name)
	}
	l, err := a.linkByName(name)
	if err != nil {
		return fmt.Errorf("agent: manage %s: %w", name, err)
	}
	if p.Mode == xdp.ModeNone {
		p.Mode = xdp.ModeAuto
	}
	if p.Rules.Count == 0 {
		p.Rules = DefaultRules
	}
	queues := l.Attrs().NumRxQueues
	d := &netdev{name: name, ifindex: l.Attrs().Index, queues: queues, policy: p,
		pins: filepath.Join(a.cfg.PinDir, name), sockets: map[uint32]bool{}, orphans: map[uint32]bool{}}
	mode, err := a.resolveSteering(name, p.Steering)
	if err != nil {
		return fmt.Errorf("agent: manage %s: %w", name, err)
	}
	d.kind = map[Steering]xdp.Kind{SteerHardware: xdp.Direct, SteerSoftware: xdp.Filter}[mode]
	a.chooseMode(d)
	// Sockets a predecessor handed out can only be in its pinned XSKMAP:
	// without one there is nothing to look for, and the probe (a bind per
	// queue) would leave every queue busy for tens of milliseconds.
	_, err = os.Stat(filepath.Join(d.pins, "xsks"))
	predecessor := err == nil
	if d.prog, err = a.loadProgram(d); err != nil {
		return fmt.Errorf("agent: manage %s: %w", name, err)
	}
	d.steer = &steering{mode: mode, dev: a.nic, ifname: name, rules: p.Rules, prog: d.prog, queues: queues,
		owners: map[string][]installed{}}
	if mode == SteerHardware {
		err := reserveRSS(a.nic, name, a.rssFile(name), p.Reserved)
		switch {
		case errors.Is(err, ethtool.ErrNotSupported):
			// No indirection table to rewrite: the NIC spreads (or not) as it will.
			a.log.Warn("cannot keep RSS off the reserved queues", "netdev", name, "queues", p.Reserved, "err", err)
		case err != nil:
			d.prog.Close()
			return fmt.Errorf("agent: manage %s: %w", name, err)
		}
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
	if p.Exclusive {
		if l, err := link.LoadPinnedLink(filepath.Join(d.pins, "link"), nil); err == nil {
			d.link = l
		}
	}
	a.netdevs[name] = d
	a.log.Info("managing netdev", "netdev", name, "ifindex", d.ifindex, "queues", queues,
		"steering", mode, "program", d.kind, "busy_queues", slices.Sorted(maps.Keys(d.orphans)))
	a.reconcile(d)
	return nil
}

// chooseMode settles an auto mode from the driver's XDP features: native
// needs native XDP_REDIRECT, else generic.
func (a *Agent) chooseMode(d *netdev) {
	f, err := nic.XDPFeatures(a.cfg.NetNS, d.ifindex)
	switch {
	case err != nil || !f.Known():
		d.modeWhy = "the kernel does not report XDP features: native, else generic"
	case d.policy.Mode != xdp.ModeAuto:
		d.modeWhy = "set by the pool"
	case f.Has(nic.XDPBasic | nic.XDPRedirect):
		d.policy.Mode = xdp.ModeNative
		d.modeWhy = "the driver has native XDP_REDIRECT (" + f.String() + ")"
	default:
		d.policy.Mode = xdp.ModeGeneric
		d.modeWhy = "the driver has no native XDP_REDIRECT (" + f.String() + ")"
	}
	d.zc = err == nil && f.Has(nic.XSKZeroCopy)
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

func (a *Agent) rssFile(name string) string {
	return filepath.Join(a.cfg.StateDir, name+".rss.json")
}

func (a *Agent) loadProgram(d *netdev) (*xdp.Program, error) {
	opts := xdp.LoadOptions{Queues: d.queues}
	prog, err := xdp.LoadPinned(d.kind, d.pins, opts)
	if errors.Is(err, xdp.ErrPinsIncompatible) {
		// Pinned for another program kind or queue count: nothing can be
		// using them with this program, so start afresh.
		a.log.Warn("replacing incompatible pinned maps", "netdev", d.name, "err", err)
		for _, n := range []string{"xsks", "flows", "counters"} {
			os.Remove(filepath.Join(d.pins, n))
		}
		prog, err = xdp.LoadPinned(d.kind, d.pins, opts)
	}
	return prog, err
}

// Unmanage stops managing a netdev: its program is detached (if ours) and
// its pins removed.
func (a *Agent) Unmanage(name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.netdevs[name]
	if !ok {
		return fmt.Errorf("agent: %s is not managed", name)
	}
	delete(a.netdevs, name)
	var errs []error
	if d.lingerT != nil {
		d.lingerT.Stop()
	}
	for owner := range d.steer.owners {
		errs = append(errs, d.steer.removeOwner(owner))
	}
	if d.steer.mode == SteerHardware {
		errs = append(errs, restoreRSS(a.nic, name, a.rssFile(name)))
	}
	if d.link != nil {
		errs = append(errs, d.link.Unpin(), d.link.Close())
	} else if d.running != nil {
		if err := xdp.Detach(a.cfg.NetNS, d.ifindex, d.status.Mode, d.running); err != nil && !errors.Is(err, xdp.ErrOccupied) {
			errs = append(errs, err)
		}
	}
	errs = append(errs, d.setRunning(nil), d.prog.Unpin(), d.prog.Close(), os.Remove(d.pins))
	return errors.Join(errs...)
}

// AddSocket puts the socket fd, bound to queue of the netdev, into the
// XSKMAP and attaches the program if the netdev needs it.
func (a *Agent) AddSocket(name string, queue uint32, fd int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.netdevs[name]
	if !ok {
		return fmt.Errorf("agent: add socket: %s is not managed", name)
	}
	if int(queue) >= d.queues || int(queue) >= d.rxNow {
		return fmt.Errorf("agent: add socket: %s has %d rx queues now, no queue %d", name, min(d.queues, d.rxNow), queue)
	}
	if err := d.prog.SetSocket(queue, fd); err != nil {
		return fmt.Errorf("agent: %s: %w", name, err)
	}
	d.sockets[queue] = true
	delete(d.orphans, queue)
	a.reconcile(d)
	return nil
}

// RemoveSocket forgets the socket of queue (the kernel drops it from the
// XSKMAP when it closes). The program goes after the linger period once no
// socket is left.
func (a *Agent) RemoveSocket(name string, queue uint32) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.netdevs[name]
	if !ok {
		return fmt.Errorf("agent: remove socket: %s is not managed", name)
	}
	if !d.sockets[queue] {
		return nil
	}
	delete(d.sockets, queue)
	if err := d.prog.DeleteSocket(queue); err != nil {
		a.log.Warn("delete socket from xskmap", "netdev", name, "queue", queue, "err", err)
	}
	if len(d.sockets)+len(d.orphans) == 0 {
		a.startLinger(d)
	}
	a.reconcile(d)
	return nil
}

// Steer installs the owner's flows on the netdev, all or none: ntuple
// rules in the policy's rule range with hardware steering, entries of the
// filter program's flow map with software steering. A flow that overlaps
// another owner's is refused with an error that names that owner.
func (a *Agent) Steer(name, owner string, flows []Flow) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.netdevs[name]
	if !ok {
		return fmt.Errorf("agent: steer: %s is not managed", name)
	}
	return d.steer.add(owner, flows)
}

// Unsteer removes every flow of the owner from the netdev.
func (a *Agent) Unsteer(name, owner string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.netdevs[name]
	if !ok {
		return fmt.Errorf("agent: unsteer: %s is not managed", name)
	}
	return d.steer.removeOwner(owner)
}

// VerifySteering checks, against the NIC's rules or the filter's flow
// map, that every flow of the owner is installed on the netdev.
func (a *Agent) VerifySteering(name, owner string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.netdevs[name]
	if !ok {
		return fmt.Errorf("agent: verify steering: %s is not managed", name)
	}
	return d.steer.verify(owner)
}

// SyncSteering is for a restarted daemon: it takes ownership of the flows
// in keep that are installed, and removes every other flow xdpq installed
// on the netdev. It returns how many it removed.
func (a *Agent) SyncSteering(name string, keep map[string][]Flow) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.netdevs[name]
	if !ok {
		return 0, fmt.Errorf("agent: sync steering: %s is not managed", name)
	}
	n, err := d.steer.sync(keep)
	if n > 0 {
		a.log.Info("removed stale flows", "netdev", name, "count", n)
	}
	return n, err
}

// XSKMapFD returns a new descriptor of the netdev's XSKMAP, for a client
// that inserts its own sockets (DPDK's af_xdp PMD). The caller closes it.
func (a *Agent) XSKMapFD(name string) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.netdevs[name]
	if !ok {
		return -1, fmt.Errorf("agent: %s is not managed", name)
	}
	fd, err := unix.FcntlInt(uintptr(d.prog.XSKMap().FD()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("agent: dup xskmap of %s: %w", name, err)
	}
	return fd, nil
}

// Program returns the netdev's program, for its flow map and counters.
func (a *Agent) Program(name string) (*xdp.Program, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.netdevs[name]
	if !ok {
		return nil, fmt.Errorf("agent: %s is not managed", name)
	}
	return d.prog, nil
}

// Status reports every managed netdev, by name.
func (a *Agent) Status() []Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Status, 0, len(a.netdevs))
	for _, d := range a.netdevs {
		s := d.status
		s.Sockets = slices.Sorted(maps.Keys(d.sockets))
		s.Steering, s.Flows = d.steer.mode, d.steer.count()
		out = append(out, s)
	}
	slices.SortFunc(out, func(x, y Status) int { return strings.Compare(x.Netdev, y.Netdev) })
	return out
}

// Close releases the agent's handles. What is attached and pinned stays:
// the datapath does not depend on the daemon.
func (a *Agent) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	for _, d := range a.netdevs {
		if d.lingerT != nil {
			d.lingerT.Stop()
		}
		if d.link != nil {
			errs = append(errs, d.link.Close())
		}
		errs = append(errs, d.setRunning(nil), d.prog.Close())
	}
	a.netdevs = map[string]*netdev{}
	if a.own != nil {
		errs = append(errs, a.own.Close())
		a.own = nil
	}
	return errors.Join(errs...)
}

// startLinger starts the linger period; reconcile arms its timer.
func (a *Agent) startLinger(d *netdev) {
	d.lastEmpty = time.Now()
}

// Kick asks the event loop for a reconcile of every netdev.
func (a *Agent) Kick() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// Run follows link notifications of the netdevs' namespace and reconciles
// on each, on kicks and on every resync period, until ctx ends.
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
			return fmt.Errorf("agent: netns %s: %w", a.cfg.NetNS, err)
		}
		defer h.Close()
		opts.Namespace = &h
	}
	if err := netlink.LinkSubscribeWithOptions(ch, done, opts); err != nil {
		return fmt.Errorf("agent: subscribe to link notifications: %w", err)
	}
	// Whatever changed before the subscription is caught by this pass.
	a.reconcileAll(false)
	tick := time.NewTicker(a.cfg.Resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-ch:
			if !ok {
				return errors.New("agent: link notifications ended")
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
	a.mu.Lock()
	defer a.mu.Unlock()
	attrs := u.Attrs()
	for _, d := range a.netdevs {
		if d.ifindex != attrs.Index && d.name != attrs.Name {
			continue
		}
		if d.ifindex == attrs.Index && d.name != attrs.Name && attrs.Name != "" {
			a.log.Warn("managed netdev renamed", "netdev", d.name, "new_name", attrs.Name)
		}
		a.reconcile(d)
	}
}

func (a *Agent) reconcileAll(probe bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range a.netdevs {
		if probe {
			a.probeOrphans(d)
		}
		a.reconcile(d)
	}
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
		a.startLinger(d)
	}
}

// reconcile converges one netdev. Called with a.mu held.
func (a *Agent) reconcile(d *netdev) {
	prev := d.status
	defer func() {
		if d.status.State != prev.State || d.status.Reason != prev.Reason {
			a.log.Info("netdev state", "netdev", d.name, "state", d.status.State, "mode", d.status.Mode,
				"program", d.status.Program, "foreign", d.status.Foreign, "reason", d.status.Reason)
		}
		if a.cfg.OnChange != nil && (d.status.State != prev.State || d.status.LinkUp != prev.LinkUp ||
			d.status.RXQueues != prev.RXQueues || d.status.Netdev != prev.Netdev) {
			go a.cfg.OnChange()
		}
	}()
	d.status = Status{Netdev: d.name, Ifindex: d.ifindex}
	l, err := a.linkByIndex(d.ifindex)
	if err != nil {
		d.status.State, d.status.Reason = StateMissing, err.Error()
		d.setRunning(nil)
		return
	}
	d.status.Netdev = l.Attrs().Name
	d.status.LinkUp = l.Attrs().OperState == netlink.OperUp || l.Attrs().OperState == netlink.OperUnknown
	d.status.ModeReason, d.status.ZeroCopy = d.modeWhy, d.zc
	d.rxNow = d.queues
	if ch, err := a.nic.Channels(d.name); err == nil {
		d.rxNow = int(max(ch.RX, ch.Combined))
	}
	d.status.RXQueues = d.rxNow
	var beyond []uint32
	for q := range d.sockets {
		if int(q) >= d.rxNow {
			beyond = append(beyond, q)
		}
	}
	defer func() {
		if len(beyond) > 0 {
			slices.Sort(beyond)
			d.status.Reason = strings.TrimPrefix(d.status.Reason+fmt.Sprintf("; sockets on queues %v, beyond the %d rx queues the netdev has now", beyond, d.rxNow), "; ")
		}
	}()
	att, err := xdp.Query(a.cfg.NetNS, d.ifindex)
	if err != nil {
		d.status.State, d.status.Reason = StateNone, err.Error()
		return
	}
	lingering := !d.lastEmpty.IsZero() && time.Since(d.lastEmpty) < a.cfg.Linger
	want := len(d.sockets) > 0 || len(d.orphans) > 0 || d.policy.AttachAlways || lingering
	if lingering {
		// Come back when the linger period ends.
		if d.lingerT != nil {
			d.lingerT.Stop()
		}
		d.lingerT = time.AfterFunc(time.Until(d.lastEmpty.Add(a.cfg.Linger))+time.Millisecond, a.Kick)
	}
	ours := d.kind == xdp.Direct
	state := map[bool]State{true: StateDirect, false: StateFilter}[ours]

	switch {
	case att != nil && a.isOurs(d, att):
		if !want && d.link == nil {
			if err := xdp.Detach(a.cfg.NetNS, d.ifindex, att.Mode, d.running); err != nil {
				d.status.State, d.status.Reason = state, "detach: "+err.Error()
				return
			}
			d.setRunning(nil)
			d.status.State, d.status.Reason = StateNone, "no socket bound"
			return
		}
		d.status.State, d.status.Mode, d.status.Program = state, att.Mode, att.ID
	case att != nil:
		d.setRunning(nil)
		d.status.State, d.status.Mode, d.status.Program, d.status.Foreign = StateOverridden, att.Mode, att.ID, att.Name
		d.status.Reason = fmt.Sprintf("foreign program %q (id %d) has precedence; xsks pinned at %s", att.Name, att.ID, filepath.Join(d.pins, "xsks"))
	case want:
		mode, err := a.attach(d)
		if errors.Is(err, xdp.ErrOccupied) {
			// A program appeared since the query; its notification follows.
			d.status.State, d.status.Reason = StateOverridden, "a program appeared while attaching"
			return
		}
		if err != nil {
			d.status.State, d.status.Reason = StateNone, "attach: "+err.Error()
			return
		}
		d.setRunning(d.prog.Prog())
		info, _ := d.running.Info()
		id, _ := info.ID()
		d.status.State, d.status.Mode, d.status.Program = state, mode, id
	default:
		d.status.State, d.status.Reason = StateNone, "no socket bound"
	}
}

func (a *Agent) attach(d *netdev) (xdp.Mode, error) {
	if !d.policy.Exclusive {
		return xdp.Attach(a.cfg.NetNS, d.ifindex, d.prog.Prog(), d.policy.Mode)
	}
	l, mode, err := xdp.AttachLink(a.cfg.NetNS, d.ifindex, d.prog.Prog(), d.policy.Mode)
	if err != nil {
		return xdp.ModeNone, err
	}
	if err := l.Pin(filepath.Join(d.pins, "link")); err != nil {
		l.Close()
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
		prog.Close()
		return false
	}
	d.setRunning(prog)
	a.log.Info("adopted attached program", "netdev", d.name, "program", att.ID)
	return true
}

func (a *Agent) linkByName(name string) (netlink.Link, error) {
	var l netlink.Link
	err := a.inNetNS(func(h *netlink.Handle) (err error) { l, err = h.LinkByName(name); return err })
	return l, err
}

func (a *Agent) linkByIndex(ifindex int) (netlink.Link, error) {
	var l netlink.Link
	err := a.inNetNS(func(h *netlink.Handle) (err error) { l, err = h.LinkByIndex(ifindex); return err })
	return l, err
}

func (a *Agent) inNetNS(f func(*netlink.Handle) error) error {
	ns := netns.None()
	if a.cfg.NetNS != "" {
		var err error
		if ns, err = netns.GetFromPath(a.cfg.NetNS); err != nil {
			return err
		}
		defer ns.Close()
	}
	var h *netlink.Handle
	var err error
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return err
	}
	defer h.Close()
	return f(h)
}

// setRunning records what runs on the netdev, closing an adopted
// predecessor's program it replaces (never the agent's own).
func (d *netdev) setRunning(p *ebpf.Program) error {
	var err error
	if d.running != nil && d.running != d.prog.Prog() && d.running != p {
		err = d.running.Close()
	}
	d.running = p
	return err
}
