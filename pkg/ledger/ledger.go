package ledger

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/config"
)

// Errors the ledger's methods wrap; pkg/api maps them to HTTP status codes.
var (
	ErrNotFound    = api.ErrNotFound
	ErrConflict    = api.ErrConflict
	ErrInvalid     = api.ErrInvalid
	ErrUnavailable = api.ErrUnavailable
	// ErrBusy is what a refusal wraps when an operation on the same
	// attachment or allocation is under way: it is over soon (its
	// kernel work is bounded), and a caller that waits for it (Changed)
	// and asks again gets a true answer.
	ErrBusy = errors.New("an operation on it is in progress")
)

// Device is one device of a pool: a queue of a netdev, or in a netdev
// pool the whole netdev (its ID is then the netdev's name).
type Device struct {
	ID     string
	Netdev string
	Queues []uint32
	NUMA   int    // -1 when unknown
	PCI    string // "" for a virtual netdev
}

// Pool is a pool as the config and the netdevs found make it.
type Pool struct {
	Name     string
	Resource string
	Config   config.Pool // its settings, defaults filled in
	Devices  []Device
	// Problems say why the pool has fewer devices than its config names.
	Problems []string
	index    map[string]int // device id -> its place in Devices
}

// Mode is the pool's mode: api.ModeQueue or api.ModeNetdev.
func (p Pool) Mode() string {
	if p.Config.Mode == api.ModeNetdev {
		return api.ModeNetdev
	}
	return api.ModeQueue
}

// Owner is who may use an allocation.
type Owner struct {
	UID    *uint32
	PodUID string
	AnyPod bool
}

// LeaseSocket is a socket the broker bound for an allocation's lease: the
// pod that holds it may resume the lease with it after a daemon restart.
type LeaseSocket struct {
	Queue uint32
	Inode uint64
}

// State is where an allocation or attachment is in its life.
type State string

// States. Pending and ending are the in-progress marks of the two phases.
const (
	Pending State = "pending" // being made; an allocation is not persisted yet
	Active  State = "active"
	Ending  State = "ending" // being freed or detached
)

// Allocation is a set of devices of one pool, on one netdev, given to one
// owner, with the CNI attachments made for it. Its file is a recordV1
// (record.go), converted from it field by field.
type Allocation struct {
	ID   string
	Pool string
	// Resource is the pool's resource name when it was made: kubelet
	// reports its pods' devices under it even after a reload renames it.
	Resource string
	Netdev   string
	Queues   []uint32
	Devices  []string
	Owner    Owner
	Created  time.Time
	State    State
	// Replaces are the allocations this one succeeds on the same devices
	// (kubelet's Allocate for a restarted container); they are gone once
	// this one is committed.
	Replaces    []string
	Attachments []Attachment
	Lease       []LeaseSocket
	// Claim is the DRA ResourceClaim the allocation was prepared for;
	// nil for an allocation of the device plugin or the local API.
	Claim *Claim
	// replacedBy is the pending allocation that succeeds this one
	// (Reserve with Replace), until Commit or Abort; never persisted.
	replacedBy string
}

// state says where the allocation is, for a refusal.
func (a *Allocation) state() string {
	if a.replacedBy != "" {
		return "being replaced by " + a.replacedBy
	}
	return string(a.State)
}

// Attachment is a CNI attachment of an allocation.
type Attachment struct {
	api.Attachment
	State State
	// Moved is what the netdev mover needs to find a netdev-mode pool's
	// netdev again (opaque to the ledger); recorded before the move.
	Moved []byte
	// MapOut says the XSKMAP of the attachment's netdev (a netdev-mode
	// pool's, in its pod) was handed to the pod, for sockets it creates
	// itself (DPDK): xdpq's program stays attached to the netdev for as
	// long as the attachment lives, restarts included. Recorded before
	// the map leaves the daemon.
	MapOut bool
}

// Claim is the ResourceClaim an allocation serves (DRA): kubelet's
// Prepare names it by UID, Unprepare by UID again, and the claim's own
// configuration says which flows to steer to it.
type Claim struct {
	UID       string
	Namespace string
	Name      string
	// Flows is the claim's configured flows as the configuration gave
	// them (the CNI configuration's "flows" schema, not yet resolved to
	// the pod's addresses); nil when it gives none.
	Flows json.RawMessage
	// Interface is the claim's configuration of a netdev-mode pool's
	// netdev in the pod (dra.InterfaceConfig), nil when it gives none.
	Interface json.RawMessage
}

// Key is the attachment's name: "containerID/ifName".
func (a Attachment) Key() string { return Key(a.ContainerID, a.IfName) }

// Key names an attachment.
func Key(containerID, ifName string) string { return containerID + "/" + ifName }

// Clock is the time source; tests give a fake one.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Ledger is the record. Its methods are safe for concurrent use; none
// waits for the kernel or the network, and persistence is the only I/O.
type Ledger struct {
	store    *store
	clock    Clock
	onChange func()

	mu     sync.Mutex // guards the fields below; held for memory work only
	pools  map[string]*Pool
	allocs map[string]*Allocation
	// held says which allocation holds each queue of each netdev: two
	// pools (a config before and after a reload) may name one queue by
	// different devices, and it is still held once.
	held   map[queue]string
	atts   map[string]string // attachment key -> allocation id
	broken map[string]error  // allocation id -> why its record is unreadable
	// holdGen counts the changes of pools and of what allocations hold;
	// usage is Usage's answer per pool as of a holdGen (status asks for
	// it at every call, CNI calls change neither).
	holdGen uint64
	usage   map[string]usageAt
	// writing serialises the writes of each record (see persist).
	writing map[string]*sync.Mutex
	// changed is closed at the next change of state (see Changed); nil
	// until someone asks.
	changed chan struct{}
}

// Changed returns a channel that is closed at the ledger's next change of
// an allocation or attachment. A caller refused with ErrBusy takes it
// before asking, and waits on it before asking again: no change between
// the two is missed.
func (l *Ledger) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return l.changed
}

// changedLocked wakes the waiters of Changed.
func (l *Ledger) changedLocked() {
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// Options configure Open.
type Options struct {
	// Dir holds one file per allocation; it is created if missing.
	Dir   string
	Clock Clock // nil: the real clock
	// OnChange, if set, is called after each record write or removal
	// (an allocation made, freed, attached, leased), with no lock of the
	// ledger held. It must not block.
	OnChange func()
}

// Open reads the records in dir. Records that cannot be read are kept on
// disk and reported by Broken; Recovery says what the caller must finish
// or roll back before serving.
func Open(o Options) (*Ledger, error) {
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	st, err := openStore(o.Dir)
	if err != nil {
		return nil, err
	}
	l := &Ledger{store: st, clock: o.Clock, onChange: o.OnChange, pools: map[string]*Pool{}, allocs: map[string]*Allocation{},
		held: map[queue]string{}, atts: map[string]string{}, broken: map[string]error{}, writing: map[string]*sync.Mutex{}, usage: map[string]usageAt{}}
	recs, broken, err := st.loadAll()
	if err != nil {
		return nil, err
	}
	l.broken = broken
	// A record that succeeds others wins over them: a crash after it was
	// written and before theirs were removed leaves both.
	gone := map[string]bool{}
	for _, a := range recs {
		for _, r := range a.Replaces {
			gone[r] = true
		}
	}
	for _, a := range recs {
		if gone[a.ID] {
			// Left on disk, it loses to its successor again at the next
			// Open, which retries the removal.
			_ = st.remove(a.ID)
			continue
		}
		if err := l.conflictLocked(a); err != nil {
			l.broken[a.ID] = fmt.Errorf("%s: %w", st.path(a.ID), err)
			continue
		}
		a.Replaces = nil
		l.insertLocked(a)
	}
	return l, nil
}

// queue is a queue of a netdev.
type queue struct {
	netdev string
	q      uint32
}

// insertLocked records a into the indexes.
func (l *Ledger) insertLocked(a *Allocation) {
	l.allocs[a.ID] = a
	l.holdLocked(a)
	for _, att := range a.Attachments {
		l.atts[att.Key()] = a.ID
	}
}

func (l *Ledger) holdLocked(a *Allocation) {
	l.holdGen++
	for _, q := range a.Queues {
		l.held[queue{a.Netdev, q}] = a.ID
	}
}

// holderLocked is the allocation that holds any of a netdev's queues,
// "" when none does.
func (l *Ledger) holderLocked(netdev string, qs []uint32) string {
	for _, q := range qs {
		if h := l.held[queue{netdev, q}]; h != "" {
			return h
		}
	}
	return ""
}

// holdsLocked reports whether an allocation of pool exists.
func (l *Ledger) holdsLocked(pool string) bool {
	for _, a := range l.allocs {
		if a.Pool == pool {
			return true
		}
	}
	return false
}

func (l *Ledger) deleteLocked(a *Allocation) {
	l.holdGen++
	delete(l.allocs, a.ID)
	for _, q := range a.Queues {
		if l.held[queue{a.Netdev, q}] == a.ID {
			delete(l.held, queue{a.Netdev, q})
		}
	}
	for _, att := range a.Attachments {
		if l.atts[att.Key()] == a.ID {
			delete(l.atts, att.Key())
		}
	}
}

// newID returns a fresh allocation id: the pool's name and 12 hex digits.
func newID(pool string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return pool + "-" + hex.EncodeToString(b)
}

// poolOfID is the pool an allocation id names, "" when it names none.
func poolOfID(id string) string {
	i := strings.LastIndexByte(id, '-')
	if i <= 0 || len(id)-i-1 != 12 {
		return ""
	}
	if _, err := hex.DecodeString(id[i+1:]); err != nil {
		return ""
	}
	return id[:i]
}

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

// Broken returns the records that could not be read, by allocation id.
func (l *Ledger) Broken() map[string]error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.broken)
}

// Get returns an allocation.
func (l *Ledger) Get(id string) (Allocation, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.allocs[id]
	if a == nil {
		return Allocation{}, false
	}
	return cloneAlloc(a), true
}

// ByClaim returns the allocation of the ResourceClaim with uid, in
// whatever state it is.
func (l *Ledger) ByClaim(uid string) (Allocation, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a := l.claimLocked(uid); a != nil {
		return cloneAlloc(a), true
	}
	return Allocation{}, false
}

// claimLocked is the allocation of claim uid, or nil.
func (l *Ledger) claimLocked(uid string) *Allocation {
	for _, a := range l.allocs {
		if a.Claim != nil && a.Claim.UID == uid {
			return a
		}
	}
	return nil
}

// Allocations returns every allocation but those being made, by id.
func (l *Ledger) Allocations() []Allocation {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Allocation, 0, len(l.allocs))
	for _, id := range slices.Sorted(maps.Keys(l.allocs)) {
		if a := l.allocs[id]; a.State != Pending {
			out = append(out, cloneAlloc(a))
		}
	}
	return out
}

// AllocationsOf returns the allocations of a pool but those being made,
// by id; a pool it does not have is an ErrNotFound naming those it has.
func (l *Ledger) AllocationsOf(pool string) ([]Allocation, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pools[pool] == nil {
		return nil, api.Errorf(api.ErrNotFound, "no pool %q (pools: %s)", pool, strings.Join(slices.Sorted(maps.Keys(l.pools)), ", "))
	}
	var out []Allocation
	for _, id := range slices.Sorted(maps.Keys(l.allocs)) {
		if a := l.allocs[id]; a.Pool == pool && a.State != Pending {
			out = append(out, cloneAlloc(a))
		}
	}
	return out, nil
}

// Counts is how many allocations (but those being made) and attachments
// of theirs there are: what Allocations would return, counted.
type Counts struct {
	Allocations int
	Attachments int
	// ByPool counts the allocations of each pool that has any.
	ByPool map[string]int
}

// Count counts the allocations and their attachments, copying none.
func (l *Ledger) Count() Counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := Counts{ByPool: map[string]int{}}
	for _, a := range l.allocs {
		if a.State == Pending {
			continue
		}
		c.Allocations++
		c.Attachments += len(a.Attachments)
		c.ByPool[a.Pool]++
	}
	return c
}

func cloneAlloc(a *Allocation) Allocation {
	c := *a
	c.Queues = slices.Clone(a.Queues)
	c.Devices = slices.Clone(a.Devices)
	c.Replaces = slices.Clone(a.Replaces)
	c.Lease = slices.Clone(a.Lease)
	if a.Claim != nil {
		cl := *a.Claim
		cl.Flows, cl.Interface = slices.Clone(a.Claim.Flows), slices.Clone(a.Claim.Interface)
		c.Claim = &cl
	}
	c.Attachments = make([]Attachment, len(a.Attachments))
	for i, att := range a.Attachments {
		c.Attachments[i] = cloneAtt(att)
	}
	if len(a.Attachments) == 0 {
		c.Attachments = nil
	}
	if a.Owner.UID != nil {
		u := *a.Owner.UID
		c.Owner.UID = &u
	}
	return c
}

func cloneAtt(a Attachment) Attachment {
	a.Flows = slices.Clone(a.Flows)
	a.Queues = slices.Clone(a.Queues)
	a.Moved = slices.Clone(a.Moved)
	return a
}

// Reservation asks for devices of a pool.
type Reservation struct {
	Pool    string
	Devices []string
	Owner   Owner
	// Replace lets the reservation take devices that allocations hold:
	// they are ended (BeginFree) and succeeded by this one (kubelet's
	// Allocate for a restarted container). Without it a held device is
	// ErrConflict.
	Replace bool
	// Claim is the ResourceClaim the allocation is prepared for (DRA):
	// one claim holds at most one allocation.
	Claim *Claim
}

// Reserve makes a pending allocation of the devices: they are held from
// now on, but the allocation is neither persisted nor reported until
// Commit. With Replace, the allocations that hold any of the devices are
// marked ending and returned in Replaces; the caller undoes them and
// Commit removes them (Abort gives them back).
func (l *Ledger) Reserve(r Reservation) (Allocation, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pools[r.Pool]
	if p == nil {
		return Allocation{}, api.Errorf(api.ErrNotFound, "no pool %q (pools: %s)", r.Pool, strings.Join(slices.Sorted(maps.Keys(l.pools)), ", "))
	}
	if len(r.Devices) == 0 {
		return Allocation{}, api.Errorf(api.ErrInvalid, "pool %s: no devices asked for", r.Pool)
	}
	if err := l.blockedLocked(r.Pool); err != nil {
		return Allocation{}, err
	}
	// A pod could never lease more: refused now, not at its first lease.
	if max := p.Config.Limits.MaxQueuesPerPod; p.Mode() == api.ModeQueue && max > 0 && len(r.Devices) > max {
		return Allocation{}, api.Errorf(api.ErrInvalid, "pool %s: %d queues asked; its limits.maxQueuesPerPod is %d", r.Pool, len(r.Devices), max)
	}
	a := &Allocation{Pool: r.Pool, Resource: p.Resource, Owner: r.Owner, Created: l.clock.Now(), State: Pending}
	if r.Claim != nil {
		if r.Claim.UID == "" {
			return Allocation{}, api.Errorf(api.ErrInvalid, "pool %s: a claim without a UID", r.Pool)
		}
		if h := l.claimLocked(r.Claim.UID); h != nil {
			return Allocation{}, api.Errorf(api.ErrConflict, "claim %s/%s (%s) already holds allocation %s (%s)", r.Claim.Namespace, r.Claim.Name, r.Claim.UID, h.ID, h.state())
		}
		cl := *r.Claim
		cl.Flows, cl.Interface = slices.Clone(r.Claim.Flows), slices.Clone(r.Claim.Interface)
		a.Claim = &cl
	}
	replaces := map[string]bool{}
	for _, id := range r.Devices {
		i, ok := p.index[id]
		var d Device
		if ok {
			d = p.Devices[i]
		}
		switch {
		case !ok:
			return Allocation{}, api.Errorf(api.ErrInvalid, "device %s is not in pool %s", id, r.Pool)
		case slices.Contains(a.Devices, id):
			return Allocation{}, api.Errorf(api.ErrInvalid, "device %s asked for twice", id)
		case a.Netdev != "" && d.Netdev != a.Netdev:
			return Allocation{}, api.Errorf(api.ErrInvalid, "devices %v span netdevs %s and %s; an allocation is on one netdev", r.Devices, a.Netdev, d.Netdev)
		}
		for _, q := range d.Queues {
			h := l.held[queue{d.Netdev, q}]
			if h == "" || replaces[h] {
				continue
			}
			old := l.allocs[h]
			if !r.Replace || old.State != Active || old.replacedBy != "" || old.Pool != r.Pool {
				return Allocation{}, api.Errorf(api.ErrConflict, "device %s is in use by allocation %s (%s)", id, h, old.State)
			}
			if err := l.checkEndableLocked(old); err != nil {
				return Allocation{}, err
			}
			replaces[h] = true
		}
		a.Netdev = d.Netdev
		a.Devices = append(a.Devices, id)
		a.Queues = append(a.Queues, d.Queues...)
	}
	slices.Sort(a.Queues)
	for {
		a.ID = newID(r.Pool)
		if l.allocs[a.ID] == nil && l.broken[a.ID] == nil {
			break
		}
	}
	a.Replaces = slices.Sorted(maps.Keys(replaces))
	for _, old := range a.Replaces {
		// In memory only: a crash before Commit leaves it active, whole,
		// and kubelet's next Allocate replaces it again. Its devices pass
		// to the new allocation now; those it holds beyond the
		// reservation stay its own until it is gone.
		l.allocs[old].replacedBy = a.ID
	}
	l.insertLocked(a)
	return cloneAlloc(a), nil
}

// checkEndableLocked refuses to end an allocation one of whose
// attachments is being made or removed.
func (l *Ledger) checkEndableLocked(a *Allocation) error {
	for _, att := range a.Attachments {
		if att.State != Active {
			return api.Errorf(api.ErrConflict, "allocation %s: attachment %s is %s: %w", a.ID, att.Key(), att.State, ErrBusy)
		}
	}
	return nil
}

// Commit makes a pending allocation active, with the attachments given
// (those carried over from the allocations it replaces), persists it and
// removes the allocations it replaces, whose other attachments the caller
// has undone.
//
// The record is written before anything changes in memory: when it
// cannot be written (a full or read-only disk), the commit has not
// happened and the allocation is dropped as by Abort (the allocations it
// was to replace are active again), so nothing is left holding devices
// or served that a restarted daemon would not know; the caller stops
// serving it.
func (l *Ledger) Commit(id string, carried []Attachment) error {
	l.mu.Lock()
	a := l.allocs[id]
	if a == nil || a.State != Pending {
		l.mu.Unlock()
		return api.Errorf(api.ErrConflict, "commit %s: not a pending allocation", id)
	}
	atts := make([]Attachment, len(carried))
	for i, att := range carried {
		atts[i] = cloneAtt(att)
		atts[i].AllocationID = id
		atts[i].State = Active
	}
	rec := cloneAlloc(a)
	rec.State = Active
	rec.Attachments = append(rec.Attachments, atts...)
	l.mu.Unlock()
	// No one else writes a pending allocation's record. The successor is
	// written first: it names what it replaces, so a crash between this
	// write and theirs leaves a state Open resolves.
	if err := l.store.write(&rec); err != nil {
		l.Abort(id)
		// The rename may have taken with only the directory's sync
		// failing: the record must not outlive the allocation.
		if rerr := l.store.remove(id); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = errors.Join(err, fmt.Errorf("and its record could not be removed: %w", rerr))
		}
		return fmt.Errorf("commit %s: %w", id, err)
	}
	l.mu.Lock()
	a.Attachments = append(a.Attachments, atts...)
	a.State = Active
	var gone []string
	for _, old := range a.Replaces {
		if o := l.allocs[old]; o != nil {
			l.deleteLocked(o)
			gone = append(gone, old)
		}
	}
	// deleteLocked may have dropped queues the new allocation holds.
	l.holdLocked(a)
	for _, att := range a.Attachments {
		l.atts[att.Key()] = id
	}
	// A lease set while it was pending is in memory only.
	rewrite := !slices.Equal(a.Lease, rec.Lease)
	l.mu.Unlock()
	var errs []error
	for _, old := range gone {
		errs = append(errs, l.persist(old))
	}
	l.mu.Lock()
	a.Replaces = nil
	if len(gone) > 0 {
		l.dropEmptyLingeringLocked(a.Pool)
	}
	l.mu.Unlock()
	if len(gone) > 0 || rewrite {
		errs = append(errs, l.persist(id))
	} else {
		l.mu.Lock()
		l.changedLocked()
		l.mu.Unlock()
		if l.onChange != nil {
			l.onChange()
		}
	}
	return errors.Join(errs...)
}

// Abort drops a pending allocation; the allocations it was to replace are
// active again.
func (l *Ledger) Abort(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.allocs[id]
	if a == nil || a.State != Pending {
		return
	}
	l.deleteLocked(a)
	for _, old := range a.Replaces {
		if o := l.allocs[old]; o != nil {
			o.replacedBy = ""
			l.holdLocked(o)
		}
	}
	l.changedLocked()
}

// BeginFree marks an allocation ending and returns it; the caller undoes
// its attachments and stops serving it, then calls EndFree. The ending
// mark is persisted: a daemon that restarts finishes the free.
func (l *Ledger) BeginFree(id string) (Allocation, error) {
	l.mu.Lock()
	a := l.allocs[id]
	if a == nil {
		l.mu.Unlock()
		return Allocation{}, api.Errorf(api.ErrNotFound, "no allocation %q", id)
	}
	if a.State != Active || a.replacedBy != "" {
		l.mu.Unlock()
		return Allocation{}, api.Errorf(api.ErrConflict, "allocation %s is %s: %w", id, a.state(), ErrBusy)
	}
	if err := l.checkEndableLocked(a); err != nil {
		l.mu.Unlock()
		return Allocation{}, err
	}
	a.State = Ending
	c := cloneAlloc(a)
	l.mu.Unlock()
	if err := l.persist(id); err != nil {
		// Not recorded: not begun either, or every later free would be
		// refused as "ending" until a restart.
		l.mu.Lock()
		a.State = Active
		l.changedLocked()
		l.mu.Unlock()
		return Allocation{}, err
	}
	return c, nil
}

// EndFree removes an ending allocation and its attachments; its devices
// are free.
func (l *Ledger) EndFree(id string) error {
	l.mu.Lock()
	a := l.allocs[id]
	if a == nil || a.State != Ending {
		l.mu.Unlock()
		return api.Errorf(api.ErrConflict, "end free %s: not ending", id)
	}
	l.deleteLocked(a)
	l.dropEmptyLingeringLocked(a.Pool)
	l.mu.Unlock()
	return l.persist(id)
}

// SetOwner records who may use an allocation (Kubernetes learns the pod
// only at CNI ADD).
func (l *Ledger) SetOwner(id string, o Owner) error {
	l.mu.Lock()
	a := l.allocs[id]
	if a == nil {
		l.mu.Unlock()
		return api.Errorf(api.ErrNotFound, "no allocation %q", id)
	}
	a.Owner = o
	l.mu.Unlock()
	return l.persist(id)
}

// BindOwner makes pod uid the owner of an allocation any pod may use,
// and records it. An allocation another pod owns already is refused
// with ErrConflict: of two pods binding at once, one wins.
func (l *Ledger) BindOwner(id, uid string) error {
	l.mu.Lock()
	a := l.allocs[id]
	switch {
	case a == nil:
		l.mu.Unlock()
		return api.Errorf(api.ErrNotFound, "no allocation %q", id)
	case a.Owner.PodUID == uid:
		l.mu.Unlock()
		return nil
	case !a.Owner.AnyPod:
		o := a.Owner
		l.mu.Unlock()
		return api.Errorf(api.ErrConflict, "allocation %s belongs to %+v", id, o)
	}
	a.Owner = Owner{PodUID: uid}
	l.mu.Unlock()
	return l.persist(id)
}

// SetLease records the sockets of an allocation's lease (nil when it
// ended).
func (l *Ledger) SetLease(id string, socks []LeaseSocket) error {
	l.mu.Lock()
	a := l.allocs[id]
	if a == nil {
		l.mu.Unlock()
		return api.Errorf(api.ErrNotFound, "no allocation %q", id)
	}
	if slices.Equal(a.Lease, socks) {
		l.mu.Unlock()
		return nil
	}
	a.Lease = slices.Clone(socks)
	pending := a.State == Pending
	l.mu.Unlock()
	if pending {
		return nil // Commit writes it
	}
	return l.persist(id)
}
