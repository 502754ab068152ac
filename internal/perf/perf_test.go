package perf

import (
	"bytes"
	"context"
	"io"
	"os"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/node"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/xsk"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }

func start(t *testing.T) (*node.Node, *node.Peer) {
	t.Helper()
	return node.StartTB(t, node.Config{Queues: 2})
}

func udp(n *node.Node, from, to int, i int) []byte {
	src, dst := n.Pair.B, n.Pair.A
	if from == 0 {
		src, dst = n.Pair.A, n.Pair.B
	}
	f, _ := frame.Spec{SrcMAC: src.MAC, DstMAC: dst.MAC, Src: src.Addr, Dst: dst.Addr, Protocol: 17,
		SrcPort: 1, DstPort: 5000, Payload: frame.Payload(uint32(to), uint64(i), 60)}.Build()
	return f
}

// TestRXDrop: frames sent to the queue are counted, and a line a second
// is printed.
func TestRXDrop(t *testing.T) {
	n, p := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	done := make(chan Totals)
	counted := make(chan struct{})
	var once sync.Once
	reported := func(t Totals) {
		if t.RX[0] == 500 { // a line was printed after the last frame was counted
			once.Do(func() { close(counted) })
		}
	}
	go func() {
		tot, err := Run(ctx, Config{Socket: n.Alloc.SocketPath(), Mode: RXDrop, Ring: 1024, Interval: 100 * time.Millisecond, Out: &out,
			Reported: reported})
		if err != nil {
			t.Error(err)
		}
		done <- tot
	}()
	if err := n.WaitSockets(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var frames [][]byte
	for i := range 500 {
		frames = append(frames, udp(n, 1, 0, i))
	}
	if err := p.Send[0].Send(frames, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-counted:
	case <-time.After(10 * time.Second):
		t.Error("no report counted the 500 frames")
	}
	cancel()
	tot := <-done
	if tot.RX[0] != 500 {
		t.Errorf("counted %d of 500 frames", tot.RX[0])
	}
	if len(tot.Away) != 1 {
		t.Errorf("away %v, want the one queue's", tot.Away)
	}
	if !bytes.Contains(out.Bytes(), []byte("q0 rx")) || !bytes.Contains(out.Bytes(), []byte(" away ")) ||
		!bytes.Contains(out.Bytes(), []byte("xdpqperf rxdrop: allocation alloc-1, xa queues [0], copy")) {
		t.Errorf("output:\n%s", out.String())
	}
}

// TestTXPush: the frames it pushes arrive at the peer byte for byte.
func TestTXPush(t *testing.T) {
	n, p := start(t)
	want := udp(n, 0, 0, 0)
	var got atomic.Int64
	received := make(chan struct{})
	// Ended and joined before the node's cleanup closes the UMEM the loop reads.
	defer func() { <-received }()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		defer close(received)
		p.Recv[0].Receive(-1, time.Now().Add(5*time.Second), func(b []byte) error {
			if !bytes.Equal(b, want) {
				t.Errorf("frame differs:\n got % x\nwant % x", b, want)
				cancel()
			}
			if got.Add(1) == 1000 {
				cancel()
			}
			return ctx.Err()
		})
	}()
	a, b := n.Pair.A, n.Pair.B
	tot, err := Run(ctx, Config{Socket: n.Alloc.SocketPath(), Mode: TXPush, Ring: 512, Out: io.Discard, Duration: 5 * time.Second,
		Size: len(want), SrcMAC: a.MAC, DstMAC: b.MAC, Src: a.Addr, Dst: b.Addr, SrcPort: 1, DstPort: 5000})
	if err != nil {
		t.Fatal(err)
	}
	if got.Load() < 1000 || tot.TX[0] < 1000 {
		t.Errorf("pushed %d, peer got %d", tot.TX[0], got.Load())
	}
}

// TestL2Fwd: every frame comes back with its MAC addresses swapped.
func TestL2Fwd(t *testing.T) {
	n, p := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Totals)
	go func() {
		tot, err := Run(ctx, Config{Socket: n.Alloc.SocketPath(), Mode: L2Fwd, Ring: 512, Out: io.Discard})
		if err != nil {
			t.Error(err)
		}
		done <- tot
	}()
	if err := n.WaitSockets(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var sent, want [][]byte
	for i := range 300 {
		f := udp(n, 1, 0, i)
		sent = append(sent, f)
		w := bytes.Clone(f)
		copy(w[0:6], f[6:12])
		copy(w[6:12], f[0:6])
		want = append(want, w)
	}
	if err := p.Send[0].Send(sent, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := p.Recv[0].Expect(want, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	cancel()
	if tot := <-done; tot.RX[0] != 300 || tot.TX[0] != 300 {
		t.Errorf("forwarded rx %d tx %d, want 300", tot.RX[0], tot.TX[0])
	}
}

// TestL2FwdJumbo: on multi-buffer sockets, jumbo frames (up to 9014
// bytes at a 9000-byte MTU, 3 descriptors of 4 KiB frames) come back
// whole, byte for byte, with only their MAC addresses swapped (in a
// packet's first descriptor, not in the others, which hold payload), and
// the totals count packets, not descriptors.
func TestL2FwdJumbo(t *testing.T) {
	n, p := node.StartTB(t, node.Config{MTU: 9000})
	ctx, cancel := context.WithCancel(context.Background())
	var tot Totals
	done := make(chan struct{})
	go func() {
		defer close(done)
		var err error
		if tot, err = Run(ctx, Config{Socket: n.Alloc.SocketPath(), Mode: L2Fwd, Ring: 256, MultiBuffer: true, Out: io.Discard}); err != nil {
			t.Error(err)
		}
	}()
	// Also on a failure: the lease goes before the node.
	t.Cleanup(func() {
		cancel()
		<-done
	})
	if err := n.WaitSockets(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	src, dst := n.Pair.B, n.Pair.A
	var sent, want [][]byte
	for i := range 300 {
		size := []int{60, 1442, 2048, 3840, 3841, 4097, 6042, 7681, 9014}[i%9]
		f, err := frame.Spec{SrcMAC: src.MAC, DstMAC: dst.MAC, Src: src.Addr, Dst: dst.Addr, Protocol: 17,
			SrcPort: 1, DstPort: 5000, Payload: frame.Payload(0, uint64(i), size-42)}.Build()
		if err != nil {
			t.Fatal(err)
		}
		sent = append(sent, f)
		w := bytes.Clone(f)
		copy(w[0:6], f[6:12])
		copy(w[6:12], f[0:6])
		want = append(want, w)
	}
	// 50 frames at a time: at most 150 descriptors on the forwarder's
	// rings of 256 and 300 on the peer's of 1024, so that none is lost to
	// a full ring whatever the scheduling.
	for i := 0; i < len(sent); i += 50 {
		if err := p.Send[0].Send(sent[i:i+50], time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := p.Recv[0].Expect(want[i:i+50], time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("frames %d to %d: %v", i, i+50, err)
		}
	}
	cancel()
	<-done
	if len(tot.RX) != 1 || tot.RX[0] != 300 || tot.TX[0] != 300 {
		t.Errorf("forwarded rx %v tx %v, want 300 packets", tot.RX, tot.TX)
	}
	if p.Recv[0].Descriptors <= p.Recv[0].Frames {
		t.Errorf("%d frames back in %d descriptors: none in pieces", p.Recv[0].Frames, p.Recv[0].Descriptors)
	}
}

// TestWholePackets: l2fwd puts on the TX ring the descriptors up to the
// last packet's end that fit, never a packet's head without its tail.
func TestWholePackets(t *testing.T) {
	const c = xsk.Continues
	a := []xsk.Desc{{Options: c}, {Options: c}, {}, {}, {Options: c}, {}, {Options: c}}
	for _, tc := range []struct {
		descs       []xsk.Desc
		room, whole int
	}{
		{a, 0, 0},
		{a, 2, 0}, // the first packet's head only: none
		{a, 3, 3},
		{a, 4, 4},
		{a, 5, 4}, // not the third packet's head
		{a, 6, 6},
		{a, 100, 6}, // not the last packet's head, its tail still to come
		{a[4:], 100, 2},
		{a[6:], 100, 0},
		{nil, 10, 0},
	} {
		if got := wholePackets(tc.descs, tc.room); got != tc.whole {
			t.Errorf("wholePackets(%v, %d) = %d, want %d", tc.descs, tc.room, got, tc.whole)
		}
	}
	for _, tc := range []struct {
		descs []xsk.Desc
		first int
	}{{a, 3}, {a[2:], 1}, {a[4:], 2}, {a[6:], 0}, {nil, 0}} {
		if got := firstPacket(tc.descs); got != tc.first {
			t.Errorf("firstPacket(%v) = %d, want %d", tc.descs, got, tc.first)
		}
	}
}

// TestTotalsLines: what WriteTotals prints, ParseTotals reads back from
// among xdpqperf's other lines; output without totals says so.
func TestTotalsLines(t *testing.T) {
	want := Totals{Queues: []uint32{2, 5}, RX: []uint64{10, 20}, TX: []uint64{0, 3},
		Drops: []xsk.Statistics{{RXDropped: 1, RXRingFull: 2, RXFillRingEmptyDescs: 3, RXInvalidDescs: 4}, {RXFillRingEmptyDescs: 7}},
		Away:  []time.Duration{1500 * time.Microsecond, 42 * time.Microsecond}}
	var b bytes.Buffer
	b.WriteString("xdpqperf rxdrop: allocation a, xa queues [2 5], copy\n    1s  q2 rx 10 pps\n")
	WriteTotals(&b, want)
	got, ok := ParseTotals(b.String())
	if dr, full, empty, inv := got.Dropped(); !ok || !reflect.DeepEqual(got, want) || got.Received() != 30 ||
		dr != 1 || full != 2 || empty != 10 || inv != 4 {
		t.Errorf("ParseTotals(%q) = %+v, %v; want %+v", b.String(), got, ok, want)
	}
	if _, ok := ParseTotals("xdpqperf: connect: refused\n"); ok {
		t.Error("totals read from output without any")
	}
}

// TestRXDropLoops: with one loop over the queues (client.Poller) and with
// a loop per queue, every frame is counted on the queue it came to.
func TestRXDropLoops(t *testing.T) {
	for _, loops := range []string{LoopOne, LoopPerQueue} {
		t.Run(loops, func(t *testing.T) {
			n, p := node.StartTB(t, node.Config{Queues: 2, Alloc: []uint32{0, 1}, PeerQueues: []uint32{0, 1}})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			want := []uint64{300, 200}
			counted := make(chan struct{})
			var once sync.Once
			reported := func(t Totals) {
				if reflect.DeepEqual(t.RX, want) {
					once.Do(func() { close(counted) })
				}
			}
			done := make(chan Totals, 1)
			go func() {
				tot, err := Run(ctx, Config{Socket: n.Alloc.SocketPath(), Mode: RXDrop, Loops: loops, Ring: 1024,
					Interval: 50 * time.Millisecond, Out: io.Discard, Reported: reported})
				if err != nil {
					t.Error(err)
				}
				done <- tot
			}()
			if err := n.WaitSockets(2, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			for q, k := range want {
				var frames [][]byte
				for i := range int(k) {
					frames = append(frames, udp(n, 1, q, i))
				}
				if err := p.Send[q].Send(frames, time.Now().Add(5*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-counted:
			case <-time.After(10 * time.Second):
				t.Error("no report counted 300 and 200 frames")
			}
			cancel()
			tot := <-done
			if !reflect.DeepEqual(tot.RX, want) || len(tot.Away) != 2 {
				t.Errorf("counted %v, away %v; want %v and two queues' away", tot.RX, tot.Away, want)
			}
		})
	}
	if _, err := Run(context.Background(), Config{Mode: RXDrop, Loops: "two"}); err == nil {
		t.Error("loops \"two\" was taken")
	}
}

// TestOneLoop: which runs get one loop over their queues.
func TestOneLoop(t *testing.T) {
	procs := runtime.GOMAXPROCS(0)
	for _, c := range []struct {
		cfg  Config
		n    int
		want bool
	}{
		{Config{Mode: RXDrop, Loops: LoopOne}, 4, true},
		{Config{Mode: RXDrop, Loops: LoopOne}, 1, false}, // one queue: its Receiver
		{Config{Mode: RXDrop, Loops: LoopPerQueue}, 4, false},
		{Config{Mode: RXDrop}, procs + 1, true}, // fewer cores than queues
		{Config{Mode: RXDrop}, max(procs, 2), procs < 2},
		{Config{Mode: L2Fwd, Loops: LoopOne}, 4, false}, // rxdrop alone has one
		{Config{Mode: TXPush}, procs + 1, false},
	} {
		if got := oneLoop(c.cfg, c.n); got != c.want {
			t.Errorf("mode %s, loops %q, %d queues, GOMAXPROCS %d: one loop %v, want %v", c.cfg.Mode, c.cfg.Loops, c.n, procs, got, c.want)
		}
	}
}
