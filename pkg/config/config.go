package config

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/xdpq/xdpq/pkg/flow"
)

// Config is the whole file.
type Config struct {
	// ResourcePrefix is the prefix of the pools' resource names.
	ResourcePrefix string `json:"resourcePrefix,omitempty" desc:"Prefix of the extended resource names; default xdpq.io."`
	// Pools are the resources this node offers.
	Pools []Pool `json:"pools" desc:"The pools of queues, each one extended resource."`
	// Nodes replace pools (by name) on the nodes they select.
	Nodes []NodeOverride `json:"nodes,omitempty" desc:"Per-node overrides: on a node that matches, these pools replace the pools of the same name (or are added)."`
}

// Pool is one resource.
type Pool struct {
	Name string `json:"name" desc:"The pool's name; the resource is <resourcePrefix>/<name>. Lower case letters, digits and '-', at most 63."`
	// Mode is queue (queues shared among pods, default) or netdev (the
	// whole netdev to one pod).
	Mode string `json:"mode,omitempty" desc:"queue (default): queues of a netdev shared among pods; netdev: the whole netdev to one pod, moved into its network namespace." enum:"queue,netdev"`
	// ServedBy is how kubelet hands the pool's devices to pods: dra
	// (a ResourceClaim) or devicePlugin (an extended resource); empty
	// is the daemon's default (its --served-by).
	ServedBy string   `json:"servedBy,omitempty" desc:"How pods get the pool's devices: dra (ResourceClaims of driver xdpq.io, and the extended resource through a DeviceClass) or devicePlugin (the extended resource through a device plugin). Empty: the daemon's --served-by. A pool changes only once no allocation of the other holds its devices." enum:"dra,devicePlugin"`
	Steering string   `json:"steering,omitempty" desc:"How flows reach a pod's queues: hardware (ntuple rules, direct program), software (filter program) or auto (default: hardware where the NIC has ntuple filters)." enum:"auto,hardware,software"`
	Devices  Selector `json:"devices" desc:"Which netdevs the pool takes queues of."`
	// Queues is the queues reserved on every matched netdev that names no
	// range itself, e.g. "8-15" or "0,2,4-7".
	Queues string `json:"queues,omitempty" desc:"Queues to reserve on each matched netdev, e.g. 8-15 or 0,2,4-7; required unless every netdevs entry carries its own #range (queue mode)."`
	// SharedDestinations are what a flow may steer beyond the pod's own
	// addresses: a network configuration cannot take them.
	SharedDestinations []string `json:"sharedDestinations,omitempty" desc:"Addresses or prefixes (e.g. 192.0.2.10, 192.0.2.0/28) that a flow of this pool may steer to although they are not the pod's own addresses, e.g. a virtual IP several pods serve. Without them a flow's destination must be one of the pod's addresses: a network configuration cannot divert the node's or another pod's traffic. Checked at each attachment: a change applies to attachments made after it."`
	AllowTX            bool     `json:"allowTX,omitempty" desc:"Hand out sockets with a TX ring; a TX ring lets the pod put raw frames on the node's NIC."`
	Limits             Limits   `json:"limits,omitempty" desc:"What one pod may ask for."`
	// Attach is onDemand (default: only while a socket is bound) or always.
	Attach    string    `json:"attach,omitempty" desc:"onDemand (default): the XDP program is attached only while a socket is bound; always: while the pool exists (attaching makes some NICs reconfigure their rings)." enum:"onDemand,always"`
	Linger    Duration  `json:"linger,omitempty" desc:"How long the program stays after the last socket went, e.g. 5s (default)."`
	Exclusive bool      `json:"exclusive,omitempty" desc:"Hold the program with a pinned bpf_link: the kernel then refuses every other XDP program on the netdev."`
	BusyPoll  *BusyPoll `json:"busyPoll,omitempty" desc:"Preferred busy polling for the pool's sockets."`
	DPDK      *DPDK     `json:"dpdk,omitempty" desc:"Netdev-mode pools, Kubernetes: put the allocation's socket (and map) where DPDK's af_xdp driver looks without dp_path."`
}

// DPDK places an allocation's socket, and optionally its netdev's XSKMAP,
// in the pod's container where DPDK's af_xdp driver looks by default.
type DPDK struct {
	// Iface is the interface DPDK is told (iface=): the netdev's CNI
	// ifName in the pod.
	Iface string `json:"iface" desc:"The interface DPDK is given (iface=), the netdev's CNI ifName in the pod, e.g. net1. The container gets the allocation's socket at /tmp/afxdp_dp/<iface>/afxdp.sock (use_cni, DPDK 23.11.2+ and 24.07+) and /tmp/afxdp.sock (DPDK 23.03 to 23.11.1)."`
	// PinnedMap also mounts the netdev's XSKMAP, pinned, for DPDK's
	// use_pinned_map.
	PinnedMap bool `json:"pinnedMap,omitempty" desc:"Also mount the netdev's XSKMAP, pinned, at /tmp/afxdp_dp/<iface>/xsks_map (use_pinned_map, DPDK 24.07+); mode 0600, for root in the container."`
}

// Selector matches netdevs; a netdev matches when it matches every list
// that is given.
type Selector struct {
	// Netdevs are names, each with an optional queue range: "eth1#8-15".
	Netdevs      []string `json:"netdevs,omitempty" desc:"Netdev names, each optionally with the queues to reserve on it: eth1 or eth1#8-15 or eth1#0,2,4-7."`
	Drivers      []string `json:"drivers,omitempty" desc:"Driver names, e.g. ice, mlx5_core."`
	Vendors      []string `json:"vendors,omitempty" desc:"PCI vendor ids in hex, e.g. 8086."`
	DeviceIDs    []string `json:"deviceIDs,omitempty" desc:"PCI device ids in hex, e.g. 1592."`
	PCIAddresses []string `json:"pciAddresses,omitempty" desc:"PCI addresses, e.g. 0000:3b:00.0."`
}

// Limits bound one pod's request.
type Limits struct {
	MaxUMEMBytes    int64  `json:"maxUMEMBytes,omitempty" desc:"Largest UMEM memfd a pod may send, in bytes; default 268435456."`
	MaxRing         uint32 `json:"maxRing,omitempty" desc:"Most entries in any ring; a power of two, default 8192."`
	MaxQueuesPerPod int    `json:"maxQueuesPerPod,omitempty" desc:"Most queues one pod may ask for; default 64."`
}

// BusyPoll configures preferred busy polling.
type BusyPoll struct {
	TimeoutMicros int `json:"timeoutMicros" desc:"SO_BUSY_POLL in microseconds, 1 to 1000000."`
	Budget        int `json:"budget" desc:"SO_BUSY_POLL_BUDGET, 1 to 65535."`
}

// NodeOverride replaces pools on the nodes it selects.
type NodeOverride struct {
	Names  []string          `json:"names,omitempty" desc:"Node names this override applies to."`
	Labels map[string]string `json:"labels,omitempty" desc:"Node labels that must all match."`
	Pools  []Pool            `json:"pools" desc:"Pools that replace the pools of the same name on these nodes, or are added."`
}

// Duration is a time.Duration written as "5s".
type Duration struct{ time.Duration }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(strconv.Quote(d.String())), nil }

// UnmarshalJSON reads a duration string such as "5s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	s, err := strconv.Unquote(string(b))
	if err != nil {
		return fmt.Errorf("a duration is a string such as \"5s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: %v", s, err)
	}
	d.Duration = v
	return nil
}

// Defaults of a pool.
const (
	DefaultPrefix   = "xdpq.io"
	DefaultMaxUMEM  = 256 << 20
	DefaultMaxRing  = 8192
	DefaultMaxQueue = 64
	DefaultLinger   = 5 * time.Second
)

// ForNode returns the pools in force on a node: the config's pools with
// the matching overrides applied in order, defaults filled in.
func (c *Config) ForNode(name string, labels map[string]string) []Pool {
	pools := slices.Clone(c.Pools)
	for _, o := range c.Nodes {
		if !o.matches(name, labels) {
			continue
		}
		for _, op := range o.Pools {
			i := slices.IndexFunc(pools, func(p Pool) bool { return p.Name == op.Name })
			if i >= 0 {
				pools[i] = op
			} else {
				pools = append(pools, op)
			}
		}
	}
	for i := range pools {
		pools[i].fillDefaults()
	}
	return pools
}

func (o NodeOverride) matches(name string, labels map[string]string) bool {
	if len(o.Names) > 0 && !slices.Contains(o.Names, name) {
		return false
	}
	for k, v := range o.Labels {
		if labels[k] != v {
			return false
		}
	}
	return len(o.Names) > 0 || len(o.Labels) > 0
}

// SharedPrefixes are SharedDestinations as prefixes; a validated pool's
// all parse.
func (p Pool) SharedPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range p.SharedDestinations {
		if pf, err := flow.ParseDestination(s); err == nil {
			out = append(out, pf)
		}
	}
	return out
}

func (p *Pool) fillDefaults() {
	if p.Mode == "" {
		p.Mode = "queue"
	}
	if p.Steering == "" {
		p.Steering = "auto"
	}
	if p.Attach == "" {
		p.Attach = "onDemand"
	}
	if p.Linger.Duration == 0 {
		p.Linger.Duration = DefaultLinger
	}
	if p.Limits.MaxUMEMBytes == 0 {
		p.Limits.MaxUMEMBytes = DefaultMaxUMEM
	}
	if p.Limits.MaxRing == 0 {
		p.Limits.MaxRing = DefaultMaxRing
	}
	if p.Limits.MaxQueuesPerPod == 0 {
		p.Limits.MaxQueuesPerPod = DefaultMaxQueue
	}
}

// Resource returns the pool's extended resource name.
func (c *Config) Resource(p Pool) string {
	prefix := c.ResourcePrefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return prefix + "/" + p.Name
}

// ParseQueues parses a queue list such as "8-15" or "0,2,4-7" into sorted,
// distinct queue numbers.
func ParseQueues(s string) ([]uint32, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("empty queue list")
	}
	seen := map[uint32]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("queue %q: not a number from 0 to 65535", lo)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 16); err != nil {
				return nil, fmt.Errorf("queue %q: not a number from 0 to 65535", hi)
			}
			if b < a {
				return nil, fmt.Errorf("queue range %q runs backwards", part)
			}
		}
		if b-a > 4095 {
			return nil, fmt.Errorf("queue range %q: more than 4096 queues", part)
		}
		for q := a; q <= b; q++ {
			if seen[uint32(q)] {
				return nil, fmt.Errorf("queue %d listed twice", q)
			}
			seen[uint32(q)] = true
		}
	}
	out := make([]uint32, 0, len(seen))
	for q := range seen {
		out = append(out, q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out, nil
}

// SplitNetdev splits "eth1#8-15" into the name and its queues (nil when
// the entry names no range).
func SplitNetdev(entry string) (string, []uint32, error) {
	name, qs, ok := strings.Cut(entry, "#")
	if name == "" || len(name) > 15 || strings.ContainsAny(name, "/ \t\n:") {
		return "", nil, fmt.Errorf("netdev name %q is not valid", name)
	}
	if !ok {
		return name, nil, nil
	}
	q, err := ParseQueues(qs)
	if err != nil {
		return "", nil, fmt.Errorf("netdev %s: %v", name, err)
	}
	return name, q, nil
}
