package frame

import (
	"bytes"
	"encoding/hex"
	"net"
	"net/netip"
	"testing"
)

// A checksum is right when the one's complement sum over the covered bytes,
// checksum included, is 0xffff. The kernel tests in pkg/xdp also prove it:
// frames built here are accepted by a real UDP socket.
func TestBuildUDP4(t *testing.T) {
	s := Spec{
		SrcMAC:   net.HardwareAddr{2, 0, 0, 0, 0, 1},
		DstMAC:   net.HardwareAddr{2, 0, 0, 0, 0, 2},
		Src:      netip.MustParseAddr("10.0.0.1"),
		Dst:      netip.MustParseAddr("10.0.0.2"),
		Protocol: 17, SrcPort: 1000, DstPort: 2000,
		Payload: []byte("hi"),
	}
	b, err := s.Build()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 14+20+8+2 {
		t.Fatalf("length %d", len(b))
	}
	if got := fold(sumBytes(b[14:34])); got != 0xffff {
		t.Errorf("ip header checksum does not verify: %#x\n%s", got, hex.Dump(b))
	}
	// UDP checksum verifies over pseudo-header + segment.
	if got := fold(pseudoSum(s.Src, s.Dst, 17, 10) + sumBytes(b[34:])); got != 0xffff {
		t.Errorf("udp checksum does not verify: %#x", got)
	}
}

func TestBuildChecksumsVerify(t *testing.T) {
	for _, c := range []struct {
		src, dst string
		proto    uint8
		vlan     uint16
	}{
		{"10.1.1.1", "10.2.2.2", 6, 0},
		{"fd00::1", "fd00::2", 17, 0},
		{"fd00::1", "fd00::2", 6, 42},
		{"192.0.2.1", "192.0.2.9", 17, 4094},
	} {
		s := Spec{
			SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2},
			Src: netip.MustParseAddr(c.src), Dst: netip.MustParseAddr(c.dst),
			Protocol: c.proto, SrcPort: 7, DstPort: 9, VLAN: c.vlan, Payload: Payload(1, 2, 33),
		}
		b, err := s.Build()
		if err != nil {
			t.Fatal(err)
		}
		l3 := 14
		if c.vlan != 0 {
			l3 += 4
			if b[12] != 0x81 || b[13] != 0 || uint16(b[14]&0xf)<<8|uint16(b[15]) != c.vlan {
				t.Errorf("%v: bad vlan tag % x", c, b[12:16])
			}
		}
		l4 := l3 + 20
		if s.Dst.Is6() {
			l4 = l3 + 40
		}
		if got := fold(pseudoSum(s.Src, s.Dst, c.proto, len(b)-l4) + sumBytes(b[l4:])); got != 0xffff {
			t.Errorf("%v: l4 checksum does not verify: %#x", c, got)
		}
		if !bytes.HasSuffix(b, s.Payload) {
			t.Errorf("%v: payload not at the end", c)
		}
	}
}

func TestBuildRejects(t *testing.T) {
	good := Spec{
		SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2},
		Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Protocol: 17,
	}
	bad := []func(*Spec){
		func(s *Spec) { s.SrcMAC = nil },
		func(s *Spec) { s.Dst = netip.MustParseAddr("fd00::1") },
		func(s *Spec) { s.Protocol = 1 },
		func(s *Spec) { s.Src = netip.Addr{} },
	}
	for i, f := range bad {
		s := good
		f(&s)
		if _, err := s.Build(); err == nil {
			t.Errorf("case %d: no error", i)
		}
	}
}
