package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

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

// lease is an active lease: its sockets are in dp's XSKMAP of dev.
type lease struct {
	dev   xsk.Netdev
	dp    Datapath
	peer  Peer // who holds it
	socks []LeaseSocket
	// fds are the server's duplicates of the sockets (socks' order), for
	// their statistics. They keep the sockets bound, so they live no
	// longer than the lease: closed when it ends, when its allocation
	// is removed or the server closes (a resumed lease gets them again
	// from the client). The fields below are guarded by the allocation's
	// mu: a Stats reading them holds the lease (readers), and the last
	// of it and dropFDs closes them, so no lock is held across the
	// kernel call.
	fds     []int
	readers int
	closing bool // dropFDs was called
	closed  bool // fds are closed
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
	return &Server{cfg: cfg, dp: dp, log: cfg.Logger, allocs: map[string]*allocation{}, adding: map[string]bool{}, refusals: map[string]uint64{}}
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
	if err := restrictDir(a.Dir, a.Owner); err != nil {
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
// the broker decides by the peer's credentials, at once.
func restrictDir(dir string, o Owner) error {
	mode := os.FileMode(0o755)
	if owned(o) {
		mode = 0o711
	}
	// Root first (a directory of an older daemon was its owner's), then
	// the mode: the mode of a directory root does not own would need
	// CAP_FOWNER.
	if err := os.Lchown(dir, 0, -1); err != nil {
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

// checkResumable checks a recorded lease against the allocation's queues.
func checkResumable(socks []LeaseSocket, queues []uint32) error {
	seen := map[uint32]bool{}
	for _, ls := range socks {
		if !slices.Contains(queues, ls.Queue) {
			return fmt.Errorf("queue %d is not the allocation's (%v)", ls.Queue, queues)
		}
		if seen[ls.Queue] {
			return fmt.Errorf("queue %d recorded twice", ls.Queue)
		}
		if ls.Inode == 0 {
			return fmt.Errorf("queue %d: no inode", ls.Queue)
		}
		seen[ls.Queue] = true
	}
	return nil
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

// accept serves the allocation's socket until it closes. Errors such as
// EMFILE, ENFILE or ECONNABORTED leave the socket open: the loop backs off
// (5 ms doubling to 1 s, as net/http does) and goes on.
func (s *Server) accept(al *allocation) {
	defer s.wg.Done()
	var delay time.Duration
	for {
		c, err := al.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Error("accept; retrying", "allocation", al.id, "err", err, "retry_in", delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-al.done:
				t.Stop()
				return
			}
			continue
		}
		delay = 0
		s.admit(c, al)
	}
}

// admit identifies the peer of a new connection at once. The owner gets a
// handshake slot; anyone else is told why it is refused, a few at a time,
// and closed; what is over either bound is closed at once. A flood of
// connections from others thus costs the owner nothing.
func (s *Server) admit(c *net.UnixConn, al *allocation) {
	peer, err := peerOf(c, s.cfg.ProcRoot)
	if err != nil {
		_ = c.Close() // refused; the reason is logged next
		s.warn(al, "peer not identified; connection closed", "err", err)
		return
	}
	p := al.policy()
	why := p.owner.check(peer)
	s.mu.Lock()
	full := s.open >= s.cfg.MaxConnections
	if !full {
		s.open++
	}
	s.mu.Unlock()
	if full {
		_ = c.Close() // refused; the reason is logged next
		s.warn(al, "too many connections in a handshake across the daemon; closed", "peer", peer.String(), "limit", s.cfg.MaxConnections)
		return
	}
	al.mu.Lock()
	admitted := false
	switch {
	case al.stopping:
	case why != nil && al.refusals < maxRefusals:
		al.refusals++
		admitted = true
	case why == nil && al.handshakes < s.cfg.MaxHandshakes:
		al.handshakes++
		admitted = true
	}
	if admitted {
		al.conns[c] = true
		s.wg.Add(1)
	}
	al.mu.Unlock()
	if !admitted {
		s.closeSlot()
		_ = c.Close() // refused; the reason is logged next
		if why != nil {
			s.refused(al, peer, wire.CodeForbidden, why.Error())
			s.warn(al, "refused", "peer", peer.String(), "reason", why, "answered", false)
		} else {
			s.warn(al, "too many connections in a handshake; closed", "peer", peer.String(), "limit", s.cfg.MaxHandshakes)
		}
		return
	}
	go func() {
		defer s.wg.Done()
		var l *lease
		if why != nil {
			s.refuseForeign(c, al, peer, why)
			s.closeSlot()
		} else {
			held := true
			release := func() {
				if held {
					held = false
					al.mu.Lock()
					al.handshakes--
					al.mu.Unlock()
					s.closeSlot()
				}
			}
			var err error
			l, err = s.serve(c, al, peer, release)
			release()
			if err != nil { // told, and logged, once the slot is free again
				s.fail(c, al, peer, err)
			}
		}
		_ = c.Close() // the handshake or lease is over; its outcome was logged
		al.mu.Lock()
		delete(al.conns, c)
		if why != nil {
			al.refusals--
		}
		al.mu.Unlock()
		if l != nil {
			s.end(al, l)
		}
	}()
}

// claim binds an allocation whose owner is any pod to the pod of its
// peer, if Config.ClaimPod says that pod holds it; else the peer is
// refused. Allocations with another owner pass.
func (s *Server) claim(al *allocation, peer Peer) error {
	if s.cfg.ClaimPod == nil || !al.policy().owner.AnyPod {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.StepTimeout)
	defer cancel()
	if err := s.cfg.ClaimPod(ctx, al.id, peer.Pod); err != nil {
		return refuse(wire.CodeForbidden, "pod %s: %v", peer.Pod.PodUID, err)
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.owner.AnyPod {
		al.owner = Owner{PodUID: peer.Pod.PodUID}
		return nil
	}
	if err := al.owner.check(peer); err != nil { // another pod's claim came first
		return refuse(wire.CodeForbidden, "%v", err)
	}
	return nil
}

// closeSlot gives back a connection's place under MaxConnections.
func (s *Server) closeSlot() {
	s.mu.Lock()
	s.open--
	s.mu.Unlock()
}

// warn logs a warning about a connection, at most one a second per
// allocation, with the count of those left out since.
func (s *Server) warn(al *allocation, msg string, args ...any) {
	al.mu.Lock()
	now := time.Now()
	quiet := now.Before(al.quietUntil)
	left := al.quietCount
	if quiet {
		al.quietCount++
	} else {
		al.quietUntil, al.quietCount = now.Add(time.Second), 0
	}
	al.mu.Unlock()
	if quiet {
		return
	}
	if left > 0 {
		args = append(args, "not_logged_before", left)
	}
	s.log.Warn(msg, append([]any{"allocation", al.id}, args...)...)
}

// refuseForeign tells a peer that is not the owner why, in the protocol
// its first message speaks, if it sends one soon.
func (s *Server) refuseForeign(c *net.UnixConn, al *allocation, peer Peer, why error) {
	s.refused(al, peer, wire.CodeForbidden, why.Error())
	s.warn(al, "refused", "peer", peer.String(), "reason", why)
	first, fds, err := s.recv(c, 1, min(s.cfg.StepTimeout, refuseWait))
	closeFDs(fds)
	if err != nil {
		return
	}
	// The answer to a refused peer is a courtesy: the refusal is logged
	// above, and a peer that cannot be told has gone.
	if first[0] == '/' {
		_ = s.sendDPDK(c, dpdkHostNak)
		return
	}
	pe := refuse(wire.CodeForbidden, "%v", why)
	_ = s.send(c, wire.Message{Type: wire.TypeError, Code: pe.Code, Reason: pe.Reason})
}

// recv reads one message with at most maxFDs descriptors within the step timeout.
func (s *Server) recv(c *net.UnixConn, maxFDs int, timeout time.Duration) ([]byte, []int, error) {
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, nil, err
	}
	buf := make([]byte, wire.MaxMessage+1)
	n, fds, err := xsk.RecvFDs(c, buf, maxFDs)
	if errors.Is(err, xsk.ErrTruncated) {
		return nil, nil, refuse(wire.CodeBadMessage, "message too long or too many descriptors (at most %d)", maxFDs)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil, nil, refuse(wire.CodeTimeout, "no message within %v", timeout)
	}
	if errors.Is(err, io.EOF) {
		return nil, nil, errClosed
	}
	if err != nil {
		return nil, nil, err
	}
	if n == 0 {
		closeFDs(fds)
		return nil, nil, errClosed
	}
	return buf[:n], fds, nil
}

// serve runs the owner's connection: a device plugin handshake, or the
// native one and then, once active, the lease until the connection
// closes. It returns the lease, if one became active (the caller ends
// it), and why the handshake failed (the caller tells the client). Once
// the lease is active it calls release: it no longer takes a handshake
// slot.
func (s *Server) serve(c *net.UnixConn, al *allocation, peer Peer, release func()) (*lease, error) {
	first, fds, err := s.recv(c, 1, s.cfg.StepTimeout)
	if err != nil {
		return nil, err
	}
	if err := s.claim(al, peer); err != nil {
		closeFDs(fds)
		if first[0] == '/' { // told in the protocol it speaks
			s.refused(al, peer, wire.CodeForbidden, err.Error())
			s.warn(al, "refused", "peer", peer.String(), "reason", err)
			_ = s.sendDPDK(c, dpdkHostNak) // refused and logged; a peer not told has gone
			return nil, nil
		}
		return nil, err
	}
	if first[0] == '/' {
		s.dpdk(c, al, peer, first, fds)
		return nil, nil
	}
	if len(fds) > 0 {
		closeFDs(fds)
		return nil, refuse(wire.CodeBadMessage, "hello carries no descriptor")
	}
	l, err := s.native(c, al, peer, first)
	if err != nil {
		return l, err
	}
	release()
	// The connection is the lease: wait for it to close.
	for {
		_, fds, err := s.recv(c, 0, 24*time.Hour*365)
		closeFDs(fds)
		var pe *wire.ProtocolError
		if err != nil && !errors.As(err, &pe) {
			return l, nil
		}
	}
}

// fail logs a refused or broken handshake and tells the client why.
func (s *Server) fail(c *net.UnixConn, al *allocation, peer Peer, err error) {
	var pe *wire.ProtocolError
	if !errors.As(err, &pe) {
		if errors.Is(err, errClosed) || errors.Is(err, net.ErrClosed) {
			s.log.Info("client left during the handshake", "allocation", al.id, "peer", peer.String())
			return
		}
		pe = refuse(wire.CodeInternal, "%v", err)
	}
	s.refused(al, peer, pe.Code, pe.Reason)
	s.log.Warn("refused", "allocation", al.id, "peer", peer.String(), "code", pe.Code, "reason", pe.Reason)
	_ = s.send(c, wire.Message{Type: wire.TypeError, Code: pe.Code, Reason: pe.Reason}) // logged above; a peer not told has gone
}

func (s *Server) send(c *net.UnixConn, m wire.Message, fds ...int) error {
	b, err := jsonMarshal(m)
	if err != nil {
		return err
	}
	if err := c.SetWriteDeadline(time.Now().Add(s.cfg.StepTimeout)); err != nil {
		return err
	}
	return xsk.SendFDs(c, b, fds)
}

// sendDPDK sends a line of the DPDK protocol, with fds.
func (s *Server) sendDPDK(c *net.UnixConn, text string, fds ...int) error {
	if err := c.SetWriteDeadline(time.Now().Add(s.cfg.StepTimeout)); err != nil {
		return err
	}
	return xsk.SendFDs(c, []byte(text), fds)
}

// native runs the native handshake. A lease it returns is active (its
// sockets are in the XSKMAP), even with an error (the client did not
// learn so): the caller ends it.
func (s *Server) native(c *net.UnixConn, al *allocation, peer Peer, first []byte) (*lease, error) {
	hello, err := wire.ParseMessage(first, wire.TypeHello)
	if err != nil {
		return nil, err
	}
	if hello.Version != wire.Version {
		return nil, refuse(wire.CodeVersion, "protocol version %d; this daemon speaks %d", hello.Version, wire.Version)
	}
	al.mu.Lock()
	if al.leased {
		al.mu.Unlock()
		return nil, refuse(wire.CodeBusy, "allocation %s is in use by another connection; close it first", al.id)
	}
	al.leased = true
	al.mu.Unlock()
	l, err := s.handshake(c, al, peer)
	if l == nil {
		al.mu.Lock()
		al.leased = false
		al.mu.Unlock()
	}
	return l, err
}

func (s *Server) handshake(c *net.UnixConn, al *allocation, peer Peer) (*lease, error) {
	p := al.policy()
	lim := p.limits
	if err := s.send(c, wire.Message{Type: wire.TypeWelcome, Version: wire.Version, Allocation: al.id, Netdev: p.dev.Name,
		Queues: al.queues, Limits: &lim, BusyPoll: p.busyPoll}); err != nil {
		return nil, err
	}
	b, fds, err := s.recv(c, max(1, len(al.queues)), s.cfg.StepTimeout)
	if err != nil {
		return nil, err
	}
	m, err := wire.Decode(b)
	switch {
	case err != nil:
	case m.Type == wire.TypeRequest:
		return s.request(c, al, peer, p, m, fds)
	case m.Type == wire.TypeResume:
		return s.resume(c, al, peer, p, m, fds)
	default:
		err = refuse(wire.CodeBadMessage, "got a %q message, want %q or %q", m.Type, wire.TypeRequest, wire.TypeResume)
	}
	closeFDs(fds)
	return nil, err
}

// request binds new sockets with the client's memfd as their UMEM.
func (s *Server) request(c *net.UnixConn, al *allocation, peer Peer, p policy, req *wire.Message, fds []int) (*lease, error) {
	if len(fds) != 1 {
		closeFDs(fds)
		return nil, refuse(wire.CodeBadRequest, "a request carries exactly one descriptor, the UMEM memfd; got %d", len(fds))
	}
	memfd := fds[0]
	cfg, err := checkRequest(req, al.queues, p.limits)
	if err == nil {
		err = checkMemfd(memfd, cfg.UMEM, p.limits)
	}
	if err != nil {
		closeFDs([]int{memfd})
		return nil, err
	}
	cfg.Mode = al.mode
	bound, err := xsk.Bind(p.dev, memfd, req.Queues, cfg)
	closeFDs([]int{memfd}) // the bound sockets' UMEM holds the pages
	if errors.Is(err, unix.EBUSY) {
		// A socket of the queue's previous holder is still bound: its
		// process has not exited yet (a pod deleted and its queues given
		// to the next before its containers were killed). The client
		// tries again.
		return nil, refuse(wire.CodeBusy, "%v: a socket of the queue's previous holder is still open; try again", err)
	}
	if errors.Is(err, xsk.ErrNoMultiBuffer) {
		return nil, refuse(wire.CodeBadRequest, "%v; ask without multi_buffer (frames larger than a UMEM frame are then dropped), or use a pool in copy or auto mode", err)
	}
	if err != nil {
		return nil, refuse(wire.CodeInternal, "%v", err)
	}
	// The copies here become the lease's duplicates once it is active, and
	// go with it; refused, they go now: an open copy would keep a socket
	// bound after the pod let it go.
	sockFDs := make([]int, len(bound))
	for i, b := range bound {
		sockFDs[i] = b.FD
	}
	kept := false
	defer func() {
		if !kept {
			closeFDs(sockFDs)
		}
	}()
	socks := make([]LeaseSocket, len(bound))
	for i, b := range bound {
		if err := setBusyPoll(b.FD, p.busyPoll); err != nil {
			return nil, refuse(wire.CodeInternal, "busy poll on %s/q%d: %v", p.dev, b.Queue, err)
		}
		ino, err := socketInode(b.FD)
		if err != nil {
			return nil, refuse(wire.CodeInternal, "%s/q%d: %v", p.dev, b.Queue, err)
		}
		socks[i] = LeaseSocket{Queue: b.Queue, Inode: ino}
	}
	if err := s.send(c, wire.Message{Type: wire.TypeSockets, Queues: req.Queues, Rings: req.Rings, FrameSize: req.FrameSize,
		Headroom: req.Headroom, ZeroCopy: bound[0].ZeroCopy, MultiBuffer: cfg.MultiBuffer}, sockFDs...); err != nil {
		return nil, err
	}
	b, _, err := s.recv(c, 0, s.cfg.StepTimeout)
	if err != nil {
		return nil, err
	}
	if _, err := wire.ParseMessage(b, wire.TypeReady); err != nil {
		return nil, err
	}
	l, err := s.activate(c, al, peer, p, socks, sockFDs, "new")
	kept = l != nil
	return l, err
}

// resume takes back the sockets of the allocation's recorded lease from
// the client that holds them: each must be an AF_XDP socket whose inode
// the lease recorded for the queue it is named for. They are the same
// sockets, bound as they were: nothing is bound, no option changes.
func (s *Server) resume(c *net.UnixConn, al *allocation, peer Peer, p policy, m *wire.Message, fds []int) (*lease, error) {
	// The client's sockets, received here, become the lease's duplicates
	// once it is active; refused, they go now.
	kept := false
	defer func() {
		if !kept {
			closeFDs(fds)
		}
	}()
	al.mu.Lock()
	recorded := slices.Clone(al.lease)
	al.mu.Unlock()
	if err := checkResume(m, len(fds), recorded); err != nil {
		return nil, err
	}
	socks := make([]LeaseSocket, len(fds))
	for i, fd := range fds {
		q := m.Queues[i]
		ino, err := xdpSocketInode(fd)
		if err != nil {
			return nil, refuse(wire.CodeBadRequest, "the descriptor for queue %d: %v", q, err)
		}
		j := slices.IndexFunc(recorded, func(ls LeaseSocket) bool { return ls.Inode == ino })
		if j < 0 {
			return nil, refuse(wire.CodeForbidden, "the socket for queue %d (inode %d) is not one of this allocation's lease", q, ino)
		}
		if recorded[j].Queue != q {
			return nil, refuse(wire.CodeForbidden, "the socket of inode %d is bound to queue %d, not %d", ino, recorded[j].Queue, q)
		}
		socks[i] = recorded[j]
	}
	l, err := s.activate(c, al, peer, p, socks, fds, "resumed")
	kept = l != nil
	return l, err
}

// queuesOf returns the queues of socks, in their order.
func queuesOf(socks []LeaseSocket) []uint32 {
	qs := make([]uint32, len(socks))
	for i, ls := range socks {
		qs[i] = ls.Queue
	}
	return qs
}

// activate puts the lease's sockets into the XSKMAP, reports the lease and
// tells the client. The lease it returns owns fds (its duplicates); with
// no lease the caller still does.
func (s *Server) activate(c *net.UnixConn, al *allocation, peer Peer, p policy, socks []LeaseSocket, fds []int, how string) (*lease, error) {
	for i, ls := range socks {
		if err := p.dp.AddSocket(p.dev.Name, ls.Queue, fds[i]); err != nil {
			for _, done := range socks[:i] {
				if rerr := p.dp.RemoveSocket(p.dev.Name, done.Queue, done.Inode); rerr != nil {
					s.log.Warn("remove socket", "allocation", al.id, "queue", done.Queue, "err", rerr)
				}
			}
			return nil, refuse(wire.CodeInternal, "%v", err)
		}
	}
	l := &lease{dev: p.dev, dp: p.dp, peer: peer, socks: socks, fds: fds}
	al.mu.Lock()
	al.lease = slices.Clone(socks)
	al.active = l
	prev := al.ended
	al.mu.Unlock()
	if prev != nil {
		<-prev // the previous lease's end is reported first
	}
	// Reported before the client learns it is active: a lease a client
	// holds has always been recorded.
	if s.cfg.OnLease != nil {
		s.cfg.OnLease(al.id, slices.Clone(socks))
	}
	if err := s.send(c, wire.Message{Type: wire.TypeActive}); err != nil {
		return l, err
	}
	s.log.Info("lease active", "allocation", al.id, "peer", peer.String(), "queues", queuesOf(socks), "lease", how)
	return l, nil
}

// end ends a lease whose connection closed: its sockets leave the XSKMAP
// and OnLease hears of it. When the server is closing, the lease stays as
// it is for the next daemon.
func (s *Server) end(al *allocation, l *lease) {
	queues := queuesOf(l.socks)
	// The duplicates go first: with the daemon closing, so that none
	// outlives it (the next daemon gets them again when the lease
	// resumes); else so that the queues are free once the end is reported.
	al.dropFDs(l)
	al.mu.Lock()
	detached := al.detached
	if detached {
		al.leased = false
	}
	al.mu.Unlock()
	if detached {
		s.log.Info("server closing; the lease stays in the kernel for the next daemon", "allocation", al.id, "queues", queues)
		return
	}
	for _, ls := range l.socks {
		if err := l.dp.RemoveSocket(l.dev.Name, ls.Queue, ls.Inode); err != nil {
			s.log.Warn("remove socket", "allocation", al.id, "queue", ls.Queue, "err", err)
		}
	}
	ended := make(chan struct{})
	al.mu.Lock()
	al.lease, al.leased, al.ended = nil, false, ended
	al.mu.Unlock()
	if s.cfg.OnLease != nil {
		s.cfg.OnLease(al.id, nil)
	}
	close(ended)
	s.log.Info("lease ended", "allocation", al.id, "queues", queues)
}

func (s *Server) dpdk(c *net.UnixConn, al *allocation, peer Peer, msg []byte, fds []int) {
	connected := false
	reply := func(text string, fds ...int) bool {
		return s.sendDPDK(c, text, fds...) == nil
	}
	for {
		cmd, err := parseDPDKCommand(msg)
		var ok bool
		switch {
		case err != nil:
			ok = reply(dpdkNak)
		case cmd.name == dpdkConnect:
			// The peer was found to be the owner when it connected.
			connected = true
			ok = reply(dpdkHostOK)
		case cmd.name == dpdkVersion:
			ok = reply(dpdkVersionAns)
		case cmd.name == dpdkXSKMapFD:
			fd, why := s.xskMap(connected, cmd, al.policy())
			if why != nil {
				s.log.Warn("xskmap refused", "allocation", al.id, "peer", peer.String(), "protocol", "dpdk", "reason", why)
				ok = reply(dpdkFDNak)
				break
			}
			ok = reply(dpdkFDAck, fd)
			closeFDs([]int{fd}) // the peer has its own copy, or is gone
		case cmd.name == dpdkBusyPoll:
			ans, why := s.busyPoll(connected, cmd, fds, al.policy().busyPoll)
			if why != nil {
				s.log.Warn("busy poll refused", "allocation", al.id, "peer", peer.String(), "protocol", "dpdk", "reason", why)
			}
			ok = reply(ans)
		case cmd.name == dpdkFin:
			reply(dpdkFinAck)
			closeFDs(fds)
			return
		default:
			ok = reply(dpdkNak)
		}
		closeFDs(fds)
		if !ok {
			return
		}
		if msg, fds, err = s.recv(c, 1, s.cfg.StepTimeout); err != nil {
			return
		}
	}
}

// xskMap returns a descriptor of the XSKMAP of the allocation's netdev
// when the netdev is the allocation's alone; the reason otherwise (the
// DPDK handshake can only say /fd_nak: the log says why).
func (s *Server) xskMap(connected bool, cmd dpdkCommand, p policy) (int, error) {
	switch {
	case !connected:
		return -1, errors.New("not connected")
	case len(cmd.args) != 1:
		return -1, fmt.Errorf("want one argument, the netdev; got %d", len(cmd.args))
	case p.own == nil:
		return -1, fmt.Errorf("the XSKMAP of %s is shared with other allocations and never leaves the daemon: "+
			"for DPDK's af_xdp driver use a netdev-mode pool (the netdev is moved into the pod), "+
			"or receive bound sockets with the xdpq client (no capability needed)", p.dev.Name)
	case cmd.args[0] != p.dev.Name:
		return -1, fmt.Errorf("netdev %q is not the allocation's; it has %s", cmd.args[0], p.dev.Name)
	}
	fd, err := p.own.XSKMapFD()
	if err != nil {
		return -1, fmt.Errorf("xskmap of %s: %w", p.dev.Name, err)
	}
	return fd, nil
}

// busyPoll configures preferred busy polling on the AF_XDP socket the
// client sent, which it may not do itself without CAP_NET_ADMIN, within
// the allocation's setting: none at all when it has none.
func (s *Server) busyPoll(connected bool, cmd dpdkCommand, fds []int, limit *wire.BusyPoll) (string, error) {
	timeout, budget, err := busyPollArgs(cmd.args)
	switch {
	case !connected:
		return dpdkBusyNak, errors.New("not connected")
	case err != nil:
		return dpdkBusyNak, err
	case len(fds) != 1:
		return dpdkBusyNak, fmt.Errorf("%d descriptors; want the AF_XDP socket", len(fds))
	case limit == nil:
		return dpdkBusyNak, errors.New("the pool has no busy polling")
	case timeout > limit.TimeoutMicros || budget > limit.Budget:
		return dpdkBusyNak, fmt.Errorf("timeout %d µs, budget %d; the pool allows at most %d µs, %d", timeout, budget, limit.TimeoutMicros, limit.Budget)
	}
	if _, err := xdpSocketInode(fds[0]); err != nil {
		return dpdkBusyNak, err
	}
	if err := setBusyPoll(fds[0], &wire.BusyPoll{TimeoutMicros: timeout, Budget: budget}); err != nil {
		return dpdkBusyNak, err
	}
	return dpdkBusyAck, nil
}

// setBusyPoll sets a socket up for preferred busy polling; nil does nothing.
func setBusyPoll(fd int, bp *wire.BusyPoll) error {
	if bp == nil {
		return nil
	}
	for _, o := range []struct {
		name    string
		opt, is int
	}{
		{"SO_PREFER_BUSY_POLL", unix.SO_PREFER_BUSY_POLL, 1},
		{"SO_BUSY_POLL", unix.SO_BUSY_POLL, bp.TimeoutMicros},
		{"SO_BUSY_POLL_BUDGET", unix.SO_BUSY_POLL_BUDGET, bp.Budget},
	} {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, o.opt, o.is); err != nil {
			return fmt.Errorf("%s %d: %w", o.name, o.is, err)
		}
	}
	return nil
}

// socketInode returns the inode of the socket fd refers to.
func socketInode(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return 0, fmt.Errorf("not a socket (mode %#o)", st.Mode)
	}
	return st.Ino, nil
}

// xdpSocketInode returns the inode of fd if it is an AF_XDP socket.
func xdpSocketInode(fd int) (uint64, error) {
	ino, err := socketInode(fd)
	if err != nil {
		return 0, err
	}
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return 0, fmt.Errorf("socket domain: %w", err)
	}
	if domain != unix.AF_XDP {
		return 0, fmt.Errorf("not an AF_XDP socket (domain %d)", domain)
	}
	return ino, nil
}

// closeFDs closes descriptors received from a peer, or our copies of
// ones sent: Linux frees a descriptor even when close reports an error,
// and nothing was written through them here.
func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// Serve runs until ctx ends, then closes the server.
func (s *Server) Serve(ctx context.Context) {
	<-ctx.Done()
	s.Close()
}

// dropFDs closes the lease's duplicates, at once or, when a Stats is
// reading them, as soon as it is done; the lease is no longer active for
// Stats.
func (al *allocation) dropFDs(l *lease) {
	al.mu.Lock()
	l.closing = true
	now := l.readers == 0 && !l.closed
	l.closed = l.closed || now
	if al.active == l {
		al.active = nil
	}
	al.mu.Unlock()
	if now {
		closeFDs(l.fds)
	}
}

// hold returns the active lease with a hold on its duplicates, which stay
// open until release; nil when the allocation has no active lease.
func (al *allocation) hold() *lease {
	al.mu.Lock()
	defer al.mu.Unlock()
	l := al.active
	if l == nil || l.closing {
		return nil
	}
	l.readers++
	return l
}

// release gives back a hold; the last one of a dropped lease closes its
// duplicates.
func (al *allocation) release(l *lease) {
	al.mu.Lock()
	l.readers--
	now := l.closing && l.readers == 0 && !l.closed
	l.closed = l.closed || now
	al.mu.Unlock()
	if now {
		closeFDs(l.fds)
	}
}

// QueueStats are the kernel's counters of the socket an active lease has
// on one queue.
type QueueStats struct {
	Allocation string
	// Netdev is where the socket is bound: for an allocation retargeted
	// into a pod, the netdev's name there.
	Netdev string
	Queue  uint32
	xsk.Statistics
}

// Stats reads the kernel's counters (XDP_STATISTICS) of the sockets of
// every active lease, by allocation and queue, through the duplicates the
// server keeps of them for as long as the lease lasts. A socket whose
// counters cannot be read is left out.
func (s *Server) Stats() []QueueStats {
	s.mu.Lock()
	als := slices.Collect(maps.Values(s.allocs))
	s.mu.Unlock()
	var out []QueueStats
	for _, al := range als {
		l := al.hold()
		if l == nil {
			continue
		}
		for i, ls := range l.socks {
			st, err := xsk.StatisticsOf(l.fds[i])
			if err != nil {
				s.log.Debug("socket statistics", "allocation", al.id, "queue", ls.Queue, "err", err)
				continue
			}
			out = append(out, QueueStats{Allocation: al.id, Netdev: l.dev.Name, Queue: ls.Queue, Statistics: st})
		}
		al.release(l)
	}
	slices.SortFunc(out, func(a, b QueueStats) int {
		return cmp.Or(strings.Compare(a.Allocation, b.Allocation), cmp.Compare(a.Queue, b.Queue))
	})
	return out
}

// Refusals returns how many connections the server refused since it was
// created, by the wire code of the refusal (wire.CodeForbidden for peers
// that are not the owner, answered or not).
func (s *Server) Refusals() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.refusals)
}

// refused counts a refusal and reports it to Config.OnRefuse.
func (s *Server) refused(al *allocation, peer Peer, code, reason string) {
	s.mu.Lock()
	s.refusals[code]++
	s.mu.Unlock()
	if s.cfg.OnRefuse != nil {
		s.cfg.OnRefuse(al.id, peer, code, reason)
	}
}
