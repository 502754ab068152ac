package agent

import (
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
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
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

// Policy is how a netdev is managed; it comes from its pool. Set brings a
// managed netdev to a new policy in place, field by field.
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
	// Linger is how long the program stays after the last socket went;
	// zero means Config.Linger.
	Linger time.Duration
	// BusyPoll readies the netdev for preferred busy polling
	// (SO_PREFER_BUSY_POLL): napi_defer_hard_irqs 2 and gro_flush_timeout
	// 200 µs, the values of the kernel's example. The netdev's own values
	// are saved in Config.StateDir and put back when the policy no longer
	// asks, or the netdev is unmanaged.
	BusyPoll bool
}

// Config configures an Agent.
type Config struct {
	// NetNS is the path of the network namespace of the netdevs; empty for
	// the agent's own.
	NetNS string
	// PinDir is where maps (and exclusive links) are pinned, per netdev.
	PinDir string
	// Linger is how long the program stays after the last socket went,
	// for a policy that sets none.
	Linger time.Duration
	// Resync is the period of the safety-net reconcile of every netdev.
	Resync time.Duration
	// StateDir holds what the agent must put back later (RSS tables, NAPI
	// settings).
	StateDir string
	// SysRoot is a sysfs that shows NetNS (a sysfs shows the namespace of
	// whoever mounted it), for the NAPI settings of Policy.BusyPoll. Empty:
	// the agent mounts one from inside NetNS when a policy first asks,
	// detached (see nic.MountSysfs), so nothing is left mounted.
	SysRoot string
	// NIC steers in hardware; nil means ethtool in NetNS.
	NIC NtupleDevice
	// Hook attaches and detaches programs; nil means the kernel's
	// (KernelHook).
	Hook Hook
	// OnChange, if set, is called (without the agent's lock held, on a
	// goroutine of its own) whenever a netdev's reported state, link,
	// rx queue count or name changes.
	OnChange func()
	Logger   *slog.Logger
}

// DefaultStateDir is where the agent keeps its state files.
const DefaultStateDir = "/run/xdpq/agent"

// DefaultPinDir is where the agent pins under the default bpffs.
const DefaultPinDir = "/sys/fs/bpf/xdpq"

// DefaultLinger is Config.Linger when it is zero.
const DefaultLinger = 5 * time.Second

// Status reports a managed netdev.
type Status struct {
	Netdev   string
	Ifindex  int
	State    State
	Steering Steering // hardware or software, as resolved
	Flows    int      // flows xdpq steers on the netdev
	// UnknownFlows are flows xdpq installed that no owner claimed when
	// AdoptSteering took the others: they stay until a SyncSteering.
	UnknownFlows int
	Mode         xdp.Mode // where the attached program runs
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
	// Policy is the policy in force, with its defaults filled in: what the
	// last Set asked, except for the fields it could not apply.
	Policy Policy
	// PolicyError says why the last Set left fields of its policy
	// unapplied; empty when it applied them all.
	PolicyError string
}

// Agent reconciles the managed netdevs. Create it with New, bring netdevs
// to their policy with Set, and run its event loop with Run.
type Agent struct {
	cfg       Config
	log       *slog.Logger
	kick      chan struct{}
	nic       NtupleDevice
	own       io.Closer                  // the ethtool handle the agent opened, if any
	now       func() time.Time           // the clock of linger periods
	sysfs     func() (*nic.Sysfs, error) // opened on first use
	sysOpened atomic.Bool                // whether sysfs was called
	// listening is closed once Run follows the link notifications.
	listening     chan struct{}
	listeningOnce sync.Once

	// mu guards netdevs, closed, and of every netdev its token (busy,
	// stale) and what Status and the metrics read (see netdev). It is
	// held for memory work alone: the kernel work on a netdev is done by
	// the holder of its token, outside mu, so that one netdev's slow
	// attach (a NIC reconfiguring its rings) stalls no other netdev's
	// sockets, and Status never waits for the kernel.
	mu sync.Mutex
	// idle is signalled (on mu) whenever a netdev's token is given back.
	idle    *sync.Cond
	netdevs map[string]*netdev
	closed  bool
}

// A netdev's token (busy) is held by whoever works on it: Set,
// Unmanage, the steering and socket calls and reconcile, each outside
// the agent's lock. The event loop skips a busy netdev (marking it
// stale: the holder reconciles it before giving the token back); the
// other calls wait for the token. The token holder alone writes the
// netdev's fields; those that Status and the metrics read (status, with
// the sockets as of the reconcile that published it; ifindex, the
// steering counts, policy and its errors, prog, kind, reattach) it
// writes under the agent's lock too.
type netdev struct {
	name    string
	ifindex int
	queues  int // the XSKMAP's size: the most rx queues the netdev can have
	rxNow   int // rx queues now
	policy  Policy
	// policyErr is why the last Set could not apply all of its policy.
	policyErr string
	// gaps is what the NIC lacks for the policy in force (hardwareGaps).
	gaps    string
	mode    xdp.Mode // policy.Mode, auto settled by the driver's features
	kind    xdp.Kind
	modeWhy string
	zc      bool
	steer   *steering
	// steerMode, flows and unknown are steer's, for Status: steer itself
	// is the token holder's.
	steerMode      Steering
	flows, unknown int
	pins           string
	prog           *xdp.Program      // ours, on the pinned maps
	running        *ebpf.Program     // the xdpq program attached: prog's, or an adopted earlier instance
	link           link.Link         // Exclusive only
	sockets        map[uint32]uint64 // queue: the inode of the socket put in the XSKMAP for it
	// orphans are queues found busy on start whose sockets the agent did
	// not hand out in this life; they are probed again on every resync.
	orphans   map[uint32]bool
	lastEmpty time.Time // when the last socket went
	lingerT   *time.Timer
	status    Status
	busy      bool // a token holder is changing the netdev
	stale     bool // a reconcile was skipped while busy
	// lock makes this agent the only one on the netdev (netdevLock).
	lock *netdevLock
	// reattach times the re-attaches of xdpq's program after a foreign
	// one left, for metrics.
	reattach histogram
}

// New returns an agent; it mounts bpffs under PinDir's parent if needed.
func New(cfg Config) (*Agent, error) {
	if cfg.PinDir == "" {
		cfg.PinDir = DefaultPinDir
	}
	if cfg.Linger == 0 {
		cfg.Linger = DefaultLinger
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
		return nil, fmt.Errorf("create pin dir: %w", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(cfg.PinDir, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		return nil, fmt.Errorf("pin dir %s is not on a bpffs (mount -t bpf bpf %s)", cfg.PinDir, xdp.DefaultBPFFS)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, kick: make(chan struct{}, 1), netdevs: map[string]*netdev{}, nic: cfg.NIC,
		now: time.Now, listening: make(chan struct{})}
	a.idle = sync.NewCond(&a.mu)
	a.sysfs = sync.OnceValues(func() (*nic.Sysfs, error) {
		a.sysOpened.Store(true)
		if cfg.SysRoot != "" {
			return nic.OpenSysfs(cfg.SysRoot)
		}
		// Mounted rather than /sys even for the agent's own namespace:
		// /sys shows the namespace of whoever mounted it, which in a
		// container need not be the one the agent runs in.
		return nic.MountSysfs(cfg.NetNS)
	})
	if cfg.Hook == nil {
		a.cfg.Hook = KernelHook{}
	}
	if a.nic == nil {
		h, err := ethtool.Open(cfg.NetNS)
		if err != nil {
			return nil, err
		}
		a.nic, a.own = h, h
	}
	return a, nil
}

func (a *Agent) dev(d *netdev) xsk.Netdev {
	return xsk.Netdev{Name: d.name, Ifindex: d.ifindex, NetNS: a.cfg.NetNS}
}

// take waits until the netdev's token is free and takes it. Called with
// a.mu held, which it releases while it waits. nil: name is not managed.
func (a *Agent) take(name string) *netdev {
	for {
		d := a.netdevs[name]
		if d == nil || !d.busy {
			if d != nil {
				d.busy = true
			}
			return d
		}
		a.idle.Wait()
	}
}

// takeUnlocked is take for a caller without a.mu.
func (a *Agent) takeUnlocked(name string) *netdev {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.take(name)
}

// release gives the token back, called without a.mu: a reconcile skipped
// while it was held (stale) runs first, by the holder.
func (a *Agent) release(d *netdev) {
	for {
		a.mu.Lock()
		if !d.stale || a.netdevs[d.name] != d {
			d.busy, d.stale = false, false
			a.idle.Broadcast()
			a.mu.Unlock()
			return
		}
		d.stale = false
		a.mu.Unlock()
		a.reconcile(d)
	}
}

// idleNetdev waits until no one holds the netdev's token. Called with a.mu
// held, which it releases while it waits. nil: name is not managed.
func (a *Agent) idleNetdev(name string) *netdev {
	for {
		d := a.netdevs[name]
		if d == nil || !d.busy {
			return d
		}
		a.idle.Wait()
	}
}

// lingering tells whether the linger period after the last socket runs,
// and how long it has left.
func (d *netdev) lingering(now time.Time) (bool, time.Duration) {
	if d.lastEmpty.IsZero() {
		return false, 0
	}
	left := d.lastEmpty.Add(d.policy.Linger).Sub(now)
	return left > 0, left
}

// AddSocket puts the socket fd, bound to queue of the netdev, into the
// XSKMAP and attaches the program if the netdev needs it.
func (a *Agent) AddSocket(name string, queue uint32, fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("add socket to %s/q%d: %w", name, queue, err)
	}
	d := a.takeUnlocked(name)
	if d == nil {
		return fmt.Errorf("add socket to %s/q%d: the netdev is not managed", name, queue)
	}
	defer a.release(d)
	if int(queue) >= d.queues || int(queue) >= d.rxNow {
		return fmt.Errorf("add socket to %s/q%d: the netdev has %d rx queues now", name, queue, min(d.queues, d.rxNow))
	}
	if err := d.prog.SetSocket(queue, fd); err != nil {
		return fmt.Errorf("add socket to %s/q%d: %w", name, queue, err)
	}
	a.mu.Lock()
	d.sockets[queue] = st.Ino
	a.mu.Unlock()
	delete(d.orphans, queue)
	a.reconcile(d)
	return nil
}

// RemoveSocket forgets the socket of queue whose inode is inode (0: any),
// and takes it out of the XSKMAP (the kernel does too when it closes). A
// queue that holds another socket now is left alone: the queue's next
// holder may have bound and added its socket before the end of the
// previous one is told. The program goes after the linger period once no
// socket is left.
func (a *Agent) RemoveSocket(name string, queue uint32, inode uint64) error {
	d := a.takeUnlocked(name)
	if d == nil {
		return fmt.Errorf("remove socket from %s/q%d: the netdev is not managed", name, queue)
	}
	defer a.release(d)
	if ino, ok := d.sockets[queue]; !ok || inode != 0 && ino != inode {
		return nil
	}
	a.mu.Lock()
	delete(d.sockets, queue)
	a.mu.Unlock()
	if err := d.prog.DeleteSocket(queue); err != nil {
		a.log.Warn("delete socket from xskmap", "netdev", name, "queue", queue, "err", err)
	}
	if len(d.sockets)+len(d.orphans) == 0 {
		d.lastEmpty = a.now()
	}
	a.reconcile(d)
	return nil
}

// XSKMapFD returns a new descriptor of the netdev's XSKMAP, for a client
// that inserts its own sockets (DPDK's af_xdp PMD). The caller closes it.
func (a *Agent) XSKMapFD(name string) (int, error) {
	// The token keeps the program from being replaced or closed while
	// its map is duplicated, outside the agent's lock (a syscall).
	d := a.takeUnlocked(name)
	if d == nil {
		return -1, fmt.Errorf("dup xskmap of %s: it is not managed", name)
	}
	fd, err := unix.FcntlInt(uintptr(d.prog.XSKMap().FD()), unix.F_DUPFD_CLOEXEC, 0)
	a.release(d)
	if err != nil {
		return -1, fmt.Errorf("dup xskmap of %s: %w", name, err)
	}
	return fd, nil
}

// Program returns the netdev's program, for its flow map and counters. A
// Set that changes the steering replaces it.
func (a *Agent) Program(name string) (*xdp.Program, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d := a.idleNetdev(name)
	if d == nil {
		return nil, fmt.Errorf("program of %s: it is not managed", name)
	}
	return d.prog, nil
}

// Status reports every managed netdev, by name.
func (a *Agent) Status() []Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	// In the order of the names: sorting the statuses themselves, which
	// are large, cost a status call with 64 netdevs a tenth of its time.
	names := make([]string, 0, len(a.netdevs))
	for name, d := range a.netdevs {
		if d.prog != nil { // else its first Set is under way
			names = append(names, name)
		}
	}
	slices.Sort(names)
	out := make([]Status, 0, len(names))
	for _, name := range names {
		d := a.netdevs[name]
		s := d.status
		s.Sockets = slices.Clone(s.Sockets)
		s.Steering, s.Flows, s.UnknownFlows = d.steerMode, d.flows, d.unknown
		s.Policy = d.policy
		s.Policy.Reserved = slices.Clone(d.policy.Reserved)
		s.PolicyError = strings.TrimPrefix(d.policyErr+"; "+d.gaps, "; ")
		s.PolicyError = strings.TrimSuffix(s.PolicyError, "; ")
		out = append(out, s)
	}
	return out
}

// Close releases the agent's handles. What is attached and pinned stays:
// the datapath does not depend on the daemon.
func (a *Agent) Close() error {
	a.mu.Lock()
	for slices.ContainsFunc(slices.Collect(maps.Values(a.netdevs)), func(d *netdev) bool { return d.busy }) {
		a.idle.Wait()
	}
	all := a.netdevs
	a.netdevs, a.closed = map[string]*netdev{}, true
	for _, d := range all {
		if d.lingerT != nil {
			d.lingerT.Stop()
		}
	}
	own := a.own
	a.own = nil
	a.mu.Unlock()
	var errs []error
	for _, d := range all {
		if d.link != nil {
			errs = append(errs, d.link.Close())
		}
		d.setRunning(nil)
		errs = append(errs, d.prog.Close())
		d.lock.release()
	}
	if own != nil {
		errs = append(errs, own.Close())
	}
	if a.sysOpened.Load() {
		if s, err := a.sysfs(); err == nil {
			errs = append(errs, s.Close())
		}
	}
	return errors.Join(errs...)
}

// Kick asks the event loop for a reconcile of every netdev.
func (a *Agent) Kick() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// Listening is closed once Run follows the link notifications of the
// netdevs' namespace and has reconciled every netdev since: from then on
// a change of a netdev's XDP hook is acted on without waiting for the
// resync, and Run holds its namespace handle and netlink socket. It
// stays open if Run fails before.
func (a *Agent) Listening() <-chan struct{} { return a.listening }

// Ifindex is the managed netdev name's ifindex now (it changes when the
// netdev is re-created); false when name is not managed.
func (a *Agent) Ifindex(name string) (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d := a.netdevs[name]
	if d == nil {
		return 0, false
	}
	return d.ifindex, true
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
	h, err := nic.Handle(a.cfg.NetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	return f(h)
}

// setRunning records what runs on the netdev, closing an adopted
// predecessor's program it replaces (never the agent's own).
func (d *netdev) setRunning(p *ebpf.Program) {
	if d.running != nil && d.running != d.prog.Prog() && d.running != p {
		// The agent's reference to a program the kernel keeps while it is
		// attached: closing it can only fail for a bad descriptor.
		_ = d.running.Close()
	}
	d.running = p
}
