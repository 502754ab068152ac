package client

import (
	"errors"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// A Poller is one receive loop over several sockets of a lease: the loop
// of a pod that gives all its queues one core (GOMAXPROCS=1, as a DPDK
// lcore polls its queues). Each round takes what came on every socket
// (at most RXBatch each, through the sockets' Receivers), and a round
// that found nothing anywhere waits as a Receiver does: it naps while
// frames came on any socket within the last millisecond, and then
// sleeps in poll(2) on all of them until one has frames. One goroutine
// per socket on one core serializes their waits instead: a Receiver's
// nap holds the core's one P, so the other sockets' loops wait it out,
// and a socket is looked at only once every loop has napped.
//
// A Poller drives its sockets' Receivers (Lease.Receiver): do not run
// their own loops beside it. It is not safe for concurrent use; end its
// loop before Lease.Close, as a Receiver's.
type Poller struct {
	rs      []*Receiver
	sockets []int // the lease's index of each Receiver's socket
	pfds    []unix.PollFd
	busy    bool
	last    time.Time // when frames last came on any socket
}

// Poller returns one loop over the given sockets (indexes into
// l.Sockets), or over all of the lease's when none is given.
func (l *Lease) Poller(sockets ...int) *Poller {
	if len(sockets) == 0 {
		for i := range l.Sockets {
			sockets = append(sockets, i)
		}
	}
	p := &Poller{sockets: sockets, busy: l.BusyPoll != nil}
	for _, i := range sockets {
		r := l.Receiver(i)
		p.rs = append(p.rs, r)
		p.pfds = append(p.pfds, unix.PollFd{Fd: int32(r.s.FD()), Events: unix.POLLIN})
	}
	return p
}

// Receive calls fn with each frame received on the Poller's sockets, with
// the socket's index in the lease, and gives the frames back to the
// kernel: fn must not keep the slice. When none has frames, it waits up
// to wait for some (a negative wait waits until one arrives; 0 does not
// wait). It returns how many frames it handed to fn.
func (p *Poller) Receive(wait time.Duration, fn func(socket int, frame []byte)) (int, error) {
	if n := p.round(fn); n > 0 || wait == 0 {
		return n, nil
	}
	var deadline time.Time
	if wait > 0 {
		deadline = time.Now().Add(wait)
	}
	for {
		switch {
		case p.busy:
			// Each socket's queue's NAPI, on this core (see Receiver).
			for _, r := range p.rs {
				if r.closed.Load() {
					return 0, ErrLeaseClosed
				}
				if err := r.s.WakeRX(); err != nil {
					return 0, err
				}
			}
		case time.Since(p.last) < idleAfter && (deadline.IsZero() || time.Until(deadline) > nap):
			napNow()
		default:
			if err := p.sleep(deadline); err != nil {
				return 0, err
			}
		}
		if n := p.round(fn); n > 0 {
			return n, nil
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			return 0, nil
		}
		if p.busy {
			runtime.Gosched()
		}
	}
}

// round takes what came on every socket.
func (p *Poller) round(fn func(int, []byte)) int {
	total := 0
	for k, r := range p.rs {
		socket := p.sockets[k]
		n, _ := r.Receive(0, func(b []byte) { fn(socket, b) }) // a Receive that does not wait returns no error
		total += n
	}
	if total > 0 {
		p.last = time.Now()
	}
	return total
}

// sleep waits in poll(2) until a socket has frames, deadline (zero: for
// ever) passes, or the lease is closed. It wakes every pollSlice to see
// whether the lease was closed, which does not wake a poll.
func (p *Poller) sleep(deadline time.Time) error {
	for {
		for _, r := range p.rs {
			if r.closed.Load() {
				return ErrLeaseClosed
			}
		}
		d := pollSlice
		if !deadline.IsZero() {
			if d = min(d, time.Until(deadline)); d <= 0 {
				return nil
			}
		}
		for i := range p.pfds {
			p.pfds[i].Revents = 0
		}
		n, err := unix.Poll(p.pfds, int((d+time.Millisecond-1)/time.Millisecond))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			for _, r := range p.rs {
				if r.closed.Load() {
					return ErrLeaseClosed
				}
			}
			return nil
		}
	}
}

// pollSlice is the longest a Poller sleeps in one poll(2) call.
const pollSlice = 100 * time.Millisecond
