package cni

import (
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/xdpq/xdpq/internal/testing/testnet"
	"github.com/xdpq/xdpq/pkg/api"
)

// chainResult is what the runtime reads of a chain's ADD.
type chainResult struct {
	CNIVersion string `json:"cniVersion"`
	Interfaces []struct {
		Name    string `json:"name"`
		Sandbox string `json:"sandbox"`
	} `json:"interfaces"`
	IPs []struct {
		Address   string `json:"address"`
		Interface *int   `json:"interface"`
	} `json:"ips"`
}

// TestChainAfterBridge: xdpq chained after the node's primary plugin
// (bridge with host-local) in one conflist, as on a node without Multus,
// driven by cnitool. For a pod holding an allocation, the result is
// bridge's (its interfaces and the pod's address), the flow's "ipam"
// destination is that address, CHECK passes through both plugins, and
// DEL leaves nothing. A pod holding no xdpq device passes through: same
// result as bridge's, nothing attached, CHECK and DEL pass. A failed ADD
// leaves no cache file. (Before, xdpq ignored prevResult: "IPAM assigned
// none", or a result without bridge's interfaces and IPs.)
func TestChainAfterBridge(t *testing.T) {
	n := startNodeFor(t, 0)
	build(t, n.bin, map[string]string{"xdpq": "github.com/xdpq/xdpq/cmd/cni"})
	// The primary plugin is the distribution's, as on a node (building
	// bridge from its module would pull its nftables dependency into this
	// one's go.sum).
	bridge, err := os.ReadFile(testnet.RequireTool(t, "containernetworking-plugins", "/usr/lib/cni/bridge"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.bin, "bridge"), bridge, 0o755); err != nil {
		t.Fatal(err)
	}
	tools := t.TempDir()
	build(t, tools, map[string]string{"cnitool": "github.com/containernetworking/cni/cnitool"})
	netdir := t.TempDir()
	name := fmt.Sprintf("xdpq-chain-%d", os.Getpid())
	br := fmt.Sprintf("xqbr%d", os.Getpid()%100000)
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", br).Run()
		stale, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", name+"-*"))
		for _, f := range stale {
			os.Remove(f)
		}
	})
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"plugins":[
		{"type":"bridge","bridge":%q,"ipam":{"type":"host-local","subnet":"10.78.0.0/24","dataDir":%q}},
		{"type":"xdpq","daemonSocket":%q,"flows":[{"protocol":"udp","destination":"ipam","destinationPort":"2152"}]}]}`,
		name, br, n.data, n.socket)
	if err := os.WriteFile(filepath.Join(netdir, name+".conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(verb, netns, cniArgs string) ([]byte, error) {
		cmd := exec.Command(filepath.Join(tools, "cnitool"), verb, name, netns)
		cmd.Env = append(os.Environ(), "CNI_PATH="+n.bin, "NETCONFPATH="+netdir, "CNI_IFNAME=eth0", "CNI_ARGS="+cniArgs)
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); ok {
			err = fmt.Errorf("cnitool %s: %v: %s%s", verb, err, ee.Stderr, out)
		}
		return out, err
	}
	cached := func(netns string) bool {
		s := sha512.Sum512([]byte(netns))
		_, err := os.Stat(filepath.Join(DefaultCacheDir, fmt.Sprintf("cnitool-%x", s[:10])+"-eth0.json"))
		return err == nil
	}
	pod := func() string {
		ns, err := testutils.NewNS()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Close(); testutils.UnmountNS(ns) })
		return ns.Path()
	}
	add := func(netns, cniArgs string) chainResult {
		t.Helper()
		out, err := run("add", netns, cniArgs)
		if err != nil {
			t.Fatal(err)
		}
		var res chainResult
		if err := json.Unmarshal(out, &res); err != nil || res.CNIVersion != "1.0.0" || len(res.IPs) != 1 || len(res.Interfaces) != 3 ||
			res.Interfaces[2].Name != "eth0" || res.Interfaces[2].Sandbox != netns || res.IPs[0].Interface == nil || *res.IPs[0].Interface != 2 {
			t.Fatalf("the chain's result is not bridge's: %s (%v)", out, err)
		}
		return res
	}

	// A pod with an allocation.
	withQueues := pod()
	args := "IgnoreUnknown=1;XDPQ_ALLOCATION=" + n.alloc
	res := add(withQueues, args)
	podIP := netip.MustParsePrefix(res.IPs[0].Address).Addr()
	att, err := api.NewClient(n.socket).CNICheck(fmt.Sprintf("cnitool-%x", sha512Sum(withQueues)), "eth0")
	if err != nil {
		t.Fatal(err)
	}
	want := netip.PrefixFrom(podIP, 32)
	if len(att.Flows) != 1 || att.Flows[0].Dst != want || att.Flows[0].DstPort != 2152 {
		t.Errorf("the attachment's flows %+v, want udp to %s port 2152 (bridge's address)", att.Flows, want)
	}
	if _, err := run("check", withQueues, args); err != nil {
		t.Error(err)
	}

	// A pod without: it passes through.
	without := pod()
	add(without, "IgnoreUnknown=1")
	if cached(without) {
		t.Error("a pod with no xdpq device left a cache file")
	}
	if got := n.flows(t); got != 1 {
		t.Errorf("%d flows with one pod holding queues, want 1", got)
	}
	if _, err := run("check", without, "IgnoreUnknown=1"); err != nil {
		t.Error(err)
	}
	if _, err := run("del", without, "IgnoreUnknown=1"); err != nil {
		t.Error(err)
	}

	// A failed ADD: an allocation that does not exist.
	failed := pod()
	if _, err := run("add", failed, "IgnoreUnknown=1;XDPQ_ALLOCATION=demo-000000000000"); err == nil || !strings.Contains(err.Error(), "no allocation") {
		t.Errorf("ADD with an unknown allocation: %v", err)
	}
	if cached(failed) {
		t.Error("a failed ADD left its cache file")
	}
	run("del", failed, "IgnoreUnknown=1") // as the runtime does after a failed ADD

	if _, err := run("del", withQueues, args); err != nil {
		t.Fatal(err)
	}
	if got := n.flows(t); got != 0 {
		t.Errorf("%d flows after DEL", got)
	}
	if cached(withQueues) {
		t.Error("DEL left the cache file")
	}
	if l := n.leases(name); len(l) != 0 {
		t.Errorf("host-local leases left: %v", l)
	}
}

func sha512Sum(s string) []byte {
	h := sha512.Sum512([]byte(s))
	return h[:10]
}
