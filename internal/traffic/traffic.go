// Package traffic holds the send and receive loops over an xsk.Socket that
// the tests, the benchmark and the demo share.
package traffic

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/xdpq/xdpq/pkg/xsk"
)

// Batch is how many descriptors a loop moves per ring operation.
const Batch = 64

// Sender transmits frames from a socket using the UMEM frames it was given.
type Sender struct {
	s      *xsk.Socket
	free   []uint64 // the frames on no ring
	frames int      // the frames the Sender owns, free or in flight
	descs  []xsk.Desc
	comp   []uint64
	batch  int
}

// NewSender returns a Sender that owns the UMEM frames at addrs and
// transmits in batches of batch frames (Batch if 0).
func NewSender(s *xsk.Socket, addrs []uint64, batch int) *Sender {
	if batch <= 0 {
		batch = Batch
	}
	return &Sender{s: s, free: append([]uint64(nil), addrs...), frames: len(addrs), descs: make([]xsk.Desc, 0, batch),
		comp: make([]uint64, batch), batch: batch}
}

// Send transmits each frame in order and returns once the kernel has
// completed all of them, or an error at the deadline. A frame larger than
// a UMEM frame goes in several descriptors (see xsk.UMEM.Scatter): the
// socket must be bound with multi-buffer. A frame that needs more UMEM
// frames than the Sender owns, or more descriptors than the TX ring
// holds, is refused before anything is sent.
func (t *Sender) Send(frames [][]byte, deadline time.Time) error {
	u := t.s.UMEM()
	fs := u.Config().FrameSize
	for i, f := range frames {
		need := u.FramesFor(len(f))
		if need > t.frames {
			return fmt.Errorf("send: frame %d of %d bytes needs %d frames of %d bytes, the sender owns %d", i, len(f), need, fs, t.frames)
		}
		if ring := int(t.s.Rings().TX); need > ring {
			return fmt.Errorf("send: frame %d of %d bytes needs %d descriptors, the TX ring holds %d", i, len(f), need, ring)
		}
	}
	i, inflight := 0, 0
	for i < len(frames) || inflight > 0 {
		n := t.s.Complete(t.comp)
		t.free = append(t.free, t.comp[:n]...)
		inflight -= n

		// Only what the TX ring has room for: the descriptors of a frame
		// go on it together or not at all.
		room := t.s.TXFree()
		t.descs = t.descs[:0]
		for i < len(frames) && len(t.descs) < t.batch {
			need := u.FramesFor(len(frames[i]))
			if len(t.descs)+need > room || need > len(t.free) {
				break // wait for room, or for completions
			}
			descs, used, err := u.Scatter(frames[i], t.free[len(t.free)-need:], t.descs)
			if err != nil {
				return fmt.Errorf("send: frame %d: %w", i, err)
			}
			t.descs, t.free = descs, t.free[:len(t.free)-used]
			i++
		}
		sent, err := t.s.Transmit(t.descs)
		if err != nil {
			return fmt.Errorf("send: %w", err)
		}
		if sent != len(t.descs) {
			return fmt.Errorf("send: the TX ring took %d of %d descriptors it had room for", sent, len(t.descs))
		}
		inflight += sent
		if err := t.s.Kick(); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		if n == 0 && sent == 0 && time.Now().After(deadline) {
			return fmt.Errorf("send: %d of %d frames sent, %d descriptors not completed at the deadline", i, len(frames), inflight)
		}
	}
	return nil
}

// Receiver receives frames on a socket and returns each frame to the fill
// ring after the callback saw it. A frame received in several descriptors
// (a socket bound with multi-buffer) is gathered into one buffer first.
type Receiver struct {
	s     *xsk.Socket
	descs []xsk.Desc
	// refill holds frames for the fill ring. The kernel publishes its
	// consumer index lazily, so the ring may briefly look full although it
	// has taken frames; the rest wait here for the next round.
	refill []uint64
	mask   uint64
	gather xsk.Gather // a frame in several descriptors, so far
	// Descriptors counts the descriptors received, Frames the frames:
	// more descriptors than frames means frames came in pieces.
	Descriptors, Frames int
}

// NewReceiver gives the UMEM frames at addrs to the socket's fill ring;
// those that do not fit now go on it as it drains.
func NewReceiver(s *xsk.Socket, addrs []uint64) (*Receiver, error) {
	r := &Receiver{s: s, descs: make([]xsk.Desc, Batch), refill: make([]uint64, 0, len(addrs)),
		mask: ^uint64(s.UMEM().Config().FrameSize - 1)}
	r.refill = append(r.refill, addrs...)
	r.fill()
	return r, nil
}

func (r *Receiver) fill() {
	if len(r.refill) == 0 {
		return
	}
	n := r.s.Fill(r.refill)
	r.refill = r.refill[:copy(r.refill, r.refill[n:])]
}

// ErrStop, returned by a callback, ends Receive without an error.
var ErrStop = errors.New("stop")

// Receive calls fn for each received frame until it has seen n frames
// (n < 0: no limit), fn returns an error, or the deadline passes, and
// returns how many frames it saw. Reaching the deadline is not an error.
func (r *Receiver) Receive(n int, deadline time.Time, fn func(frame []byte) error) (int, error) {
	seen := 0
	for n < 0 || seen < n {
		// A frame ends in one of the descriptors taken: n-seen of them
		// complete at most n-seen frames, also when the first continues
		// a frame of an earlier round.
		want := len(r.descs)
		if n >= 0 {
			want = min(want, n-seen)
		}
		r.fill()
		got := r.s.Receive(r.descs[:want])
		if got == 0 {
			if time.Now().After(deadline) {
				return seen, nil
			}
			if _, err := r.s.Poll(10 * time.Millisecond); err != nil {
				return seen, err
			}
			continue
		}
		r.Descriptors += got
		var stop error
		for _, d := range r.descs[:got] {
			b, whole := r.gather.Add(d, r.s.UMEM().Bytes(d.Addr, d.Len))
			r.refill = append(r.refill, d.Addr&r.mask)
			if !whole {
				continue
			}
			seen++
			r.Frames++
			if stop == nil {
				if err := fn(b); err != nil {
					stop = err
				}
			}
		}
		r.fill()
		if stop != nil {
			if errors.Is(stop, ErrStop) {
				return seen, nil
			}
			return seen, stop
		}
	}
	return seen, nil
}

// Flood is FloodAll on one socket.
func Flood(s *xsk.Socket, addrs []uint64, size uint32, batch int, stop func() bool) (uint64, error) {
	return FloodAll([]*xsk.Socket{s}, [][]uint64{addrs}, size, batch, stop)
}

// Prepare writes packet into addrs for FloodAll: into each frame when it
// fits one, else into each run of the frames it needs (xsk.UMEM.Scatter).
func Prepare(u *xsk.UMEM, addrs []uint64, packet []byte) error {
	per := u.FramesFor(len(packet))
	for g := 0; g+per <= len(addrs); g += per {
		if _, _, err := u.Scatter(packet, addrs[g:g+per], nil); err != nil {
			return err
		}
	}
	return nil
}

// FloodAll transmits the packet of size bytes written at addrs[i] (see
// Prepare) on socks[i], over and over, each socket in turn from this one
// thread, up to batch descriptors a submission, until stop returns true
// (checked every 64 rounds), and returns how many packets the kernel
// completed. A packet larger than a socket's UMEM frames takes a run of
// frames of addrs[i] and goes in several descriptors (the socket must be
// bound with multi-buffer); each socket's own frame size says how many.
// Packets still in flight at the end are waited for, up to a second, so
// the sockets can be used again.
func FloodAll(socks []*xsk.Socket, addrs [][]uint64, size uint32, batch int, stop func() bool) (uint64, error) {
	qs := make([]*floodQueue, len(socks))
	most := 1
	for i, s := range socks {
		qs[i] = newFloodQueue(s, addrs[i], size)
		most = max(most, qs[i].per)
	}
	descs := make([]xsk.Desc, 0, max(batch, most))
	var sent uint64 // packets completed
	for i := 0; ; i++ {
		if i&63 == 0 && stop() {
			break
		}
		for _, q := range qs {
			sent += q.complete()
			descs = descs[:0]
			if q.per == 1 {
				k := min(len(q.free), batch)
				for d := range k {
					descs = append(descs, xsk.Desc{Addr: q.free[len(q.free)-1-d], Len: size})
				}
			} else {
				// Whole packets, and only what the ring has room for.
				room := min(q.s.TXFree(), max(batch, q.per))
				for len(q.ready) > 0 && len(descs)+q.per <= room {
					descs = append(descs, q.runs[q.ready[len(q.ready)-1]]...)
					q.ready = q.ready[:len(q.ready)-1]
				}
			}
			m, err := q.s.Transmit(descs)
			if err != nil {
				return sent, err
			}
			if q.per == 1 {
				q.free = q.free[:len(q.free)-m]
			} else if m != len(descs) {
				return sent, fmt.Errorf("flood: the TX ring took %d of %d descriptors it had room for", m, len(descs))
			}
			q.inflight += m
			if m == 0 {
				if err := q.s.Kick(); err != nil {
					return sent, err
				}
			}
		}
	}
	for _, q := range qs {
		for end := time.Now().Add(time.Second); q.inflight > 0 && time.Now().Before(end); {
			if err := q.s.Kick(); err != nil { // as while sending: no completion comes without it
				return sent, err
			}
			sent += q.complete()
		}
	}
	return sent, nil
}

// floodQueue is FloodAll's state for one socket.
type floodQueue struct {
	s        *xsk.Socket
	per      int      // frames a packet, by the socket's frame size
	free     []uint64 // per == 1: the frames on no ring
	comp     []uint64
	inflight int // descriptors
	// per > 1: each run of frames is a packet, its descriptors made
	// once; a run is free again once all its frames completed.
	runs  [][]xsk.Desc
	run   []int32 // by frame index (address / frame size): its run
	done  []int   // frames of each run completed
	ready []int   // runs on no ring
	fs    uint64
}

func newFloodQueue(s *xsk.Socket, addrs []uint64, size uint32) *floodQueue {
	q := &floodQueue{s: s, per: s.UMEM().FramesFor(int(size)), comp: make([]uint64, s.Rings().Completion)}
	if q.per == 1 {
		q.free = append(make([]uint64, 0, len(addrs)), addrs...)
		return q
	}
	fs := s.UMEM().Config().FrameSize
	q.fs = uint64(fs)
	q.run = make([]int32, s.UMEM().NumFrames())
	for g := 0; g+q.per <= len(addrs); g += q.per {
		var ds []xsk.Desc
		for k, a := range addrs[g : g+q.per] {
			d := xsk.Desc{Addr: a, Len: min(fs, size-uint32(k)*fs)}
			if k < q.per-1 {
				d.Options = xsk.Continues
			}
			ds = append(ds, d)
			q.run[a/q.fs] = int32(len(q.runs))
		}
		q.ready = append(q.ready, len(q.runs))
		q.runs = append(q.runs, ds)
	}
	q.done = make([]int, len(q.runs))
	return q
}

// complete takes the completed descriptors off the completion ring,
// frees their frames, and returns how many packets they completed.
func (q *floodQueue) complete() uint64 {
	n := q.s.Complete(q.comp)
	q.inflight -= n
	if q.per == 1 {
		q.free = append(q.free, q.comp[:n]...)
		return uint64(n)
	}
	var packets uint64
	for _, a := range q.comp[:n] {
		g := int(q.run[a/q.fs])
		if q.done[g]++; q.done[g] == q.per {
			q.done[g] = 0
			q.ready = append(q.ready, g)
			packets++
		}
	}
	return packets
}

// Expect receives exactly the frames of want, in order, byte for byte,
// and fails on the first difference or at the deadline.
func (r *Receiver) Expect(want [][]byte, deadline time.Time) error {
	i := 0
	n, err := r.Receive(len(want), deadline, func(b []byte) error {
		if i >= len(want) {
			return fmt.Errorf("received more than the %d frames wanted", len(want))
		}
		if !bytes.Equal(b, want[i]) {
			return fmt.Errorf("frame %d of %d differs: %s", i, len(want), diff(b, want[i]))
		}
		i++
		return nil
	})
	if err != nil {
		return err
	}
	if n != len(want) {
		return fmt.Errorf("received %d of %d frames", n, len(want))
	}
	return nil
}

// diff says how got differs from want: the whole frames when short, else
// their lengths and the bytes around the first difference.
func diff(got, want []byte) string {
	if len(got) <= 128 && len(want) <= 128 {
		return fmt.Sprintf("\n got % x\nwant % x", got, want)
	}
	at := 0
	for at < len(got) && at < len(want) && got[at] == want[at] {
		at++
	}
	from := max(at-16, 0)
	return fmt.Sprintf("got %d bytes, want %d; first difference at byte %d:\n got[%d:] % x\nwant[%d:] % x",
		len(got), len(want), at, from, got[from:min(at+32, len(got))], from, want[from:min(at+32, len(want))])
}
