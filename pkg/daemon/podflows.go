package daemon

import (
	"context"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/ledger"
	"github.com/xdpq/xdpq/pkg/podflows"
)

// ownAttachments are the CNI verbs of the attachments the daemon makes
// itself (a pod's annotated flows, a claim's netdev in its sandbox), as
// the faces that make them ask for them.
type ownAttachments struct{ d *Daemon }

func (c ownAttachments) Add(ctx context.Context, req api.CNIAddRequest) error {
	_, err := c.d.local.AddOwn(ctx, req)
	return err
}

func (c ownAttachments) Del(ctx context.Context, ref api.AttachmentRef) error {
	return c.d.core.del(ctx, ref)
}

// podFlowsCore is the daemon as the flows annotation's face
// (pkg/podflows) sees it: the pod's allocations, and the CNI verbs for
// the daemon's own attachments.
type podFlowsCore struct{ ownAttachments }

func (c podFlowsCore) PodAllocations(uid string) []podflows.Allocation {
	var out []podflows.Allocation
	for _, a := range c.d.core.ledger.Allocations() {
		if a.Owner.PodUID != uid {
			continue
		}
		p, _ := c.d.core.ledger.Meta(a.Pool)
		pa := podflows.Allocation{ID: a.ID, Pool: a.Pool, Netdev: p.Mode() == api.ModeNetdev, Shared: p.Config.SharedPrefixes()}
		if a.Claim != nil {
			pa.Claim, pa.ClaimFlows = a.Claim.Namespace+"/"+a.Claim.Name, a.Claim.Flows
		}
		key := podflows.Ref(uid, a.Pool)
		var att ledger.Attachment
		if att, pa.Attached = c.d.core.ledger.Attachment(key.ContainerID + "/" + key.IfName); pa.Attached {
			pa.Flows = att.Flows
		}
		out = append(out, pa)
	}
	return out
}
