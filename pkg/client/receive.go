package client

import (
	"runtime"
	"time"

	"github.com/xdpq/xdpq/pkg/xsk"
)

// RXBatch is the most frames a Receiver takes off the RX ring at once.
// Each round reads the ring's producer index once, hands the frames over,
// and publishes them back on the fill ring with one index update: the
// ring operations, not the frames, are what a round costs, so a bigger
// batch is cheaper per frame up to about this size, and a smaller one
// gives the application its first frame sooner. 64 is xdpsock's and
// DPDK's default burst.
const RXBatch = 64

// A Receiver is the fast path of one socket's receive side: the loop
// xdpqperf runs and the one to copy. It owns the socket's RX and fill
// rings and the socket's frames (RXFrames and SpareFrames): do not use
// those besides it.
//
// The fill ring stays topped up: the socket's RX frames are on it when
// Connect returns, and its spare frames (an RX ring's worth) wait in the
// Receiver; each round gives the kernel back the frames it handed over,
// and the spare frames keep the fill ring full while the application
// still holds frames (Peek). Frames are lost only when the application
// falls behind the wire by more than a ring's worth (2048 frames at the
// default ring size: 1.4 ms at 1.5 Mpps): a burst of 1024 frames into a
// loop that keeps up on average loses none.
//
// When nothing has arrived, a round waits the way the socket's pool says:
// in poll(2) by default, so that an idle loop sleeps (the kernel is woken
// only when it asks to be, through need_wakeup); with the pool's
// preferred busy polling (Lease.BusyPoll), by spinning on non-blocking
// recvfrom calls, each of which runs the queue's NAPI on this core while
// the NIC's interrupts are deferred. After a full batch, a round lets the
// Go scheduler run other goroutines: the loops of a lease's other queues
// in the same process would otherwise wait for the scheduler's 10 ms time
// slice, long enough for their RX rings to overflow.
//
// A Receiver is not safe for concurrent use: run one goroutine per
// socket.
type Receiver struct {
	s      *xsk.Socket
	umem   *xsk.UMEM
	descs  []xsk.Desc
	refill []uint64 // frames for the fill ring, oldest first
	mask   uint64   // a frame's address from any address inside it
	busy   bool     // the pool busy-polls
}

// Receiver returns socket i's Receiver; each call returns the same one.
func (l *Lease) Receiver(i int) *Receiver {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if l.receivers == nil {
		l.receivers = make([]*Receiver, len(l.Sockets))
	}
	if r := l.receivers[i]; r != nil {
		return r
	}
	s := l.Sockets[i]
	r := &Receiver{s: s, umem: s.UMEM(), descs: make([]xsk.Desc, RXBatch),
		mask: ^uint64(s.UMEM().Config().FrameSize - 1), busy: l.BusyPoll != nil}
	r.refill = make([]uint64, 0, len(l.rx[i])+len(l.spare[i]))
	r.Recycle(l.spare[i]...)
	l.receivers[i] = r
	return r
}

// Receive calls fn with each frame received, at most RXBatch of them, in
// order, and then gives the frames back to the kernel: fn must not keep
// the slice. When none is waiting, it waits up to wait for some (a
// negative wait waits until one arrives; 0 does not wait). It returns how
// many frames it handed to fn; 0 with a nil error when the wait ended
// with none.
func (r *Receiver) Receive(wait time.Duration, fn func(frame []byte)) (int, error) {
	descs, err := r.Peek(wait)
	for _, d := range descs {
		fn(r.umem.Bytes(d.Addr, d.Len))
		r.refill = append(r.refill, d.Addr&r.mask)
	}
	r.fill()
	return len(descs), err
}

// Peek waits as Receive does and returns the descriptors received, at
// most RXBatch, valid until the next Peek or Receive. Their frames are the
// application's until it gives them back with Recycle: at once, or after
// transmitting them (a forwarder puts them on its TX ring and recycles
// them from the completion ring).
func (r *Receiver) Peek(wait time.Duration) ([]xsk.Desc, error) {
	r.fill() // the spare frames, and those the ring had no room for
	n := r.s.Receive(r.descs)
	if n == 0 && wait != 0 {
		var err error
		if n, err = r.wait(wait); err != nil {
			return nil, err
		}
	}
	if n == len(r.descs) {
		runtime.Gosched()
	}
	return r.descs[:n], nil
}

// Recycle gives frames back to the kernel's fill ring (any address inside
// a frame gives the frame). Those the ring cannot take now wait in the
// Receiver for the next round.
func (r *Receiver) Recycle(addrs ...uint64) {
	for _, a := range addrs {
		r.refill = append(r.refill, a&r.mask)
	}
	r.fill()
}

func (r *Receiver) fill() {
	if len(r.refill) == 0 {
		return
	}
	n := r.s.Fill(r.refill)
	r.refill = r.refill[:copy(r.refill, r.refill[n:])]
}

// wait waits up to d for frames and takes them off the RX ring.
func (r *Receiver) wait(d time.Duration) (int, error) {
	if r.busy {
		deadline := time.Now().Add(d)
		for {
			if err := r.s.WakeRX(); err != nil {
				return 0, err
			}
			if n := r.s.Receive(r.descs); n > 0 {
				return n, nil
			}
			if d > 0 && time.Now().After(deadline) {
				return 0, nil
			}
			runtime.Gosched()
		}
	}
	if _, err := r.s.Poll(d); err != nil {
		return 0, err
	}
	return r.s.Receive(r.descs), nil
}
