package daemon

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
)

// TestNodeAddressRefused: on veth, a real daemon refuses an ADD that
// names an address of the node (xa's own, in the NICs' namespace) as the
// pod's, as static IPAM would, with its flow's destination that address:
// the request's fault, saying which address, which netdev holds it and
// what an operator may do. Nothing is left (no attachment, no flow in
// the filter's map) and the allocation takes a good ADD after it. An
// address the node takes after the daemon started is refused as well:
// the daemon asks the kernel at each ADD. So are xa's subnet broadcast
// and a multicast group (VRRP's) named as the pod's own.
func TestNodeAddressRefused(t *testing.T) {
	pair := testnet.NewPair(t, 4)
	d, _ := runDaemon(t, standaloneOpts(t, pair, t.TempDir(), testPins(t),
		"pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}}]\n"))
	ctx := context.Background()
	a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	// late is an address xb takes only now, in the NICs' namespace.
	late := netip.MustParseAddr("10.99.0.8")
	if err := pair.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(pair.B.Name)
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: late.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	}); err != nil {
		t.Fatal(err)
	}
	add := func(own netip.Addr) (*api.Attachment, error) {
		return d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: a.ID, Netns: pair.NSPath(),
			Addresses: []netip.Addr{own}, Flows: []api.CNIFlow{{Protocol: "udp", Dst: netip.PrefixFrom(own, 32), DstPort: 22}}})
	}
	flows := func() int {
		s, err := d.core.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range s.Netdevs {
			if n.Netdev == "xa" {
				return n.Flows
			}
		}
		t.Fatal("xa not in status")
		return 0
	}
	for _, c := range []struct {
		own  netip.Addr
		says string
	}{
		{pair.A.Addr, "pool upf: flow udp 10.99.0.1:22: destination 10.99.0.1 is an address of the node (xa): " +
			"a pod's flows may not take the node's own traffic; an operator grants it with the pool's sharedDestinations"},
		{late, "destination 10.99.0.8 is an address of the node (xb)"},
		{netip.MustParseAddr("10.99.0.255"), "destination 10.99.0.255 is an address of the node (xa's broadcast)"},
		{netip.MustParseAddr("224.0.0.18"), "destination 224.0.0.18 is a multicast group, never one pod's own address"},
	} {
		_, err := add(c.own)
		if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("ADD naming %s as the pod's: %v (code %s); want a refusal saying %q", c.own, err, api.CodeOf(err), c.says)
		}
		if _, ok := d.core.ledger.Attachment("c1/net1"); ok {
			t.Errorf("the ADD naming %s left an attachment", c.own)
		}
		if n := flows(); n != 0 {
			t.Errorf("the ADD naming %s left %d flows on xa", c.own, n)
		}
	}
	if _, err := add(pair.PodAddr); err != nil {
		t.Fatalf("a good ADD after the refusals: %v", err)
	}
	if n := flows(); n != 1 {
		t.Errorf("%d flows on xa after the good ADD; want 1", n)
	}
	if _, err := d.local.CNICheck(ctx, api.AttachmentRef{ContainerID: "c1", IfName: "net1"}); err != nil {
		t.Errorf("CHECK of the good ADD: %v", err)
	}
}
