package daemon

import (
	"context"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/apis/xdpq/v1alpha1"
	"github.com/xdpq/xdpq/pkg/broker"
	"github.com/xdpq/xdpq/pkg/nodestatus"
)

// nodeReporter is what the daemon tells the cluster of its node: the
// XdpqNode's status, from the daemon's (Changed says it may have
// changed), and Events. pkg/nodestatus is the one with an API server;
// without one the daemon tells nothing. No method blocks.
type nodeReporter interface {
	Run(ctx context.Context) error
	Changed()
	NetdevOverridden(netdev, program string, id uint32)
	NetdevReclaimed(netdev, state string)
	ConfigRefused(err error)
	ConnectionRefused(alloc string, pod v1alpha1.PodRef, code, reason string)
	PodFlows(pod v1alpha1.PodRef, alloc string, flows []string, refused string)
	// Delete deletes the node's XdpqNode (xdpq uninstalled); after Run.
	Delete(ctx context.Context) error
}

var _ nodeReporter = (*nodestatus.Writer)(nil)

// noReporter is the reporter without an API server.
type noReporter struct{}

func (noReporter) Run(ctx context.Context) error                             { <-ctx.Done(); return nil }
func (noReporter) Changed()                                                  {}
func (noReporter) NetdevOverridden(string, string, uint32)                   {}
func (noReporter) NetdevReclaimed(string, string)                            {}
func (noReporter) ConfigRefused(error)                                       {}
func (noReporter) ConnectionRefused(string, v1alpha1.PodRef, string, string) {}
func (noReporter) PodFlows(v1alpha1.PodRef, string, []string, string)        {}
func (noReporter) Delete(context.Context) error                              { return nil }

// newNodeReporter is the writer of the node's XdpqNode when the daemon
// has an API server.
func (d *Daemon) newNodeReporter() nodeReporter {
	if d.opts.Kube == nil {
		return noReporter{}
	}
	return nodestatus.New(nodestatus.Config{Node: d.opts.NodeName, Nodes: d.opts.Kube.Nodes, Events: d.opts.Kube.Events, Dynamic: d.opts.Kube.Dynamic,
		Source: d.nodeStatus, Serving: d.core.started, Logger: d.log})
}

// nodeStatus is what the XdpqNode's status is made of: the daemon's
// status and every allocation.
func (d *Daemon) nodeStatus(ctx context.Context) (*api.Status, *api.AllocationList, error) {
	s, err := d.core.Status(ctx)
	if err != nil {
		return nil, nil, err
	}
	l, err := d.core.Allocations(ctx, "")
	if err != nil {
		return nil, nil, err
	}
	return s, l, nil
}

// reportNetdevs runs while the daemon does: each time an agent reports a
// netdev's change it has the Events of hooks changing hands told
// (nodestatus.Hooks) and the status written. One goroutine compares, so
// each transition is told once.
func (d *Daemon) reportNetdevs(ctx context.Context) error {
	var hooks nodestatus.Hooks
	for {
		var now []nodestatus.Hook
		for _, s := range d.core.netdevStatus() {
			now = append(now, nodestatus.Hook{Netdev: s.Netdev, State: string(s.State), Program: uint32(s.Program), Foreign: s.Foreign})
		}
		hooks.Observe(now, d.node)
		d.node.Changed()
		select {
		case <-ctx.Done():
			return nil
		case <-d.netdevsChanged:
		}
	}
}

// signalNetdevs tells reportNetdevs that a netdev changed; it never blocks.
func (d *Daemon) signalNetdevs() {
	select {
	case d.netdevsChanged <- struct{}{}:
	default:
	}
}

// onRefuse records the Event of a connection the broker refused, naming
// the peer's pod when an allocation's attachment names it.
func (d *Daemon) onRefuse(alloc string, peer broker.Peer, code, reason string) {
	pod := v1alpha1.PodRef{UID: peer.Pod.PodUID}
	if pod.UID != "" {
		for _, a := range d.core.ledger.Allocations() {
			if a.Owner.PodUID != pod.UID {
				continue
			}
			for _, att := range a.Attachments {
				if att.PodName != "" {
					pod.Namespace, pod.Name = att.PodNamespace, att.PodName
				}
			}
		}
	}
	if pod.UID != "" && pod.Name == "" && d.opts.Pods != nil {
		if p, ok := d.opts.Pods.Cached(pod.UID); ok {
			pod.Namespace, pod.Name = p.Namespace, p.Name
		}
	}
	d.node.ConnectionRefused(alloc, pod, code, reason)
}
