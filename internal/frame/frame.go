// Package frame builds Ethernet frames carrying UDP or TCP over IPv4 or
// IPv6, with an optional 802.1Q tag and valid checksums, so that tests
// and benchmarks can send frames the kernel stack accepts and compare
// what arrives byte for byte. It exists because the only packet library
// of the Go ecosystem (gopacket) is far larger than this need.
package frame

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// Spec describes one frame.
type Spec struct {
	SrcMAC, DstMAC   net.HardwareAddr
	VLAN             uint16 // 802.1Q VLAN id; 0 for an untagged frame
	Src, Dst         netip.Addr
	Protocol         uint8 // 17 UDP or 6 TCP
	SrcPort, DstPort uint16
	Payload          []byte
}

// Build returns the frame.
func (s Spec) Build() ([]byte, error) {
	return s.Append(nil)
}

// Append appends the frame to b.
func (s Spec) Append(b []byte) ([]byte, error) {
	if len(s.SrcMAC) != 6 || len(s.DstMAC) != 6 {
		return nil, fmt.Errorf("build frame: MAC addresses must be 6 bytes")
	}
	v4 := s.Dst.Is4()
	if v4 != s.Src.Is4() || !s.Src.IsValid() || !s.Dst.IsValid() {
		return nil, fmt.Errorf("build frame: source %v and destination %v must both be IPv4 or IPv6", s.Src, s.Dst)
	}
	var l4 []byte
	switch s.Protocol {
	case 17:
		l4 = make([]byte, 8, 8+len(s.Payload))
		binary.BigEndian.PutUint16(l4[4:], uint16(8+len(s.Payload)))
	case 6:
		l4 = make([]byte, 20, 20+len(s.Payload))
		binary.BigEndian.PutUint32(l4[4:], 1) // sequence number
		l4[12] = 5 << 4                       // data offset
		l4[13] = 0x18                         // PSH|ACK
		binary.BigEndian.PutUint16(l4[14:], 65535)
	default:
		return nil, fmt.Errorf("build frame: protocol %d: want 17 (udp) or 6 (tcp)", s.Protocol)
	}
	binary.BigEndian.PutUint16(l4[0:], s.SrcPort)
	binary.BigEndian.PutUint16(l4[2:], s.DstPort)
	l4 = append(l4, s.Payload...)
	sum := pseudoSum(s.Src, s.Dst, s.Protocol, len(l4))
	csum := ^fold(sum + sumBytes(l4))
	if s.Protocol == 17 && csum == 0 {
		csum = 0xffff
	}
	off := 6
	if s.Protocol == 6 {
		off = 16
	}
	binary.BigEndian.PutUint16(l4[off:], csum)

	b = append(b, s.DstMAC...)
	b = append(b, s.SrcMAC...)
	if s.VLAN != 0 {
		b = binary.BigEndian.AppendUint16(b, 0x8100)
		b = binary.BigEndian.AppendUint16(b, s.VLAN&0x0fff)
	}
	if v4 {
		b = binary.BigEndian.AppendUint16(b, 0x0800)
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(l4)))
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		ip[8] = 64
		ip[9] = s.Protocol
		src, dst := s.Src.As4(), s.Dst.As4()
		copy(ip[12:], src[:])
		copy(ip[16:], dst[:])
		binary.BigEndian.PutUint16(ip[10:], ^fold(sumBytes(ip)))
		b = append(b, ip...)
	} else {
		b = binary.BigEndian.AppendUint16(b, 0x86dd)
		ip := make([]byte, 40)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(len(l4)))
		ip[6] = s.Protocol
		ip[7] = 64
		src, dst := s.Src.As16(), s.Dst.As16()
		copy(ip[8:], src[:])
		copy(ip[24:], dst[:])
		b = append(b, ip...)
	}
	return append(b, l4...), nil
}

func pseudoSum(src, dst netip.Addr, proto uint8, n int) uint32 {
	var sum uint32
	if src.Is4() {
		a, b := src.As4(), dst.As4()
		sum = sumBytes(a[:]) + sumBytes(b[:])
	} else {
		a, b := src.As16(), dst.As16()
		sum = sumBytes(a[:]) + sumBytes(b[:])
	}
	return sum + uint32(proto) + uint32(n)
}

func sumBytes(b []byte) uint32 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func fold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// Payload returns n bytes that identify frame seq of stream id: the first
// 12 bytes are id and seq, the rest a pattern derived from both, so that a
// receiver can check every byte.
func Payload(id uint32, seq uint64, n int) []byte {
	n = max(n, 12)
	p := make([]byte, n)
	binary.BigEndian.PutUint32(p, id)
	binary.BigEndian.PutUint64(p[4:], seq)
	for i := 12; i < n; i++ {
		p[i] = byte(uint64(i)*31 + seq*7 + uint64(id))
	}
	return p
}
