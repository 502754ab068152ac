package agent

import "time"

// SetClock makes the agent read the time of linger periods from now.
func SetClock(a *Agent, now func() time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.now = now
}

// ReconcileNow runs the periodic resync's reconcile of every netdev now,
// and returns when it is done.
func (a *Agent) ReconcileNow() { a.reconcileAll(true) }
