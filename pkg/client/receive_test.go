package client_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/node"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }

// start runs a node whose allocation is xa's queue 0, for root, and a
// peer that sends to it from xb.
func start(t *testing.T, busy *wire.BusyPoll) (*node.Node, *node.Peer) {
	t.Helper()
	return node.StartTB(t, node.Config{BusyPoll: busy})
}

// lease connects to the node's allocation and waits for its socket in
// the XSKMAP; the lease closes with the test.
func lease(tb testing.TB, n *node.Node, o client.Options) *client.Lease {
	tb.Helper()
	l, err := client.Connect(n.Alloc.SocketPath(), o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	if err := n.WaitSockets(1, 5*time.Second); err != nil {
		tb.Fatal(err)
	}
	return l
}

// burst is 1024 frames, each of its own content.
func burst(n *node.Node, round int) [][]byte {
	src, dst := n.Pair.B, n.Pair.A
	var fs [][]byte
	for i := range 1024 {
		f, _ := frame.Spec{SrcMAC: src.MAC, DstMAC: dst.MAC, Src: src.Addr, Dst: dst.Addr, Protocol: 17,
			SrcPort: 1, DstPort: 5000, Payload: frame.Payload(uint32(round), uint64(i), 60)}.Build()
		fs = append(fs, f)
	}
	return fs
}

// receiveBurst sends a burst while the receive loop is away, then runs
// the loop until it has every frame or a second passes with none, and
// returns what it received.
func receiveBurst(t *testing.T, p *node.Peer, r *client.Receiver, want [][]byte) [][]byte {
	t.Helper()
	if err := p.Send[0].Send(want, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	var got [][]byte
	for len(got) < len(want) {
		began := time.Now()
		n, err := r.Receive(time.Second, func(b []byte) { got = append(got, bytes.Clone(b)) })
		if err != nil {
			t.Fatal(err)
		}
		// 0 before the wait is over: the first descriptors of a packet
		// came, and the next Receive hands it over.
		if n == 0 && time.Since(began) >= time.Second {
			break
		}
	}
	return got
}

// checkDrops checks the kernel's drop counters of the lease's first
// socket after bursts: none unless lose, and then some, with frames lost
// (ring says which setting was to lose them).
func checkDrops(t *testing.T, l *client.Lease, lose, lost bool, ring string) {
	t.Helper()
	st, err := l.Sockets[0].Statistics()
	if err != nil {
		t.Fatal(err)
	}
	drops := st.RXDropped + st.RXRingFull + st.RXFillRingEmptyDescs
	switch {
	case lose && (!lost || drops == 0):
		t.Errorf("%s lost nothing (lost %v, kernel drops %+v): the bursts do not test the ring", ring, lost, st)
	case !lose && drops != 0:
		t.Errorf("the kernel counts drops: %+v", st)
	}
}

// TestReceiverBurst: with pkg/client's defaults, a loop that keeps up on
// average loses nothing to bursts of 1024 frames that come while it is
// busy elsewhere: every frame arrives byte for byte and in order, and the
// kernel counts no drop, burst after burst, whether the loop waits in
// poll or busy-polls. A ring of 512, given the same bursts, loses frames:
// the defaults are what keeps them.
func TestReceiverBurst(t *testing.T) {
	for _, tc := range []struct {
		name string
		busy *wire.BusyPoll
		ring uint32
		lose bool
	}{
		{name: "defaults, poll"},
		{name: "defaults, busy poll", busy: &wire.BusyPoll{TimeoutMicros: 20, Budget: 64}},
		{name: "ring 512", ring: 512, lose: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, p := start(t, tc.busy)
			l := lease(t, n, client.Options{Name: "burst", Ring: tc.ring})
			if (l.BusyPoll != nil) != (tc.busy != nil) {
				t.Fatalf("lease busy poll %v, want %v", l.BusyPoll, tc.busy)
			}
			r := l.Receiver(0)
			if l.Receiver(0) != r {
				t.Fatal("a second Receiver(0) is another receiver")
			}
			lost := false
			for round := range 10 {
				want := burst(n, round)
				got := receiveBurst(t, p, r, want)
				if len(got) < len(want) {
					lost = true
					if !tc.lose {
						t.Fatalf("burst %d: %d of %d frames received", round, len(got), len(want))
					}
					break
				}
				for i := range want {
					if !bytes.Equal(got[i], want[i]) {
						t.Fatalf("burst %d: frame %d differs:\n got % x\nwant % x", round, i, got[i], want[i])
					}
				}
			}
			checkDrops(t, l, tc.lose, lost, "a ring of 512")
		})
	}
}

// TestReceiverWait: an idle Receive returns after its wait with nothing,
// and Peek's frames are the application's until Recycle: while it holds
// them, the Receiver's spare frames keep the fill ring full, so a second
// burst is received whole.
func TestReceiverWait(t *testing.T) {
	n, p := start(t, nil)
	l := lease(t, n, client.Options{Name: "wait"})
	r := l.Receiver(0)
	if got, err := r.Receive(20*time.Millisecond, func([]byte) { t.Error("a frame on an idle queue") }); got != 0 || err != nil {
		t.Fatalf("idle Receive: %d, %v", got, err)
	}
	// Hold a whole RX ring's worth of frames (2048) without recycling.
	var held []xsk.Desc
	first := append(burst(n, 0), burst(n, 1)...)
	if err := p.Send[0].Send(first, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	for len(held) < len(first) {
		ds, err := r.Peek(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) == 0 {
			t.Fatalf("%d of %d frames peeked", len(held), len(first))
		}
		for _, d := range ds {
			if b := l.UMEM.Bytes(d.Addr, d.Len); !bytes.Equal(b, first[len(held)]) {
				t.Fatalf("frame %d differs", len(held))
			}
			held = append(held, d)
		}
	}
	want := burst(n, 2)
	if err := p.Send[0].Send(want, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, d := range held {
		r.Recycle(d.Addr)
	}
	var got [][]byte
	for len(got) < len(want) {
		n, err := r.Receive(time.Second, func(b []byte) { got = append(got, bytes.Clone(b)) })
		if err != nil || n == 0 {
			t.Fatalf("%d of %d frames of the burst received while 2048 were held (%v)", len(got), len(want), err)
		}
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d differs", i)
		}
	}
	if st, _ := l.Sockets[0].Statistics(); st.RXRingFull+st.RXFillRingEmptyDescs+st.RXDropped != 0 {
		t.Errorf("the kernel counts drops: %+v", st)
	}
}

// BenchmarkReceiver is the receive loop's own cost: b.N frames through
// a Receiver while a peer in this process sends as fast as it can (on
// veth the sending core also does the receive side's XDP work). For
// profiles of the loop: go test -run '^$' -bench Receiver -cpuprofile.
func BenchmarkReceiver(b *testing.B) {
	n, p := node.StartTB(b, node.Config{})
	l := lease(b, n, client.Options{Name: "bench"})
	frames := burst(n, 0)[:64]
	stop := make(chan struct{})
	sent := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				sent <- nil
				return
			default:
			}
			if err := p.Send[0].Send(frames, time.Now().Add(5*time.Second)); err != nil {
				sent <- err
				return
			}
		}
	}()
	r := l.Receiver(0)
	b.ResetTimer()
	for got := 0; got < b.N; {
		k, err := r.Receive(time.Second, func([]byte) {})
		if err != nil || k == 0 {
			b.Fatalf("%d of %d frames (%v)", got, b.N, err)
		}
		got += k
	}
	b.StopTimer()
	close(stop)
	if err := <-sent; err != nil {
		b.Fatal(err)
	}
}

// TestReceiverClosed: a loop asleep on an idle queue when its lease
// closes returns ErrLeaseClosed, which says what happened and what to do,
// rather than the runtime's "use of closed file".
func TestReceiverClosed(t *testing.T) {
	n, _ := start(t, nil)
	r := lease(t, n, client.Options{Name: "closed"}).Receiver(0)
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := r.Receive(-1, func([]byte) {}); err != nil {
				done <- err
				return
			}
		}
	}()
	if err := client.CloseReceiver(r); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, client.ErrLeaseClosed) || !strings.Contains(err.Error(), "end the receive loops before Lease.Close") {
			t.Errorf("a closed receiver's wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a loop waiting for ever did not end when its receiver closed")
	}
}

// TestReceiverJumbo: a pod that asks for MultiBuffer gets frames of every
// size up to a 9000-byte MTU's whole, byte for byte and in order, from
// its Receiver at both frame sizes (a 9014-byte frame is received in 6
// descriptors of 2 KiB frames, each a frame less 256 bytes of headroom),
// including bursts that end a batch in the middle of a
// packet; forwarded by Peek and Transmit as they came, they go back out
// whole; and a lease without MultiBuffer gets what fits a frame while the
// kernel counts the rest as dropped.
func TestReceiverJumbo(t *testing.T) {
	for _, fs := range []uint32{xsk.FrameSize2K, xsk.FrameSize4K} {
		t.Run(map[uint32]string{2048: "2K", 4096: "4K"}[fs], func(t *testing.T) {
			n, p := node.StartTB(t, node.Config{MTU: 9000})
			l := lease(t, n, client.Options{Name: "jumbo", FrameSize: fs, MultiBuffer: true, TX: true})
			if !l.MultiBuffer {
				t.Fatal("the lease is not multi-buffer")
			}
			r := l.Receiver(0)
			var want [][]byte
			for i := range 300 {
				size := []int{18, 1400, 2006, 2007, 4054, 4055, 6000, 8972}[i%8]
				want = append(want, jumbo(n, i, size))
			}
			got := receiveBurst(t, p, r, want)
			if len(got) != len(want) {
				t.Fatalf("%d of %d frames received", len(got), len(want))
			}
			for i := range want {
				if !bytes.Equal(got[i], want[i]) {
					t.Fatalf("frame %d (%d bytes) differs: got %d bytes", i, len(want[i]), len(got[i]))
				}
			}
			if st, err := l.Sockets[0].Statistics(); err != nil || st.RXDropped+st.RXRingFull+st.RXFillRingEmptyDescs != 0 {
				t.Fatalf("statistics %+v, %v", st, err)
			}

			// Forwarded as they came: Peek's descriptors, marks and all,
			// on the TX ring.
			s := l.Sockets[0]
			fwd := want[:40]
			if err := p.Send[0].Send(fwd, time.Now().Add(5*time.Second)); err != nil {
				t.Fatal(err)
			}
			comp := make([]uint64, 64)
			descs := 0
			var back [][]byte
			for deadline := time.Now().Add(5 * time.Second); descs < 1 || s.TXPending() > 0 || p.Recv[0].Frames < len(fwd); {
				if time.Now().After(deadline) {
					t.Fatalf("forwarded %d descriptors, the peer has %d of %d frames", descs, p.Recv[0].Frames, len(fwd))
				}
				ds, err := r.Peek(0)
				if err != nil {
					t.Fatal(err)
				}
				if len(ds) > 0 {
					if sent, err := s.Transmit(ds); err != nil || sent != len(ds) {
						t.Fatalf("transmit %d of %d: %v", sent, len(ds), err)
					}
					descs += len(ds)
				}
				s.Kick()
				if k := s.Complete(comp); k > 0 {
					r.Recycle(comp[:k]...)
				}
				if p.Recv[0].Frames < len(fwd) {
					if _, err := p.Recv[0].Receive(-1, time.Now(), func(b []byte) error { back = append(back, bytes.Clone(b)); return nil }); err != nil {
						t.Fatal(err)
					}
				}
			}
			if descs <= len(fwd) {
				t.Errorf("%d frames in %d descriptors: none in pieces", len(fwd), descs)
			}
			for i := range fwd {
				if i >= len(back) || !bytes.Equal(back[i], fwd[i]) {
					t.Fatalf("forwarded frame %d (%d bytes) came back otherwise (%d frames back)", i, len(fwd[i]), len(back))
				}
			}
		})
	}

	// MultiBuffer's defaults take a burst of 1024 jumbo frames that comes
	// while the loop is away, burst after burst; a ring of 2048 (the
	// default without MultiBuffer) does not.
	for _, tc := range []struct {
		name string
		ring uint32
		lose bool
	}{{name: "defaults, bursts"}, {name: "ring 2048, bursts", ring: 2048, lose: true}} {
		t.Run(tc.name, func(t *testing.T) {
			n, p := node.StartTB(t, node.Config{MTU: 9000, Limits: wire.Limits{MaxUMEM: 256 << 20, MaxRing: 8192, MaxQueue: 4}})
			l := lease(t, n, client.Options{Name: "jumbo-burst", MultiBuffer: true, Ring: tc.ring})
			r := l.Receiver(0)
			lost := false
			for round := range 5 {
				var want [][]byte
				for i := range 1024 {
					want = append(want, jumbo(n, round*1024+i, 8972))
				}
				got := receiveBurst(t, p, r, want)
				if len(got) < len(want) {
					if lost = true; !tc.lose {
						t.Fatalf("burst %d: %d of %d frames received", round, len(got), len(want))
					}
					break
				}
				for i := range want {
					if !bytes.Equal(got[i], want[i]) {
						t.Fatalf("burst %d: frame %d differs", round, i)
					}
				}
			}
			checkDrops(t, l, tc.lose, lost, "a ring of 2048")
		})
	}

	t.Run("without MultiBuffer", func(t *testing.T) {
		n, p := node.StartTB(t, node.Config{MTU: 9000})
		l := lease(t, n, client.Options{Name: "small"})
		small, big := jumbo(n, 1, 1000), jumbo(n, 2, 8972)
		got := receiveBurst(t, p, l.Receiver(0), [][]byte{big, small, big, small})
		if len(got) != 2 || !bytes.Equal(got[0], small) || !bytes.Equal(got[1], small) {
			t.Fatalf("received %d frames, want the 2 small ones", len(got))
		}
		if st, err := l.Sockets[0].Statistics(); err != nil || st.RXDropped != 2 {
			t.Fatalf("statistics %+v, %v: want 2 dropped", st, err)
		}
	})
}

// jumbo is a UDP frame to the node with a payload of size bytes.
func jumbo(n *node.Node, seq, size int) []byte {
	src, dst := n.Pair.B, n.Pair.A
	f, err := frame.Spec{SrcMAC: src.MAC, DstMAC: dst.MAC, Src: src.Addr, Dst: dst.Addr, Protocol: 17,
		SrcPort: 1, DstPort: 5000, Payload: frame.Payload(7, uint64(seq), size)}.Build()
	if err != nil {
		panic(err)
	}
	return f
}

// TestReceiverLongestAway: LongestAway tells how long the loop left its
// ring while frames were coming (here the application's code, 30 ms
// between two rounds), and not the time it waited on an idle queue; each
// call starts the measure again.
func TestReceiverLongestAway(t *testing.T) {
	n, p := start(t, nil)
	l := lease(t, n, client.Options{Name: "away"})
	r := l.Receiver(0)
	if _, err := r.Receive(20*time.Millisecond, func([]byte) {}); err != nil {
		t.Fatal(err)
	}
	if a := r.LongestAway(); a != 0 {
		t.Errorf("away %v on a queue where nothing came, want 0", a)
	}

	const busy = 30 * time.Millisecond
	if got := receiveBurst(t, p, r, burst(n, 0)); len(got) != 1024 {
		t.Fatalf("%d of 1024 frames received", len(got))
	}
	time.Sleep(busy) // the application's code between two rounds, the loop away from its ring
	if _, err := r.Receive(0, func([]byte) {}); err != nil {
		t.Fatal(err)
	}
	if a := r.LongestAway(); a < busy {
		t.Errorf("away %v after %v in the application's code while frames came, want at least that", a, busy)
	}
	if a := r.LongestAway(); a != 0 {
		t.Errorf("away %v right after a LongestAway, want 0", a)
	}

	// An idle wait, then frames again: the wait is not an absence.
	const idle = 300 * time.Millisecond
	if got, err := r.Receive(idle, func([]byte) {}); got != 0 || err != nil {
		t.Fatalf("idle Receive: %d, %v", got, err)
	}
	if got := receiveBurst(t, p, r, burst(n, 1)); len(got) != 1024 {
		t.Fatalf("%d of 1024 frames received", len(got))
	}
	if a := r.LongestAway(); a >= idle {
		t.Errorf("away %v: the %v wait on an idle queue was counted", a, idle)
	}
}

// TestReceiverCirculates: a loop that gives every frame back keeps a
// ring's worth of frames in circulation, in the order the kernel took
// them from the fill ring (as a C loop does): the kernel's copy of each
// frame finds the frame's memory and its buffer head where it left them,
// a ring ago, rather than a spare frame's or one from anywhere in the
// UMEM. The spare frames stay out until the application holds frames
// (TestReceiverWait).
func TestReceiverCirculates(t *testing.T) {
	const ring = 512
	n, p := start(t, nil)
	l := lease(t, n, client.Options{Name: "circulates", Ring: ring})
	r := l.Receiver(0)
	var addrs []uint64
	for round := range 8 { // 4 rings' worth, in bursts of half a ring
		want := burst(n, round)[:ring/2]
		if err := p.Send[0].Send(want, time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(want); {
			ds, err := r.Peek(time.Second)
			if err != nil || len(ds) == 0 {
				t.Fatalf("round %d: %d of %d frames (%v)", round, got, len(want), err)
			}
			for _, d := range ds {
				if !bytes.Equal(l.UMEM.Bytes(d.Addr, d.Len), want[got]) {
					t.Fatalf("round %d: frame %d differs", round, got)
				}
				got++
				addrs = append(addrs, d.Addr)
				r.Recycle(d.Addr)
			}
		}
	}
	seen := map[uint64]bool{}
	for _, a := range addrs {
		seen[a] = true
	}
	if len(seen) != ring {
		t.Errorf("%d frames came in %d frames of the UMEM, want the ring's %d", len(addrs), len(seen), ring)
	}
	for i := ring; i < len(addrs); i++ {
		if addrs[i] != addrs[i-ring] {
			t.Fatalf("frame %d came in frame %#x, a ring before in %#x: the order the kernel takes them changed", i, addrs[i], addrs[i-ring])
		}
	}
	if st, _ := l.Sockets[0].Statistics(); st.RXRingFull+st.RXFillRingEmptyDescs+st.RXDropped != 0 {
		t.Errorf("the kernel counts drops: %+v", st)
	}
}

// epollEntries counts the entries of this process's epoll sets (the Go
// runtime's poller among them) that watch the file of fd.
func epollEntries(t *testing.T, fd int) int {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	ino := fmt.Sprintf(" ino:%x ", st.Ino)
	infos, err := filepath.Glob("/proc/self/fdinfo/*")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range infos {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // closed since the listing
		}
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "tfd:") && strings.Contains(line+" ", ino) {
				n++
			}
		}
	}
	return n
}

// TestReceiverPollerOnlyAsleep: a Receiver's socket is in the runtime's
// poller (epoll) only while its loop sleeps there. Registered all along,
// the kernel woke the poller's entry for every frame the socket
// transmitted, on the transmitting core: a forwarder's softirq time per
// frame was twice the C client's in make bench.
func TestReceiverPollerOnlyAsleep(t *testing.T) {
	n, p := start(t, nil)
	l := lease(t, n, client.Options{Name: "asleep"})
	r := l.Receiver(0)
	fd := l.Sockets[0].FD()
	if k := epollEntries(t, fd); k != 0 {
		t.Fatalf("a Receiver not waiting: its socket in %d epoll entries, want none", k)
	}
	got := make(chan error, 1)
	go func() {
		k, err := r.Receive(-1, func([]byte) {})
		if err == nil && k != 1 {
			err = fmt.Errorf("received %d frames, want 1", k)
		}
		got <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for epollEntries(t, fd) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("a Receiver asleep on an idle queue: its socket in no epoll entry within 10 s")
		}
		time.Sleep(time.Millisecond) // polling the kernel's view, not synchronising with it
	}
	if err := p.Send[0].Send(burst(n, 0)[:1], time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if k := epollEntries(t, fd); k != 0 {
		t.Errorf("after the sleep: the socket in %d epoll entries, want none", k)
	}
}
