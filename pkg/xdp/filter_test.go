package xdp_test

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/xdpq/xdpq/internal/frame"
	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/xdp"
)

// listenUDP opens a kernel UDP socket on A's address in the pair's netns.
func listenUDP(t *testing.T, p *testnet.Pair, port uint16) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	err := p.NS.Do(func(ns.NetNS) (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(p.A.Addr, port)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// expectDatagrams reads n datagrams from c and checks their payloads.
func expectDatagrams(t *testing.T, c *net.UDPConn, want [][]byte) {
	t.Helper()
	buf := make([]byte, 2048)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i, w := range want {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("kernel socket: datagram %d of %d: %v", i, len(want), err)
		}
		if !bytes.Equal(buf[:n], w) {
			t.Fatalf("kernel socket: datagram %d differs", i)
		}
	}
	c.SetReadDeadline(time.Now())
	if n, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("kernel socket: unexpected datagram (%d bytes, %v)", n, err)
	}
}

// TestFilterPassesOtherTraffic checks that the filter program hands the
// socket only the flows in its map and passes everything else to the
// kernel stack, where a UDP socket receives it, with counters that agree.
func TestFilterPassesOtherTraffic(t *testing.T) {
	p := testnet.NewPair(t, queues)
	prog, recv, _, send := setup(t, p, xdp.Filter, xdp.ModeNative)
	v6 := netip.MustParseAddr("fd00::1")
	for _, f := range []xdp.Flow{
		{Queue: 0, Protocol: xdp.UDP, Dst: p.A.Addr, Port: 5000},
		{Queue: 0, Protocol: xdp.UDP, Dst: p.A.Addr, Port: 5000, VLAN: 42},
		{Queue: 0, Protocol: xdp.TCP, Dst: p.A.Addr},             // every TCP port
		{Queue: 0, Protocol: xdp.UDP, Dst: v6, Port: 5000},       // IPv6
		{Queue: 1, Protocol: xdp.UDP, Dst: p.A.Addr, Port: 7000}, // queue 1 has no socket in the map
	} {
		if err := prog.AddFlow(f, 7); err != nil {
			t.Fatal(err)
		}
	}
	if err := prog.DeleteSocket(1); err != nil {
		t.Fatal(err)
	}
	kernel6000 := listenUDP(t, p, 6000)
	kernel7000 := listenUDP(t, p, 7000)

	build := func(s frame.Spec, n int) [][]byte {
		out := make([][]byte, n)
		for i := range out {
			s.Payload = frame.Payload(9, uint64(i), 32)
			b, err := s.Build()
			if err != nil {
				t.Fatal(err)
			}
			out[i] = b
		}
		return out
	}
	base := frame.Spec{SrcMAC: p.B.MAC, DstMAC: p.A.MAC, Src: p.B.Addr, Dst: p.A.Addr, Protocol: 17, SrcPort: 1, DstPort: 5000}
	with := func(f func(*frame.Spec)) frame.Spec { s := base; f(&s); return s }
	payloads := func(fs [][]byte, hdr int) [][]byte {
		out := make([][]byte, len(fs))
		for i, f := range fs {
			out[i] = f[hdr:]
		}
		return out
	}

	matched := build(base, 100)
	matchedVLAN := build(with(func(s *frame.Spec) { s.VLAN = 42 }), 10)
	matchedTCP := build(with(func(s *frame.Spec) { s.Protocol = 6; s.DstPort = 443 }), 10)
	matched6 := build(with(func(s *frame.Spec) { s.Src = netip.MustParseAddr("fd00::2"); s.Dst = v6 }), 10)
	otherPort := build(with(func(s *frame.Spec) { s.DstPort = 6000 }), 100)
	otherVLAN := build(with(func(s *frame.Spec) { s.VLAN = 43 }), 10)
	otherProtoPort := build(with(func(s *frame.Spec) { s.Protocol = 6; s.DstPort = 5000; s.Dst = netip.MustParseAddr("10.99.0.9") }), 10)

	deadline := time.Now().Add(5 * time.Second)
	var all [][]byte
	for _, fs := range [][][]byte{matched, matchedVLAN, matchedTCP, matched6, otherPort, otherVLAN, otherProtoPort} {
		all = append(all, fs...)
	}
	if err := send[0].Send(all, deadline); err != nil {
		t.Fatal(err)
	}
	var toSocket [][]byte
	for _, fs := range [][][]byte{matched, matchedVLAN, matchedTCP, matched6} {
		toSocket = append(toSocket, fs...)
	}
	if err := recv[0].Expect(toSocket, deadline); err != nil {
		t.Fatal(err)
	}
	expectDatagrams(t, kernel6000, payloads(otherPort, 14+20+8))

	// A flow whose queue has no socket: the redirect fails and the frames go
	// to the kernel, not into the void.
	noSocket := build(with(func(s *frame.Spec) { s.DstPort = 7000 }), 20)
	if err := send[1].Send(noSocket, deadline); err != nil {
		t.Fatal(err)
	}
	expectDatagrams(t, kernel7000, payloads(noSocket, 14+20+8))

	c0, err := prog.Counters(0)
	if err != nil {
		t.Fatal(err)
	}
	if want := (xdp.Counters{Redirected: 130, Passed: 120}); c0 != want {
		t.Errorf("queue 0 counters %+v, want %+v", c0, want)
	}
	c1, err := prog.Counters(1)
	if err != nil {
		t.Fatal(err)
	}
	if want := (xdp.Counters{RedirectFailed: 20}); c1 != want {
		t.Errorf("queue 1 counters %+v, want %+v", c1, want)
	}

	// Deleting the flow sends its frames to the kernel again.
	if err := prog.DeleteFlow(xdp.Flow{Queue: 0, Protocol: xdp.UDP, Dst: p.A.Addr, Port: 5000}); err != nil {
		t.Fatal(err)
	}
	kernel5000 := listenUDP(t, p, 5000)
	again := build(base, 10)
	if err := send[0].Send(again, deadline); err != nil {
		t.Fatal(err)
	}
	expectDatagrams(t, kernel5000, payloads(again, 14+20+8))
	expectNone(t, recv[0], "queue 0 after deleting the flow")
}

func TestFlowValidation(t *testing.T) {
	prog, err := xdp.Load(xdp.Filter, xdp.LoadOptions{Queues: 1})
	if err != nil {
		testnet.RequireRoot(t)
		t.Fatal(err)
	}
	defer prog.Close()
	for _, f := range []xdp.Flow{
		{Protocol: 1, Dst: netip.MustParseAddr("10.0.0.1")},
		{Protocol: xdp.UDP},
		{Protocol: xdp.UDP, Dst: netip.MustParseAddr("10.0.0.1"), VLAN: 4095},
	} {
		if err := prog.AddFlow(f, 0); err == nil {
			t.Errorf("AddFlow(%v) accepted", f)
		}
	}
	direct, err := xdp.Load(xdp.Direct, xdp.LoadOptions{Queues: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if err := direct.AddFlow(xdp.Flow{Protocol: xdp.UDP, Dst: netip.MustParseAddr("10.0.0.1")}, 0); err == nil {
		t.Error("the direct program accepted a flow")
	}
	if _, err := xdp.Load(xdp.Direct, xdp.LoadOptions{}); err == nil {
		t.Error("Load accepted 0 queues")
	}
}

// TestFlowMapFull: a flow beyond the map's size is refused with an error
// that says the map is full, not the kernel's "argument list too long".
func TestFlowMapFull(t *testing.T) {
	testnet.RequireRoot(t)
	p, err := xdp.Load(xdp.Filter, xdp.LoadOptions{Queues: 1, MaxFlows: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 3 {
		f := xdp.Flow{Queue: 0, Protocol: xdp.UDP, Dst: netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), Port: 53}
		err := p.AddFlow(f, uint32(i))
		switch {
		case i < 2 && err != nil:
			t.Fatalf("flow %d: %v", i, err)
		case i == 2 && (!errors.Is(err, xdp.ErrFlowMapFull) || !strings.Contains(err.Error(), "the flow map is full (2 entries")):
			t.Errorf("a flow beyond the map: %v", err)
		}
	}
}
