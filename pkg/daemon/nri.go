package daemon

import (
	"context"
	"time"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/dra"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/nri"
)

// A netdev-mode pool served by DRA moves its netdev into the pod with
// the pod's sandbox: pkg/nri's Sandboxes is that face, and nriCore the
// daemon as it sees it.

// nriRetry is how long the NRI plugin waits before it connects again.
const nriRetry = 2 * time.Second

// nriLoop runs the daemon's NRI plugin.
func (d *Daemon) nriLoop(ctx context.Context) error {
	return nri.Run(ctx, d.opts.DRA.NRISocket, nri.NewSandboxes(nriCore{ownAttachments{d}}), d.log, nriRetry, nil)
}

// nriCore is the daemon as the NRI face (nri.Sandboxes) sees it.
type nriCore struct{ ownAttachments }

// NetdevClaims are the allocations of netdev-mode claims of pod uid.
func (c nriCore) NetdevClaims(uid string) []nri.Claim {
	var out []nri.Claim
	for _, a := range c.d.core.ledger.Allocations() {
		if a.Claim == nil || a.Owner.PodUID != uid || a.State != ledger.Active {
			continue
		}
		if p, ok := c.d.core.ledger.Meta(a.Pool); !ok || p.Mode() != api.ModeNetdev {
			continue
		}
		nc := nri.Claim{Allocation: a.ID, Name: a.Claim.Namespace + "/" + a.Claim.Name, Netdev: a.Netdev}
		ic, err := dra.ClaimInterface(a)
		if err == nil {
			nc.Flows, _, err = dra.ClaimNetdevFlows(a, ic)
		}
		nc.Interface, nc.MTU, nc.Prefixes, nc.Err = ic.Name, ic.MTU, ic.Prefixes(), err
		out = append(out, nc)
	}
	return out
}

func (c nriCore) Sandboxes() []api.AttachmentRef {
	var out []api.AttachmentRef
	for _, att := range c.d.core.ledger.Attachments() {
		if nri.IsSandbox(att.ContainerID) {
			out = append(out, api.AttachmentRef{ContainerID: att.ContainerID, IfName: att.IfName})
		}
	}
	return out
}

func (c nriCore) Moved() { c.d.dra.Changed() } // the claims' networkData

// claimNetwork is where a claim's netdev is in its pod, nil when it is
// not there.
func claimNetwork(a ledger.Allocation) *dra.Network {
	for _, att := range a.Attachments {
		if !nri.IsSandbox(att.ContainerID) || att.State != ledger.Active {
			continue
		}
		n := &dra.Network{InterfaceName: att.IfName, HardwareAddress: att.Mac}
		if ic, err := dra.ClaimInterface(a); err == nil {
			n.IPs = ic.Addresses
		}
		return n
	}
	return nil
}
