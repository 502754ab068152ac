package xdp_test

import (
	"testing"
	"time"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// jumboMTU is a jumbo frame's MTU; its largest frame is 14 bytes more.
const jumboMTU = 9000

// TestJumboFrames sends frames of every size up to a 9000-byte MTU's
// (9014 bytes with the Ethernet header) by multi-buffer AF_XDP TX on B's
// queue 1 and checks that they arrive byte for byte on A's queue 1 through
// each of xdpq's programs attached in native mode (which veth refuses for
// a program without xdp.frags at this MTU), in several descriptors each
// when larger than a UMEM frame; and that a socket bound without
// multi-buffer gets the frames that fit its UMEM frames and loses the
// others to RXDropped, as the package documents.
func TestJumboFrames(t *testing.T) {
	for _, kind := range []xdp.Kind{xdp.Direct, xdp.Filter} {
		for _, fs := range []uint32{xsk.FrameSize2K, xsk.FrameSize4K} {
			t.Run(kind.String()+"/"+map[uint32]string{2048: "2K", 4096: "4K"}[fs], func(t *testing.T) {
				p := testnet.NewPair(t, 2)
				if err := p.SetMTU(jumboMTU); err != nil {
					t.Fatal(err)
				}
				prog, err := xdp.Load(kind, xdp.LoadOptions{Queues: 2})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { prog.Close() })
				if _, err := xdp.Attach(p.NSPath(), p.A.Index, prog.Prog(), xdp.ModeNative); err != nil {
					t.Fatalf("attach native at MTU %d: %v", jumboMTU, err)
				}
				t.Cleanup(func() { xdp.Detach(p.NSPath(), p.A.Index, xdp.ModeNative, prog.Prog()) })
				if kind == xdp.Filter {
					if err := prog.AddFlow(xdp.Flow{Queue: 1, Protocol: xdp.UDP, Dst: p.A.Addr, Port: 5001}, 1); err != nil {
						t.Fatal(err)
					}
				}
				rx := xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: fs}, Rings: xsk.Rings{Fill: 2048, Completion: 64, RX: 2048}, MultiBuffer: true}
				tx := xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: fs}, Rings: xsk.Rings{Fill: 64, Completion: 1024, TX: 1024}, MultiBuffer: true}
				devA := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: p.NSPath()}
				devB := xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}
				rumem, rsocks, err := xsk.Open(devA, []uint32{1}, 4096, rx)
				if err != nil {
					t.Fatal(err)
				}
				tumem, tsocks, err := xsk.Open(devB, []uint32{1}, 1024, tx)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					rsocks[0].Close()
					tsocks[0].Close()
					rumem.Close()
					tumem.Close()
				})
				recv, err := traffic.NewReceiver(rsocks[0], frames(rumem, 0, 4096))
				if err != nil {
					t.Fatal(err)
				}
				send := traffic.NewSender(tsocks[0], frames(tumem, 0, 1024), 0)
				if err := prog.SetSocket(1, rsocks[0].FD()); err != nil {
					t.Fatal(err)
				}

				// Payload sizes around every frame boundary, up to the MTU's
				// (28 bytes of IPv4 and UDP header in it), 20 frames each:
				// a TX descriptor holds a whole frame's bytes, an RX one
				// (copy mode) the frame less the kernel's 256-byte headroom.
				var want [][]byte
				rxFrame := int(fs) - 256
				for _, n := range []int{18, 1472, int(fs) - 42 - 1, int(fs) - 42, int(fs) - 42 + 1, 2*int(fs) - 42, 2*int(fs) - 42 + 7,
					rxFrame - 42 - 1, rxFrame - 42, rxFrame - 42 + 1, 2*rxFrame - 42, 2*rxFrame - 42 + 1, jumboMTU - 28} {
					want = append(want, udpFrames(p, uint32(n), p.A.Addr, 5001, 20, n)...)
				}
				if err := send.Send(want, time.Now().Add(5*time.Second)); err != nil {
					t.Fatal(err)
				}
				if err := recv.Expect(want, time.Now().Add(5*time.Second)); err != nil {
					t.Fatal(err)
				}
				if recv.Descriptors <= recv.Frames {
					t.Errorf("%d frames came in %d descriptors: none in pieces", recv.Frames, recv.Descriptors)
				}
				if st, err := rsocks[0].Statistics(); err != nil || st != (xsk.Statistics{}) {
					t.Errorf("statistics %+v, %v", st, err)
				}
				if len(want[len(want)-1]) != jumboMTU+14 {
					t.Fatalf("largest frame %d bytes", len(want[len(want)-1]))
				}

				// Without multi-buffer: what fits a frame arrives, the rest
				// is dropped and counted.
				rsocks[0].Close()
				rx.MultiBuffer, rx.BusyRetry = false, time.Second
				rumem2, rsocks2, err := xsk.Open(devA, []uint32{1}, 4096, rx)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { rsocks2[0].Close(); rumem2.Close() })
				recv2, err := traffic.NewReceiver(rsocks2[0], frames(rumem2, 0, 4096))
				if err != nil {
					t.Fatal(err)
				}
				if err := prog.SetSocket(1, rsocks2[0].FD()); err != nil {
					t.Fatal(err)
				}
				small := udpFrames(p, 1, p.A.Addr, 5001, 10, 1000)
				big := udpFrames(p, 2, p.A.Addr, 5001, 10, jumboMTU-28)
				if err := send.Send(append(append([][]byte{}, big...), small...), time.Now().Add(5*time.Second)); err != nil {
					t.Fatal(err)
				}
				if err := recv2.Expect(small, time.Now().Add(5*time.Second)); err != nil {
					t.Fatal(err)
				}
				st, err := rsocks2[0].Statistics()
				if err != nil {
					t.Fatal(err)
				}
				if st.RXDropped != uint64(len(big)) {
					t.Errorf("socket without multi-buffer: RXDropped %d, want %d (%+v)", st.RXDropped, len(big), st)
				}
			})
		}
	}
}

// TestLoadWithoutFrags: where the kernel refuses BPF_F_XDP_HAS_FRAGS
// (before Linux 5.18) the programs are loaded without it and attach as
// they did before jumbo frames: natively at MTU 1500, and refused by veth
// at a 9000-byte MTU, which the programs loaded as xdp.frags take. The
// kernel here takes the flag, so Load must keep it.
func TestLoadWithoutFrags(t *testing.T) {
	if !xdp.HaveFrags() {
		t.Fatal("this kernel refuses BPF_F_XDP_HAS_FRAGS; the tests need Linux 5.18 or later")
	}
	for _, kind := range []xdp.Kind{xdp.Direct, xdp.Filter} {
		t.Run(kind.String(), func(t *testing.T) {
			p := testnet.NewPair(t, 2)
			attach := func(load func(xdp.Kind, xdp.LoadOptions) (*xdp.Program, error)) error {
				prog, err := load(kind, xdp.LoadOptions{Queues: 2})
				if err != nil {
					t.Fatal(err)
				}
				defer prog.Close()
				if _, err := xdp.Attach(p.NSPath(), p.A.Index, prog.Prog(), xdp.ModeNative); err != nil {
					return err
				}
				if err := xdp.Detach(p.NSPath(), p.A.Index, xdp.ModeNative, prog.Prog()); err != nil {
					t.Fatal(err)
				}
				return nil
			}
			if err := attach(xdp.LoadWithoutFrags); err != nil {
				t.Fatalf("without frags, at MTU 1500: %v", err)
			}
			if err := p.SetMTU(jumboMTU); err != nil {
				t.Fatal(err)
			}
			if err := attach(xdp.LoadWithoutFrags); err == nil {
				t.Errorf("without frags, at MTU %d: attached; veth should refuse a program without frags", jumboMTU)
			}
			if err := attach(xdp.Load); err != nil {
				t.Errorf("Load at MTU %d: %v", jumboMTU, err)
			}
		})
	}
}
