// Package flow is the flows a pod wants steered to its queues, as a CNI
// configuration's "flows" and a pod's xdpq.io/flows annotation write them:
// their schema, checks and resolution to the addresses the daemon steers.
// The CNI plugin and the daemon both use it.
package flow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/xdpq/xdpq/pkg/api"
)

// Flow is traffic the pod wants.
type Flow struct {
	Protocol string `json:"protocol"`
	// Destination is an address or prefix; empty or "ipam" means the
	// address IPAM assigns to the pod.
	Destination string `json:"destination,omitempty"`
	// DestinationPort is a port or a range "2000-2063"; empty means any.
	DestinationPort string `json:"destinationPort,omitempty"`
	Source          string `json:"source,omitempty"`
	SourcePort      string `json:"sourcePort,omitempty"`
	VLAN            int    `json:"vlan,omitempty"`
}

// Parsed is a Flow checked and with its ports expanded.
type Parsed struct {
	Protocol string
	Dst      netip.Prefix // zero: the IPAM address
	DstPorts []uint16     // nil: any port
	Src      netip.Prefix
	SrcPort  uint16
	VLAN     uint16
}

// MaxPortRange is the widest port range a flow may name: each port is a
// rule of its own.
const MaxPortRange = 64

// MaxFlows is how many flows one list (a NetConf's, a pod annotation's)
// may have.
const MaxFlows = 64

// FieldError is a flow's field that is wrong, and how.
type FieldError struct {
	Field   string // e.g. flows[2].destinationPort
	Details string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Details }

func fieldError(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Details: fmt.Sprintf(format, args...)}
}

// ParseList decodes a JSON list of flows and checks each; unknown fields
// are refused. An error names the list's field.
func ParseList(b []byte, field string) ([]Parsed, error) {
	var fs []Flow
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fs); err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: more than one JSON value", field)
	}
	if len(fs) > MaxFlows {
		return nil, fmt.Errorf("%s: %d flows, at most %d", field, len(fs), MaxFlows)
	}
	out := make([]Parsed, 0, len(fs))
	for i, f := range fs {
		pf, err := Parse(f, fmt.Sprintf("%s[%d]", field, i))
		if err != nil {
			return nil, err
		}
		out = append(out, pf)
	}
	return out, nil
}

// Parse checks a flow and expands its ports; an error is a *FieldError
// naming the field of field (e.g. "flows[2]").
func Parse(f Flow, field string) (Parsed, error) {
	pf := Parsed{Protocol: f.Protocol}
	if f.Protocol != "udp" && f.Protocol != "tcp" {
		return pf, fieldError(field+".protocol", "%q: udp or tcp", f.Protocol)
	}
	if d := f.Destination; d != "" && d != "ipam" {
		p, err := ParseDestination(d)
		if err != nil {
			return pf, fieldError(field+".destination", "%v", err)
		}
		pf.Dst = p
	}
	if f.Source != "" {
		p, err := ParseDestination(f.Source)
		if err != nil {
			return pf, fieldError(field+".source", "%v", err)
		}
		pf.Src = p
		if pf.Dst.IsValid() && p.Addr().Is4() != pf.Dst.Addr().Is4() {
			return pf, fieldError(field+".source", "IP version differs from the destination's")
		}
	}
	if f.DestinationPort != "" {
		lo, hi, err := portRange(f.DestinationPort)
		if err != nil {
			return pf, fieldError(field+".destinationPort", "%v", err)
		}
		for p := lo; p <= hi; p++ {
			pf.DstPorts = append(pf.DstPorts, uint16(p))
		}
	}
	if f.SourcePort != "" {
		lo, hi, err := portRange(f.SourcePort)
		if err != nil || lo != hi {
			return pf, fieldError(field+".sourcePort", "%q: one port from 1 to 65535", f.SourcePort)
		}
		pf.SrcPort = uint16(lo)
	}
	if f.VLAN < 0 || f.VLAN > 4094 {
		return pf, fieldError(field+".vlan", "%d: from 1 to 4094 (0: untagged)", f.VLAN)
	}
	pf.VLAN = uint16(f.VLAN)
	return pf, nil
}

// Resolve gives the flows whose destination is the IPAM address each
// of ips (of the source's family) and expands port ranges: the flows the
// daemon steers.
func Resolve(flows []Parsed, ips []netip.Addr) ([]api.CNIFlow, error) {
	var out []api.CNIFlow
	for i, f := range flows {
		dsts := []netip.Prefix{f.Dst}
		if !f.Dst.IsValid() {
			dsts = nil
			for _, a := range ips {
				if !f.Src.IsValid() || f.Src.Addr().Is4() == a.Is4() {
					dsts = append(dsts, netip.PrefixFrom(a, a.BitLen()))
				}
			}
			if len(dsts) == 0 {
				return nil, fieldError(fmt.Sprintf("flows[%d].destination", i), "empty means the address IPAM assigns, and IPAM assigned none")
			}
		}
		ports := f.DstPorts
		if ports == nil {
			ports = []uint16{0}
		}
		for _, d := range dsts {
			for _, p := range ports {
				out = append(out, api.CNIFlow{Protocol: f.Protocol, Dst: d, DstPort: p, Src: f.Src, SrcPort: f.SrcPort, VLAN: f.VLAN})
			}
		}
	}
	return out, nil
}

// ParseDestination reads an address (a prefix of its full length) or a
// prefix, as a flow's destination or source and a pool's
// sharedDestinations write them.
func ParseDestination(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("%q is not an address or prefix", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q is not an address or prefix", s)
	}
	return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
}

func portRange(s string) (lo, hi int, err error) {
	a, b, isRange := strings.Cut(s, "-")
	if lo, err = strconv.Atoi(a); err != nil || lo < 1 || lo > 65535 {
		return 0, 0, fmt.Errorf("%q: a port from 1 to 65535 or a range such as 2000-2063", s)
	}
	hi = lo
	if isRange {
		if hi, err = strconv.Atoi(b); err != nil || hi < lo || hi > 65535 {
			return 0, 0, fmt.Errorf("%q: a range runs from a lower to a higher port", s)
		}
	}
	if hi-lo+1 > MaxPortRange {
		return 0, 0, fmt.Errorf("%q: %d ports; at most %d (each port is a rule of its own)", s, hi-lo+1, MaxPortRange)
	}
	return lo, hi, nil
}

// Format writes a flow as status and the XdpqNode resource show it:
// "udp 10.0.0.2:4789", "tcp 10.0.0.0/24 from 10.1.0.1:80 vlan 7".
func Format(f api.CNIFlow) string {
	var b strings.Builder
	b.WriteString(f.Protocol)
	b.WriteString(" ")
	b.WriteString(endpoint(f.Dst, f.DstPort))
	if f.Src.IsValid() {
		b.WriteString(" from ")
		b.WriteString(endpoint(f.Src, f.SrcPort))
	}
	if f.VLAN != 0 {
		fmt.Fprintf(&b, " vlan %d", f.VLAN)
	}
	return b.String()
}

func endpoint(p netip.Prefix, port uint16) string {
	s := p.String()
	if p.IsSingleIP() {
		s = p.Addr().String()
	}
	if port == 0 {
		return s
	}
	if p.IsSingleIP() {
		return netip.AddrPortFrom(p.Addr(), port).String()
	}
	return fmt.Sprintf("%s port %d", s, port)
}

// ErrNotOwn is what CheckOwn's refusals wrap: a flow would steer traffic
// that is not the pod's.
var ErrNotOwn = errors.New("a pod steers only its own traffic")

// CheckOwn refuses a flow whose destination is not the pod's own: each
// destination must be one of the pod's addresses (own), or lie within a
// destination the operator granted the pool (shared). A prefix is never
// a pod's own, nor is another pod's address or the node's: steering them
// would divert traffic the pod has no claim on (the node's SSH, another
// tenant's packets) onto its queues. CheckOwn trusts own, which a
// network configuration's IPAM may set to any address: CheckNode refuses
// the node's among them. The error names the flow.
func CheckOwn(flows []api.CNIFlow, own []netip.Addr, shared []netip.Prefix) error {
	for _, f := range flows {
		if Granted(f.Dst, shared) {
			continue
		}
		if f.Dst.IsSingleIP() && slices.Contains(own, f.Dst.Addr()) {
			if what := notOwnable(f.Dst.Addr()); what != "" {
				// An IPAM (static names any address) gave the pod an
				// address that no one host owns: its traffic is the
				// node's and its neighbours' (VRRP, mDNS, DHCP).
				return fmt.Errorf("flow %s: destination %s is %s, never one pod's own address: %w; "+
					"an operator grants it with the pool's sharedDestinations", Format(f), f.Dst.Addr(), what, ErrNotOwn)
			}
			continue
		}
		addrs := "none"
		if len(own) > 0 {
			addrs = fmt.Sprint(own)
		}
		return fmt.Errorf("flow %s: destination %s is not an address of the pod (its addresses: %s; the pool grants %s): %w; "+
			"an operator grants a shared destination with the pool's sharedDestinations",
			Format(f), f.Dst, addrs, grants(shared), ErrNotOwn)
	}
	return nil
}

// limitedBroadcast is IPv4's 255.255.255.255.
var limitedBroadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// notOwnable says what a is when no one host owns it (a multicast group,
// a broadcast, the unspecified or a loopback address), "" for a unicast
// address. A subnet's directed broadcast is a node's address of its
// netdev (CheckNode).
func notOwnable(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case a.IsMulticast():
		return "a multicast group"
	case a == limitedBroadcast:
		return "the broadcast address"
	case a.IsUnspecified():
		return "the unspecified address"
	case a.IsLoopback():
		return "a loopback address"
	}
	return ""
}

// Granted reports whether dst lies within a destination the operator
// granted the pool (its sharedDestinations).
func Granted(dst netip.Prefix, shared []netip.Prefix) bool {
	return slices.ContainsFunc(shared, func(s netip.Prefix) bool { return s.Bits() <= dst.Bits() && s.Contains(dst.Addr()) })
}

// ErrNodeAddress is what CheckNode's refusals wrap: a flow would take
// the node's own traffic.
var ErrNodeAddress = errors.New("a pod's flows may not take the node's own traffic")

// Claimed are the destinations of flows that the pod claims as its own
// addresses: each single address no shared destination grants. They are
// what CheckNode needs to know of the node.
func Claimed(flows []api.CNIFlow, shared []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, f := range flows {
		if f.Dst.IsSingleIP() && !Granted(f.Dst, shared) && !slices.Contains(out, f.Dst.Addr()) {
			out = append(out, f.Dst.Addr())
		}
	}
	return out
}

// CheckNode refuses a flow whose destination is an address of the node
// (node holds each with the netdev that holds it), unless a shared
// destination grants it. CheckOwn cannot see this: a pod's "own"
// addresses are what its network configuration's IPAM says (static
// IPAM names any address), so a configuration may name the node's
// address as the pod's, and its flows would take the node's SSH and
// kubelet traffic arriving on the pool's netdev off the host's stack.
// An empty or "ipam" destination is resolved to the pod's addresses
// before this check, and so is refused as well when one is the node's.
// The error names the flow, the address and its netdev.
func CheckNode(flows []api.CNIFlow, node map[netip.Addr]string, shared []netip.Prefix) error {
	for _, f := range flows {
		if !f.Dst.IsSingleIP() || Granted(f.Dst, shared) {
			continue
		}
		if dev, ok := node[f.Dst.Addr()]; ok {
			return fmt.Errorf("flow %s: destination %s is an address of the node (%s): %w; "+
				"an operator grants it with the pool's sharedDestinations", Format(f), f.Dst.Addr(), dev, ErrNodeAddress)
		}
	}
	return nil
}

func grants(shared []netip.Prefix) string {
	if len(shared) == 0 {
		return "no shared destination"
	}
	return fmt.Sprint(shared)
}
