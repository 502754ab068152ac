package daemon

import (
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdpq/xdpq/pkg/config"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/nic"
)

// core owns the node's allocations and attachments over the ledger, the
// broker, the node agent and the mover: it reserves and serves
// allocations, makes and undoes attachments, frees, recovers what a
// previous daemon left, keeps the netdevs as the config says, and
// reports the state. The faces (the device plugin, DRA, NRI, the local
// API's CNI verbs, the flows annotation, the XdpqNode writer) call down
// into it; it calls none of them back, but tells them what changed
// through subscribe.
type core struct {
	opts    *Options // the daemon's
	log     *slog.Logger
	ledger  *ledger.Ledger
	watcher *config.Watcher
	agent   netdevAgent // the node's netdevs
	broker  socketBroker
	mover   netdevMover
	kubelet podResources
	// discover lists the node's netdevs (nic.Discoverer; a fake in the
	// decision tests).
	discover func() ([]nic.Netdev, error)
	// nodeAddrs says which of the addresses asked a netdev of the
	// NICs' network namespace holds, and which netdev (nic.Holders;
	// a fake in the decision tests).
	nodeAddrs func([]netip.Addr) (map[netip.Addr]string, error)
	pods      *podNetdevs // netdev-mode netdevs in pods, by node name
	// rec is the reconciler: the netdevs found, the config in force.
	rec *reconciler
	// recovered is set once start has finished what a previous daemon
	// left: then the device plugins start.
	recovered atomic.Bool
	// ready is closed once the daemon serves (Daemon.Ready).
	ready chan struct{}
	// waitingHook, if set (by tests), is called each time whenIdle is
	// about to wait for an operation under way.
	waitingHook func()
	// subs are told of changes (subscribe); set before Run.
	subs []func(change)

	mu        sync.Mutex       // guards the fields below; never held across a call out
	retry     map[string]error // allocations and attachments a failed undo left, and why (retryLater)
	ifindexes map[string]int   // each node netdev's ifindex as retargetRecreated last saw it
	collected time.Time        // when the collector last finished
	// uninstalling is set when uninstall begins: nothing new is served.
	// uninstalled is set when it removed everything but the files, which
	// close removes.
	uninstalling, uninstalled bool
}

// A change is what the core tells its subscribers.
type change struct {
	kind changeKind
	// alloc is the allocation unserved or freed.
	alloc ledger.Allocation
}

type changeKind int

const (
	// netdevsChanged: a netdev's state, or its devices' health, changed
	// (the node agent or a pod's agent saw it).
	netdevsChanged changeKind = iota
	// poolsChanged: the config in force was applied again, or recovery
	// finished; the pools and how each is served may differ.
	poolsChanged
	// allocationUnserved: an allocation is no longer served (freed,
	// replaced by kubelet's Allocate for a restarted container, or its
	// record dropped); alloc says which.
	allocationUnserved
	// allocationFreed: an allocation was freed; alloc says which.
	allocationFreed
	// configApplied: the config watcher's config was put in force (or
	// refused by the reconciler), and unreadable records read again.
	configApplied
)

// subscribe has f told every change, in the goroutine that made it: f
// must not block, nor call back into the core.
func (c *core) subscribe(f func(change)) { c.subs = append(c.subs, f) }

// publish tells the subscribers a change.
func (c *core) publish(ch change) {
	for _, f := range c.subs {
		f(ch)
	}
}

// devicesChanged is the agents' OnChange: a netdev re-created under its
// name is served by its new ifindex, and the subscribers are told.
func (c *core) devicesChanged() {
	c.retargetRecreated()
	c.publish(change{kind: netdevsChanged})
}

// started reports whether start has finished (Ready is closed).
func (c *core) started() bool {
	select {
	case <-c.ready:
		return true
	default:
		return false
	}
}

// setCollected records when the collector last finished (Status says).
func (c *core) setCollected(t time.Time) {
	c.mu.Lock()
	c.collected = t
	c.mu.Unlock()
}
