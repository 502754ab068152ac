package nodestatus

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/xdpq/xdpq"
	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
	"github.com/xdpq/xdpq/pkg/flow"
)

// Condition reasons.
const (
	ReasonServing       = "Serving"
	ReasonStarting      = "Starting"
	ReasonStopped       = "DaemonStopped"
	ReasonInForce       = "InForce"
	ReasonRefused       = "Refused"
	ReasonAsExpected    = "AsExpected"
	ReasonOverridden    = "NetdevOverridden"
	ReasonMissing       = "NetdevMissing"
	ReasonLinkDown      = "LinkDown"
	ReasonPolicy        = "PolicyNotApplied"
	ReasonRecords       = "RecordsUnreadable"
	ReasonPoolLimited   = "PoolLimited"
	shortHashLen        = 12
	maxConditionMessage = 32768 // metav1.Condition's limit
)

// Convert turns the daemon's status and its allocations (l, nil for
// none) into the XdpqNode's. serving says
// whether the daemon serves yet or still takes over from a previous one
// (the Ready condition); prev are the conditions
// last written, whose transition times stay where a condition's status
// did not change; now is the time of a transition.
func Convert(s *api.Status, l *api.AllocationList, serving bool, prev []metav1.Condition, now time.Time) v1alpha1.XdpqNodeStatus {
	if l == nil {
		l = &api.AllocationList{}
	}
	var out v1alpha1.XdpqNodeStatus
	var degraded []string
	var degradedReason string
	degrade := func(reason, msg string) {
		if degradedReason == "" {
			degradedReason = reason
		}
		degraded = append(degraded, msg)
	}
	for _, n := range s.Netdevs {
		nd := v1alpha1.Netdev{Name: n.Netdev, Driver: n.Driver, PCIAddress: n.PCI, NUMANode: int32(n.NUMANode),
			State: programState(n.State), ProgramID: n.Program, ZeroCopy: n.ZeroCopy, Queues: int32(n.RXQueues),
			Steering: n.Steering, Flows: int32(n.Flows), LinkUp: n.LinkUp, Reason: n.Reason}
		if n.Mode != "none" {
			nd.XDPMode = n.Mode
		}
		switch nd.State {
		case v1alpha1.StateDirect:
			nd.ProgramName = "xdpq_direct"
		case v1alpha1.StateFilter:
			nd.ProgramName = "xdpq_filter"
		case v1alpha1.StateOverridden:
			nd.ProgramName, nd.ForeignProgram = n.Foreign, n.Foreign
		}
		for _, q := range n.Reserved {
			nd.ReservedQueues = append(nd.ReservedQueues, int32(q))
		}
		if n.PolicyError != "" {
			nd.Reason = strings.TrimPrefix(nd.Reason+"; "+n.PolicyError, "; ")
		}
		out.Netdevs = append(out.Netdevs, nd)
		switch {
		case nd.State == v1alpha1.StateOverridden:
			out.Summary.Overridden++
			degrade(ReasonOverridden, fmt.Sprintf("netdev %s: foreign program %q has precedence", n.Netdev, n.Foreign))
		case nd.State == v1alpha1.StateMissing:
			degrade(ReasonMissing, fmt.Sprintf("netdev %s is missing", n.Netdev))
		case !n.LinkUp:
			degrade(ReasonLinkDown, fmt.Sprintf("netdev %s: link down", n.Netdev))
		}
		if n.PolicyError != "" {
			degrade(ReasonPolicy, fmt.Sprintf("netdev %s: %s", n.Netdev, n.PolicyError))
		}
	}
	slices.SortFunc(out.Netdevs, func(a, b v1alpha1.Netdev) int { return strings.Compare(a.Name, b.Name) })
	out.Summary.Netdevs = int32(len(out.Netdevs))

	for _, p := range s.Pools {
		pl := v1alpha1.Pool{Name: p.Name, Resource: p.Resource, Capacity: int32(p.Queues), Allocated: int32(max(p.Queues-p.Free, 0)), Reason: p.Reason}
		out.Pools = append(out.Pools, pl)
		out.Summary.QueuesTotal += pl.Capacity
		out.Summary.QueuesAllocated += pl.Allocated
		if p.Reason != "" {
			degrade(ReasonPoolLimited, fmt.Sprintf("pool %s: %s", p.Name, p.Reason))
		}
	}
	slices.SortFunc(out.Pools, func(a, b v1alpha1.Pool) int { return strings.Compare(a.Name, b.Name) })
	out.Summary.Queues = fmt.Sprintf("%d/%d", out.Summary.QueuesAllocated, out.Summary.QueuesTotal)
	out.Summary.Version = xdpq.Version()

	flows := map[string][]string{}
	for _, att := range l.Attachments {
		for _, f := range att.Flows {
			flows[att.AllocationID] = append(flows[att.AllocationID], flow.Format(f))
		}
	}
	for _, a := range l.Allocations {
		al := v1alpha1.Allocation{ID: a.ID, Pool: a.Pool, Netdev: a.Netdev, Queues: []int32{}, LeaseConnected: len(a.Lease) > 0, Claim: a.Claim}
		for _, q := range a.Queues {
			al.Queues = append(al.Queues, int32(q))
		}
		if a.PodUID != "" || a.Pod != "" {
			ns, name, _ := strings.Cut(a.Pod, "/")
			al.Pod = &v1alpha1.PodRef{Namespace: ns, Name: name, UID: a.PodUID}
		}
		al.Flows = flows[a.ID]
		out.Allocations = append(out.Allocations, al)
	}
	slices.SortFunc(out.Allocations, func(a, b v1alpha1.Allocation) int { return strings.Compare(a.ID, b.ID) })
	out.Summary.Allocations = int32(len(out.Allocations))

	out.Config = v1alpha1.Config{Hash: s.Config.Hash, LastError: s.ConfigError}
	if !s.Config.Loaded.IsZero() {
		// Seconds: what the API server keeps, so that a status read back
		// compares equal.
		out.Config.LastGoodReload = metav1.NewTime(s.Config.Loaded.Truncate(time.Second))
	}
	out.Summary.Config = s.Config.Hash[:min(len(s.Config.Hash), shortHashLen)]
	if s.ConfigError != "" {
		out.Summary.Config += " (refused newer)"
	}
	for _, e := range s.StateErrors {
		degrade(ReasonRecords, e)
	}

	out.Conditions = slices.Clone(prev)
	set := func(typ string, ok bool, reason, msg string) {
		st := metav1.ConditionFalse
		if ok {
			st = metav1.ConditionTrue
		}
		if len(msg) > maxConditionMessage {
			msg = msg[:maxConditionMessage-3] + "..."
		}
		meta.SetStatusCondition(&out.Conditions, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg,
			LastTransitionTime: metav1.NewTime(now.Truncate(time.Second))})
	}
	if serving {
		set(v1alpha1.ConditionReady, true, ReasonServing, "the daemon serves its pools")
	} else {
		set(v1alpha1.ConditionReady, false, ReasonStarting, "the daemon is taking over what a previous one left")
	}
	if s.ConfigError == "" {
		set(v1alpha1.ConditionConfigValid, true, ReasonInForce, "the config file is in force")
	} else {
		set(v1alpha1.ConditionConfigValid, false, ReasonRefused, s.ConfigError)
	}
	if len(degraded) == 0 {
		set(v1alpha1.ConditionDegraded, false, ReasonAsExpected, "every netdev runs as its pool asks")
	} else {
		set(v1alpha1.ConditionDegraded, true, degradedReason, strings.Join(degraded, "; "))
	}
	slices.SortFunc(out.Conditions, func(a, b metav1.Condition) int { return strings.Compare(a.Type, b.Type) })
	return out
}

// programState maps the agent's state to the resource's: "None" is Idle.
func programState(s string) v1alpha1.ProgramState {
	switch st := v1alpha1.ProgramState(s); st {
	case v1alpha1.StateDirect, v1alpha1.StateFilter, v1alpha1.StateOverridden, v1alpha1.StateMissing:
		return st
	default:
		return v1alpha1.StateIdle
	}
}

// urgent reports whether next differs from prev in more than what pod
// churn changes (allocations, pools' allocated counts, flow counts): then
// it is written without waiting for MinInterval.
func urgent(prev, next *v1alpha1.XdpqNodeStatus) bool {
	return !equalStatus(churnless(prev), churnless(next))
}

// churnless is s without what pod churn changes.
func churnless(s *v1alpha1.XdpqNodeStatus) *v1alpha1.XdpqNodeStatus {
	c := s.DeepCopy()
	c.Allocations = nil
	c.Summary.Allocations, c.Summary.QueuesAllocated, c.Summary.Queues = 0, 0, ""
	for i := range c.Pools {
		c.Pools[i].Allocated = 0
	}
	for i := range c.Netdevs {
		c.Netdevs[i].Flows = 0
	}
	return c
}
