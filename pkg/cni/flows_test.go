package cni

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/xdpq/xdpq/pkg/api"
)

// TestFlowsOnlyThePodsOwn: a network configuration's flows steer only
// traffic to the pod's own addresses (those IPAM gave it) or to what the
// pool grants (sharedDestinations). Another pod's address, the node's
// own address on the netdev, a prefix, and a port range to another's
// address are each refused, naming the flow, and leave no flow, no
// attachment and no IPAM lease behind.
func TestFlowsOnlyThePodsOwn(t *testing.T) {
	n := startNode(t) // grants 10.88.0.0/24 and 10.78.0.5
	conf := func(flows string) []byte {
		return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"upf","type":"xdpq","daemonSocket":%q,
			"ipam":{"type":"host-local","subnet":"10.77.0.0/24","dataDir":%q},"flows":%s}`, n.socket, n.data, flows))
	}
	add := func(id, flows string) error {
		args := &skel.CmdArgs{ContainerID: id, Netns: n.pair.NSPath(), IfName: "net1", Args: "IgnoreUnknown=1;XDPQ_ALLOCATION=" + n.alloc,
			StdinData: conf(flows)}
		_, _, err := testutils.CmdAddWithArgs(args, func() error { return CmdAdd(args) })
		return err
	}
	// Pod A takes 10.77.0.2, the first address of the range.
	if err := add("ctr-a", `[{"protocol":"udp","destinationPort":"5001"}]`); err != nil {
		t.Fatal(err)
	}
	base := n.flows(t)
	node := n.pair.A.Addr // xa's address: the node's own on the netdev
	for _, c := range []struct{ name, flows, refused string }{
		{"another pod's address", `[{"protocol":"udp","destination":"10.77.0.2","destinationPort":"5001"}]`, "udp 10.77.0.2:5001"},
		{"the node's address", fmt.Sprintf(`[{"protocol":"tcp","destination":%q,"destinationPort":"22"}]`, node), fmt.Sprintf("tcp %s:22", node)},
		{"a prefix", `[{"protocol":"udp","destination":"10.77.0.0/24","destinationPort":"5001"}]`, "udp 10.77.0.0/24 port 5001"},
		{"a port range to another's address", `[{"protocol":"udp","destination":"10.77.0.2","destinationPort":"6000-6003"}]`, "udp 10.77.0.2:6000"},
		{"an own flow beside a stolen one", `[{"protocol":"udp","destinationPort":"7000"},{"protocol":"udp","destination":"10.77.0.2","destinationPort":"7000"}]`, "udp 10.77.0.2:7000"},
	} {
		err := add("ctr-b", c.flows)
		if err == nil || !strings.Contains(err.Error(), "flow "+c.refused+": destination") || !strings.Contains(err.Error(), "not an address of the pod") {
			t.Errorf("%s: ADD answered %v; want a refusal naming flow %q", c.name, err, c.refused)
		}
		if got := n.flows(t); got != base {
			t.Errorf("%s: %d flows after the refusal, want %d", c.name, got, base)
		}
		if _, err := api.NewClient(n.socket).CNICheck("ctr-b", "net1"); err == nil {
			t.Errorf("%s: the refused ADD left an attachment", c.name)
		}
	}
	// Each refusal gave its IPAM address back: host-local keeps a file
	// per address it gave, and only pod A's is there.
	if leases := ipamLeases(t, n.data); fmt.Sprint(leases) != "[10.77.0.2]" {
		t.Errorf("IPAM holds %v after the refusals; want pod A's 10.77.0.2 alone", leases)
	}
	// Its own address, a port range of it, and what the pool grants are
	// steered.
	if err := add("ctr-b", `[{"protocol":"udp","destination":"ipam","destinationPort":"6000-6003"},{"protocol":"udp","destination":"10.88.0.7","destinationPort":"53"},{"protocol":"tcp","destination":"10.78.0.5","destinationPort":"80"}]`); err != nil {
		t.Fatalf("own and granted flows: %v", err)
	}
	att, err := api.NewClient(n.socket).CNICheck("ctr-b", "net1")
	if err != nil {
		t.Fatal(err)
	}
	own := ipamLeases(t, n.data)[1]
	if len(att.Flows) != 6 || att.Flows[0].Dst.Addr() != own || fmt.Sprint(att.Addresses) != fmt.Sprintf("[%s]", own) {
		t.Errorf("pod B's attachment: flows %v, addresses %v; want 6 flows, the first to %s, its only address", att.Flows, att.Addresses, own)
	}
}

// ipamLeases are the addresses host-local (its dataDir dir, network
// "upf") has given and not taken back, in order.
func ipamLeases(t *testing.T, dir string) []netip.Addr {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "upf"))
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, e := range ents {
		if a, err := netip.ParseAddr(e.Name()); err == nil {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
