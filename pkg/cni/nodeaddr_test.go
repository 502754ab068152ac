package cni

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/xdpq/xdpq/pkg/api"
)

// TestStaticIPAMTakesNoOnesAddress: through the installed plugin, as a
// runtime runs it (cnitool), a network configuration whose static IPAM
// names the node's own address (xa's, in the NICs' namespace) as the
// pod's, with a flow to its "ipam" address, is refused: the runtime
// shows the daemon's reason as the plugin's CNI error, and no flow and
// no attachment are left. A configuration naming an address no one
// holds attaches; another pod's configuration naming that same address
// is then refused as another's, and attaches once the first is gone.
func TestStaticIPAMTakesNoOnesAddress(t *testing.T) {
	n := startNode(t)
	c := newCNITool(t, n)
	build(t, n.bin, map[string]string{"static": "github.com/containernetworking/plugins/plugins/ipam/static"})
	static := func(addr string, port int) {
		t.Helper()
		conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"xdpq","daemonSocket":%q,
			"ipam":{"type":"static","addresses":[{"address":%q}]},
			"flows":[{"protocol":"tcp","destination":"ipam","destinationPort":"%d"}]}`, c.name, n.socket, addr, port)
		if err := os.WriteFile(filepath.Join(c.netconf, c.name+".conf"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pod := func() string {
		ns, err := testutils.NewNS()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ns.Close(); _ = testutils.UnmountNS(ns) })
		return ns.Path()
	}
	left := func(what string, flows, atts int) {
		t.Helper()
		s, err := api.NewClient(n.socket).Status()
		if err != nil {
			t.Fatal(err)
		}
		if got := n.flows(t); got != flows || s.Attachments != atts {
			t.Errorf("%s: %d flows and %d attachments; want %d and %d", what, got, s.Attachments, flows, atts)
		}
	}

	static(n.pair.A.Addr.String()+"/24", 22)
	_, err := c.run("add", pod())
	want := fmt.Sprintf("xdpq daemon; pool demo: flow tcp %s:22: destination %s is an address of the node (xa): "+
		"a pod's flows may not take the node's own traffic; an operator grants it with the pool's sharedDestinations", n.pair.A.Addr, n.pair.A.Addr)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("ADD with the node's address as the pod's: %v; want the runtime to show %q", err, want)
	}
	left("after the refusal", 0, 0)
	// VRRP's group: the node's (and its neighbours') traffic too.
	static("224.0.0.18/32", 5353)
	if _, err := c.run("add", pod()); err == nil || !strings.Contains(err.Error(), "destination 224.0.0.18 is a multicast group, never one pod's own address") {
		t.Errorf("ADD with a multicast group as the pod's address: %v", err)
	}
	left("after the multicast refusal", 0, 0)

	own := n.pair.PodAddr.String()
	static(own+"/24", 2152)
	first := pod()
	if _, err := c.run("add", first); err != nil {
		t.Fatalf("ADD with an address no one holds: %v", err)
	}
	left("after the good ADD", 1, 1)
	// Another port: no flow of the first pod's overlaps it.
	static(own+"/24", 80)
	second := pod()
	_, err = c.run("add", second)
	want = fmt.Sprintf("xdpq daemon; address %s: attachment cnitool-", own)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "steers it as its pod's own address already") {
		t.Errorf("another pod's ADD with the same address: %v; want the runtime to show %q", err, want)
	}
	left("after the second pod's refusal", 1, 1)
	if _, err := c.run("del", first); err != nil {
		t.Fatal(err)
	}
	if _, err := c.run("add", second); err != nil {
		t.Errorf("the second pod's ADD once the first is gone: %v", err)
	}
	left("after the second pod's ADD", 1, 1)
	if _, err := c.run("del", second); err != nil {
		t.Fatal(err)
	}
}
