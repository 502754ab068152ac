package daemon

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netns"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/mover"
	"github.com/xdpq/xdpq/pkg/wire"
	"github.com/xdpq/xdpq/pkg/xsk"
)

// The daemon meets the kernel-facing packages through these interfaces,
// defined here where they are used and kept to what it calls:
// pkg/agent, pkg/broker and pkg/mover implement them.

// netdevAgent keeps netdevs to a policy: the node's agent, and the agent
// of each netdev in a pod.
type netdevAgent interface {
	Set(netdev string, p agent.Policy) error
	Unmanage(netdev string) error
	Status() []agent.Status
	Run(ctx context.Context) error
	// Listening is closed once Run follows link notifications.
	Listening() <-chan struct{}
	Close() error
	Collector() prometheus.Collector
	// Ifindex is the managed netdev's ifindex now: a netdev re-created
	// under its name has a new one.
	Ifindex(netdev string) (int, bool)
	flowSteerer
}

// flowSteerer steers CNI attachments' flows onto their queues.
type flowSteerer interface {
	Steer(netdev, owner string, flows []agent.Flow) error
	Unsteer(netdev, owner string) error
	VerifySteering(netdev, owner string) error
	// RepairSteering puts back the flows gone from the kernel;
	// EnsureSteering installs those of flows the owner does not hold.
	RepairSteering(netdev string) (map[string]int, error)
	EnsureSteering(netdev, owner string, flows []agent.Flow) (int, error)
	// SyncSteering keeps the flows in keep and removes every other;
	// AdoptSteering keeps them and leaves every other in place.
	SyncSteering(netdev string, keep map[string][]agent.Flow) (removed int, err error)
	AdoptSteering(netdev string, keep map[string][]agent.Flow) (unknown int, err error)
}

// socketBroker serves the allocations' sockets.
type socketBroker interface {
	Add(a broker.Allocation) error
	Remove(id string) error
	Retarget(id string, dev xsk.Netdev, own broker.PodDatapath) error
	SetOwner(id string, o broker.Owner) error
	SetLimits(id string, l wire.Limits, bp *wire.BusyPoll) error
	Leased(id string) bool
	Holder(id string) (broker.Peer, bool)
	Stats() []broker.QueueStats
	Refusals() map[string]uint64
	Close()
}

// netdevMover moves a netdev-mode pool's netdevs into pods and back.
type netdevMover interface {
	Prepare(netdev, ifname string, mtu int) (mover.Record, error)
	MoveIn(r mover.Record, pod netns.NsHandle) (mover.Link, error)
	MoveOut(ctx context.Context, r mover.Record, pod netns.NsHandle) error
	Recover(ctx context.Context, r mover.Record, pod netns.NsHandle) (mover.Location, error)
	Close() error
}

var (
	_ netdevAgent  = (*agent.Agent)(nil)
	_ socketBroker = (*broker.Server)(nil)
	_ netdevMover  = (*mover.Mover)(nil)
)

// kubelet asks kubelet's PodResources API at its socket which devices
// containers hold.
// podResources is kubelet's PodResources API as the daemon asks it.
type podResources interface {
	// heldDevices are the devices running containers hold, as
	// "<resource>/<device id>".
	heldDevices(ctx context.Context) (map[string]bool, error)
	// podDevices are the device IDs a pod's containers hold, by resource.
	podDevices(ctx context.Context, namespace, name string) (map[string][]string, error)
}
