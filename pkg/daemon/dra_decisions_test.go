package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/xdpq/xdpq/pkg/api"
	"github.com/xdpq/xdpq/pkg/dra"
)

// draDaemon is a daemon on a fake node that serves the pools whose
// servedBy is dra through its DRA face (not started: PrepareClaim is
// called directly, as the driver calls it), with an NRI socket when nri.
func draDaemon(t *testing.T, n *fakeNode, yaml string, nri bool) *Daemon {
	t.Helper()
	n.kubelet = fakeKubelet{err: errors.New("not asked")}
	n.dra = &DRA{Kube: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "4f1c2a3b-5d6e-4f70-8a9b-0c1d2e3f4a5b"}}),
		CDIDir: t.TempDir()}
	if nri {
		n.dra.NRISocket = "/run/nri/nri.sock" // never dialled: Prepare only checks that there is one
	}
	d, _ := n.daemon(yaml)
	if err := d.core.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDRAPrepareDecisions: kubelet's Prepare of a claim, as the DRA face
// decides it over a core with fake kernel parts (no root): a claim the
// face can serve gets one allocation, served, owned by its pod, and the
// same answer when kubelet asks again; every claim it cannot serve is
// refused as what it is, saying why, before anything is held.
func TestDRAPrepareDecisions(t *testing.T) {
	const cfg = "pools: [" +
		"{name: dns, servedBy: dra, steering: software, devices: {netdevs: ['xa#0-3']}}, " +
		"{name: dp, servedBy: devicePlugin, steering: software, devices: {netdevs: ['xb#0-1']}}, " +
		"{name: two, servedBy: dra, steering: software, devices: {netdevs: ['xd#0-1', 'xe#0-1']}}, " +
		"{name: vf, servedBy: dra, mode: netdev, devices: {netdevs: [xc]}}]\n"
	nodeAddr := netip.MustParseAddr("192.0.2.7")
	flows := func(dst string) []byte {
		return []byte(fmt.Sprintf(`[{"protocol": "udp", "destination": %q, "destinationPort": "53"}]`, dst))
	}
	claim := func(pool string, devices ...string) dra.Claim {
		return dra.Claim{UID: "uid-1", Namespace: "default", Name: "c1", Pool: pool, Devices: devices, Pods: []string{"pod-1"}}
	}
	for _, c := range []struct {
		name       string
		claim      dra.Claim
		nri        bool
		uninstall  bool
		kind       error
		says       string // "" prepared
		wantQueues []uint32
		wantNetdev string
		wantAnyPod bool
	}{
		{name: "a queue claim", claim: claim("dns", "xa-q1", "xa-q2"), wantNetdev: "xa", wantQueues: []uint32{1, 2}},
		{name: "flows to an address not the node's", wantNetdev: "xa", wantQueues: []uint32{0},
			claim: func() dra.Claim { c := claim("dns", "xa-q0"); c.Flows = flows("198.51.100.1"); return c }()},
		{name: "a claim shared by two pods", wantNetdev: "xa", wantQueues: []uint32{3}, wantAnyPod: true,
			claim: func() dra.Claim { c := claim("dns", "xa-q3"); c.Pods = []string{"pod-1", "pod-2"}; return c }()},
		{name: "a netdev claim", claim: claim("vf", "xc"), nri: true, wantNetdev: "xc", wantQueues: []uint32{0}},
		{name: "a pool the device plugin serves", claim: claim("dp", "xb-q0"), kind: api.ErrConflict,
			says: "pool dp is served by the device plugin on this node (servedBy)"},
		{name: "a pool the node has not", claim: claim("nope", "xa-q0"), kind: api.ErrNotFound, says: "no pool nope on this node"},
		{name: "a device gone from the pool", claim: claim("dns", "xa-q9"), kind: api.ErrNotFound, says: "device xa-q9 is no longer in pool dns"},
		{name: "queues of two netdevs", claim: claim("two", "xd-q0", "xe-q0"), kind: api.ErrInvalid,
			says: "was given queues of netdevs xd and xe, and its queues must be of one netdev"},
		{name: "flows to the node's address", kind: api.ErrInvalid, says: "claim config: flows:",
			claim: func() dra.Claim { c := claim("dns", "xa-q0"); c.Flows = flows(nodeAddr.String()); return c }()},
		{name: "flows for two pods", kind: api.ErrInvalid, says: "flows steer to one pod's addresses",
			claim: func() dra.Claim {
				c := claim("dns", "xa-q0")
				c.Pods, c.Flows = []string{"pod-1", "pod-2"}, flows("198.51.100.1")
				return c
			}()},
		{name: "an interface for a queue pool", kind: api.ErrInvalid, says: "interface applies to pools of mode netdev",
			claim: func() dra.Claim {
				c := claim("dns", "xa-q0")
				c.Interface = &dra.InterfaceConfig{Name: "net1"}
				return c
			}()},
		{name: "a netdev claim without NRI", claim: claim("vf", "xc"), kind: api.ErrNotSupported, says: "the daemon has no NRI socket"},
		{name: "a netdev claim for two pods", nri: true, kind: api.ErrInvalid, says: "the claim is reserved for 2 pods: a whole netdev moves into one pod's",
			claim: func() dra.Claim { c := claim("vf", "xc"); c.Pods = []string{"pod-1", "pod-2"}; return c }()},
		{name: "a netdev claim's flows to its own address, and it has none", nri: true, kind: api.ErrInvalid,
			says: "a netdev-mode claim's own addresses are its interface.addresses",
			claim: func() dra.Claim {
				c := claim("vf", "xc")
				c.Flows = []byte(`[{"protocol": "udp", "destinationPort": "53"}]`)
				return c
			}()},
		{name: "while xdpq is uninstalled", claim: claim("dns", "xa-q0"), uninstall: true, kind: api.ErrUnavailable,
			says: "xdpq is being uninstalled from this node"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newFakeNode(t, fakeNetdev("xa", 4), fakeNetdev("xb", 2), fakeNetdev("xc", 1), fakeNetdev("xd", 2), fakeNetdev("xe", 2))
			n.addrs = map[netip.Addr]string{nodeAddr: "xa"}
			d := draDaemon(t, n, cfg, c.nri)
			if c.uninstall {
				d.core.refuseNew()
			}
			ctx := context.Background()
			edits, err := d.dra.PrepareClaim(ctx, c.claim)
			if c.says != "" {
				if !errors.Is(err, c.kind) || !strings.Contains(fmt.Sprint(err), c.says) {
					t.Fatalf("prepare: %v (code %s); want %v saying %q", err, api.CodeOf(err), c.kind, c.says)
				}
				if all := d.core.ledger.Allocations(); len(all) > 0 {
					t.Errorf("the refused claim left allocations %+v", all)
				}
				if served := n.broker.servedIDs(); len(served) > 0 {
					t.Errorf("the refused claim left %v served", served)
				}
				left, _ := os.ReadDir(d.opts.AllocDir)
				for _, e := range left {
					if e.Name() != dpdkLinkDir && !strings.HasPrefix(e.Name(), ".") {
						t.Errorf("the refused claim left %s in the allocation directory", e.Name())
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("prepare: %v", err)
			}
			a, ok := d.core.ledger.ByClaim(c.claim.UID)
			if !ok {
				t.Fatal("prepared, but no allocation holds the claim")
			}
			if a.Netdev != c.wantNetdev || !slices.Equal(a.Queues, c.wantQueues) {
				t.Errorf("allocation on %s queues %v; want %s %v", a.Netdev, a.Queues, c.wantNetdev, c.wantQueues)
			}
			if c.wantAnyPod != a.Owner.AnyPod || !c.wantAnyPod && a.Owner.PodUID != "pod-1" {
				t.Errorf("owner %+v; want the claim's one pod, or any of its pods when it has several", a.Owner)
			}
			if a.Claim == nil || a.Claim.Namespace+"/"+a.Claim.Name != "default/c1" {
				t.Errorf("the allocation's claim %+v; want default/c1", a.Claim)
			}
			if served := n.broker.servedIDs(); !slices.Equal(served, []string{a.ID}) {
				t.Errorf("served %v; want %s", served, a.ID)
			}
			if edits.Env["XDPQ_ALLOCATION"] != a.ID || edits.Env["XDPQ_SOCKET"] != "/run/xdpq/xdpq.sock" ||
				len(edits.Mounts) == 0 || edits.Mounts[0].HostPath != d.core.allocDir(a.ID) || edits.Mounts[0].ContainerPath != "/run/xdpq" {
				t.Errorf("the claim's container edits %+v; want its allocation's socket directory at /run/xdpq, named in the environment", edits)
			}
			// kubelet asks again (its own restart, a retried RPC): the
			// same allocation, nothing more held.
			again, err := d.dra.PrepareClaim(ctx, c.claim)
			if err != nil || again.Env["XDPQ_ALLOCATION"] != a.ID || len(d.core.ledger.Allocations()) != 1 {
				t.Errorf("prepared again: %v, allocation %s, %d allocations; want the same one alone", err, again.Env["XDPQ_ALLOCATION"],
					len(d.core.ledger.Allocations()))
			}
			if err := d.dra.UnprepareClaim(ctx, c.claim.UID); err != nil {
				t.Fatal(err)
			}
			if all := d.core.ledger.Allocations(); len(all) > 0 {
				t.Errorf("unprepared, and allocations %+v remain", all)
			}
			if served := n.broker.servedIDs(); len(served) > 0 {
				t.Errorf("unprepared, and %v still served", served)
			}
			if err := d.dra.UnprepareClaim(ctx, c.claim.UID); err != nil {
				t.Errorf("unprepared again: %v; want nothing to do", err)
			}
		})
	}
}
