package deviceplugin

import (
	"cmp"
	"slices"
	"sort"
)

// Prefer picks size devices from avail: all of must first; then queues of
// must's netdev; then of netdevs on must's NUMA node; then of the others,
// the netdevs with the most available queues first. Within a netdev it
// takes the run of queues with the smallest span (contiguous where it can).
func Prefer(avail, must []Device, size int) []string {
	chosen := map[string]bool{}
	var out []string
	take := func(d Device) {
		if !chosen[d.ID] && len(out) < size {
			chosen[d.ID] = true
			out = append(out, d.ID)
		}
	}
	for _, d := range must {
		take(d)
	}
	numa := -1
	netdevs := map[string]bool{}
	for _, d := range must {
		netdevs[d.Netdev] = true
		if d.NUMA >= 0 {
			numa = d.NUMA
		}
	}
	// Kubelet offers every free device: thousands on a big node. Each
	// netdev's slice is made its size at once.
	eligible := func(d Device) bool { return !chosen[d.ID] && d.Healthy }
	count := map[string]int{}
	for _, d := range avail {
		if eligible(d) {
			count[d.Netdev]++
		}
	}
	group := make(map[string][]Device, len(count))
	for _, d := range avail {
		if eligible(d) {
			g := group[d.Netdev]
			if g == nil {
				g = make([]Device, 0, count[d.Netdev])
			}
			group[d.Netdev] = append(g, d)
		}
	}
	names := make([]string, 0, len(group))
	for n := range group {
		names = append(names, n)
	}
	rank := func(n string) int {
		switch {
		case netdevs[n]:
			return 0
		case numa >= 0 && group[n][0].NUMA == numa:
			return 1
		}
		return 2
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := names[i], names[j]
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra < rb
		}
		if la, lb := len(group[a]), len(group[b]); la != lb {
			return la > lb
		}
		return a < b
	})
	for _, n := range names {
		need := size - len(out)
		if need <= 0 {
			break
		}
		ds := group[n]
		slices.SortFunc(ds, func(a, b Device) int { return cmp.Compare(a.Queue, b.Queue) })
		if need >= len(ds) {
			for _, d := range ds {
				take(d)
			}
			continue
		}
		// The span counts the queues of this netdev that must be included.
		span := func(i int) uint32 {
			lo, hi := ds[i].Queue, ds[i+need-1].Queue
			for _, m := range must {
				if m.Netdev == n {
					lo, hi = min(lo, m.Queue), max(hi, m.Queue)
				}
			}
			return hi - lo
		}
		best := 0
		for i := 0; i+need <= len(ds); i++ {
			if span(i) < span(best) {
				best = i
			}
		}
		for _, d := range ds[best : best+need] {
			take(d)
		}
	}
	return out
}
