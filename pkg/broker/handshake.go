// The native handshake (hello, request or resume, welcome) up to an
// active lease.

package broker

import (
	"errors"
	"io"
	"net"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

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
	bound, err := s.bind(p.dev, memfd, req.Queues, cfg)
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
