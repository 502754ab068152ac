package daemon

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
)

// TestBadInputRefusedAsSuch: what is wrong with a request is answered
// as the request's fault (400) or a conflict (409) naming what, never as
// the daemon's internal error: a netns that is a file or another kind of
// namespace, a prefix under software steering, a flow that overlaps
// another attachment's, more flows than the filter's map holds. None of them leaves an attachment.
func TestBadInputRefusedAsSuch(t *testing.T) {
	pair := testnet.NewPair(t, 4)
	d, _ := runDaemon(t, standaloneOpts(t, pair, t.TempDir(), testPins(t),
		"pools: [{name: upf, steering: software, devices: {netdevs: ['xa#0-1']}, sharedDestinations: [10.50.0.0/24]}]\n"))
	ctx := context.Background()
	a, err := d.local.Alloc(ctx, api.AllocRequest{Pool: "upf", Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	vip := api.CNIFlow{Protocol: "udp", Dst: netip.MustParsePrefix("10.50.0.9/32"), DstPort: 53}
	if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "first", IfName: "net1", Allocation: a.ID, Flows: []api.CNIFlow{vip}}); err != nil {
		t.Fatal(err)
	}
	// The filter's flow map has 4096 entries, a flow takes one per
	// queue: 2100 flows on two queues do not fit.
	var many []api.CNIFlow
	for port := range uint16(2100) {
		many = append(many, api.CNIFlow{Protocol: "udp", Dst: netip.MustParsePrefix("10.50.0.20/32"), DstPort: port + 1})
	}
	for _, c := range []struct {
		name string
		req  api.CNIAddRequest
		kind error
		says string
	}{
		{"a file as netns", api.CNIAddRequest{Netns: "/etc/passwd"}, api.ErrInvalid, "/etc/passwd is not a namespace"},
		{"a mount namespace as netns", api.CNIAddRequest{Netns: "/proc/self/ns/mnt"}, api.ErrInvalid, "not a network namespace"},
		{"a prefix under software steering", api.CNIAddRequest{Flows: []api.CNIFlow{{Protocol: "udp", Dst: netip.MustParsePrefix("10.50.0.0/28"), DstPort: 53}}},
			api.ErrInvalid, "software steering needs one destination address, not a prefix"},
		{"a flow another attachment has", api.CNIAddRequest{Flows: []api.CNIFlow{vip}}, api.ErrConflict, "overlaps flow"},
		{"more flows than the map holds", api.CNIAddRequest{Flows: many}, api.ErrConflict, "the flow map is full"},
	} {
		req := c.req
		req.ContainerID, req.IfName, req.Allocation = "c-bad", "net1", a.ID
		_, err := d.local.CNIAdd(ctx, req)
		if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.says) || api.CodeOf(err) == api.CodeInternal {
			t.Errorf("%s: %v (code %s); want %v saying %q", c.name, err, api.CodeOf(err), c.kind, c.says)
		}
		if _, ok := d.core.ledger.Attachment("c-bad/net1"); ok {
			t.Errorf("%s: the refused ADD left an attachment", c.name)
		}
	}
	// A real network namespace is taken.
	if _, err := d.local.CNIAdd(ctx, api.CNIAddRequest{ContainerID: "c-good", IfName: "net1", Allocation: a.ID, Netns: pair.NSPath()}); err != nil {
		t.Errorf("a network namespace: %v", err)
	}
}

// TestConfigProblemSaidOnce: a config problem is logged once, not at
// every reconcile that finds it again (it stays in status). A decision of
// the reconciler's, on a fake node: no kernel is asked.
func TestConfigProblemSaidOnce(t *testing.T) {
	n := newFakeNode(t, fakeNetdev("xa", 4))
	yaml := "pools: [{name: upf, steering: software, devices: {netdevs: ['xa#2-7']}}]\n"
	d, _ := n.daemon(yaml)
	n.reload(d, yaml)
	ctx := context.Background()
	for range 3 {
		if err := d.core.syncNetdevs(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s, err := d.core.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.ConfigError == "" && s.Pools[0].Reason == "" {
		t.Fatalf("no problem in status: %+v", s)
	}
	if c := strings.Count(n.logs.String(), `msg=config problem=`); c != 1 {
		t.Errorf("the config problem was logged %d times, want once:\n%s", c, n.logs.String())
	}
}
