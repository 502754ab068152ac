package nodestatus

import "github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"

// Hook is a netdev's XDP hook as the node agent reports it: its state
// (the agent's words: None, Direct, Filter, Overridden, Missing), the
// program on it and, when Overridden, the foreign program's name.
type Hook struct {
	Netdev  string
	State   string
	Program uint32
	Foreign string
}

// HookEvents are the Events of netdevs' hooks changing hands
// (Writer's).
type HookEvents interface {
	NetdevOverridden(netdev, program string, id uint32)
	NetdevReclaimed(netdev, state string)
}

// Hooks finds, in each report of the netdevs' hooks, a foreign program
// taking a netdev's hook over (or another foreign program replacing it)
// and xdpq's coming back once it left, and tells each transition once. A
// netdev gone (Missing) is not a return. One goroutine calls Observe.
type Hooks struct {
	last map[string]Hook
}

// Observe compares hooks with the previous report and tells events the
// transitions.
func (h *Hooks) Observe(hooks []Hook, events HookEvents) {
	if h.last == nil {
		h.last = map[string]Hook{}
	}
	for _, now := range hooks {
		prev, seen := h.last[now.Netdev]
		h.last[now.Netdev] = now
		overridden := string(v1alpha1.StateOverridden)
		switch {
		case now.State == overridden && (!seen || prev.State != now.State || prev.Program != now.Program):
			events.NetdevOverridden(now.Netdev, now.Foreign, now.Program)
		case seen && prev.State == overridden && now.State != overridden && now.State != string(v1alpha1.StateMissing):
			events.NetdevReclaimed(now.Netdev, string(programState(now.State)))
		}
	}
}
