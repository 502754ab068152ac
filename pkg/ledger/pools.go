// The pools: the config's devices as the ledger holds them, a pool
// removed from the config lingering while allocations hold its devices,
// and what each pool has free.

package ledger

import (
	"maps"
	"slices"
	"strings"

	"github.com/xdpq/xdpq/pkg/api"
)

// PoolChanges says what SetPools changed.
type PoolChanges struct {
	Added, Removed []string // pool names
	// Lingering are pools gone from the config that allocations still
	// hold devices of; they are removed when the last is freed.
	Lingering []string
}

// SetPools puts a new set of pools in force. A pool gone from the set
// stays, with no devices, until its last allocation is freed; devices gone
// from a pool stay with the allocations that hold them.
func (l *Ledger) SetPools(pools []Pool) PoolChanges {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ch PoolChanges
	next := map[string]*Pool{}
	for _, p := range pools {
		p := p
		p.Devices = slices.Clone(p.Devices)
		p.index = make(map[string]int, len(p.Devices))
		for i, d := range p.Devices {
			p.index[d.ID] = i
		}
		if l.pools[p.Name] == nil {
			ch.Added = append(ch.Added, p.Name)
		}
		next[p.Name] = &p
	}
	for _, a := range l.allocs {
		name := a.Pool
		if next[name] != nil {
			continue
		}
		// Gone from the config, or never in it since this ledger opened
		// (a restart with records of a pool the new config lacks).
		keep := Pool{Name: name}
		if p := l.pools[name]; p != nil {
			keep = *p
		}
		keep.Devices, keep.index = nil, nil
		keep.Problems = []string{lingering}
		next[name] = &keep
		ch.Lingering = append(ch.Lingering, name)
	}
	for name := range l.pools {
		if next[name] == nil {
			ch.Removed = append(ch.Removed, name)
		}
	}
	l.pools = next
	l.holdGen++
	slices.Sort(ch.Added)
	slices.Sort(ch.Removed)
	slices.Sort(ch.Lingering)
	return ch
}

// lingering is the problem of a pool gone from the config.
const lingering = "removed from the config; it goes when its allocations are freed"

// dropEmptyLingeringLocked removes a pool that is gone from the config
// once nothing holds its devices. It reports whether it did.
func (l *Ledger) dropEmptyLingeringLocked(name string) bool {
	p := l.pools[name]
	if p == nil || l.holdsLocked(name) || !slices.Contains(p.Problems, lingering) {
		return false
	}
	delete(l.pools, name)
	l.holdGen++
	return true
}

// Pool returns a pool by name.
func (l *Ledger) Pool(name string) (Pool, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pools[name]
	if p == nil {
		return Pool{}, false
	}
	return clonePool(p), true
}

// Device returns a device of a pool by its id.
func (l *Ledger) Device(pool, id string) (Device, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pools[pool]
	if p == nil {
		return Device{}, false
	}
	i, ok := p.index[id]
	if !ok {
		return Device{}, false
	}
	d := p.Devices[i]
	d.Queues = slices.Clone(d.Queues)
	return d, true
}

// ClaimsHeld counts the allocations of a pool that serve DRA claims and
// those that do not.
func (l *Ledger) ClaimsHeld(pool string) (claims, others int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.allocs {
		switch {
		case a.Pool != pool:
		case a.Claim != nil:
			claims++
		default:
			others++
		}
	}
	return claims, others
}

// Meta returns a pool without its devices: what a call that needs its
// settings, not its thousands of queues, reads.
func (l *Ledger) Meta(name string) (Pool, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pools[name]
	if p == nil {
		return Pool{}, false
	}
	return meta(p), true
}

// Metas returns every pool without its devices, by name.
func (l *Ledger) Metas() []Pool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Pool, 0, len(l.pools))
	for _, name := range slices.Sorted(maps.Keys(l.pools)) {
		out = append(out, meta(l.pools[name]))
	}
	return out
}

func meta(p *Pool) Pool {
	return Pool{Name: p.Name, Resource: p.Resource, Config: p.Config, Problems: slices.Clone(p.Problems)}
}

// Pools returns every pool, by name.
func (l *Ledger) Pools() []Pool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Pool, 0, len(l.pools))
	for _, name := range slices.Sorted(maps.Keys(l.pools)) {
		out = append(out, clonePool(l.pools[name]))
	}
	return out
}

func clonePool(p *Pool) Pool {
	c := *p
	c.Devices = slices.Clone(p.Devices)
	c.Problems = slices.Clone(p.Problems)
	c.index = nil // the ledger's own
	return c
}

// Holder returns the id of the allocation that holds a device of a pool
// (one of its queues, or the device itself when a shrink took it out of
// the pool), "" when none does.
func (l *Ledger) Holder(pool, device string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.pools[pool]; p != nil {
		if i, ok := p.index[device]; ok {
			return l.holderLocked(p.Devices[i].Netdev, p.Devices[i].Queues)
		}
	}
	for _, a := range l.allocs {
		if a.Pool == pool && slices.Contains(a.Devices, device) {
			return a.ID
		}
	}
	return ""
}

// FreeDevices returns the devices of a pool that no allocation holds.
func (l *Ledger) FreeDevices(pool string) ([]Device, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pools[pool]
	if p == nil {
		return nil, api.Errorf(api.ErrNotFound, "no pool %q (pools: %s)", pool, strings.Join(slices.Sorted(maps.Keys(l.pools)), ", "))
	}
	var out []Device
	for _, d := range p.Devices {
		if l.holderLocked(d.Netdev, d.Queues) == "" {
			out = append(out, d)
		}
	}
	return out, nil
}

type usageAt struct {
	gen uint64
	u   PoolUsage
}

// PoolUsage is a pool's count of devices.
type PoolUsage struct {
	Devices int // in the pool now
	Free    int // of those, held by no allocation; 0 while Blocked: none can be had
	// Beyond counts devices the pool's allocations hold that the pool no
	// longer has (a shrink while they were held).
	Beyond int
	// Blocked says why the pool takes no allocation now, "" when it does.
	Blocked string
}

// Usage counts a pool's devices.
func (l *Ledger) Usage(pool string) PoolUsage {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.usage[pool]
	if !ok || c.gen != l.holdGen {
		c = usageAt{l.holdGen, l.countLocked(pool)}
		l.usage[pool] = c
	}
	u := c.u
	if err := l.blockedLocked(pool); err != nil {
		u.Blocked, u.Free = err.Error(), 0
	}
	return u
}

// countLocked is Usage without its cache and Blocked.
func (l *Ledger) countLocked(pool string) PoolUsage {
	var u PoolUsage
	p := l.pools[pool]
	var in map[string]int
	if p != nil {
		in = p.index
		u.Devices = len(p.Devices)
		for _, d := range p.Devices {
			if l.holderLocked(d.Netdev, d.Queues) == "" {
				u.Free++
			}
		}
	}
	for _, a := range l.allocs {
		if a.Pool != pool {
			continue
		}
		for _, d := range a.Devices {
			if _, ok := in[d]; !ok {
				u.Beyond++
			}
		}
	}
	return u
}

// blockedLocked refuses allocations from a pool that an unreadable record
// may hold queues of.
func (l *Ledger) blockedLocked(pool string) error {
	for id, err := range l.broken {
		if p := poolOfID(id); p == pool || p == "" {
			return api.Errorf(api.ErrUnavailable, "the record of allocation %s cannot be read (%v), and it may hold devices of pool %s: "+
				"repair the file or remove it if that allocation is gone, then reload (SIGHUP)", id, err, pool)
		}
	}
	return nil
}
