// A lease's life: activated with its sockets in the XSKMAP, held while
// its connection lasts, ended (sockets out of the map, descriptors
// closed); its sockets' kernel statistics.

package broker

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

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
