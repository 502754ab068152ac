package ethtool

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"unsafe"
)

// FlowType is the kind of traffic a rule matches (ethtool flow-type).
type FlowType uint32

// Flow types xdpq uses.
const (
	TCP4  FlowType = 0x01
	UDP4  FlowType = 0x02
	TCP6  FlowType = 0x05
	UDP6  FlowType = 0x06
	IP4   FlowType = 0x0d // IPV4_USER_FLOW, any L4 protocol
	IP6   FlowType = 0x0e // IPV6_USER_FLOW
	Ether FlowType = 0x12

	flowExt    = 0x80000000
	flowMACExt = 0x40000000
	flowRSS    = 0x20000000
)

func (t FlowType) String() string {
	switch t {
	case TCP4:
		return "tcp4"
	case UDP4:
		return "udp4"
	case TCP6:
		return "tcp6"
	case UDP6:
		return "udp6"
	case IP4:
		return "ip4"
	case IP6:
		return "ip6"
	case Ether:
		return "ether"
	}
	return fmt.Sprintf("flow-type %#x", uint32(t))
}

func (t FlowType) v6() bool   { return t == TCP6 || t == UDP6 || t == IP6 }
func (t FlowType) ip() bool   { return t != Ether }
func (t FlowType) port() bool { return t == TCP4 || t == UDP4 || t == TCP6 || t == UDP6 }

// Rule is an ntuple classification rule. Zero fields match anything.
type Rule struct {
	// Location is the rule's slot in the driver's table.
	Location uint32
	Type     FlowType
	Src, Dst netip.Prefix // IP flows
	SrcPort  uint16       // TCP and UDP flows
	DstPort  uint16
	L4Proto  uint8  // IP4 and IP6 flows
	VLAN     uint16 // VLAN id, any priority
	DstMAC   net.HardwareAddr
	// EtherType is matched by Ether flows.
	EtherType uint16
	// Action: Drop, or steer to Queue; with RSSContext (non-zero), spread
	// over that RSS context's queues starting at Queue.
	Queue      uint32
	RSSContext uint32
	Drop       bool
}

func (r Rule) String() string {
	s := fmt.Sprintf("loc %d %v", r.Location, r.Type)
	if r.Src.IsValid() {
		s += " src " + r.Src.String()
	}
	if r.Dst.IsValid() {
		s += " dst " + r.Dst.String()
	}
	if r.SrcPort != 0 {
		s += fmt.Sprintf(" sport %d", r.SrcPort)
	}
	if r.DstPort != 0 {
		s += fmt.Sprintf(" dport %d", r.DstPort)
	}
	if r.L4Proto != 0 {
		s += fmt.Sprintf(" proto %d", r.L4Proto)
	}
	if r.VLAN != 0 {
		s += fmt.Sprintf(" vlan %d", r.VLAN)
	}
	if r.DstMAC != nil {
		s += " dmac " + r.DstMAC.String()
	}
	if r.EtherType != 0 {
		s += fmt.Sprintf(" ethertype %#04x", r.EtherType)
	}
	switch {
	case r.Drop:
		s += " drop"
	case r.RSSContext != 0:
		s += fmt.Sprintf(" context %d queue +%d", r.RSSContext, r.Queue)
	default:
		s += fmt.Sprintf(" queue %d", r.Queue)
	}
	return s
}

// Byte offsets inside struct ethtool_rxnfc (linux/ethtool.h, 192 bytes).
const (
	rxnfcSize      = 192
	offFlowType    = 16           // fs.flow_type
	offH           = 20           // fs.h_u
	offHExt        = offH + 52    // fs.h_ext
	offM           = offHExt + 20 // fs.m_u
	offMExt        = offM + 52    // fs.m_ext
	offCookie      = 168          // fs.ring_cookie
	offLocation    = 176          // fs.location
	offRuleCount   = 184          // rule_cnt / rss_context
	ringCookieDrop = ^uint64(0)   // RX_CLS_FLOW_DISC
)

// rxnfc is struct ethtool_rxnfc with its flow spec as bytes.
type rxnfc struct {
	cmd      uint32
	flowType uint32
	data     uint64
	rest     [rxnfcSize - 16]byte
}

var ne = binary.NativeEndian

// marshal encodes the rule as the struct ethtool_rxnfc of ETHTOOL_SRXCLSRLINS.
func (r Rule) marshal() ([rxnfcSize]byte, error) {
	var b [rxnfcSize]byte
	fail := func(format string, args ...any) ([rxnfcSize]byte, error) {
		return b, fmt.Errorf("rule %v: "+format, append([]any{r}, args...)...)
	}
	ne.PutUint32(b[0:], cmdSRXCLSRLINS)
	ft := uint32(r.Type)
	switch r.Type {
	case TCP4, UDP4, TCP6, UDP6, IP4, IP6, Ether:
	default:
		return fail("unknown flow type")
	}
	h, m := b[offH:offHExt], b[offM:offMExt]
	if r.Type.ip() {
		alen := 4
		if r.Type.v6() {
			alen = 16
		}
		put := func(off int, p netip.Prefix, name string) error {
			if !p.IsValid() {
				return nil
			}
			if p.Addr().Is6() != r.Type.v6() || p.Addr().Is4In6() {
				return fmt.Errorf("%s %v does not fit flow type %v", name, p, r.Type)
			}
			a, mask := p.Masked().Addr().AsSlice(), prefixMask(p.Bits(), alen)
			copy(h[off:], a)
			copy(m[off:], mask)
			return nil
		}
		if err := errors.Join(put(0, r.Src, "source"), put(alen, r.Dst, "destination")); err != nil {
			return fail("%v", err)
		}
		switch {
		case r.Type.port():
			if r.L4Proto != 0 {
				return fail("l4 protocol is given by the flow type")
			}
			putPort := func(off int, v uint16) {
				if v != 0 {
					binary.BigEndian.PutUint16(h[off:], v)
					binary.BigEndian.PutUint16(m[off:], 0xffff)
				}
			}
			putPort(2*alen, r.SrcPort)
			putPort(2*alen+2, r.DstPort)
		default: // user flows: l4_4_bytes, tos/tclass, ip_ver (v4), proto
			if r.SrcPort != 0 || r.DstPort != 0 {
				return fail("ports need a tcp or udp flow type")
			}
			protoOff := 2*alen + 4 + 1
			if !r.Type.v6() {
				h[2*alen+4+1] = 1 // ip_ver: ETH_RX_NFC_IP4
				protoOff = 2*alen + 4 + 2
			}
			if r.L4Proto != 0 {
				h[protoOff], m[protoOff] = r.L4Proto, 0xff
			}
		}
		if r.DstMAC != nil || r.EtherType != 0 {
			return fail("mac and ethertype need the ether flow type")
		}
	} else {
		if r.Src.IsValid() || r.Dst.IsValid() || r.SrcPort != 0 || r.DstPort != 0 || r.L4Proto != 0 {
			return fail("addresses, ports and protocol need an ip flow type")
		}
		if r.DstMAC != nil {
			if len(r.DstMAC) != 6 {
				return fail("mac %v is not 6 bytes", r.DstMAC)
			}
			copy(h[0:], r.DstMAC)
			copy(m[0:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		}
		if r.EtherType != 0 {
			binary.BigEndian.PutUint16(h[12:], r.EtherType)
			binary.BigEndian.PutUint16(m[12:], 0xffff)
		}
	}
	if r.VLAN != 0 {
		if r.VLAN > 4094 {
			return fail("vlan %d out of range 1..4094", r.VLAN)
		}
		ft |= flowExt
		binary.BigEndian.PutUint16(b[offHExt+10:], r.VLAN)
		binary.BigEndian.PutUint16(b[offMExt+10:], 0x0fff)
	}
	switch {
	case r.Drop:
		if r.RSSContext != 0 || r.Queue != 0 {
			return fail("drop takes no queue")
		}
		ne.PutUint64(b[offCookie:], ringCookieDrop)
	case r.RSSContext != 0:
		ft |= flowRSS
		ne.PutUint64(b[offCookie:], uint64(r.Queue))
		ne.PutUint32(b[offRuleCount:], r.RSSContext)
	default:
		ne.PutUint64(b[offCookie:], uint64(r.Queue))
	}
	ne.PutUint32(b[offFlowType:], ft)
	ne.PutUint32(b[offLocation:], r.Location)
	return b, nil
}

// unmarshalRule decodes the flow spec of a struct ethtool_rxnfc as the
// driver reports it (ETHTOOL_GRXCLSRULE).
func unmarshalRule(b []byte) (Rule, error) {
	if len(b) < rxnfcSize {
		return Rule{}, fmt.Errorf("rxnfc: %d bytes, want %d", len(b), rxnfcSize)
	}
	ft := ne.Uint32(b[offFlowType:])
	r := Rule{Type: FlowType(ft &^ (flowExt | flowMACExt | flowRSS)), Location: ne.Uint32(b[offLocation:])}
	h, m := b[offH:offHExt], b[offM:offMExt]
	var err error
	switch r.Type {
	case TCP4, UDP4, TCP6, UDP6, IP4, IP6:
		alen := 4
		if r.Type.v6() {
			alen = 16
		}
		get := func(off int) (netip.Prefix, error) {
			ones, err := maskBits(m[off : off+alen])
			if err != nil || ones == 0 {
				return netip.Prefix{}, err
			}
			a, _ := netip.AddrFromSlice(h[off : off+alen])
			return netip.PrefixFrom(a, ones).Masked(), nil
		}
		if r.Src, err = get(0); err != nil {
			return r, err
		}
		if r.Dst, err = get(alen); err != nil {
			return r, err
		}
		if r.Type.port() {
			r.SrcPort = binary.BigEndian.Uint16(h[2*alen:]) & binary.BigEndian.Uint16(m[2*alen:])
			r.DstPort = binary.BigEndian.Uint16(h[2*alen+2:]) & binary.BigEndian.Uint16(m[2*alen+2:])
		} else {
			protoOff := 2*alen + 4 + 1
			if !r.Type.v6() {
				protoOff = 2*alen + 4 + 2
			}
			r.L4Proto = h[protoOff] & m[protoOff]
		}
	case Ether:
		if ones, _ := maskBits(m[0:6]); ones == 48 {
			r.DstMAC = net.HardwareAddr(append([]byte(nil), h[0:6]...))
		}
		r.EtherType = binary.BigEndian.Uint16(h[12:]) & binary.BigEndian.Uint16(m[12:])
	default:
		return r, fmt.Errorf("rxnfc: flow type %#x is not one xdpq uses", ft)
	}
	if ft&flowExt != 0 {
		r.VLAN = binary.BigEndian.Uint16(b[offHExt+10:]) & binary.BigEndian.Uint16(b[offMExt+10:]) & 0x0fff
	}
	cookie := ne.Uint64(b[offCookie:])
	switch {
	case cookie == ringCookieDrop:
		r.Drop = true
	case ft&flowRSS != 0:
		r.RSSContext, r.Queue = ne.Uint32(b[offRuleCount:]), uint32(cookie)
	default:
		// The low 32 bits are the queue; the top byte may name a VF.
		r.Queue = uint32(cookie)
	}
	return r, nil
}

func prefixMask(ones, n int) []byte {
	m := make([]byte, n)
	for i := range m {
		switch {
		case ones >= 8:
			m[i] = 0xff
			ones -= 8
		case ones > 0:
			m[i] = byte(0xff << (8 - ones))
			ones = 0
		}
	}
	return m
}

func maskBits(m []byte) (int, error) {
	ones, done := 0, false
	for _, x := range m {
		if done && x != 0 || x != 0 && bits.LeadingZeros8(^x) != bits.OnesCount8(x) {
			return 0, fmt.Errorf("rxnfc: address mask % x is not a prefix", m)
		}
		ones += bits.OnesCount8(x)
		done = done || x != 0xff
	}
	return ones, nil
}

// AddRule inserts r at r.Location.
func (h *Handle) AddRule(ifname string, r Rule) error {
	b, err := r.marshal()
	if err != nil {
		return err
	}
	return h.do(ifname, unsafe.Pointer(&b[0]), fmt.Sprintf("insert rule %v", r))
}

// DeleteRule removes the rule at loc.
func (h *Handle) DeleteRule(ifname string, loc uint32) error {
	var b [rxnfcSize]byte
	ne.PutUint32(b[0:], cmdSRXCLSRLDEL)
	ne.PutUint32(b[offLocation:], loc)
	return h.do(ifname, unsafe.Pointer(&b[0]), fmt.Sprintf("delete rule %d", loc))
}

// RuleTable reports the driver's rule table: its size and whether the
// driver picks locations itself (RX_CLS_LOC_SPECIAL).
func (h *Handle) RuleTable(ifname string) (size uint32, special bool, err error) {
	var b [rxnfcSize]byte
	ne.PutUint32(b[0:], cmdGRXCLSRLCNT)
	if err := h.do(ifname, unsafe.Pointer(&b[0]), "count rules"); err != nil {
		return 0, false, err
	}
	data := ne.Uint64(b[8:])
	return uint32(data), data&rxClsLocSpecial != 0, nil
}

// Rules returns every rule in the driver's table.
func (h *Handle) Rules(ifname string) ([]Rule, error) {
	var b [rxnfcSize]byte
	ne.PutUint32(b[0:], cmdGRXCLSRLCNT)
	if err := h.do(ifname, unsafe.Pointer(&b[0]), "count rules"); err != nil {
		return nil, err
	}
	count := ne.Uint32(b[offRuleCount:])
	buf := make([]byte, rxnfcSize+4*int(count))
	ne.PutUint32(buf[0:], cmdGRXCLSRLALL)
	ne.PutUint32(buf[offRuleCount:], count)
	if err := h.do(ifname, unsafe.Pointer(&buf[0]), "list rules"); err != nil {
		return nil, err
	}
	n := ne.Uint32(buf[offRuleCount:])
	var out []Rule
	for i := range min(n, count) {
		loc := ne.Uint32(buf[rxnfcSize+4*int(i):])
		var g [rxnfcSize]byte
		ne.PutUint32(g[0:], cmdGRXCLSRULE)
		ne.PutUint32(g[offLocation:], loc)
		if err := h.do(ifname, unsafe.Pointer(&g[0]), fmt.Sprintf("get rule %d", loc)); err != nil {
			return nil, err
		}
		r, err := unmarshalRule(g[:])
		if err != nil {
			return nil, fmt.Errorf("rule %d: %w", loc, err)
		}
		out = append(out, r)
	}
	return out, nil
}
