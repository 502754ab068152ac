package xdp_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

const queues = 4

var (
	rxConfig = xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 1024, Completion: 64, RX: 1024}}
	txConfig = xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 512, TX: 512}}
)

// setup loads and attaches a program to A and returns it with receiving
// sockets on A's queues (in the XSKMAP) and sending sockets on B's.
func setup(t *testing.T, p *testnet.Pair, kind xdp.Kind, mode xdp.Mode) (*xdp.Program, []*traffic.Receiver, []*xsk.Socket, []*traffic.Sender) {
	t.Helper()
	prog, err := xdp.Load(kind, xdp.LoadOptions{Queues: queues})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	got, err := xdp.Attach(p.NSPath(), p.A.Index, prog.Prog(), mode)
	if err != nil {
		t.Fatal(err)
	}
	if got != mode {
		t.Fatalf("attached in %v, want %v", got, mode)
	}
	t.Cleanup(func() { xdp.Detach(p.NSPath(), p.A.Index, mode, prog.Prog()) })

	qs := []uint32{0, 1, 2, 3}
	devA := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: p.NSPath()}
	rumem, rsocks, err := xsk.Open(devA, qs, queues*1024, rxConfig)
	if err != nil {
		t.Fatal(err)
	}
	devB := xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}
	tumem, tsocks, err := xsk.Open(devB, qs, queues*512, txConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range append(rsocks, tsocks...) {
			s.Close()
		}
		rumem.Close()
		tumem.Close()
	})
	var recv []*traffic.Receiver
	var send []*traffic.Sender
	for k := range queues {
		r, err := traffic.NewReceiver(rsocks[k], frames(rumem, k*1024, 1024))
		if err != nil {
			t.Fatal(err)
		}
		recv = append(recv, r)
		send = append(send, traffic.NewSender(tsocks[k], frames(tumem, k*512, 512), 0))
		if err := prog.SetSocket(uint32(k), rsocks[k].FD()); err != nil {
			t.Fatal(err)
		}
	}
	return prog, recv, rsocks, send
}

func frames(u *xsk.UMEM, first, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = u.FrameAddr(first + i)
	}
	return out
}

func udpFrames(p *testnet.Pair, id uint32, dst netip.Addr, port uint16, n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		src := p.B.Addr
		if dst.Is6() {
			src = netip.MustParseAddr("fd00::2")
		}
		f, err := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: src, Dst: dst,
			Protocol: 17, SrcPort: 40000, DstPort: port, Payload: frame.Payload(id, uint64(i), size)}.Build()
		if err != nil {
			panic(err)
		}
		out[i] = f
	}
	return out
}

// expectNone checks that r has nothing queued.
func expectNone(t *testing.T, r *traffic.Receiver, what string) {
	t.Helper()
	n, err := r.Receive(-1, time.Now(), func([]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%s: %d unexpected frames", what, n)
	}
}

// TestQueueToSocket sends 1000 frames by AF_XDP TX on B's queue k and
// checks they arrive byte for byte on the socket of the queue they were
// received on, and on no other, for every queue, program and attach mode.
//
// In native mode veth receives peer tx queue k on rx queue k. In generic
// mode veth never records the rx queue (a NIC driver does): the skb keeps
// the tx queue_mapping k of the sender, which the receive path reads as
// "rx queue k-1" (queue_mapping holds the rx queue plus one) and k = 0 as
// "none recorded", queue 0. So peer queue k arrives on rx queue
// max(k-1, 0), and that is what the test expects.
func TestQueueToSocket(t *testing.T) {
	for _, kind := range []xdp.Kind{xdp.Direct, xdp.Filter} {
		for _, mode := range []xdp.Mode{xdp.ModeNative, xdp.ModeGeneric} {
			t.Run(kind.String()+"/"+mode.String(), func(t *testing.T) {
				p := testnet.NewPair(t, queues)
				prog, recv, socks, send := setup(t, p, kind, mode)
				for k := range queues {
					port := uint16(5000 + k)
					rq := k // the rx queue the frames arrive on
					if mode == xdp.ModeGeneric {
						rq = max(k-1, 0)
					}
					if kind == xdp.Filter {
						f := xdp.Flow{Queue: uint32(rq), Protocol: xdp.UDP, Dst: p.A.Addr, Port: port}
						if err := prog.AddFlow(f, 1); err != nil {
							t.Fatal(err)
						}
					}
					want := udpFrames(p, uint32(k), p.A.Addr, port, 1000, 64)
					if err := send[k].Send(want, time.Now().Add(5*time.Second)); err != nil {
						t.Fatal(err)
					}
					if err := recv[rq].Expect(want, time.Now().Add(5*time.Second)); err != nil {
						t.Fatal(err)
					}
					for j := range queues {
						if j != rq {
							expectNone(t, recv[j], fmt.Sprintf("queue %d after sending on %d", j, k))
						}
					}
				}
				for k, s := range socks {
					st, err := s.Statistics()
					if err != nil {
						t.Fatal(err)
					}
					if st.RXDropped != 0 || st.RXRingFull != 0 || st.RXInvalidDescs != 0 {
						t.Errorf("queue %d: %+v", k, st)
					}
				}
				// Both programs count what they redirected, per queue.
				for k := range queues {
					want := uint64(1000)
					if mode == xdp.ModeGeneric {
						want = []uint64{2000, 1000, 1000, 0}[k]
					}
					c, err := prog.Counters(uint32(k))
					if err != nil {
						t.Fatal(err)
					}
					if c != (xdp.Counters{Redirected: want}) {
						t.Errorf("queue %d counters %+v, want %d redirected", k, c, want)
					}
				}
			})
		}
	}
}
