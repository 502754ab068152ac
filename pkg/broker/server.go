package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/xsk"
)

// SocketName is the name of an allocation's socket in its directory.
const SocketName = "xdpq.sock"

// Datapath is what the broker needs of the node agent.
type Datapath interface {
	// AddSocket puts a bound socket into the netdev's XSKMAP.
	AddSocket(netdev string, queue uint32, fd int) error
	// RemoveSocket takes it out again.
	RemoveSocket(netdev string, queue uint32) error
	// XSKMapFD returns a new descriptor of the netdev's XSKMAP; the caller
	// closes it.
	XSKMapFD(netdev string) (int, error)
}

// Allocation is a set of queues of one netdev given to one owner.
type Allocation struct {
	ID     string
	Netdev xsk.Netdev
	Queues []uint32
	Owner  Owner
	Limits Limits
	// Mode is how sockets bind: auto (zero-copy where the driver has it),
	// copy or zero-copy.
	Mode xsk.Mode
	// Dir is the directory the allocation's socket is created in; only the
	// allocation's container should see it.
	Dir string
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
	Logger      *slog.Logger
}

// Server serves the allocations' sockets.
type Server struct {
	cfg Config
	dp  Datapath
	log *slog.Logger

	mu     sync.Mutex // guards allocs
	allocs map[string]*allocation
	wg     sync.WaitGroup // connection and accept goroutines
}

type allocation struct {
	Allocation
	ln *net.UnixListener

	mu    sync.Mutex // guards conns, leased, Owner, Netdev and dp
	dp    Datapath   // the agent of the netdev: the server's unless retargeted
	conns map[*net.UnixConn]bool
	// leased is true while a native client holds the allocation's sockets.
	leased bool
}

// target is the netdev a connection binds on and the agent whose XSKMAP
// takes its sockets, as of the connection's start.
func (al *allocation) target() (xsk.Netdev, Datapath) {
	al.mu.Lock()
	defer al.mu.Unlock()
	return al.Netdev, al.dp
}

func (al *allocation) owner() Owner {
	al.mu.Lock()
	defer al.mu.Unlock()
	return al.Owner
}

// NewServer returns a server that puts sockets into dp's XSKMAPs.
func NewServer(cfg Config, dp Datapath) *Server {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.StepTimeout == 0 {
		cfg.StepTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{cfg: cfg, dp: dp, log: cfg.Logger, allocs: map[string]*allocation{}}
}

// Add starts serving an allocation at its socket path.
func (s *Server) Add(a Allocation) error {
	if a.ID == "" || len(a.Queues) == 0 || a.Dir == "" {
		return fmt.Errorf("broker: allocation %q needs an id, queues and a directory", a.ID)
	}
	if a.Limits == (Limits{}) {
		a.Limits = DefaultLimits
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.allocs[a.ID]; ok {
		return fmt.Errorf("broker: allocation %s exists", a.ID)
	}
	if err := os.MkdirAll(a.Dir, 0o755); err != nil {
		return fmt.Errorf("broker: allocation %s: %w", a.ID, err)
	}
	path := a.SocketPath()
	os.Remove(path) // a predecessor's socket; no process listens on it
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("broker: allocation %s: %w", a.ID, err)
	}
	// Anyone who sees the socket may connect; who may use it is decided
	// by the peer's credentials.
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return fmt.Errorf("broker: allocation %s: %w", a.ID, err)
	}
	al := &allocation{Allocation: a, ln: ln, dp: s.dp, conns: map[*net.UnixConn]bool{}}
	s.allocs[a.ID] = al
	s.wg.Add(1)
	go s.accept(al)
	s.log.Info("serving allocation", "allocation", a.ID, "netdev", a.Netdev.Name, "queues", a.Queues, "socket", path)
	return nil
}

// SetOwner changes who may use an allocation from now on (connections
// already open are not affected): Kubernetes learns the pod of an
// allocation only after Allocate, from the CNI plugin.
func (s *Server) SetOwner(id string, o Owner) error {
	s.mu.Lock()
	al, ok := s.allocs[id]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("broker: no allocation %s", id)
	}
	al.mu.Lock()
	al.Owner = o
	al.mu.Unlock()
	return nil
}

// Retarget moves an allocation to another netdev and agent: a netdev-mode
// pool's netdev moved into its pod's network namespace (dev.NetNS), and
// back. Open connections close, their sockets leaving the old XSKMAP: they
// were bound where the netdev no longer is. A nil dp is the server's own.
func (s *Server) Retarget(id string, dev xsk.Netdev, dp Datapath) error {
	s.mu.Lock()
	al, ok := s.allocs[id]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("broker: no allocation %s", id)
	}
	if dp == nil {
		dp = s.dp
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	if len(al.conns) > 0 {
		s.log.Info("connections end: the allocation's netdev moves", "allocation", id, "netdev", dev.Name, "connections", len(al.conns))
	}
	for c := range al.conns {
		c.Close()
	}
	al.Netdev, al.dp = dev, dp
	return nil
}

// Leased reports whether a client holds the allocation's sockets now. A
// lease's sockets leave the XSKMAP before the lease is free for the next.
func (s *Server) Leased(id string) bool {
	s.mu.Lock()
	al, ok := s.allocs[id]
	s.mu.Unlock()
	if !ok {
		return false
	}
	al.mu.Lock()
	defer al.mu.Unlock()
	return al.leased
}

// Remove stops serving an allocation: its socket goes, its connections
// close and their sockets leave the XSKMAP.
func (s *Server) Remove(id string) error {
	s.mu.Lock()
	al, ok := s.allocs[id]
	delete(s.allocs, id)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("broker: no allocation %s", id)
	}
	al.ln.Close() // unlinks the socket file
	al.mu.Lock()
	for c := range al.conns {
		c.Close()
	}
	al.mu.Unlock()
	return nil
}

// Close removes every allocation and waits for their connections to end.
func (s *Server) Close() {
	s.mu.Lock()
	var ids []string
	for id := range s.allocs {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.Remove(id)
	}
	s.wg.Wait()
}

func (s *Server) accept(al *allocation) {
	defer s.wg.Done()
	for {
		c, err := al.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error("accept", "allocation", al.ID, "err", err)
			}
			return
		}
		al.mu.Lock()
		al.conns[c] = true
		al.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				al.mu.Lock()
				delete(al.conns, c)
				al.mu.Unlock()
				c.Close()
			}()
			s.serve(c, al)
		}()
	}
}

// recv reads one message with at most maxFDs descriptors within the step timeout.
func (s *Server) recv(c *net.UnixConn, maxFDs int, timeout time.Duration) ([]byte, []int, error) {
	c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, MaxMessage+1)
	n, fds, err := xsk.RecvFDs(c, buf, maxFDs)
	if errors.Is(err, xsk.ErrTruncated) {
		return nil, nil, refuse(CodeBadMessage, "message too long or too many descriptors (at most %d)", maxFDs)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil, nil, refuse(CodeTimeout, "no message within %v", timeout)
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

func (s *Server) serve(c *net.UnixConn, al *allocation) {
	peer, err := peerOf(c, s.cfg.ProcRoot)
	if err != nil {
		s.log.Warn("peer not identified", "allocation", al.ID, "err", err)
		return
	}
	first, fds, err := s.recv(c, 1, s.cfg.StepTimeout)
	if err != nil {
		s.fail(c, al, peer, err)
		return
	}
	if first[0] == '/' {
		s.dpdk(c, al, peer, first, fds)
		return
	}
	if len(fds) > 0 {
		closeFDs(fds)
		s.fail(c, al, peer, refuse(CodeBadMessage, "hello carries no descriptor"))
		return
	}
	if err := s.native(c, al, peer, first); err != nil {
		s.fail(c, al, peer, err)
	}
}

// fail logs a refused or broken handshake and tells the client why.
func (s *Server) fail(c *net.UnixConn, al *allocation, peer Peer, err error) {
	var pe *ProtocolError
	if !errors.As(err, &pe) {
		if errors.Is(err, errClosed) || errors.Is(err, net.ErrClosed) {
			s.log.Info("client left during the handshake", "allocation", al.ID, "peer", peer.String())
			return
		}
		pe = refuse(CodeInternal, "%v", err)
	}
	s.log.Warn("refused", "allocation", al.ID, "peer", peer.String(), "code", pe.Code, "reason", pe.Reason)
	s.send(c, Message{Type: TypeError, Code: pe.Code, Reason: pe.Reason})
}

func (s *Server) send(c *net.UnixConn, m Message, fds ...int) error {
	b, err := jsonMarshal(m)
	if err != nil {
		return err
	}
	c.SetWriteDeadline(time.Now().Add(s.cfg.StepTimeout))
	return xsk.SendFDs(c, b, fds)
}

func (s *Server) native(c *net.UnixConn, al *allocation, peer Peer, first []byte) error {
	hello, err := ParseMessage(first, TypeHello)
	if err != nil {
		return err
	}
	if hello.Version != Version {
		return refuse(CodeVersion, "protocol version %d; this daemon speaks %d", hello.Version, Version)
	}
	if err := al.owner().check(peer); err != nil {
		return refuse(CodeForbidden, "%v", err)
	}
	al.mu.Lock()
	if al.leased {
		al.mu.Unlock()
		return refuse(CodeBusy, "allocation %s is in use by another connection; close it first", al.ID)
	}
	al.leased = true
	al.mu.Unlock()
	defer func() {
		al.mu.Lock()
		al.leased = false
		al.mu.Unlock()
	}()
	lim := al.Limits
	dev, dp := al.target()
	if err := s.send(c, Message{Type: TypeWelcome, Version: Version, Allocation: al.ID, Netdev: dev.Name,
		Queues: al.Queues, Limits: &lim}); err != nil {
		return err
	}

	b, fds, err := s.recv(c, 1, s.cfg.StepTimeout)
	if err != nil {
		return err
	}
	req, err := ParseMessage(b, TypeRequest)
	if err != nil || len(fds) != 1 {
		closeFDs(fds)
		if err == nil {
			err = refuse(CodeBadRequest, "a request carries exactly one descriptor, the UMEM memfd; got %d", len(fds))
		}
		return err
	}
	memfd := fds[0]
	cfg, err := checkRequest(req, al.Queues, lim)
	if err == nil {
		err = checkMemfd(memfd, cfg.UMEM, lim)
	}
	if err != nil {
		unix.Close(memfd)
		return err
	}
	cfg.Mode = al.Mode
	bound, err := xsk.Bind(dev, memfd, req.Queues, cfg)
	unix.Close(memfd)
	if err != nil {
		return refuse(CodeInternal, "%v", err)
	}
	// The copies here go once the sockets are in the XSKMAP or refused:
	// an open copy would keep a socket alive after the pod let it go.
	sockFDs := make([]int, len(bound))
	for i, b := range bound {
		sockFDs[i] = b.FD
	}
	defer func() { closeFDs(sockFDs) }() // whatever is left at return
	if err := s.send(c, Message{Type: TypeSockets, Queues: req.Queues, Rings: req.Rings, FrameSize: req.FrameSize,
		Headroom: req.Headroom, ZeroCopy: bound[0].ZeroCopy}, sockFDs...); err != nil {
		return err
	}

	b, _, err = s.recv(c, 0, s.cfg.StepTimeout)
	if err != nil {
		return err
	}
	if _, err := ParseMessage(b, TypeReady); err != nil {
		return err
	}
	var added []uint32
	for _, bnd := range bound {
		if err := dp.AddSocket(dev.Name, bnd.Queue, bnd.FD); err != nil {
			for _, q := range added {
				dp.RemoveSocket(dev.Name, q)
			}
			return refuse(CodeInternal, "%v", err)
		}
		added = append(added, bnd.Queue)
	}
	closeFDs(sockFDs)
	sockFDs = nil
	defer func() {
		for _, q := range added {
			if err := dp.RemoveSocket(dev.Name, q); err != nil {
				s.log.Warn("remove socket", "allocation", al.ID, "queue", q, "err", err)
			}
		}
		s.log.Info("lease ended", "allocation", al.ID, "peer", peer.String(), "queues", added)
	}()
	if err := s.send(c, Message{Type: TypeActive}); err != nil {
		return err
	}
	s.log.Info("lease active", "allocation", al.ID, "peer", peer.String(), "queues", added, "zero_copy", bound[0].ZeroCopy)

	// The connection is the lease: wait for it to close.
	for {
		_, fds, err := s.recv(c, 0, 24*time.Hour*365)
		closeFDs(fds)
		var pe *ProtocolError
		if err != nil && !errors.As(err, &pe) {
			return nil
		}
	}
}

func (s *Server) dpdk(c *net.UnixConn, al *allocation, peer Peer, msg []byte, fds []int) {
	connected := false
	reply := func(text string, fds ...int) bool {
		c.SetWriteDeadline(time.Now().Add(s.cfg.StepTimeout))
		return xsk.SendFDs(c, []byte(text), fds) == nil
	}
	for {
		cmd, err := parseDPDKCommand(msg)
		var ok bool
		switch {
		case err != nil:
			ok = reply(dpdkNak)
		case cmd.name == dpdkConnect:
			if err := al.owner().check(peer); err != nil {
				s.log.Warn("refused", "allocation", al.ID, "peer", peer.String(), "protocol", "dpdk", "reason", err)
				reply(dpdkHostNak)
				closeFDs(fds)
				return
			}
			connected = true
			ok = reply(dpdkHostOK)
		case cmd.name == dpdkVersion:
			ok = reply(dpdkVersionAns)
		case cmd.name == dpdkXSKMapFD:
			dev, dp := al.target()
			if !connected || len(cmd.args) != 1 || cmd.args[0] != dev.Name {
				ok = reply(dpdkFDNak)
				break
			}
			fd, err := dp.XSKMapFD(dev.Name)
			if err != nil {
				s.log.Warn("xskmap fd", "allocation", al.ID, "err", err)
				ok = reply(dpdkFDNak)
				break
			}
			ok = reply(dpdkFDAck, fd)
			unix.Close(fd)
		case cmd.name == dpdkBusyPoll:
			ok = reply(s.busyPoll(connected, cmd, fds))
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

// busyPoll configures preferred busy polling on the AF_XDP socket the
// client sent, which it may not do itself without CAP_NET_ADMIN.
func (s *Server) busyPoll(connected bool, cmd dpdkCommand, fds []int) string {
	timeout, budget, err := busyPollArgs(cmd.args)
	if !connected || err != nil || len(fds) != 1 {
		return dpdkBusyNak
	}
	if domain, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_DOMAIN); err != nil || domain != unix.AF_XDP {
		return dpdkBusyNak
	}
	for _, o := range [][2]int{{unix.SO_PREFER_BUSY_POLL, 1}, {unix.SO_BUSY_POLL, timeout}, {unix.SO_BUSY_POLL_BUDGET, budget}} {
		if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, o[0], o[1]); err != nil {
			return dpdkBusyNak
		}
	}
	return dpdkBusyAck
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// Serve runs until ctx ends, then closes the server.
func (s *Server) Serve(ctx context.Context) {
	<-ctx.Done()
	s.Close()
}
