package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/agent"
	"github.com/xdpq/xdpq/pkg/api"
)

// TestVerifyDecisions: CNI CHECK of an attachment, as the core answers
// it from what the node agent reports. A netdev that is gone or whose
// hook a foreign program holds is the node's state, which may pass:
// unavailable, naming the state and why, never the daemon's internal
// error; flows the agent no longer has fail the check; an attachment
// the daemon never made is not found. Once the netdev is back, the same
// attachment checks out again. A decision of the core on a fake node;
// TestCNICheckNetdevMissing deletes a real veth.
func TestVerifyDecisions(t *testing.T) {
	for _, c := range []struct {
		name  string
		state agent.Status // what the agent reports of xa
		lost  bool         // the agent lost the attachment's flows
		ref   api.AttachmentRef
		kind  error
		says  string // "" checks out
	}{
		{name: "steered"},
		{name: "xa steered by its program", state: agent.Status{State: agent.StateFilter}},
		{name: "xa gone", state: agent.Status{State: agent.StateMissing, Reason: "link not found"},
			kind: api.ErrUnavailable, says: "netdev xa is Missing: link not found"},
		{name: "a foreign program on xa", state: agent.Status{State: agent.StateOverridden, Reason: "program 42 (fw) attached"},
			kind: api.ErrUnavailable, says: "netdev xa is Overridden: program 42 (fw) attached"},
		{name: "flows lost", lost: true, says: "not installed"},
		{name: "never attached", ref: api.AttachmentRef{ContainerID: "c9", IfName: "net1"}, kind: api.ErrNotFound,
			says: "no attachment of container c9 interface net1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newFakeNode(t, fakeNetdev("xa", 4))
			d := n.started("pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n")
			ctx := context.Background()
			a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 1, UID: 1000})
			if err != nil {
				t.Fatal(err)
			}
			pod := netip.MustParseAddr("10.77.0.4")
			if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID,
				Addresses: []netip.Addr{pod}, Flows: []api.CNIFlow{{Protocol: "udp", Dst: netip.PrefixFrom(pod, 32), DstPort: 2152}}}); err != nil {
				t.Fatal(err)
			}
			ref := c.ref
			if ref == (api.AttachmentRef{}) {
				ref = api.AttachmentRef{ContainerID: "c1", IfName: "net1"}
			}
			n.agent.mu.Lock()
			if c.state.State != "" {
				n.agent.state = map[string]agent.Status{"xa": c.state}
			}
			if c.lost {
				delete(n.agent.flows["xa"], "c1/net1")
			}
			n.agent.mu.Unlock()

			att, err := d.local.CNICheck(ctx, ref)
			switch {
			case c.says == "" && err != nil:
				t.Fatalf("CHECK: %v", err)
			case c.says == "":
				if att.AllocationID != a.ID || len(att.Flows) != 1 {
					t.Errorf("CHECK reports %+v", att)
				}
				return
			case c.kind != nil && !errors.Is(err, c.kind), !strings.Contains(fmt.Sprint(err), c.says):
				t.Fatalf("CHECK: %v (code %s); want %v saying %q", err, api.CodeOf(err), c.kind, c.says)
			case c.kind == nil && api.CodeOf(err) != api.CodeInternal:
				t.Errorf("CHECK: %v is %s; want the daemon's own failure", err, api.CodeOf(err))
			}
			if c.state.State == "" {
				return
			}
			// The node's state passes: the attachment is as it was.
			n.agent.mu.Lock()
			n.agent.state = nil
			n.agent.mu.Unlock()
			if _, err := d.local.CNICheck(ctx, ref); err != nil {
				t.Errorf("CHECK once xa is back: %v", err)
			}
		})
	}
}
