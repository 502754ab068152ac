package broker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// SocketName is the name of an allocation's socket in its directory.
const SocketName = "xdpq.sock"

// Datapath is what the broker needs of the agent of a netdev: it puts the
// sockets it binds into the netdev's XSKMAP and takes them out. The map
// itself never leaves it: on a netdev shared by several allocations (a
// queue pool) a descriptor of the map would let its holder delete or
// replace every other allocation's sockets.
type Datapath interface {
	// AddSocket puts a bound socket into the netdev's XSKMAP.
	AddSocket(netdev string, queue uint32, fd int) error
	// RemoveSocket takes the socket of inode out again; a queue that
	// holds another socket by now (its next holder's) keeps it.
	RemoveSocket(netdev string, queue uint32, inode uint64) error
}

// PodDatapath is the datapath of a netdev that is one allocation's alone,
// in its pod's network namespace (a netdev-mode pool). It is the only
// kind of datapath whose XSKMAP the broker hands out, and only to that
// allocation's owner, for sockets the owner creates itself (DPDK's
// af_xdp driver). The server's own datapath, shared by the allocations
// of queue pools, has no way to hand out a map.
type PodDatapath interface {
	Datapath
	// XSKMapFD returns a new descriptor of the netdev's XSKMAP; the caller
	// closes it. From then on xdpq's program stays attached to the netdev
	// for as long as the allocation has it: the sockets the owner inserts
	// are invisible to the agent.
	XSKMapFD() (int, error)
}

// Allocation is a set of queues of one netdev given to one owner.
type Allocation struct {
	ID     string
	Netdev xsk.Netdev
	Queues []uint32
	Owner  Owner
	Limits wire.Limits
	// BusyPoll, if set, is the pool's busy polling: every socket a lease
	// is given is set up for it, and a DPDK client may ask for no more.
	BusyPoll *wire.BusyPoll
	// Mode is how sockets bind: auto (zero-copy where the driver has it),
	// copy or zero-copy.
	Mode xsk.Mode
	// Dir is the directory the allocation's socket is created in; only the
	// allocation's container should see it.
	Dir string
	// Links are other paths of the socket: hard links, on Dir's
	// filesystem, made again whenever the socket is and removed with it.
	// DPDK's af_xdp driver looks for afxdp.sock in the directory; a
	// mount of the socket file itself must come from a path that no
	// container can change.
	Links []string
	// Resumable is the lease a previous daemon reported for this
	// allocation (its last Config.OnLease call): a client still holding
	// those sockets may resume the lease with them instead of binding new
	// ones. Nil when the allocation had no lease.
	Resumable []LeaseSocket
}

// SocketPath is where the allocation's socket is.
func (a Allocation) SocketPath() string { return filepath.Join(a.Dir, SocketName) }

// Config configures a Server.
type Config struct {
	// ProcRoot is where procfs is mounted; "" means /proc.
	ProcRoot string
	// StepTimeout bounds how long the server waits for each client message
	// of a handshake; zero means 10s.
	StepTimeout time.Duration
	// MaxHandshakes bounds the owner's connections of one allocation that
	// are in a handshake at once (a device plugin handshake counts for as
	// long as it is open); more are closed as soon as they are accepted.
	// Zero means 16. Peers that are not the owner never take one of these:
	// they are refused at once.
	MaxHandshakes int
	// MaxConnections bounds the connections of all allocations together
	// that are in a handshake or being refused (an active lease no longer
	// counts); more are closed as soon as they are accepted. Zero means
	// DefaultMaxConnections. With MaxHandshakes and the four refusals
	// per allocation it bounds the descriptors the server holds for
	// connections.
	MaxConnections int
	// OnLease, if set, is told of every lease of an allocation, for the
	// daemon to record and hand to its successor as
	// Allocation.Resumable: the sockets of a lease (queue and inode) when
	// it becomes active (also when resumed), before the client is told
	// so, and nil once it has ended and its sockets have left the XSKMAP,
	// or when Retarget forgets a recorded lease. It is called without any
	// lock of the server held, never on the goroutine of a call into the
	// server (so it may take the lock its caller holds); calls for one
	// allocation come in order (a lease's end is reported before the next
	// lease's start), calls for different allocations may run
	// concurrently. A lease's end may be reported after Remove returned;
	// Remove does not report a recorded lease that was never resumed.
	// Close reports nothing: the leases stay in the kernel for the next
	// daemon to resume.
	OnLease func(alloc string, socks []LeaseSocket)
	// ClaimPod, if set, is asked before an allocation whose owner is any
	// pod (Owner.AnyPod) serves a process of a pod: whether that pod
	// holds the allocation (the daemon asks kubelet which devices the pod
	// has). Nil binds the allocation to the pod: from then on its owner
	// is that pod, and a process of any other pod is refused. An error
	// refuses the peer, with the error as the reason. It is called on the
	// connection's goroutine with no lock of the server held, with a
	// context that ends after StepTimeout; calls for one allocation may
	// run concurrently (the owner taken is the first claim's to finish).
	// Without it any pod's process is accepted: the allocation's
	// directory, mounted into its container only, keeps others out.
	ClaimPod func(ctx context.Context, alloc string, pod PodIdentity) error
	// OnRefuse, if set, is told of every connection refused (those
	// counted by Refusals): the allocation, the peer, the protocol's error
	// code and the reason. It is called on the goroutine that refused
	// (the connection's, or the accept loop's) with no lock of the server
	// held, and must not block.
	OnRefuse func(alloc string, peer Peer, code, reason string)
	Logger   *slog.Logger
}

// Server serves the allocations' sockets.
type Server struct {
	cfg Config
	dp  Datapath
	log *slog.Logger
	// bind binds a lease's sockets (xsk.Bind), and dirUID owns the
	// allocations' directories (root, 0): what needs privileges, which
	// the tests of the broker's decisions without root fake.
	bind   binder
	dirUID int

	mu     sync.Mutex // guards allocs, adding, closed, open and refusals
	allocs map[string]*allocation
	adding map[string]bool // ids whose socket Add is creating
	closed bool
	open   int           // connections in a handshake or being refused
	staged atomic.Uint64 // names listen's staged sockets apart
	// refusals counts the connections refused, by wire code.
	refusals map[string]uint64
	wg       sync.WaitGroup // connection and accept goroutines
}

// How long a peer that is not the owner has to send its first message
// (so that it learns why it is refused, in its protocol), and how many
// such peers are answered at once; more are closed without an answer.
const (
	refuseWait        = 500 * time.Millisecond
	maxRefusals       = 4
	defaultHandshakes = 16
)

// binder binds AF_XDP sockets to queues with memfd as their UMEM, as
// xsk.Bind does.
type binder func(dev xsk.Netdev, memfd int, queues []uint32, cfg xsk.Config) ([]xsk.Bound, error)

// DefaultMaxConnections is Config.MaxConnections when it is zero.
const DefaultMaxConnections = 4096

type allocation struct {
	id     string
	names  []string // its socket's path and links
	queues []uint32
	mode   xsk.Mode
	ln     *net.UnixListener
	done   chan struct{} // closed when the allocation stops being served

	mu    sync.Mutex // guards everything below
	owner Owner
	dev   xsk.Netdev // where sockets bind
	dp    Datapath   // the agent of the netdev: the server's unless retargeted
	// own is dp when the allocation was retargeted to a netdev of its own
	// (Retarget with a PodDatapath), else nil: only then may a DPDK client
	// have the netdev's XSKMAP.
	own      PodDatapath
	limits   wire.Limits
	busyPoll *wire.BusyPoll
	conns    map[*net.UnixConn]bool
	stopping bool // the allocation is being removed or the server closed
	detached bool // the server closed: its leases stay for the next daemon
	// leased is true while a native client holds the allocation (from its
	// hello until its lease's end has been dealt with).
	leased bool
	// lease is the sockets of the active lease, or of the lease a previous
	// daemon recorded until it is resumed or replaced.
	lease []LeaseSocket
	// active is the active lease, for Stats, until its duplicates close.
	active *lease
	// ended is closed once the last lease's end has been reported.
	ended                chan struct{}
	handshakes, refusals int
	quietUntil           time.Time // rate limit of warnings about connections
	quietCount           int       // warnings not logged since the last
	stopOnce             sync.Once
}

// policy is what a connection works with, as of its start.
type policy struct {
	owner    Owner
	dev      xsk.Netdev
	dp       Datapath
	own      PodDatapath
	limits   wire.Limits
	busyPoll *wire.BusyPoll
}

func (al *allocation) policy() policy {
	al.mu.Lock()
	defer al.mu.Unlock()
	p := policy{owner: al.owner, dev: al.dev, dp: al.dp, own: al.own, limits: al.limits}
	if al.busyPoll != nil {
		bp := *al.busyPoll
		p.busyPoll = &bp
	}
	return p
}

// NewServer returns a server that puts sockets into dp's XSKMAPs.
func NewServer(cfg Config, dp Datapath) *Server {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.StepTimeout == 0 {
		cfg.StepTimeout = 10 * time.Second
	}
	if cfg.MaxHandshakes <= 0 {
		cfg.MaxHandshakes = defaultHandshakes
	}
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg, dp: dp, log: cfg.Logger, bind: xsk.Bind, allocs: map[string]*allocation{}, adding: map[string]bool{},
		refusals: map[string]uint64{}}
}

// Add starts serving an allocation at its socket path.
func (s *Server) Add(a Allocation) error {
	if a.ID == "" || len(a.Queues) == 0 || a.Dir == "" {
		return fmt.Errorf("allocation %q needs an id, queues and a directory", a.ID)
	}
	for _, l := range a.Links {
		if !filepath.IsAbs(l) || filepath.Clean(l) != l || l == a.SocketPath() || filepath.Dir(l) == l {
			return fmt.Errorf("allocation %s: link %q is not another absolute path for its socket", a.ID, l)
		}
	}
	if a.Limits == (wire.Limits{}) {
		a.Limits = wire.DefaultLimits
	}
	if a.BusyPoll != nil {
		if err := a.BusyPoll.Validate(); err != nil {
			return fmt.Errorf("allocation %s: %w", a.ID, err)
		}
	}
	if err := checkResumable(a.Resumable, a.Queues); err != nil {
		return fmt.Errorf("allocation %s: resumable lease: %w", a.ID, err)
	}
	s.mu.Lock()
	_, exists := s.allocs[a.ID]
	switch {
	case s.closed:
		s.mu.Unlock()
		return fmt.Errorf("allocation %s: the server is closed", a.ID)
	case exists || s.adding[a.ID]:
		s.mu.Unlock()
		return fmt.Errorf("allocation %s exists", a.ID)
	}
	s.adding[a.ID] = true
	s.mu.Unlock()

	al, err := s.listen(a)
	s.mu.Lock()
	delete(s.adding, a.ID)
	if err == nil && s.closed {
		err = fmt.Errorf("allocation %s: the server is closed", a.ID)
		if uerr := al.unlisten(); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.allocs[a.ID] = al
	s.wg.Add(1)
	s.mu.Unlock()
	go s.accept(al)
	s.log.Info("serving allocation", "allocation", a.ID, "netdev", a.Netdev.Name, "queues", a.Queues,
		"socket", a.SocketPath(), "resumable", len(a.Resumable) > 0)
	return nil
}

// listen creates the allocation's socket.
//
// The allocation's directory is writable by its owner: by the owner's uid
// in standalone mode, by the container's root in Kubernetes, where it is
// mounted into the container. So nothing in it is changed by its path,
// which the owner could swap for a symlink to any file of the node between
// two calls: the socket is bound, given its owner and mode, and linked in
// a staging directory only root can write, then renamed into place
// (rename replaces whatever is at the target and follows no link there).
func (s *Server) listen(a Allocation) (*allocation, error) {
	fail := func(err error) (*allocation, error) {
		return nil, fmt.Errorf("listen for allocation %s: %w", a.ID, err)
	}
	if err := os.MkdirAll(a.Dir, 0o755); err != nil {
		return fail(err)
	}
	// The directory's parent is the daemon's: its own path is safe to use.
	if err := restrictDir(a.Dir, a.Owner, s.dirUID); err != nil {
		return fail(err)
	}
	staging := filepath.Join(filepath.Dir(a.Dir), StagingDir)
	if err := os.MkdirAll(staging, 0o700); err != nil {
		return fail(err)
	}
	if err := os.Chmod(staging, 0o700); err != nil {
		return fail(err)
	}
	// Unique to this server and call: servers of other processes may
	// share the directory (tests do; daemons do not, their state
	// directory's lock keeps a second one out). Short: a socket's path
	// has room for 107 bytes, and this one must fit wherever the
	// allocation's own (<dir>/xdpq.sock) does.
	tmp := filepath.Join(staging, fmt.Sprintf("%d.%d", os.Getpid(), s.staged.Add(1)))
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: tmp, Net: "unixpacket"})
	if err != nil {
		return fail(err)
	}
	ln.SetUnlinkOnClose(false) // the socket is elsewhere by then: unlisten removes it
	names := append([]string{a.SocketPath()}, a.Links...)
	var staged []string
	undo := func(err error) (*allocation, error) {
		_ = ln.Close() // never served; the names below are what could stay behind
		for _, p := range append(staged, tmp) {
			err = joinRemove(err, p)
		}
		return fail(err)
	}
	uid, mode := -1, os.FileMode(0o666)
	if owned(a.Owner) {
		uid, mode = int(*a.Owner.UID), 0o600
	}
	// The mode while root owns it, then the owner: a daemon that changes
	// the mode of a file it does not own needs CAP_FOWNER, which the
	// DaemonSet does not give it.
	if err := os.Chmod(tmp, mode); err != nil {
		return undo(err)
	}
	if err := os.Chown(tmp, uid, -1); err != nil {
		return undo(err)
	}
	for i := range a.Links {
		l := fmt.Sprintf("%s.%d", tmp, i+1)
		if err := joinRemove(nil, l); err != nil { // a stale one, or Link fails
			return undo(err)
		}
		if err := os.Link(tmp, l); err != nil {
			return undo(err)
		}
		staged = append(staged, l)
	}
	// The links first, the socket's own name last: a client that finds
	// the socket finds every other name of it too.
	for i, l := range staged {
		if err := os.Rename(l, a.Links[i]); err != nil {
			for _, done := range a.Links[:i] {
				err = joinRemove(err, done)
			}
			return undo(err)
		}
	}
	if err := os.Rename(tmp, names[0]); err != nil {
		for _, l := range a.Links {
			err = joinRemove(err, l)
		}
		return undo(err)
	}
	al := &allocation{id: a.ID, names: names, queues: slices.Clone(a.Queues), mode: a.Mode, ln: ln, done: make(chan struct{}),
		owner: a.Owner, dev: a.Netdev, dp: s.dp, limits: a.Limits, conns: map[*net.UnixConn]bool{},
		lease: slices.Clone(a.Resumable)}
	if a.BusyPoll != nil {
		bp := *a.BusyPoll
		al.busyPoll = &bp
	}
	return al, nil
}

// StagingDir is where the broker makes sockets before it moves them into
// their allocations' directories: a directory beside those, that only
// root may write. A daemon that removes allocation directories no record
// names must leave it alone.
const StagingDir = ".staging"

// owned says whether an allocation's owner is a local uid (standalone),
// whose alone its directory and socket are.
func owned(o Owner) bool { return o.UID != nil && o.PodUID == "" && !o.AnyPod }

// restrictDir sets who may reach an allocation's directory. Root owns it,
// always: the daemon (root without CAP_DAC_OVERRIDE or CAP_FOWNER in the
// DaemonSet) puts sockets in it and removes them, and the holder can
// plant nothing there. An owner known by uid (standalone) gets 0711: the
// socket inside is its alone (0600), and other users may not list the
// directory. An owner known by its pod (Kubernetes) runs as a uid the
// daemon does not know: the directory is mounted into the pod's container
// only, and it and the socket are open to whoever sees them (0755, 0666);
// the broker decides by the peer's credentials, at once. root is root's
// uid: 0, but for the tests without root their own.
func restrictDir(dir string, o Owner, root int) error {
	mode := os.FileMode(0o755)
	if owned(o) {
		mode = 0o711
	}
	// Root first (a directory of an older daemon was its owner's), then
	// the mode: the mode of a directory root does not own would need
	// CAP_FOWNER.
	if err := os.Lchown(dir, root, -1); err != nil {
		return err
	}
	return os.Chmod(dir, mode)
}

// unlisten closes the allocation's socket and removes its names (unlink
// follows no link: whatever the owner put there goes, nothing else). A
// name it could not remove is returned: it stays behind, a socket nobody
// answers.
func (al *allocation) unlisten() error {
	// Closing frees the listening socket even when it reports an error;
	// its names are what could stay.
	_ = al.ln.Close()
	var err error
	for _, n := range al.names {
		err = joinRemove(err, n)
	}
	return err
}

// joinRemove removes path and adds to err the failure to, when path was
// there: what it leaves behind.
func joinRemove(err error, path string) error {
	if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		return errors.Join(err, rerr)
	}
	return err
}

func (s *Server) lookup(id string) (*allocation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	al, ok := s.allocs[id]
	if !ok {
		return nil, fmt.Errorf("no allocation %s", id)
	}
	return al, nil
}

// SetOwner changes who may use an allocation from now on (connections
// already open are not affected): Kubernetes learns the pod of an
// allocation only after Allocate, from the CNI plugin. Who may reach its
// socket stays as Add made it (restrictDir): the daemon changes nothing
// in the directory by path.
func (s *Server) SetOwner(id string, o Owner) error {
	al, err := s.lookup(id)
	if err != nil {
		return err
	}
	al.mu.Lock()
	al.owner = o
	al.mu.Unlock()
	return nil
}

// SetLimits changes an allocation's limits and busy polling (nil: none),
// after a change of its pool's configuration. They hold for the next
// lease and for device plugin commands from now on; a lease already
// active, or resumed, keeps the sockets it has.
func (s *Server) SetLimits(id string, lim wire.Limits, bp *wire.BusyPoll) error {
	if lim == (wire.Limits{}) {
		lim = wire.DefaultLimits
	}
	if bp != nil {
		if err := bp.Validate(); err != nil {
			return fmt.Errorf("allocation %s: %w", id, err)
		}
		c := *bp
		bp = &c
	}
	al, err := s.lookup(id)
	if err != nil {
		return err
	}
	al.mu.Lock()
	al.limits, al.busyPoll = lim, bp
	al.mu.Unlock()
	return nil
}

// Retarget moves an allocation to another netdev: a netdev-mode pool's
// netdev moved into its pod's network namespace (dev.NetNS) with the
// agent that manages it there (own), and back to the node (own nil: the
// server's datapath). Open connections close, their sockets leaving the
// old XSKMAP: they were bound where the netdev no longer is. For the same
// reason a lease recorded by a previous daemon and not resumed yet is
// forgotten (and reported ended), unless dev is where the allocation
// already was.
func (s *Server) Retarget(id string, dev xsk.Netdev, own PodDatapath) error {
	al, err := s.lookup(id)
	if err != nil {
		return err
	}
	var dp Datapath = s.dp
	if own != nil {
		dp = own
	}
	al.mu.Lock()
	conns := slices.Collect(maps.Keys(al.conns))
	var ended chan struct{}
	if al.dev != dev && !al.leased && len(al.lease) > 0 {
		al.lease = nil
		ended = make(chan struct{})
		al.ended = ended
	}
	al.dev, al.dp, al.own = dev, dp, own
	al.mu.Unlock()
	if len(conns) > 0 {
		s.log.Info("connections end: the allocation's netdev moves", "allocation", id, "netdev", dev.Name, "connections", len(conns))
	}
	for _, c := range conns {
		_ = c.Close() // ended on purpose: its goroutine sees the close and cleans up
	}
	if ended != nil {
		s.log.Info("recorded lease forgotten: the allocation's netdev moved", "allocation", id, "netdev", dev.Name)
		// Not on the caller's goroutine: it may hold the lock OnLease takes.
		s.mu.Lock()
		closed := s.closed // Close reports nothing, and waits for no more goroutines
		if !closed {
			s.wg.Add(1)
		}
		s.mu.Unlock()
		if closed {
			close(ended)
			return nil
		}
		go func() {
			defer s.wg.Done()
			if s.cfg.OnLease != nil {
				s.cfg.OnLease(id, nil)
			}
			close(ended)
		}()
	}
	return nil
}

// Leased reports whether a client holds the allocation's sockets now. A
// lease's sockets leave the XSKMAP before the lease is free for the next.
func (s *Server) Leased(id string) bool {
	al, err := s.lookup(id)
	if err != nil {
		return false
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	return al.leased
}

// Holder returns the process that holds the allocation's active lease,
// if one does: the peer that took it, or resumed it after a restart.
func (s *Server) Holder(id string) (Peer, bool) {
	al, err := s.lookup(id)
	if err != nil {
		return Peer{}, false
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.active == nil || !al.leased {
		return Peer{}, false
	}
	return al.active.peer, true
}

// Remove stops serving an allocation: its socket goes, its connections
// close, and its lease ends (its sockets leave the XSKMAP and OnLease
// reports the end, perhaps after Remove returned).
func (s *Server) Remove(id string) error {
	s.mu.Lock()
	al, ok := s.allocs[id]
	delete(s.allocs, id)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("no allocation %s", id)
	}
	s.stop(al, false)
	return nil
}

// Close stops serving every allocation and waits for the connections to
// end. It is the daemon going away, not the allocations: the leases stay
// as they are in the kernel (their sockets in the XSKMAP, traffic
// flowing), nothing is reported to OnLease, and their clients resume them
// with the next daemon.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	als := slices.Collect(maps.Values(s.allocs))
	clear(s.allocs)
	s.mu.Unlock()
	for _, al := range als {
		s.stop(al, true)
	}
	s.wg.Wait()
}

// stop closes the allocation's socket and connections; detach leaves the
// lease to a successor.
func (s *Server) stop(al *allocation, detach bool) {
	al.mu.Lock()
	al.stopping, al.detached = true, detach
	conns := slices.Collect(maps.Keys(al.conns))
	active := al.active
	al.mu.Unlock()
	if active != nil {
		// Not left to the lease's end on the connection's goroutine: a
		// removed allocation's queues may be given again at once.
		al.dropFDs(active)
	}
	al.stopOnce.Do(func() { close(al.done) })
	if err := al.unlisten(); err != nil {
		s.log.Warn("allocation's socket names left behind", "allocation", al.id, "err", err)
	}
	for _, c := range conns {
		_ = c.Close() // ended on purpose: its goroutine sees the close and cleans up
	}
}

// Serve runs until ctx ends, then closes the server.
func (s *Server) Serve(ctx context.Context) {
	<-ctx.Done()
	s.Close()
}
