package daemon

import (
	"slices"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/config"
)

// policyFor is how the agent manages a netdev of pool p: the one place a
// pool's settings become a netdev's policy. reserved are the queues to
// keep RSS off (every pool's on the netdev).
func policyFor(p config.Pool, reserved []uint32) agent.Policy {
	pol := agent.Policy{
		Steering:     agent.Steering(p.Steering),
		AttachAlways: p.Attach == "always",
		Exclusive:    p.Exclusive,
		Linger:       p.Linger.Duration,
		BusyPoll:     p.BusyPoll != nil,
	}
	if pol.Steering != agent.SteerSoftware {
		pol.Reserved = slices.Clone(reserved)
	}
	return pol
}

// podPolicy is how a netdev-mode pool's netdev is managed inside its
// pod: the pool's policy, and with no flows the direct program (every
// frame of a queue with a socket goes to it: the netdev is the pod's).
// Once its XSKMAP was handed to the pod (mapOut), the program stays
// attached: the agent cannot see the sockets the pod inserts.
func podPolicy(p config.Pool, flows, mapOut bool) agent.Policy {
	pol := policyFor(p, nil)
	if !flows {
		pol.Steering = agent.SteerHardware
	}
	pol.AttachAlways = pol.AttachAlways || mapOut
	return pol
}

func policyEqual(a, b agent.Policy) bool {
	return a.Steering == b.Steering && a.Rules == b.Rules && slices.Equal(a.Reserved, b.Reserved) && a.Mode == b.Mode &&
		a.AttachAlways == b.AttachAlways && a.Exclusive == b.Exclusive && a.Linger == b.Linger && a.BusyPoll == b.BusyPoll
}
