package ledger

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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

// DeviceID is the stable name of a queue as a device: <netdev>-q<N>.
func DeviceID(netdev string, queue uint32) string { return fmt.Sprintf("%s-q%d", netdev, queue) }

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
