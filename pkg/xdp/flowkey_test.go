package xdp_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/xdp"
)

// TestFlowKey: a flow as the filter program's flow map holds it, and as
// a restarted agent reads it back. The program looks an IPv4 frame up
// with family 4 and the address in the first 4 bytes (the rest zero),
// so a v4-mapped destination is keyed, and read back, as the IPv4
// address it is; an IPv6 one keeps its 16 bytes; queue, VLAN, protocol
// and port come back as they went. What the program could never match
// (another protocol, a VLAN id past 4094, no destination) is refused
// before the map. No program is loaded: TestFlowValidation does that,
// as root.
func TestFlowKey(t *testing.T) {
	v4 := [16]byte{10, 0, 0, 1}
	for _, c := range []struct {
		name   string
		flow   xdp.Flow
		family uint8
		addr   [16]byte
		back   xdp.Flow // zero: the flow itself
		says   string   // the refusal
	}{
		{name: "ipv4", flow: xdp.Flow{Queue: 3, VLAN: 100, Protocol: xdp.UDP, Dst: netip.MustParseAddr("10.0.0.1"), Port: 2152}, family: 4, addr: v4},
		{name: "v4-mapped", flow: xdp.Flow{Queue: 1, Protocol: xdp.TCP, Dst: netip.MustParseAddr("::ffff:10.0.0.1"), Port: 80}, family: 4, addr: v4,
			back: xdp.Flow{Queue: 1, Protocol: xdp.TCP, Dst: netip.MustParseAddr("10.0.0.1"), Port: 80}},
		{name: "ipv6", flow: xdp.Flow{Queue: 0, Protocol: xdp.UDP, Dst: netip.MustParseAddr("fd00::1"), Port: 53}, family: 6,
			addr: netip.MustParseAddr("fd00::1").As16()},
		{name: "any port, vlan 4094", flow: xdp.Flow{Queue: 7, VLAN: 4094, Protocol: xdp.UDP, Dst: netip.MustParseAddr("192.0.2.9")}, family: 4,
			addr: [16]byte{192, 0, 2, 9}},
		{name: "icmp", flow: xdp.Flow{Protocol: 1, Dst: netip.MustParseAddr("10.0.0.1")}, says: "protocol must be tcp or udp"},
		{name: "vlan 4095", flow: xdp.Flow{Protocol: xdp.UDP, Dst: netip.MustParseAddr("10.0.0.1"), VLAN: 4095}, says: "vlan 4095 out of range"},
		{name: "no destination", flow: xdp.Flow{Protocol: xdp.UDP}, says: "no destination address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			family, addr, back, err := xdp.FlowKey(c.flow)
			if c.says != "" {
				if err == nil || !strings.Contains(err.Error(), c.says) {
					t.Fatalf("key of %v: %v; want it refused saying %q", c.flow, err, c.says)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if family != c.family || addr != c.addr {
				t.Errorf("key: family %d address % x; want %d % x", family, addr, c.family, c.addr)
			}
			want := c.back
			if want == (xdp.Flow{}) {
				want = c.flow
			}
			if back != want {
				t.Errorf("read back as %v, want %v", back, want)
			}
		})
	}
}
