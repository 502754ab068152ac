package nic

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/internal/testnet"
)

// TestHolders: of the addresses asked, those a netdev of the namespace
// holds are named with that netdev (xa's own); one that no netdev holds
// (B's source address, the pod's) is not; xa's subnet broadcast is
// named as such; the caller's namespace is
// asked without a path (its loopback, v4 and v6, and not xa's).
func TestHolders(t *testing.T) {
	p := testnet.NewPair(t, 1)
	brd := netip.MustParseAddr("10.99.0.255") // xa's /24
	held, err := Holders(p.NSPath(), []netip.Addr{p.A.Addr, p.B.Addr, p.PodAddr, brd})
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 2 || held[p.A.Addr] != "xa" || held[brd] != "xa's broadcast" {
		t.Errorf("held %v; want %s on xa and its broadcast %s alone", held, p.A.Addr, brd)
	}
	want := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/lo/disable_ipv6"); err == nil && strings.TrimSpace(string(b)) == "0" {
		want = append(want, netip.MustParseAddr("::1"))
	}
	held, err = Holders("", append([]netip.Addr{p.A.Addr}, want...))
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != len(want) || held[want[0]] != "lo" || held[want[len(want)-1]] != "lo" {
		t.Errorf("in the test's own namespace: %v; want %v on lo alone", held, want)
	}
	if held, err := Holders(p.NSPath(), nil); err != nil || len(held) != 0 {
		t.Errorf("asked nothing: %v, %v", held, err)
	}
}
