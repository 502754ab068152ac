package ledger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/xdpq/xdpq/internal/atomicfile"
	"github.com/xdpq/xdpq/pkg/api"
)

// store keeps one file per allocation in a directory.
type store struct{ dir string }

func openStore(dir string) (*store, error) {
	if dir == "" {
		return nil, errors.New("open ledger: no directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	return &store{dir: dir}, nil
}

// Path is the file of allocation id.
func (s *store) path(id string) string { return filepath.Join(s.dir, id+".json") }

func (s *store) write(a *Allocation) error {
	b, err := encodeRecord(a)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(s.path(a.ID), b, 0o600)
}

func (s *store) remove(id string) error { return atomicfile.Remove(s.path(id)) }

// loadAll reads every record. Temporary files a crash left are removed;
// a record that cannot be read or makes no sense is returned in broken
// with the reason, and left on disk.
func (s *store) loadAll() ([]*Allocation, map[string]error, error) {
	broken := map[string]error{}
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("read allocation records: %w", err)
	}
	var out []*Allocation
	for _, e := range ents {
		name := e.Name()
		if atomicfile.IsTemp(name) {
			// Never read as a record; one not removed is retried at the
			// next load.
			_ = os.Remove(filepath.Join(s.dir, name))
			continue
		}
		id, ok := strings.CutSuffix(name, ".json")
		if !ok || e.IsDir() {
			continue
		}
		a, err := s.read(id)
		if err != nil {
			broken[id] = err
			continue
		}
		out = append(out, a)
	}
	return out, broken, nil
}

func (s *store) read(id string) (*Allocation, error) {
	path := s.path(id)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	a, err := decodeRecord(b, id, recordReaders())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return a, nil
}

// checkRecord refuses a record that does not describe a whole allocation id.
func checkRecord(a *Allocation, id string) error {
	switch {
	case a.ID != id:
		return fmt.Errorf("the record is of allocation %q, not %q", a.ID, id)
	case a.Pool == "" || a.Netdev == "" || len(a.Devices) == 0 || len(a.Queues) == 0:
		return errors.New("the record lacks its pool, netdev, devices or queues")
	case a.State != Active && a.State != Ending:
		return fmt.Errorf("allocation state %q", a.State)
	}
	seen := map[string]bool{}
	for _, att := range a.Attachments {
		switch {
		case att.ContainerID == "" || att.IfName == "":
			return errors.New("an attachment lacks its container id or interface name")
		case seen[att.Key()]:
			return fmt.Errorf("attachment %s listed twice", att.Key())
		case att.State != Pending && att.State != Active && att.State != Ending:
			return fmt.Errorf("attachment %s: state %q", att.Key(), att.State)
		case att.Mode != api.ModeQueue && att.Mode != api.ModeNetdev:
			return fmt.Errorf("attachment %s: mode %q", att.Key(), att.Mode)
		}
		seen[att.Key()] = true
	}
	return nil
}

// persist writes allocation id's record as it is now, or removes the file
// when the allocation is gone; a pending allocation is not written. Writes
// of one record are serialised and each writes the state of its own
// moment, so the file never goes back to an older state.
func (l *Ledger) persist(id string) error {
	l.mu.Lock()
	wmu := l.writing[id]
	if wmu == nil {
		wmu = &sync.Mutex{}
		l.writing[id] = wmu
	}
	l.mu.Unlock()
	wmu.Lock()
	defer wmu.Unlock()
	l.mu.Lock()
	l.changedLocked() // every change of state is written: its waiters wake
	a := l.allocs[id]
	var snap Allocation
	if a != nil {
		snap = cloneAlloc(a)
	} else if l.writing[id] == wmu {
		delete(l.writing, id) // the last write of this record
	}
	l.mu.Unlock()
	if l.onChange != nil {
		defer l.onChange()
	}
	switch {
	case a == nil:
		if err := l.store.remove(id); err != nil {
			return fmt.Errorf("remove record of allocation %s: %w", id, err)
		}
	case snap.State == Pending:
	default:
		if err := l.store.write(&snap); err != nil {
			return fmt.Errorf("persist allocation %s: %w", id, err)
		}
	}
	return nil
}

// Rescan reads the records that could not be read again (an operator
// repaired or removed them). It returns the allocations that are readable
// now, recorded in the ledger, for the caller to serve.
func (l *Ledger) Rescan() []Allocation {
	l.mu.Lock()
	ids := make([]string, 0, len(l.broken))
	for id := range l.broken {
		ids = append(ids, id)
	}
	l.mu.Unlock()
	slices.Sort(ids)
	var back []Allocation
	for _, id := range ids {
		if id == "" {
			continue
		}
		a, err := l.store.read(id)
		l.mu.Lock()
		switch {
		case errors.Is(err, os.ErrNotExist):
			delete(l.broken, id)
		case err != nil:
			l.broken[id] = err
		default:
			if err := l.conflictLocked(a); err != nil {
				l.broken[id] = fmt.Errorf("%s: %w", l.store.path(id), err)
				break
			}
			delete(l.broken, id)
			l.insertLocked(a)
			back = append(back, cloneAlloc(a))
		}
		l.mu.Unlock()
	}
	return back
}

// conflictLocked refuses a record that claims what others hold.
func (l *Ledger) conflictLocked(a *Allocation) error {
	if l.allocs[a.ID] != nil {
		return fmt.Errorf("allocation %s exists", a.ID)
	}
	for _, q := range a.Queues {
		if h := l.held[queue{a.Netdev, q}]; h != "" {
			return fmt.Errorf("queue %d of %s is held by allocation %s", q, a.Netdev, h)
		}
	}
	for _, att := range a.Attachments {
		if h := l.atts[att.Key()]; h != "" {
			return fmt.Errorf("attachment %s belongs to allocation %s", att.Key(), h)
		}
	}
	return nil
}
