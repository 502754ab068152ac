package config

import (
	"fmt"
	"slices"
	"strings"

	"github.com/xdpq/xdpq/pkg/nic"
)

// Reservation is the queues one pool takes on one netdev of this node.
type Reservation struct {
	Pool   string
	Netdev nic.Netdev
	Queues []uint32
}

// Resolve matches the pools' selectors against the netdevs found on this
// node. A netdev matches a pool when it matches every selector list the
// pool gives. Problems do not stop the other pools: a queue the netdev
// lacks, a queue (or netdev) another pool took first, a named netdev
// that is not here; they are returned, one error each.
func Resolve(pools []Pool, netdevs []nic.Netdev) ([]Reservation, []error) {
	var out []Reservation
	var problems []error
	taken := map[string]map[uint32]string{} // netdev -> queue -> pool
	whole := map[string]string{}            // netdev -> netdev-mode pool
	for _, p := range pools {
		ranges := map[string][]uint32{}
		for _, e := range p.Devices.Netdevs {
			name, qs, err := SplitNetdev(e)
			if err == nil {
				ranges[name] = qs
			}
		}
		common, _ := ParseQueues(p.Queues)
		found := map[string]bool{}
		for _, n := range netdevs {
			if !p.Devices.matches(n) {
				continue
			}
			found[n.Name] = true
			qs := ranges[n.Name]
			if qs == nil {
				qs = common
			}
			if p.Mode == "netdev" {
				qs = nil
				for q := range n.RXQueues {
					qs = append(qs, uint32(q))
				}
			}
			if len(qs) == 0 {
				problems = append(problems, fmt.Errorf("pool %s: no queues to reserve on %s", p.Name, n.Name))
				continue
			}
			if last := qs[len(qs)-1]; int(last) >= n.RXQueues {
				problems = append(problems, fmt.Errorf("pool %s: %s has %d rx queues, so no queue %d", p.Name, n.Name, n.RXQueues, last))
				continue
			}
			if other, ok := whole[n.Name]; ok {
				problems = append(problems, fmt.Errorf("pool %s: %s belongs whole to pool %s", p.Name, n.Name, other))
				continue
			}
			if taken[n.Name] == nil {
				taken[n.Name] = map[uint32]string{}
			}
			conflict := ""
			for _, q := range qs {
				if other, ok := taken[n.Name][q]; ok {
					conflict = fmt.Sprintf("queue %d of %s is pool %s's", q, n.Name, other)
					break
				}
			}
			if conflict == "" && p.Mode == "netdev" && len(taken[n.Name]) > 0 {
				conflict = fmt.Sprintf("%s has queues of other pools", n.Name)
			}
			if conflict != "" {
				problems = append(problems, fmt.Errorf("pool %s: %s", p.Name, conflict))
				continue
			}
			for _, q := range qs {
				taken[n.Name][q] = p.Name
			}
			if p.Mode == "netdev" {
				whole[n.Name] = p.Name
			}
			out = append(out, Reservation{Pool: p.Name, Netdev: n, Queues: slices.Clone(qs)})
		}
		for name := range ranges {
			if !found[name] {
				problems = append(problems, fmt.Errorf("pool %s: netdev %s is not on this node (or does not match the other selectors)", p.Name, name))
			}
		}
	}
	return out, problems
}

func (s Selector) matches(n nic.Netdev) bool {
	inList := func(list []string, v string) bool { return len(list) == 0 || slices.Contains(list, v) }
	if len(s.Netdevs) > 0 {
		named := false
		for _, e := range s.Netdevs {
			// The name alone: the queues are parsed once, by Resolve.
			if name, _, _ := strings.Cut(e, "#"); name == n.Name {
				named = true
			}
		}
		if !named {
			return false
		}
	}
	return inList(s.Drivers, n.Driver) && inList(s.Vendors, n.Vendor) && inList(s.DeviceIDs, n.Device) && inList(s.PCIAddresses, n.PCI)
}
