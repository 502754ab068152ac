package xsk_test

import (
	"bytes"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/internal/traffic"
	"github.com/xdpq/xdpq/pkg/xdp"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// receiveWith binds A's queue 0 with cfg on the memfd, sends frames from
// B's queue 0 through the direct program, and returns the descriptors and
// bytes received.
func receiveWith(t *testing.T, p *testnet.Pair, memfd int, cfg xsk.Config, frames [][]byte) ([]xsk.Desc, [][]byte) {
	t.Helper()
	prog, err := xdp.Load(xdp.Direct, xdp.LoadOptions{Queues: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if _, err := xdp.Attach(p.NSPath(), p.A.Index, prog.Prog(), xdp.ModeNative); err != nil {
		t.Fatal(err)
	}
	defer xdp.Detach(p.NSPath(), p.A.Index, xdp.ModeNative, prog.Prog())
	umem, err := xsk.MapUMEM(memfd, cfg.UMEM)
	if err != nil {
		t.Fatal(err)
	}
	defer umem.Close()
	bound, err := xsk.Bind(xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: p.NSPath()}, memfd, []uint32{0}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := xsk.Adopt(bound[0].FD, umem, cfg.Rings)
	if err != nil {
		unix.Close(bound[0].FD)
		t.Fatal(err)
	}
	defer s.Close()
	addrs := make([]uint64, cfg.Rings.Fill)
	for i := range addrs {
		addrs[i] = umem.FrameAddr(i)
	}
	if s.Fill(addrs) != len(addrs) {
		t.Fatal("fill ring did not take its frames")
	}
	if err := prog.SetSocket(0, s.FD()); err != nil {
		t.Fatal(err)
	}
	tumem, tsocks, err := xsk.Open(xsk.Netdev{Name: p.B.Name, Ifindex: p.B.Index, NetNS: p.NSPath()}, []uint32{0}, 64, txConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer tumem.Close()
	defer tsocks[0].Close()
	if err := traffic.NewSender(tsocks[0], frameRange(tumem, 0, 64), 0).Send(frames, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	var descs []xsk.Desc
	var data [][]byte
	buf := make([]xsk.Desc, 64)
	for deadline := time.Now().Add(5 * time.Second); len(descs) < len(frames) && time.Now().Before(deadline); {
		n := s.Receive(buf)
		for _, d := range buf[:n] {
			descs = append(descs, d)
			data = append(data, bytes.Clone(umem.Bytes(d.Addr, d.Len)))
		}
		if n == 0 {
			s.Poll(10 * time.Millisecond)
		}
	}
	return descs, data
}

var txConfig = xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 64, TX: 64}}

// TestHeadroom: with 4 KiB frames and 256 bytes of headroom, the kernel
// leaves the headroom free in front of every received frame.
func TestHeadroom(t *testing.T) {
	p := testnet.NewPair(t, 4)
	cfg := xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 4096, Headroom: 256}, Rings: xsk.Rings{Fill: 64, Completion: 64, RX: 64}}
	mf, err := xsk.NewMemfd("headroom", 64*4096, false)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	want := pattern(p.B.MAC, p.A.MAC, p.B.Addr, p.A.Addr, 3, 20)
	descs, data := receiveWith(t, p, int(mf.Fd()), cfg, want)
	if len(descs) != len(want) {
		t.Fatalf("received %d of %d", len(descs), len(want))
	}
	for i, d := range descs {
		if off := d.Addr % 4096; off < 256 {
			t.Errorf("frame %d at offset %d of its chunk, inside the 256-byte headroom", i, off)
		}
		if !bytes.Equal(data[i], want[i]) {
			t.Errorf("frame %d differs", i)
		}
	}
}

// TestHugeTLB backs a UMEM with huge pages (MFD_HUGETLB), reserving them
// for the test if the machine has none free.
func TestHugeTLB(t *testing.T) {
	p := testnet.NewPair(t, 4)
	const path = "/proc/sys/vm/nr_hugepages"
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(old)))
	if err := os.WriteFile(path, []byte(strconv.Itoa(n+4)), 0o644); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := os.WriteFile(path, old, 0o644); err != nil {
			t.Errorf("restore %s: %v", path, err)
		}
	}()
	size := int64(2 << 20) // one default (2 MiB) huge page
	mf, err := xsk.NewMemfd("huge", size, true)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	cfg := xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 64, RX: 64}}
	want := pattern(p.B.MAC, p.A.MAC, p.B.Addr, p.A.Addr, 4, 20)
	descs, data := receiveWith(t, p, int(mf.Fd()), cfg, want)
	if len(descs) != len(want) {
		t.Fatalf("received %d of %d", len(descs), len(want))
	}
	for i := range data {
		if !bytes.Equal(data[i], want[i]) {
			t.Errorf("frame %d differs", i)
		}
	}
}

// TestRebindRetriesBusyQueue: a queue stays busy for a while after its
// socket closed; Bind retries, and gives up with a clear error while the
// queue is really taken.
func TestRebindRetriesBusyQueue(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dev := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: p.NSPath()}
	cfg := xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 64, RX: 64}}
	mf, err := xsk.NewMemfd("rebind", 1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	for i := range 5 {
		bound, err := xsk.Bind(dev, int(mf.Fd()), []uint32{2}, cfg)
		if err != nil {
			t.Fatalf("bind %d right after the previous socket closed: %v", i, err)
		}
		unix.Close(bound[0].FD)
	}
	held, err := xsk.Bind(dev, int(mf.Fd()), []uint32{3}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(held[0].FD)
	cfg.BusyRetry = 20 * time.Millisecond
	_, err = xsk.Bind(dev, int(mf.Fd()), []uint32{3}, cfg)
	if err == nil || !strings.Contains(err.Error(), "xa/q3") || !strings.Contains(err.Error(), "still in use") {
		t.Fatalf("bind a held queue: %v", err)
	}
}

func TestBusyQueueReleased(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dev := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: p.NSPath()}
	cfg := xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 64, RX: 64}}
	umem, socks, err := xsk.Open(dev, []uint32{1}, 64, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer umem.Close()
	for q, want := range []bool{false, true, false, false} {
		busy, err := xsk.BusyQueues(dev, []uint32{uint32(q)})
		if err != nil || busy[uint32(q)] != want {
			t.Errorf("queue %d: busy %v, %v; want %v", q, busy, err, want)
		}
	}
	socks[0].Close()
	// Once its socket is gone (after the kernel's deferred release) the
	// queue is free again, and a probe does not keep it.
	deadline := time.Now().Add(time.Second)
	for {
		busy, err := xsk.BusyQueues(dev, []uint32{1})
		if err != nil {
			t.Fatal(err)
		}
		if !busy[1] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("queue 1 still busy a second after its socket closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := xsk.Bind(dev, -1, []uint32{1}, cfg); err == nil {
		t.Fatal("bind with a bad memfd succeeded")
	}
	if _, err := xsk.BusyQueues(dev, []uint32{9}); err == nil || !strings.Contains(err.Error(), "xa/q9") {
		t.Errorf("probe of a queue the netdev lacks: %v", err)
	}
}

func TestBusyQueues(t *testing.T) {
	p := testnet.NewPair(t, 4)
	dev := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: p.NSPath()}
	cfg := xsk.Config{UMEM: xsk.UMEMConfig{FrameSize: 2048}, Rings: xsk.Rings{Fill: 64, Completion: 64, RX: 64}}
	umem, socks, err := xsk.Open(dev, []uint32{0, 2}, 64, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer umem.Close()
	for _, s := range socks {
		defer s.Close()
	}
	// A queue the netdev lacks is named in the error; the others are
	// still answered.
	busy, err := xsk.BusyQueues(dev, []uint32{0, 1, 2, 3, 9})
	if err == nil || !strings.Contains(err.Error(), "xa/q9") {
		t.Errorf("probe with a queue the netdev lacks: %v", err)
	}
	if want := map[uint32]bool{0: true, 1: false, 2: true, 3: false}; !maps.Equal(busy, want) {
		t.Errorf("busy %v, want %v", busy, want)
	}
	// The probes are closed when it returns; the queues they bound are
	// released a few tens of milliseconds later, which Bind's retry
	// waits out.
	cfg.BusyRetry = 200 * time.Millisecond
	umem2, socks2, err := xsk.Open(dev, []uint32{1, 3}, 64, cfg)
	if err != nil {
		t.Fatalf("bind the queues found free: %v", err)
	}
	for _, s := range socks2 {
		s.Close()
	}
	umem2.Close()
	if busy, err := xsk.BusyQueues(dev, nil); err != nil || len(busy) != 0 {
		t.Errorf("no queues: %v, %v", busy, err)
	}
}

// BenchmarkBusyQueues probes the 16 queues of a veth one by one and all at
// once, side by side: each probe's close waits for an RCU grace period,
// and concurrent closes share them.
func BenchmarkBusyQueues(b *testing.B) {
	p := testnet.NewPair(b, 16)
	dev := xsk.Netdev{Name: p.A.Name, Ifindex: p.A.Index, NetNS: p.NSPath()}
	queues := make([]uint32, 16)
	for i := range queues {
		queues[i] = uint32(i)
	}
	// Probing a queue leaves it busy for a while: wait until the last
	// round's probes are released so each round finds all queues free.
	settle := func(b *testing.B) {
		b.StopTimer()
		defer b.StartTimer()
		for {
			busy, err := xsk.BusyQueues(dev, queues)
			if err != nil {
				b.Fatal(err)
			}
			if !slices.Contains(slices.Collect(maps.Values(busy)), true) {
				time.Sleep(100 * time.Millisecond)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	b.Run("one-by-one", func(b *testing.B) {
		for b.Loop() {
			settle(b)
			for _, q := range queues {
				if busy, err := xsk.BusyQueues(dev, []uint32{q}); err != nil || busy[q] {
					b.Fatalf("q%d: busy %v, %v", q, busy, err)
				}
			}
		}
	})
	b.Run("batched", func(b *testing.B) {
		for b.Loop() {
			settle(b)
			if busy, err := xsk.BusyQueues(dev, queues); err != nil || slices.Contains(slices.Collect(maps.Values(busy)), true) {
				b.Fatalf("busy %v, %v", busy, err)
			}
		}
	})
}
