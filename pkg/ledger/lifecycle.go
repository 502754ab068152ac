// An allocation's life: reserved (pending), committed (active, recorded),
// freed (ending, then gone), and who may use it and its lease on the way.

package ledger

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"

	"github.com/xdpq/xdpq/pkg/api"
)

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
// Commit. With Replace, the allocations that hold any of the devices stay
// active, marked (in memory) as being replaced by this one, and are
// returned in Replaces: their devices pass to it; the caller undoes
// their attachments, Commit removes them and Abort unmarks them.
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
