package client

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

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
// Connect returns, and each round gives the kernel back the frames it
// handed over, in the order they came, so the same ring's worth of
// frames comes round in the same order, as in a C loop: the kernel's
// copy finds each frame's memory and buffer head where it left them, a
// ring ago. (A stack that gave spare frames out too put twice the frames
// in circulation, out of order: on veth the sender's core, which does the
// copy, spent 1.44 to 1.52 times the C client's time per frame at 4
// queues, make bench rows (e) and (g); 1.09 to 1.15 times since.) The
// socket's spare frames (an RX ring's worth) wait in the Receiver for an
// application that holds frames (Peek): once it holds so many that the
// fill ring would be less than half full, they stand in for them. Frames
// are lost only when the application falls behind the wire by more than a
// ring's worth (2048 frames at the default ring size: 1.4 ms at 1.5
// Mpps): a burst of 1024 frames into a loop that keeps up on average
// loses none.
//
// When nothing has arrived, a round waits the way the socket's pool says.
// By default, while frames keep coming it naps for tens of microseconds
// between looks at the ring, and once none has come for a millisecond it
// sleeps until the kernel says frames came (in the Go runtime's poller,
// as a net.Conn waits); it wakes the kernel itself
// only when the kernel asks (need_wakeup). Sleeping in poll while traffic
// flows would cost a wakeup every few frames on the core that received
// them, and spinning would cost this core all of its time: on veth at
// the sender's full rate (make bench, row (e)), the naps took a seventh
// of the CPU per frame of a spinning loop; at 1.8 Mpps a nap that
// overslept a ring's worth (2048 frames, about a millisecond) lost
// 0.3% of the frames to an empty fill ring, which a deeper ring
// (Options.Ring) rides out. With the
// pool's preferred busy polling (Lease.BusyPoll) it spins on non-blocking
// recvfrom calls instead, each of which runs the queue's NAPI on this
// core while the NIC's interrupts are deferred: a core of its own, for
// the lowest latency.
//
// After a full batch, a round lets the Go scheduler run other
// goroutines: the loops of a lease's other queues in the same process
// would otherwise wait for the scheduler's 10 ms time slice, long enough
// for their RX rings to overflow.
//
// On a lease with MultiBuffer, a packet larger than a UMEM frame comes
// in several descriptors (xsk.Desc.Continues on all but the last):
// Receive gathers them into a buffer of the Receiver's and hands fn the
// whole packet, one copy of its bytes; a packet in one frame is handed
// over in place, as without MultiBuffer. Peek hands the descriptors over
// as they came, for a forwarder that transmits them as they are (a
// multi-buffer TX ring takes the same marks). A loop uses one or the
// other: a packet whose first descriptors Receive has gathered goes on in
// the next Receive, and a Peek in between would see its rest without its
// start. The kernel splits a packet into at most MAX_SKB_FRAGS+1
// descriptors (18), so the gathering buffer stays below 72 KiB.
//
// A Receiver is not safe for concurrent use: run one goroutine per
// socket. End its loop before Lease.Close, which unmaps the socket's
// rings (a loop asleep in a wait returns ErrLeaseClosed; one taking
// frames at that moment would touch unmapped memory).
type Receiver struct {
	s     *xsk.Socket
	umem  *xsk.UMEM
	descs []xsk.Desc
	back  frameQueue // frames given back, in the order they came: the fill ring takes them first
	spare []uint64   // frames on no ring, a stack
	held  int        // frames Peek handed out and the application has not given back
	lent  int        // spare frames in circulation, standing in for held ones (at most held)
	mask  uint64     // a frame's address from any address inside it
	busy  bool       // the pool busy-polls
	last  time.Time  // when frames last came
	// looked is when the loop last looked at the RX ring; flowing, that
	// frames had come within idleAfter then; away the longest time
	// between two looks that began while frames were flowing, in
	// nanoseconds (LongestAway).
	looked  time.Time
	flowing bool
	away    atomic.Int64
	gather  xsk.Gather // a packet in several descriptors, so far
	// sleeping is a duplicate of the socket that a sleep waits on in the
	// runtime's poller, registered with the poller's epoll only while
	// the loop sleeps: the kernel wakes a socket's epoll entries for
	// every frame it transmits (in copy mode the freed frame's
	// sock_wfree wakes writers), and a forwarder registered all along
	// paid that wakeup per frame on its own core: make bench's
	// forwarding table, xdpqperf l2fwd on 1 queue, its core's softirq
	// time 797 ns a frame against the C client's 398. Lease.Close
	// closes it from another goroutine to end the sleep.
	sleeping atomic.Pointer[os.File]
	closed   atomic.Bool // by Lease.Close: the waits end with ErrLeaseClosed
}

// Receiver returns socket i's Receiver; each call returns the same one.
func (l *Lease) Receiver(i int) *Receiver {
	l.made[i].Do(func() {
		s := l.Sockets[i]
		r := &Receiver{s: s, umem: s.UMEM(), descs: make([]xsk.Desc, RXBatch),
			mask: ^uint64(s.UMEM().Config().FrameSize - 1), busy: l.BusyPoll != nil}
		r.back.init(len(l.rx[i]) + len(l.spare[i]))
		r.spare = slices.Clone(l.spare[i])
		l.rmu.Lock()
		l.receivers[i] = r
		l.rmu.Unlock()
	})
	l.rmu.Lock()
	defer l.rmu.Unlock()
	return l.receivers[i]
}

// Receive calls fn with each frame received, in order, taking at most
// RXBatch descriptors, and then gives the frames back to the kernel: fn
// must not keep the slice. A packet in several descriptors is handed over
// whole (gathered: see Receiver), once its last descriptor came. When
// none is waiting, it waits up to wait for some (a negative wait waits
// until one arrives; 0 does not wait). It returns how many frames it
// handed to fn; 0 with a nil error when the wait ended with none, or
// when only the first descriptors of a packet came (the next Receive
// hands it over).
func (r *Receiver) Receive(wait time.Duration, fn func(frame []byte)) (int, error) {
	descs, err := r.Peek(wait)
	n := 0
	for _, d := range descs {
		b, whole := r.gather.Add(d, r.umem.Bytes(d.Addr, d.Len))
		r.give(d.Addr & r.mask)
		if !whole {
			continue
		}
		fn(b)
		n++
	}
	r.fill()
	return n, err
}

// Peek waits as Receive does and returns the descriptors received, at
// most RXBatch, valid until the next Peek or Receive. Their frames are the
// application's until it gives them back with Recycle: at once, or after
// transmitting them (a forwarder puts them on its TX ring and recycles
// them from the completion ring).
func (r *Receiver) Peek(wait time.Duration) ([]xsk.Desc, error) {
	r.fill() // the spare frames, and those the ring had no room for
	n := r.receive()
	if n == 0 && wait != 0 {
		var err error
		if n, err = r.wait(wait); err != nil {
			return nil, err
		}
	}
	r.held += n
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
		r.give(a & r.mask)
	}
	r.fill()
}

// give takes back frame a: to the queue for the fill ring, or to the
// spares when a spare frame stood in for it.
func (r *Receiver) give(a uint64) {
	r.held = max(r.held-1, 0)
	if r.lent > r.held {
		r.lent--
		r.spare = append(r.spare, a)
		return
	}
	r.back.push(a)
}

// fill puts the frames given back on the fill ring in the order they
// came, as many as the ring has room for. While the application holds
// so many frames that the ring would be less than half full, spare
// frames stand in for them, up to a full ring: below that, the frames
// the ring holds come round in the same order, and the spares stay out
// of it.
func (r *Receiver) fill() {
	free := r.s.FillFree()
	free -= r.back.fill(r.s, free)
	if ring := int(r.s.Rings().Fill); ring-free >= ring/2 {
		return
	}
	k := min(free, r.held-r.lent, len(r.spare))
	if k <= 0 {
		return
	}
	top := len(r.spare) - k
	n := r.s.Fill(r.spare[top:])
	r.spare = append(r.spare[:top], r.spare[top+n:]...)
	r.lent += n
}

// A frameQueue is a FIFO of frame addresses.
type frameQueue struct {
	buf        []uint64 // a power of two long
	head, tail uint
}

func (q *frameQueue) init(n int) {
	q.buf = make([]uint64, 1<<bits.Len(uint(max(n, 1)-1)))
}

func (q *frameQueue) push(a uint64) {
	if q.tail-q.head == uint(len(q.buf)) {
		buf := make([]uint64, 2*len(q.buf))
		for i := q.head; i != q.tail; i++ {
			buf[i-q.head] = q.buf[i&uint(len(q.buf)-1)]
		}
		q.buf, q.head, q.tail = buf, 0, q.tail-q.head
	}
	q.buf[q.tail&uint(len(q.buf)-1)] = a
	q.tail++
}

// fill puts up to free frames from the queue's head on s's fill ring and
// returns how many.
func (q *frameQueue) fill(s *xsk.Socket, free int) int {
	n := 0
	for n < free && q.head != q.tail {
		i := q.head & uint(len(q.buf)-1)
		end := min(uint(len(q.buf)), i+(q.tail-q.head), i+uint(free-n))
		m := s.Fill(q.buf[i:end])
		q.head += uint(m)
		n += m
		if m < int(end-i) {
			break
		}
	}
	return n
}

// wait waits up to d for frames and takes them off the RX ring.
func (r *Receiver) wait(d time.Duration) (int, error) {
	if r.busy {
		deadline := time.Now().Add(d)
		for {
			if r.closed.Load() {
				return 0, ErrLeaseClosed
			}
			if err := r.s.WakeRX(); err != nil {
				return 0, err
			}
			if n := r.receive(); n > 0 {
				return n, nil
			}
			if d > 0 && time.Now().After(deadline) {
				return 0, nil
			}
			runtime.Gosched()
		}
	}
	// While traffic flows, the ring is empty for moments only: nap and
	// look again rather than sleep in poll. A loop that sleeps in poll
	// must be woken for the next frame, and the kernel wakes it from the
	// core that received the frame (on veth, the sender's), a wakeup for
	// every few frames; a nap asks nothing of that core, and the frames
	// of a nap's length (tens at a million a second) come in one batch.
	// Once no frame has come for idleAfter, the loop sleeps (r.sleep).
	if d != 0 {
		var deadline time.Time
		if d > 0 {
			deadline = time.Now().Add(d)
		}
		for time.Since(r.last) < idleAfter && (d < 0 || time.Until(deadline) > nap) {
			napNow()
			if n := r.receive(); n > 0 {
				return n, nil
			}
			runtime.Gosched() // the other queues' loops, between naps
		}
		if d > 0 {
			d = max(time.Until(deadline), 0)
		}
	}
	return r.sleep(d)
}

// sleep waits up to d (d < 0: for ever) for frames in the Go runtime's
// network poller, as a net.Conn's Read waits: the goroutine parks and its
// thread runs the others (a lease's other queues' loops), where poll(2)
// would hold the thread and its P until the runtime noticed.
func (r *Receiver) sleep(d time.Duration) (int, error) {
	var deadline time.Time
	if d >= 0 {
		deadline = time.Now().Add(d)
	}
	// Registered for this sleep alone (see sleeping): a duplicate and two
	// epoll_ctl calls, once the loop has had no frame for idleAfter.
	file, err := pollable(r.s.FD())
	if err != nil {
		return 0, err
	}
	r.sleeping.Store(file)
	defer func() {
		if r.sleeping.CompareAndSwap(file, nil) {
			_ = file.Close() // a duplicate: the socket stays open
		} // else Lease.Close closed it
	}()
	if r.closed.Load() { // closed before it could see file
		return 0, ErrLeaseClosed
	}
	conn, err := file.SyscallConn()
	if err != nil {
		return 0, r.closedErr(err)
	}
	if err := file.SetReadDeadline(deadline); err != nil {
		return 0, r.closedErr(err)
	}
	n := 0
	err = conn.Read(func(uintptr) bool {
		n = r.receive() // wakes the kernel if it asks
		return n > 0 || d == 0
	})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = nil
	}
	return n, r.closedErr(err)
}

// receive is a look at the RX ring: it takes what came (waking the
// kernel if it asks) and notes the look for LongestAway.
func (r *Receiver) receive() int {
	n := r.s.Receive(r.descs)
	now := time.Now()
	if r.flowing {
		if gap := int64(now.Sub(r.looked)); gap > r.away.Load() {
			r.away.Store(gap) // this goroutine alone raises it
		}
	}
	if n > 0 {
		r.last = now
	}
	r.looked, r.flowing = now, now.Sub(r.last) < idleAfter
	return n
}

// LongestAway returns the longest time the Receiver's loop left its RX
// ring unlooked-at while frames were coming, since the previous call:
// napping, in the application's code between rounds, or its thread off
// the CPU (another thread on its core, the hypervisor). While the loop
// is away the kernel fills the ring: away longer than the ring's depth
// at the arrival rate (2048 frames at 2 Mpps: 1 ms), it drops frames
// (Statistics.RXFillRingEmptyDescs, RXRingFull). A gap that began once
// no frame had come for a millisecond (the loop asleep until the kernel
// wakes it) is not counted. Safe to call from any goroutine.
func (r *Receiver) LongestAway() time.Duration {
	return time.Duration(r.away.Swap(0))
}

// ErrLeaseClosed is what a Receiver's wait returns once its lease is
// closed.
var ErrLeaseClosed = errors.New("the lease is closed: its sockets are given back; end the receive loops before Lease.Close")

// closedErr is err, or ErrLeaseClosed when the lease closed the
// Receiver's file (the raw side's error for that is the runtime's "use
// of closed file", which os.ErrClosed does not match).
func (r *Receiver) closedErr(err error) error {
	if err != nil && r.closed.Load() {
		return ErrLeaseClosed
	}
	return err
}

// pollable returns a File of a duplicate of socket fd that the runtime's
// poller waits on. The duplicate shares the socket's open file, whose
// O_NONBLOCK it sets: nothing waits on an AF_XDP socket in a system call
// (its wakeups are MSG_DONTWAIT calls).
func pollable(fd int) (*os.File, error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup socket for a receiver: %w", err)
	}
	if err := unix.SetNonblock(dup, true); err != nil {
		_ = unix.Close(dup) // a duplicate never used; the socket stays open
		return nil, fmt.Errorf("make a receiver's socket non-blocking: %w", err)
	}
	return os.NewFile(uintptr(dup), "xsk"), nil
}

// close ends the Receiver's waits: a sleep under way ends when its
// duplicate of the socket is closed.
func (r *Receiver) close() error {
	r.closed.Store(true)
	if f := r.sleeping.Swap(nil); f != nil {
		if err := f.Close(); !errors.Is(err, os.ErrClosed) {
			return err
		}
	}
	return nil
}

// napNow naps for nap. It is a raw system call: the Go runtime does not
// see it, so it does not hand this goroutine's P to another thread for
// the nap's length and take it back after, which cost more than the nap
// (the other goroutines wait the nap out: a lease's other queues' loops
// run between batches).
func napNow() {
	ts := unix.NsecToTimespec(nap.Nanoseconds())
	// EINTR, its one error here, only shortens the nap.
	_, _, _ = unix.RawSyscall(unix.SYS_NANOSLEEP, uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// While frames came less than idleAfter ago, a Receiver with nothing to
// take naps for nap (and the kernel's timer slack, 50 µs for most
// threads) between looks at its RX ring; after that, it sleeps until the
// kernel wakes it. A nap adds its length to the latency of the
// frames that come during it; a pool whose users want none busy-polls.
const (
	nap       = 50 * time.Microsecond
	idleAfter = time.Millisecond
)
