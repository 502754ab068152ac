package xdp_test

import (
	"maps"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// TestEarlierDirectProgram: the direct program of earlier versions (no
// counters) attached to a netdev is reported as xdpq's, of kind Direct,
// and outdated; this version's is not outdated. Open takes it with its
// XSKMAP and no counters.
func TestEarlierDirectProgram(t *testing.T) {
	p := testnet.NewPair(t, queues)
	v0, err := xdp.LoadDirectV0(queues, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v0.Close()
	if _, err := xdp.Attach(p.NSPath(), p.A.Index, v0, xdp.ModeNative); err != nil {
		t.Fatal(err)
	}
	a, err := xdp.Query(p.NSPath(), p.A.Index)
	if err != nil || a == nil || !a.Ours || a.Kind != xdp.Direct || !a.Outdated || a.ID != progID(t, v0) {
		t.Fatalf("query the earlier direct program: %+v, %v; want ours, direct, outdated", a, err)
	}
	old, err := xdp.Open(a.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if old.Kind() != xdp.Direct || old.XSKMap() == nil || old.CounterMap() != nil {
		t.Errorf("open the earlier direct program: kind %v, xskmap %v, counters %v", old.Kind(), old.XSKMap(), old.CounterMap())
	}
	if _, err := old.Counters(0); err == nil {
		t.Error("the earlier direct program has counters")
	}

	now, err := xdp.LoadWith(xdp.Direct, xdp.LoadOptions{Queues: queues}, map[string]*ebpf.Map{"xsks": old.XSKMap()})
	if err != nil {
		t.Fatal(err)
	}
	defer now.Close()
	if err := xdp.Replace(p.NSPath(), p.A.Index, xdp.ModeNative, now.Prog(), v0); err != nil {
		t.Fatal(err)
	}
	a, err = xdp.Query(p.NSPath(), p.A.Index)
	if err != nil || a == nil || !a.Ours || a.Kind != xdp.Direct || a.Outdated || a.ID != progID(t, now.Prog()) {
		t.Fatalf("query after the replacement: %+v, %v; want ours, direct, not outdated", a, err)
	}
	if err := xdp.Detach(p.NSPath(), p.A.Index, xdp.ModeNative, now.Prog()); err != nil {
		t.Fatal(err)
	}
}

// TestDirectCounters: the direct program counts, per queue, the frames it
// redirected to the queue's socket and those it passed to the kernel
// because the queue had none.
func TestDirectCounters(t *testing.T) {
	p := testnet.NewPair(t, queues)
	prog, recv, _, send := setup(t, p, xdp.Direct, xdp.ModeNative)
	// Queue 1's socket leaves the XSKMAP: its frames go to the kernel.
	if err := prog.DeleteSocket(1); err != nil {
		t.Fatal(err)
	}
	want := udpFrames(p, 0, p.A.Addr, 5000, 300, 64)
	if err := send[0].Send(want, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := recv[0].Expect(want, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := send[1].Send(udpFrames(p, 1, p.A.Addr, 5000, 70, 64), time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	waitCounters(t, prog, map[uint32]xdp.Counters{0: {Redirected: 300}, 1: {Passed: 70}, 2: {}, 3: {}})
	expectNone(t, recv[1], "queue 1 without its socket in the xskmap")
}

// waitCounters waits until prog's counters are want, per queue: the
// frames sent are seen by the program in the receiver's NAPI poll, a
// moment after they were sent.
func waitCounters(t *testing.T, prog *xdp.Program, want map[uint32]xdp.Counters) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		got := map[uint32]xdp.Counters{}
		for q := range want {
			c, err := prog.Counters(q)
			if err != nil {
				t.Fatal(err)
			}
			got[q] = c
		}
		if maps.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("counters %+v, want %+v", got, want)
		}
		<-tick.C
	}
}
