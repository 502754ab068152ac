// Package perf is xdpqperf: an xdpsock-like traffic tool that takes its
// sockets from xdpq's broker like any pod (package client) and runs
// rxdrop, txpush or l2fwd on them, printing a line per second with packets
// per second per queue and the kernel's socket statistics.
package perf

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// Modes xdpqperf runs.
const (
	RXDrop = "rxdrop" // receive and give the frames straight back
	TXPush = "txpush" // transmit one frame as fast as possible
	L2Fwd  = "l2fwd"  // send every received frame back with MACs swapped
)

// Config.Loops's choices.
const (
	LoopPerQueue = "queue"
	LoopOne      = "one"
)

// Config is what the command's flags set.
type Config struct {
	Socket   string // "" means $XDPQ_SOCKET
	Mode     string
	Duration time.Duration // 0: until ctx ends
	Queues   []uint32      // nil: all of the allocation's
	Ring     uint32
	Interval time.Duration
	// MultiBuffer asks for multi-buffer sockets: frames larger than a
	// UMEM frame (jumbo frames) are received and sent whole.
	MultiBuffer bool
	// Loops is how rxdrop runs its queues: LoopPerQueue (a goroutine
	// each, client.Receiver), LoopOne (one client.Poller over them all),
	// or "" for LoopOne when the process has fewer cores than queues
	// (GOMAXPROCS) and LoopPerQueue otherwise.
	Loops string
	Out   io.Writer
	// Reported, if set, is called after each report line with the totals
	// so far.
	Reported func(Totals)
	// txpush frames
	Size             int
	SrcMAC, DstMAC   net.HardwareAddr
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
}

// Totals are what Run counted, per queue.
type Totals struct {
	Queues []uint32
	RX, TX []uint64
	// Drops are the kernel's counters of each queue's socket at the end
	// (XDP_STATISTICS); nil when they could not be read.
	Drops []xsk.Statistics
	// Away is, per queue, the longest its receive loop left the RX ring
	// while frames came (client.Receiver.LongestAway) over the run; nil
	// in a mode that receives nothing.
	Away []time.Duration
}

// Dropped is what the kernel dropped of the frames for the queues'
// sockets, every reason together.
func (t Totals) Dropped() (rxDropped, ringFull, fillEmpty, invalid uint64) {
	for _, d := range t.Drops {
		rxDropped += d.RXDropped
		ringFull += d.RXRingFull
		fillEmpty += d.RXFillRingEmptyDescs
		invalid += d.RXInvalidDescs
	}
	return
}

type counters struct {
	rx, tx atomic.Uint64
	away   atomic.Int64 // the longest LongestAway of the run, ns
}

// noteAway takes the receive loop's LongestAway into the run's.
func (c *counters) noteAway(r *client.Receiver) time.Duration {
	a := r.LongestAway()
	if int64(a) > c.away.Load() {
		c.away.Store(int64(a)) // the reporter alone raises it
	}
	return a
}

// Run takes sockets from the broker and runs the mode until ctx ends or
// the duration passes.
func Run(ctx context.Context, cfg Config) (Totals, error) {
	switch cfg.Mode {
	case RXDrop, TXPush, L2Fwd:
	default:
		return Totals{}, fmt.Errorf("mode %q: want %s, %s or %s", cfg.Mode, RXDrop, TXPush, L2Fwd)
	}
	switch cfg.Loops {
	case "", LoopOne, LoopPerQueue:
	default:
		return Totals{}, fmt.Errorf("loops %q: want %s or %s", cfg.Loops, LoopOne, LoopPerQueue)
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	// The duration counts from the start, the handshake included: a run
	// that waited for a busy allocation still ends on time.
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	l, err := client.ConnectContext(ctx, cfg.Socket, client.Options{Name: "xdpqperf/" + cfg.Mode, Queues: cfg.Queues,
		Ring: cfg.Ring, TX: cfg.Mode != RXDrop, MultiBuffer: cfg.MultiBuffer})
	if err != nil {
		return Totals{}, err
	}
	defer func() {
		// The totals are counted by then: a lease that did not close
		// cleanly is said beside them.
		if err := l.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "xdpqperf: close the lease:", err)
		}
	}()
	var txFrame []byte
	if cfg.Mode == TXPush {
		if txFrame, err = (frame.Spec{SrcMAC: cfg.SrcMAC, DstMAC: cfg.DstMAC, Src: cfg.Src, Dst: cfg.Dst, Protocol: 17,
			SrcPort: cfg.SrcPort, DstPort: cfg.DstPort, Payload: frame.Payload(0, 0, cfg.Size-42)}).Build(); err != nil {
			return Totals{}, fmt.Errorf("txpush frame: %w", err)
		}
	}
	mode := "copy"
	if l.ZeroCopy {
		mode = "zero-copy"
	}
	fmt.Fprintf(cfg.Out, "xdpqperf %s: allocation %s, %s queues %v, %s\n", cfg.Mode, l.Allocation, l.Netdev, l.Queues, mode)

	cs := make([]counters, len(l.Sockets))
	var rs []*client.Receiver // the receive loops', in modes that receive
	if cfg.Mode != TXPush {
		for i := range l.Sockets {
			rs = append(rs, l.Receiver(i))
		}
	}
	errs := make([]error, len(l.Sockets))
	var oneErr error // the one loop's, over all the queues
	var wg sync.WaitGroup
	if oneLoop(cfg, len(l.Sockets)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			oneErr = rxdropAll(ctx, l.Poller(), cs)
		}()
	} else {
		for i, s := range l.Sockets {
			wg.Add(1)
			go func() {
				defer wg.Done()
				switch cfg.Mode {
				case RXDrop:
					errs[i] = rxdrop(ctx, rs[i], &cs[i])
				case TXPush:
					errs[i] = txpush(ctx, s, l.TXFrames(i), txFrame, &cs[i])
				case L2Fwd:
					errs[i] = l2fwd(ctx, s, rs[i], l.TXFrames(i), &cs[i])
				}
			}()
		}
	}
	report(ctx, cfg, l, rs, cs)
	wg.Wait()
	t := Totals{Queues: l.Queues}
	for i := range cs {
		t.RX = append(t.RX, cs[i].rx.Load())
		t.TX = append(t.TX, cs[i].tx.Load())
	}
	for i, r := range rs {
		cs[i].noteAway(r)
		t.Away = append(t.Away, time.Duration(cs[i].away.Load()))
	}
	for _, s := range l.Sockets {
		st, err := s.Statistics()
		if err != nil {
			t.Drops = nil // all or none
			break
		}
		t.Drops = append(t.Drops, st)
	}
	if oneErr != nil {
		return t, fmt.Errorf("the loop over queues %v: %w", l.Queues, oneErr)
	}
	for i := range cs {
		if errs[i] != nil {
			return t, fmt.Errorf("queue %d: %w", l.Queues[i], errs[i])
		}
	}
	return t, nil
}

// oneLoop says whether rxdrop runs one loop over the lease's n queues
// (Config.Loops).
func oneLoop(cfg Config, n int) bool {
	if cfg.Mode != RXDrop || n < 2 {
		return false
	}
	if cfg.Loops == "" {
		return runtime.GOMAXPROCS(0) < n
	}
	return cfg.Loops == LoopOne
}

func report(ctx context.Context, cfg Config, l *client.Lease, rs []*client.Receiver, cs []counters) {
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	prevRX, prevTX := make([]uint64, len(cs)), make([]uint64, len(cs))
	start, last := time.Now(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			secs := now.Sub(last).Seconds()
			var b strings.Builder
			fmt.Fprintf(&b, "%5.0fs", now.Sub(start).Seconds())
			for i := range cs {
				rx, tx := cs[i].rx.Load(), cs[i].tx.Load()
				fmt.Fprintf(&b, "  q%d rx %8.0f pps tx %8.0f pps", l.Queues[i], float64(rx-prevRX[i])/secs, float64(tx-prevTX[i])/secs)
				if st, err := l.Sockets[i].Statistics(); err == nil {
					fmt.Fprintf(&b, " (ring-full %d fill-empty %d", st.RXRingFull, st.RXFillRingEmptyDescs)
					if rs != nil {
						fmt.Fprintf(&b, " away %s", cs[i].noteAway(rs[i]).Round(time.Microsecond))
					}
					b.WriteString(")")
				}
				prevRX[i], prevTX[i] = rx, tx
			}
			last = now
			fmt.Fprintln(cfg.Out, b.String())
			if cfg.Reported != nil {
				t := Totals{Queues: l.Queues}
				for i := range cs {
					t.RX, t.TX = append(t.RX, cs[i].rx.Load()), append(t.TX, cs[i].tx.Load())
				}
				cfg.Reported(t)
			}
		}
	}
}

// rxdrop is the receive loop pkg/client's Receiver makes: the frames
// counted and given straight back. It waits up to wait in a round, so
// that it sees ctx end within that.
func rxdrop(ctx context.Context, r *client.Receiver, c *counters) error {
	for ctx.Err() == nil {
		n, err := r.Receive(wait, func([]byte) {})
		c.rx.Add(uint64(n))
		if err != nil {
			return err
		}
	}
	return nil
}

// rxdropAll is rxdrop over all the queues in one loop (client.Poller).
func rxdropAll(ctx context.Context, p *client.Poller, cs []counters) error {
	n := make([]uint64, len(cs))
	count := func(socket int, _ []byte) { n[socket]++ }
	for ctx.Err() == nil {
		_, err := p.Receive(wait, count)
		for i := range n {
			if n[i] > 0 {
				cs[i].rx.Add(n[i])
				n[i] = 0
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// wait is the longest a loop waits for a frame before it looks whether
// it should stop.
const wait = 50 * time.Millisecond

func txpush(ctx context.Context, s *xsk.Socket, addrs []uint64, f []byte, c *counters) error {
	if err := traffic.Prepare(s.UMEM(), addrs, f); err != nil {
		return err
	}
	for ctx.Err() == nil {
		end := time.Now().Add(50 * time.Millisecond)
		n, err := traffic.Flood(s, addrs, uint32(len(f)), 64, func() bool { return time.Now().After(end) })
		c.tx.Add(n)
		if err != nil {
			return err
		}
	}
	return nil
}

// l2fwd sends each received packet back out of the same queue with its
// MAC addresses swapped, without copying it: the RX descriptors go to the
// TX ring, and the completed frames back to the fill ring (through the
// Receiver). It counts packets, not descriptors: on a multi-buffer socket
// a jumbo frame is several of each.
//
// A packet goes on the TX ring whole or not yet: its descriptors may
// span two batches of the RX ring, and a head on the TX ring whose tail
// never followed would make the kernel join the next packet onto it.
// While the TX ring has no room for the whole packets received, the loop
// has the kernel take and complete some before it receives more, as
// xdpsock's l2fwd does: what the loop cannot keep up with, the kernel
// drops at the RX ring (Statistics.RXRingFull).
func l2fwd(ctx context.Context, s *xsk.Socket, r *client.Receiver, txFrames []uint64, c *counters) error {
	comp := make([]uint64, client.RXBatch)
	r.Recycle(txFrames...) // a forwarder transmits what it receives: its TX frames receive too
	f := forwarder{ring: int(s.Rings().TX)}
	for ctx.Err() == nil {
		if n := s.Complete(comp); n > 0 {
			r.Recycle(comp[:n]...)
		}
		if f.whole > 0 {
			sent, dropped, err := f.transmit(s)
			if err != nil {
				return err
			}
			c.tx.Add(sent)
			if len(dropped) > 0 {
				r.Recycle(dropped...)
			}
		}
		// Every round the kernel is asked to send what the TX ring holds:
		// in copy mode each ask is a syscall that sends at most the
		// socket's TX budget (32 frames unless raised). A loop that asked
		// only once the ring was full kept a ring's worth of frames
		// waiting there: their latency, and frames the fill ring lacked
		// (make bench: 0.78 of DPDK's forwarding rate on 1 queue, losing
		// 17,373 frames to an empty fill ring and 11,506 to a full RX
		// ring in 3 s).
		if s.TXPending() > 0 {
			if err := s.Kick(); err != nil {
				return err
			}
		}
		if f.whole > 0 { // the TX ring is full
			runtime.Gosched() // the other queues' loops, while this one waits for the kernel
			continue
		}
		w := wait
		if s.TXPending() > 0 {
			w = 0 // frames to send: come back for them
		}
		descs, err := r.Peek(w)
		if err != nil {
			return err
		}
		if len(descs) == 0 {
			continue
		}
		c.rx.Add(f.add(s.UMEM(), descs))
	}
	return nil
}

// forwarder holds the descriptors l2fwd received and has not put on the
// TX ring yet.
type forwarder struct {
	pending []xsk.Desc // oldest first; a packet's tail may be still to come
	whole   int        // packets whose last descriptor is in pending
	more    bool       // the last descriptor received continues a packet
	ring    int        // the TX ring's size
}

// add takes descs (Peek's, which it copies), swaps the MAC addresses in
// the first descriptor of each packet (those of the others are payload),
// and returns how many packets they end.
func (f *forwarder) add(u *xsk.UMEM, descs []xsk.Desc) uint64 {
	var ended uint64
	for _, d := range descs {
		if !f.more {
			swapMACs(u.Bytes(d.Addr, d.Len))
		}
		if f.more = d.Continues(); !f.more {
			ended++
		}
	}
	f.pending = append(f.pending, descs...)
	f.whole += int(ended)
	return ended
}

// transmit puts the whole packets at the front of pending that the TX
// ring has room for on it and returns how many. A packet of more
// descriptors than the ring holds can never go: it is dropped, its
// frames returned for the fill ring.
func (f *forwarder) transmit(s *xsk.Socket) (sent uint64, dropped []uint64, err error) {
	if n := firstPacket(f.pending); n > f.ring {
		for _, d := range f.pending[:n] {
			dropped = append(dropped, d.Addr)
		}
		f.whole--
		f.pending = f.pending[:copy(f.pending, f.pending[n:])]
	}
	k := wholePackets(f.pending, s.TXFree())
	if k == 0 {
		return 0, dropped, nil
	}
	m, err := s.Transmit(f.pending[:k])
	if err != nil {
		return 0, dropped, err
	}
	if m != k {
		// Never: the ring had room. Had it taken part of a packet, the
		// rest could not follow.
		return 0, dropped, fmt.Errorf("l2fwd: the TX ring took %d of %d descriptors it had room for", m, k)
	}
	for _, d := range f.pending[:k] {
		if !d.Continues() {
			sent++
		}
	}
	f.whole -= int(sent)
	f.pending = f.pending[:copy(f.pending, f.pending[k:])]
	return sent, dropped, nil
}

// wholePackets returns how many of the first room descriptors of descs
// hold whole packets: up to the last packet's end among them.
func wholePackets(descs []xsk.Desc, room int) int {
	end := 0
	for i, d := range descs[:min(room, len(descs))] {
		if !d.Continues() {
			end = i + 1
		}
	}
	return end
}

// firstPacket returns how many descriptors the first packet of descs
// takes, 0 when its last is not among them.
func firstPacket(descs []xsk.Desc) int {
	for i, d := range descs {
		if !d.Continues() {
			return i + 1
		}
	}
	return 0
}

// swapMACs swaps the destination and source MAC addresses of the
// Ethernet frame that starts b.
func swapMACs(b []byte) {
	if len(b) < 12 {
		return
	}
	var tmp [6]byte
	copy(tmp[:], b[0:6])
	copy(b[0:6], b[6:12])
	copy(b[6:12], tmp[:])
}

// WriteTotals prints t as xdpqperf ends: a line per queue, "total qN: rx
// M tx K", and with the kernel's counters one more, "drops qN:
// rx-dropped A rx-ring-full B fill-ring-empty C rx-invalid D";
// ParseTotals reads them back.
func WriteTotals(w io.Writer, t Totals) {
	for i, q := range t.Queues {
		fmt.Fprintf(w, "total q%d: rx %d tx %d\n", q, t.RX[i], t.TX[i])
	}
	for i, q := range t.Queues {
		if i < len(t.Drops) {
			d := t.Drops[i]
			fmt.Fprintf(w, "drops q%d: rx-dropped %d rx-ring-full %d fill-ring-empty %d rx-invalid %d\n",
				q, d.RXDropped, d.RXRingFull, d.RXFillRingEmptyDescs, d.RXInvalidDescs)
		}
	}
	for i, q := range t.Queues {
		if i < len(t.Away) {
			fmt.Fprintf(w, "away q%d: longest %dus\n", q, t.Away[i].Microseconds())
		}
	}
}

// ParseTotals reads the totals and drops lines of xdpqperf's output
// (other lines are skipped); ok is false when there is none.
func ParseTotals(out string) (t Totals, ok bool) {
	for line := range strings.Lines(out) {
		var q uint32
		var rx, tx uint64
		if _, err := fmt.Sscanf(line, "total q%d: rx %d tx %d", &q, &rx, &tx); err == nil {
			t.Queues, t.RX, t.TX = append(t.Queues, q), append(t.RX, rx), append(t.TX, tx)
		}
		var d xsk.Statistics
		if _, err := fmt.Sscanf(line, "drops q%d: rx-dropped %d rx-ring-full %d fill-ring-empty %d rx-invalid %d",
			&q, &d.RXDropped, &d.RXRingFull, &d.RXFillRingEmptyDescs, &d.RXInvalidDescs); err == nil {
			t.Drops = append(t.Drops, d)
		}
		var us int64
		if _, err := fmt.Sscanf(line, "away q%d: longest %dus", &q, &us); err == nil {
			t.Away = append(t.Away, time.Duration(us)*time.Microsecond)
		}
	}
	return t, len(t.Queues) > 0 || len(t.Drops) > 0
}

// Received is the frames received on every queue.
func (t Totals) Received() uint64 {
	var n uint64
	for _, rx := range t.RX {
		n += rx
	}
	return n
}
