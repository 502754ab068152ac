package daemon

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/api"
)

// TestGrantIsItsPools: pool rp grants the VIP 192.0.2.10; a pod of pool
// rp2 on the same netdev whose IPAM names the VIP as its own address is
// refused (before, its flow to the VIP was steered to it). rp's pod
// steers the VIP; once the operator revokes the grant, CHECK of that
// pod's attachment fails and says why, and still does after a restart
// (before, it answered 200 while the flow stayed).
func TestGrantIsItsPools(t *testing.T) {
	const pools = "pools: [{name: rp, steering: software, devices: {netdevs: ['xa#0-1']}%s}, {name: rp2, steering: software, devices: {netdevs: ['xa#2-3']}}]\n"
	n := newFakeNode(t, fakeNetdev("xa", 4))
	ctx := context.Background()
	start := func(cfg string) (*Daemon, func()) {
		t.Helper()
		d, stop := n.daemon(cfg)
		if err := d.core.start(ctx); err != nil {
			t.Fatal(err)
		}
		return d, stop
	}
	d, stop := start(strings.Replace(pools, "%s", ", sharedDestinations: [192.0.2.10]", 1))
	vip := netip.MustParseAddr("192.0.2.10")
	toVIP := []api.CNIFlow{{Protocol: "udp", Dst: netip.PrefixFrom(vip, 32), DstPort: 81}}

	other, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "rp2", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c2", IfName: "net1", Allocation: other.ID, Flows: toVIP, Addresses: []netip.Addr{vip}})
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "192.0.2.10 is granted to pool rp") {
		t.Fatalf("a pod of rp2 claiming rp's VIP as its own: %v; want it refused, naming rp", err)
	}

	granted, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "rp", Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c1", IfName: "net1", Allocation: granted.ID, Flows: toVIP}); err != nil {
		t.Fatalf("rp's pod steering the VIP rp grants: %v", err)
	}
	ref := api.AttachmentRef{ContainerID: "c1", IfName: "net1"}
	if _, err := d.local.CNICheck(ctx, ref); err != nil {
		t.Fatalf("check while granted: %v", err)
	}

	n.reload(d, strings.Replace(pools, "%s", "", 1))
	revoked := func(d *Daemon, when string) {
		t.Helper()
		_, err := d.local.CNICheck(ctx, ref)
		if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "pool rp no longer allows") || !strings.Contains(err.Error(), "udp 192.0.2.10:81") {
			t.Errorf("check %s: %v; want it refused, naming the flow", when, err)
		}
	}
	revoked(d, "once the grant was revoked")
	stop()
	d, _ = start(strings.Replace(pools, "%s", "", 1))
	revoked(d, "after a restart")
}
