package daemon

import (
	"slices"

	"github.com/xdpq/xdpq/pkg/agent"
)

// retargetRecreated moves the allocations of every node netdev that was
// re-created under its name since the last call (the node agent manages
// it under a new ifindex: a driver reload, a VF re-made) to the new
// netdev: the broker closes their connections, whose sockets were bound
// to the netdev that went and never receive again, and each pod's next
// lease binds to the new one; the flows the netdev lost are installed
// again. The agent's status changes when a netdev
// goes and comes back, so devicesChanged calls this.
func (c *core) retargetRecreated() {
	var recreated []string
	for _, s := range c.agent.Status() {
		if s.State == agent.StateMissing {
			continue // its ifindex is the one that went
		}
		c.mu.Lock()
		was, known := c.ifindexes[s.Netdev]
		c.ifindexes[s.Netdev] = s.Ifindex
		c.mu.Unlock()
		if known && was != s.Ifindex {
			recreated = append(recreated, s.Netdev)
		}
	}
	if len(recreated) == 0 {
		return
	}
	// A NIC's reset takes its ntuple rules: the attachments' flows are
	// installed again (the filter's, in pinned maps, are there still).
	c.syncSteering(false, recreated...)
	for _, a := range c.ledger.Allocations() {
		if !slices.Contains(recreated, a.Netdev) || c.pods.get(a.Netdev) != nil {
			continue // a netdev in a pod has an agent of its own
		}
		dev := c.nodeNetdev(a.Netdev)
		if err := c.broker.Retarget(a.ID, dev, nil); err != nil {
			c.log.Warn("allocation not moved to its re-created netdev", "allocation", a.ID, "netdev", a.Netdev, "err", err)
			continue
		}
		c.log.Info("allocation moved to its re-created netdev: its pod leases anew", "allocation", a.ID, "netdev", a.Netdev, "ifindex", dev.Ifindex)
	}
}
