package xdp_test

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// BenchmarkDirect runs the direct program on one 64-byte frame through
// BPF_PROG_TEST_RUN, b.N times in one call: the program of earlier
// versions (v0, which counted nothing) beside this version's (which
// counts per queue), on a queue with a socket in the XSKMAP (redirect)
// and on one without (pass). ns/run is the kernel's own measure of one
// run; ns/op adds the syscall, spread over b.N runs.
//
//	go test -run '^$' -bench Direct -benchtime 10000000x ./pkg/xdp
func BenchmarkDirect(b *testing.B) {
	testnet.RequireRoot(b)
	p := testnet.NewPair(b, 1)
	dev := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: p.NSPath()}
	umem, socks, err := xsk.Open(dev, []uint32{0}, 64, xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048},
		Rings: xsk.Rings{Fill: 64, Completion: 64, RX: 64}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { socks[0].Close(); umem.Close() })
	now, err := xdp.Load(xdp.Direct, xdp.LoadOptions{Queues: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { now.Close() })
	v0, err := xdp.LoadDirectV0(1, now.XSKMap())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { v0.Close() })
	frame := make([]byte, 64)
	for _, sock := range []struct {
		name string
		ret  uint32
	}{{"pass", 2 /* XDP_PASS */}, {"redirect", 4 /* XDP_REDIRECT */}} {
		if sock.name == "redirect" {
			if err := now.SetSocket(0, socks[0].FD()); err != nil {
				b.Fatal(err)
			}
		}
		for _, prog := range []struct {
			name string
			p    *ebpf.Program
		}{{"v0", v0}, {"counting", now.Prog()}} {
			b.Run(prog.name+"/"+sock.name, func(b *testing.B) {
				ret, perRun, err := prog.p.Benchmark(frame, b.N, b.ResetTimer)
				if err != nil {
					b.Fatal(err)
				}
				if ret != sock.ret {
					b.Fatalf("returned %d, want %d", ret, sock.ret)
				}
				b.ReportMetric(float64(perRun.Nanoseconds()), "ns/run")
			})
		}
	}
}
