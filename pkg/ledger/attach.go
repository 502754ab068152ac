package ledger

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/xdpq/xdpq/pkg/api"
)

// BeginAttach records att as a pending attachment of allocation alloc, and
// persists it, before the caller steers its flows or moves its netdev. A
// repeated ADD (the same flows and MTU on the same allocation) returns the
// attachment in force with again set, and changes nothing.
func (l *Ledger) BeginAttach(alloc string, att Attachment) (_ Attachment, again bool, _ error) {
	key := att.Key()
	l.mu.Lock()
	a := l.allocs[alloc]
	switch {
	case a == nil:
		l.mu.Unlock()
		return Attachment{}, false, api.Errorf(api.ErrNotFound, "no allocation %q", alloc)
	case a.State != Active || a.replacedBy != "":
		l.mu.Unlock()
		return Attachment{}, false, api.Errorf(api.ErrConflict, "allocation %s is %s", alloc, a.state())
	}
	if owner := l.atts[key]; owner != "" {
		old := l.allocs[owner].Attachments[l.indexLocked(owner, key)]
		l.mu.Unlock()
		if old.State == Active && owner == alloc && slices.Equal(old.Flows, att.Flows) && old.MTU == att.MTU {
			return cloneAtt(old), true, nil
		}
		if old.State != Active {
			return Attachment{}, false, api.Errorf(api.ErrConflict, "container %s interface %s: %w (%s)",
				att.ContainerID, att.IfName, ErrBusy, old.State)
		}
		return Attachment{}, false, fmt.Errorf("container %s interface %s is attached already (allocation %s, %d flows); DEL it first: %w",
			att.ContainerID, att.IfName, owner, len(old.Flows), ErrConflict)
	}
	for _, other := range a.Attachments {
		if other.Mode == api.ModeNetdev && att.Mode == api.ModeNetdev {
			l.mu.Unlock()
			return Attachment{}, false, api.Errorf(api.ErrConflict, "netdev %s is in use by attachment %s", a.Netdev, other.Key())
		}
	}
	att = cloneAtt(att)
	att.AllocationID, att.Netdev, att.Queues, att.State = alloc, a.Netdev, slices.Clone(a.Queues), Pending
	a.Attachments = append(a.Attachments, att)
	l.atts[key] = alloc
	l.mu.Unlock()
	if err := l.persist(alloc); err != nil {
		l.dropAttachment(key)
		return Attachment{}, false, fmt.Errorf("record attachment %s: %w", key, err)
	}
	return cloneAtt(att), false, nil
}

// indexLocked is the index of attachment key in allocation id's list.
func (l *Ledger) indexLocked(id, key string) int {
	return slices.IndexFunc(l.allocs[id].Attachments, func(a Attachment) bool { return a.Key() == key })
}

func (l *Ledger) dropAttachment(key string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := l.atts[key]
	if id == "" {
		return ""
	}
	a := l.allocs[id]
	a.Attachments = slices.DeleteFunc(a.Attachments, func(x Attachment) bool { return x.Key() == key })
	delete(l.atts, key)
	l.changedLocked()
	return id
}

// UpdateAttachment changes a pending attachment's record (for example
// what the netdev mover learnt) and persists it.
func (l *Ledger) UpdateAttachment(att Attachment) error {
	key := att.Key()
	l.mu.Lock()
	id := l.atts[key]
	if id == "" {
		l.mu.Unlock()
		return api.Errorf(api.ErrNotFound, "no attachment %s", key)
	}
	i := l.indexLocked(id, key)
	cur := l.allocs[id].Attachments[i]
	att = cloneAtt(att)
	att.AllocationID, att.State = id, cur.State
	l.allocs[id].Attachments[i] = att
	l.mu.Unlock()
	return l.persist(id)
}

// EndAttach ends the first phase of an attachment: with ok, it is active
// as att says (its final record), and an attachment of a pod (PodUID)
// makes that pod the allocation's owner, in the same write; without ok,
// it is gone. Either way the record is persisted.
func (l *Ledger) EndAttach(att Attachment, ok bool) error {
	key := att.Key()
	if !ok {
		id := l.dropAttachment(key)
		if id == "" {
			return nil
		}
		return l.persist(id)
	}
	l.mu.Lock()
	id := l.atts[key]
	if id == "" {
		l.mu.Unlock()
		return api.Errorf(api.ErrNotFound, "end attach %s: no such attachment", key)
	}
	i := l.indexLocked(id, key)
	att = cloneAtt(att)
	att.AllocationID, att.State = id, Active
	a := l.allocs[id]
	a.Attachments[i] = att
	if att.PodUID != "" {
		a.Owner = Owner{PodUID: att.PodUID}
	}
	l.mu.Unlock()
	return l.persist(id)
}

// BeginDetach marks an attachment ending, persists that, and returns it;
// the caller removes its flows or brings its netdev back, then calls
// EndDetach. An attachment the ledger does not know is found false with
// no error: DEL is idempotent.
func (l *Ledger) BeginDetach(key string) (Attachment, bool, error) {
	l.mu.Lock()
	id := l.atts[key]
	if id == "" {
		l.mu.Unlock()
		return Attachment{}, false, nil
	}
	i := l.indexLocked(id, key)
	att := &l.allocs[id].Attachments[i]
	if att.State != Active {
		st := att.State
		l.mu.Unlock()
		return Attachment{}, true, api.Errorf(api.ErrConflict, "attachment %s: %w (%s)", key, ErrBusy, st)
	}
	if a := l.allocs[id]; a.State != Active || a.replacedBy != "" {
		l.mu.Unlock()
		return Attachment{}, true, api.Errorf(api.ErrConflict, "attachment %s: its allocation %s is %s: %w", key, id, a.state(), ErrBusy)
	}
	att.State = Ending
	c := cloneAtt(*att)
	l.mu.Unlock()
	if err := l.persist(id); err != nil {
		// Not recorded: not begun. The record on disk may still say Ending
		// if only its directory's sync failed; the caller hears of both.
		if cerr := l.CancelDetach(key); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return Attachment{}, true, err
	}
	return c, true, nil
}

// EndDetach removes an attachment and persists its allocation.
func (l *Ledger) EndDetach(key string) error {
	id := l.dropAttachment(key)
	if id == "" {
		return nil
	}
	return l.persist(id)
}

// CancelDetach makes an ending attachment active again: undoing it
// failed, and a DEL retried by the runtime will try again.
func (l *Ledger) CancelDetach(key string) error {
	l.mu.Lock()
	id := l.atts[key]
	if id == "" {
		l.mu.Unlock()
		return api.Errorf(api.ErrNotFound, "no attachment %s", key)
	}
	l.allocs[id].Attachments[l.indexLocked(id, key)].State = Active
	l.mu.Unlock()
	return l.persist(id)
}

// Attachment returns an attachment by key.
func (l *Ledger) Attachment(key string) (Attachment, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := l.atts[key]
	if id == "" {
		return Attachment{}, false
	}
	return cloneAtt(l.allocs[id].Attachments[l.indexLocked(id, key)]), true
}

// Attachments returns every attachment, by key.
func (l *Ledger) Attachments() []Attachment {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Attachment, 0, len(l.atts))
	for _, key := range slices.Sorted(maps.Keys(l.atts)) {
		id := l.atts[key]
		out = append(out, cloneAtt(l.allocs[id].Attachments[l.indexLocked(id, key)]))
	}
	return out
}

// Recovery is what a restarted daemon finds half done in the records:
// allocations being freed (finish: undo their attachments, EndFree),
// attachments being made (roll back: undo whatever of them the kernel has,
// EndAttach not ok) and attachments being removed (finish: undo,
// EndDetach). Each is returned as the record says.
type Recovery struct {
	Freeing   []Allocation
	Attaching []Attachment
	Detaching []Attachment
}

// Recovery returns what is half done.
func (l *Ledger) Recovery() Recovery {
	l.mu.Lock()
	defer l.mu.Unlock()
	var r Recovery
	for _, id := range slices.Sorted(maps.Keys(l.allocs)) {
		a := l.allocs[id]
		if a.State == Ending {
			r.Freeing = append(r.Freeing, cloneAlloc(a))
			continue
		}
		for _, att := range a.Attachments {
			switch att.State {
			case Pending:
				r.Attaching = append(r.Attaching, cloneAtt(att))
			case Ending:
				r.Detaching = append(r.Detaching, cloneAtt(att))
			}
		}
	}
	return r
}
