package cni

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// ErrInvalidField is the CNI error code (plugin-specific, ≥ 100) of a
// configuration field that is unknown or invalid.
const ErrInvalidField = 100

// SupportedVersions are the CNI spec versions the plugin speaks.
var SupportedVersions = version.PluginSupports("0.4.0", "1.0.0", "1.1.0")

// NetConf is the plugin's network configuration.
type NetConf struct {
	types.NetConf
	// ResourceName is the pool's resource, e.g. xdpq.io/upf; Multus finds
	// the pod's devices of it.
	ResourceName string `json:"resourceName,omitempty"`
	// Flows are steered to the pod's queues.
	Flows []Flow `json:"flows,omitempty"`
	// DeviceID is the device (queue) the pod got; Multus puts it here or
	// in runtimeConfig.deviceID.
	DeviceID      string        `json:"deviceID,omitempty"`
	MTU           int           `json:"mtu,omitempty"`
	DaemonSocket  string        `json:"daemonSocket,omitempty"`
	RuntimeConfig RuntimeConfig `json:"runtimeConfig,omitempty"`
}

// RuntimeConfig holds what the runtime (or Multus) injects.
type RuntimeConfig struct {
	DeviceID string `json:"deviceID,omitempty"`
}

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

// ParsedFlow is a Flow checked and with its ports expanded.
type ParsedFlow struct {
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

// fieldError is the CNI error of one field.
func fieldError(field, format string, args ...any) *types.Error {
	return &types.Error{Code: ErrInvalidField, Msg: "invalid network configuration: " + field,
		Details: fmt.Sprintf(format, args...)}
}

// knownFields are the top-level fields a configuration may have: the
// plugin's own and those the CNI spec and runtimes (Multus) add.
var knownFields = []string{"cniVersion", "cniVersions", "name", "type", "capabilities", "ipam", "dns", "prevResult",
	"runtimeConfig", "args", "resourceName", "flows", "deviceID", "mtu", "daemonSocket", "disableCheck", "disableGC",
	"cni.dev/valid-attachments"}

// freeForm are the sections other parties own: the IPAM plugin's
// configuration, DNS, the previous result, capabilities, args.
var freeForm = []string{"ipam", "dns", "prevResult", "capabilities", "args"}

// ParseNetConf decodes and checks the configuration on a CNI plugin's
// stdin. Every error is a CNI error with a code ≥ 100 naming the field.
func ParseNetConf(b []byte) (*NetConf, []ParsedFlow, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, nil, fieldError("(config)", "not a JSON object: %v", err)
	}
	var keys []string
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !slices.Contains(knownFields, k) {
			return nil, nil, fieldError(k, "unknown field; allowed: %s", strings.Join(knownFields, ", "))
		}
	}
	// The plugin's own fields are decoded strictly; the sections owned by
	// others (the IPAM plugin's, the runtime's) are left as they are.
	strict := map[string]json.RawMessage{}
	for k, v := range raw {
		if !slices.Contains(freeForm, k) {
			strict[k] = v
		}
	}
	sb, _ := json.Marshal(strict)
	dec := json.NewDecoder(bytes.NewReader(sb))
	dec.DisallowUnknownFields()
	var c NetConf
	if err := dec.Decode(&c); err != nil {
		// Unknown nested fields and wrong types: json names the field.
		return nil, nil, fieldError("(config)", "%v", err)
	}
	if err := json.Unmarshal(b, &c.NetConf); err != nil {
		return nil, nil, fieldError("(config)", "%v", err)
	}
	if c.CNIVersion == "" {
		return nil, nil, fieldError("cniVersion", "required; this plugin speaks %s", strings.Join(SupportedVersions.SupportedVersions(), ", "))
	}
	if !slices.Contains(SupportedVersions.SupportedVersions(), c.CNIVersion) {
		return nil, nil, fieldError("cniVersion", "%q; this plugin speaks %s", c.CNIVersion, strings.Join(SupportedVersions.SupportedVersions(), ", "))
	}
	if c.Name == "" {
		return nil, nil, fieldError("name", "required")
	}
	if c.ResourceName != "" && !strings.Contains(c.ResourceName, "/") {
		return nil, nil, fieldError("resourceName", "%q: want <prefix>/<pool>, e.g. xdpq.io/upf", c.ResourceName)
	}
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535) {
		return nil, nil, fieldError("mtu", "%d: from 68 to 65535", c.MTU)
	}
	if c.RuntimeConfig.DeviceID != "" {
		if c.DeviceID != "" && c.DeviceID != c.RuntimeConfig.DeviceID {
			return nil, nil, fieldError("deviceID", "%q differs from runtimeConfig.deviceID %q", c.DeviceID, c.RuntimeConfig.DeviceID)
		}
		c.DeviceID = c.RuntimeConfig.DeviceID
	}
	var flows []ParsedFlow
	for i, f := range c.Flows {
		pf, err := parseFlow(f, fmt.Sprintf("flows[%d]", i))
		if err != nil {
			return nil, nil, err
		}
		flows = append(flows, pf)
	}
	return &c, flows, nil
}

func parseFlow(f Flow, field string) (ParsedFlow, error) {
	pf := ParsedFlow{Protocol: f.Protocol}
	if f.Protocol != "udp" && f.Protocol != "tcp" {
		return pf, fieldError(field+".protocol", "%q: udp or tcp", f.Protocol)
	}
	if d := f.Destination; d != "" && d != "ipam" {
		p, err := prefix(d)
		if err != nil {
			return pf, fieldError(field+".destination", "%v", err)
		}
		pf.Dst = p
	}
	if f.Source != "" {
		p, err := prefix(f.Source)
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

func prefix(s string) (netip.Prefix, error) {
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
