// The agent's steering calls: each takes the netdev, then works on its
// flows (ntuple rules or the filter program's map) without the agent's
// lock.

package agent

import (
	"fmt"
	"maps"
	"slices"
)

// withSteering runs f on the netdev's steering with its token held,
// outside the agent's lock, and records the counts Status reports.
func (a *Agent) withSteering(name, op string, f func(s *steering) error) error {
	d := a.takeUnlocked(name)
	if d == nil {
		return fmt.Errorf("%s: %s is not managed", op, name)
	}
	err := f(d.steer)
	a.mu.Lock()
	d.flows, d.unknown = d.steer.count(), len(d.steer.unknown)
	a.mu.Unlock()
	a.release(d)
	return err
}

// Steer installs the owner's flows on the netdev, all or none: ntuple
// rules in the policy's rule range with hardware steering, entries of the
// filter program's flow map with software steering. A flow that overlaps
// another owner's is refused with an error that names that owner.
func (a *Agent) Steer(name, owner string, flows []Flow) error {
	return a.withSteering(name, "steer", func(s *steering) error { return s.add(owner, flows) })
}

// Unsteer removes every flow of the owner from the netdev.
func (a *Agent) Unsteer(name, owner string) error {
	return a.withSteering(name, "unsteer", func(s *steering) error { return s.removeOwner(owner) })
}

// VerifySteering checks, against the NIC's rules or the filter's flow
// map, that every flow of the owner is installed on the netdev.
func (a *Agent) VerifySteering(name, owner string) error {
	return a.withSteering(name, "verify steering", func(s *steering) error { return s.verify(owner) })
}

// RepairSteering puts back the flows of the netdev's owners that are
// gone from the kernel (the NIC's rules, the filter's flow map) where
// xdpq put them, says so in the log, and returns how many of each
// owner's it put back. The daemon runs it on each of its reconciles: a
// flow deleted behind its back stops its pod's traffic, and nothing else
// would notice.
func (a *Agent) RepairSteering(name string) (map[string]int, error) {
	var back map[string]int
	err := a.withSteering(name, "repair steering", func(s *steering) (err error) {
		back, err = s.repair()
		return err
	})
	for _, owner := range slices.Sorted(maps.Keys(back)) {
		a.log.Warn("put back flows that were gone from the kernel", "netdev", name, "owner", owner, "count", back[owner])
	}
	return back, err
}

// EnsureSteering has owner hold every one of flows on the netdev,
// installing those it does not hold (all or none), and returns how many
// it installed. With SyncSteering or AdoptSteering, which take the flows
// found installed, and RepairSteering, which puts back those held and
// gone from the kernel, it is how a restarted daemon brings its
// attachments' flows back whole.
func (a *Agent) EnsureSteering(name, owner string, flows []Flow) (added int, err error) {
	err = a.withSteering(name, "ensure steering", func(s *steering) (err error) {
		added, err = s.ensure(owner, flows)
		return err
	})
	return added, err
}

// SyncSteering is for a restarted daemon, or one that can read all its
// records again: it takes ownership of the flows in keep that are
// installed (for owners it does not know; those it knows keep theirs),
// and removes every other flow xdpq installed on the netdev (its rules in
// the policy's range, its flow map entries). It returns how many it
// removed.
func (a *Agent) SyncSteering(name string, keep map[string][]Flow) (removed int, err error) {
	err = a.withSteering(name, "sync steering", func(s *steering) (err error) {
		removed, err = s.sync(keep, false)
		return err
	})
	if removed > 0 {
		a.log.Info("removed stale flows", "netdev", name, "count", removed)
	}
	return removed, err
}

// AdoptSteering is SyncSteering for a daemon that could not read all of
// its state: it takes ownership of the flows in keep that are installed
// and leaves every other flow xdpq installed in place, owned by no one.
// It returns how many such unknown flows remain (Status.UnknownFlows
// too). They keep their rule locations, a new flow that overlaps one is
// refused, and the steering cannot change kind, until a SyncSteering
// that knows every owner removes them.
func (a *Agent) AdoptSteering(name string, keep map[string][]Flow) (unknown int, err error) {
	err = a.withSteering(name, "adopt steering", func(s *steering) (err error) {
		_, err = s.sync(keep, true)
		unknown = len(s.unknown)
		return err
	})
	if unknown > 0 {
		a.log.Warn("flows of unknown owners left in place", "netdev", name, "count", unknown)
	}
	return unknown, err
}
