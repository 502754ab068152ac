package traffic_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/node"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/client"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

func TestMain(m *testing.M) { os.Exit(testnet.MainWithLeakCheck(m)) }

// jumbo is a frame of size bytes from xa to xb, its payload numbered seq.
func jumbo(tb testing.TB, n *node.Node, seq, size int) []byte {
	tb.Helper()
	a, b := n.Pair.A, n.Pair.B
	f, err := frame.Spec{SrcMAC: a.MAC, DstMAC: b.MAC, Src: a.Addr, Dst: b.Addr, Protocol: 17,
		SrcPort: 1, DstPort: 5000, Payload: frame.Payload(3, uint64(seq), size-42)}.Build()
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// lease takes xa's queue 0 with multi-buffer sockets of 2 KiB frames
// (a 9014-byte frame is 5 of them) and a TX ring.
func lease(t *testing.T, n *node.Node) *client.Lease {
	t.Helper()
	l, err := client.Connect(n.Alloc.SocketPath(), client.Options{Name: t.Name(), FrameSize: xsk.FrameSize2K, Ring: 1024,
		MultiBuffer: true, TX: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestReceiveAtMostN: Receive(n) hands over at most n frames also when
// they come in several descriptors each and a round ended in the middle
// of one; the frames it leaves are the next Receive's, in order, and
// Expect takes them.
func TestReceiveAtMostN(t *testing.T) {
	n, p := node.StartTB(t, node.Config{MTU: 9000})
	l := lease(t, n)
	var want [][]byte
	for i := range 20 {
		want = append(want, jumbo(t, n, i, 9014))
	}
	if err := traffic.NewSender(l.Sockets[0], l.TXFrames(0), 0).Send(want, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	next := 0
	for _, k := range []int{1, 3, 1, 7} {
		calls := 0
		got, err := p.Recv[0].Receive(k, time.Now().Add(5*time.Second), func(b []byte) error {
			calls++
			if next >= len(want) {
				return fmt.Errorf("frame %d: only %d were sent", next, len(want))
			}
			if !bytes.Equal(b, want[next]) {
				t.Errorf("frame %d differs (%d bytes, want %d)", next, len(b), len(want[next]))
			}
			next++
			return nil
		})
		if err != nil || got != k || calls != k {
			t.Fatalf("Receive(%d) = %d, %v; fn ran %d times", k, got, err, calls)
		}
	}
	if err := p.Recv[0].Expect(want[next:], time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	// At least 5 descriptors a frame: the test is of frames in pieces.
	if p.Recv[0].Frames != len(want) || p.Recv[0].Descriptors < 5*len(want) {
		t.Errorf("%d frames in %d descriptors; want %d in at least %d", p.Recv[0].Frames, p.Recv[0].Descriptors, len(want), 5*len(want))
	}
}

// TestSenderFrames: a Sender of 5 frames of 2 KiB sends a 9014-byte frame
// (5 frames) and refuses at once, saying why, one that needs 6, rather
// than wait for frames it will never have.
func TestSenderFrames(t *testing.T) {
	n, p := node.StartTB(t, node.Config{MTU: 9000})
	l := lease(t, n)
	s := traffic.NewSender(l.Sockets[0], l.TXFrames(0)[:5], 0)
	big := jumbo(t, n, 0, 5*2048+1)
	err := s.Send([][]byte{big}, time.Now().Add(5*time.Second))
	if err == nil || !strings.Contains(err.Error(), "needs 6 frames of 2048 bytes, the sender owns 5") {
		t.Fatalf("sending a frame of 6 UMEM frames with 5: %v; want an error saying so", err)
	}
	want := [][]byte{jumbo(t, n, 1, 9014), jumbo(t, n, 2, 9014)}
	if err := s.Send(want, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := p.Recv[0].Expect(want, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// TestFloodAllFrameSizes: FloodAll over sockets of different UMEM frame
// sizes splits the packet by each socket's own: every queue's peer gets
// it whole, byte for byte.
func TestFloodAllFrameSizes(t *testing.T) {
	testnet.RequireRoot(t)
	root := uint32(0)
	n, err := node.Start(node.Config{Queues: 2, Alloc: []uint32{0}, MTU: 9000, Owner: broker.Owner{UID: &root},
		Limits: wire.Limits{MaxUMEM: 64 << 20, MaxRing: 4096, AllowTX: true, MaxQueue: 4},
		Policy: agent.Policy{Steering: agent.SteerHardware}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	p, err := n.Peer([]uint32{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	want := jumbo(t, n, 0, 9014)
	dev := xsk.Netdev{Name: "xa", Ifindex: n.Pair.A.Index, NetNS: n.Pair.NSPath()}
	var socks []*xsk.Socket
	var addrs [][]uint64
	for q, fs := range []uint32{xsk.FrameSize2K, xsk.FrameSize4K} {
		const frames = 256
		u, ss, err := xsk.Open(dev, []uint32{uint32(q)}, frames, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: fs},
			Rings: xsk.Rings{Fill: 64, Completion: frames, TX: frames}, MultiBuffer: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ss[0].Close()
			u.Close()
		})
		var as []uint64
		for i := range frames {
			as = append(as, u.FrameAddr(i))
		}
		if err := traffic.Prepare(u, as, want); err != nil {
			t.Fatal(err)
		}
		socks, addrs = append(socks, ss[0]), append(addrs, as)
	}
	checks := 0
	sent, err := traffic.FloodAll(socks, addrs, uint32(len(want)), 64, func() bool { checks++; return checks > 2 })
	if err != nil {
		t.Fatal(err)
	}
	if sent < 2 {
		t.Errorf("%d packets sent", sent)
	}
	for q, r := range p.Recv {
		got, err := r.Receive(1, time.Now().Add(5*time.Second), func(b []byte) error {
			if !bytes.Equal(b, want) {
				t.Errorf("queue %d: got %d bytes, want the %d of the packet", q, len(b), len(want))
			}
			return nil
		})
		if err != nil || got != 1 {
			t.Errorf("queue %d: received %d packets: %v", q, got, err)
		}
	}
}
