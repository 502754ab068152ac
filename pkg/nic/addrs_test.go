package nic

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdpq/xdpq/internal/testing/testnet"
)

// TestHolders: of the addresses asked, those a netdev of the namespace
// holds are named with that netdev (xa's own); one that no netdev holds
// (B's source address, the pod's) is not; xa's subnet broadcast is
// named as such, and so is an address of a local route (AnyIP); an
// address with no route, or of a family the namespace has off, is not
// the node's; the caller's namespace is
// asked without a path (its loopback, v4 and v6, and not xa's).
func TestHolders(t *testing.T) {
	p := testnet.NewPair(t, 1)
	brd := netip.MustParseAddr("10.99.0.255") // xa's /24
	// AnyIP: a local route holds 10.99.5.0/24 without an address.
	if err := p.NS.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{Type: unix.RTN_LOCAL, Table: unix.RT_TABLE_LOCAL, Scope: netlink.SCOPE_HOST,
			LinkIndex: lo.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4(10, 99, 5, 0).To4(), Mask: net.CIDRMask(24, 32)}})
	}); err != nil {
		t.Fatal(err)
	}
	anyIP := netip.MustParseAddr("10.99.5.7")
	noRoute, v6 := netip.MustParseAddr("10.77.0.4"), netip.MustParseAddr("fd00::9") // the namespace has IPv6 off
	held, err := Holders(p.NSPath(), []netip.Addr{p.A.Addr, p.B.Addr, p.PodAddr, brd, anyIP, noRoute, v6})
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 3 || held[p.A.Addr] != "xa" || held[brd] != "xa's broadcast" || held[anyIP] != "a local route on lo" {
		t.Errorf("held %v; want %s on xa, its broadcast %s and %s of a local route alone", held, p.A.Addr, brd, anyIP)
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

// TestHoldersSubnetRouterAnycast: while a node forwards IPv6, it
// answers its prefixes' subnet-router anycast addresses (2001:db8:1::
// of 2001:db8:1::2/64) as its own: a pod may not claim one. Without
// forwarding the node does not answer it, and it is no one's.
func TestHoldersSubnetRouterAnycast(t *testing.T) {
	testnet.RequireRoot(t)
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Close(); testutils.UnmountNS(netns) })
	anycast := netip.MustParseAddr("2001:db8:1::")
	forwarding := func(on string) {
		t.Helper()
		if err := netns.Do(func(ns.NetNS) error {
			return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte(on), 0o644)
		}); err != nil {
			t.Fatal(err)
		}
	}
	forwarding("0")
	if err := netns.Do(func(ns.NetNS) error {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/disable_ipv6", []byte("0"), 0o644); err != nil {
			return err
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0"}, PeerName: "up1"}); err != nil {
			return err
		}
		for _, n := range []string{"up1", "up0"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		l, err := netlink.LinkByName("up0")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("2001:db8:1::2"), Mask: net.CIDRMask(64, 128)},
			Flags: unix.IFA_F_NODAD})
	}); err != nil {
		t.Fatal(err)
	}
	// Not forwarding first: the kernel drops the anycast address some
	// time after forwarding is turned off, not at once.
	if held, err := Holders(netns.Path(), []netip.Addr{anycast}); err != nil || len(held) != 0 {
		t.Errorf("not forwarding: held %v, %v; want none", held, err)
	}
	forwarding("1")
	held, err := Holders(netns.Path(), []netip.Addr{anycast, netip.MustParseAddr("2001:db8:1::7")})
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 1 || held[anycast] != "up0's subnet-router anycast" {
		t.Errorf("forwarding: held %v; want %s as up0's subnet-router anycast alone", held, anycast)
	}
}

// BenchmarkHolders is what a queue pool's CNI ADD with flows pays to ask
// the node for its addresses: one dump of a namespace's addresses, the
// host's own (as the daemon's in Kubernetes) and one holding 1000 more
// (as many as a node with a pod veth's link-local address each; the
// pair's namespace has IPv6 off, so IPv4 ones).
func BenchmarkHolders(b *testing.B) {
	testnet.RequireRoot(b)
	ask := []netip.Addr{netip.MustParseAddr("10.77.0.4")}
	b.Run("host", func(b *testing.B) {
		for b.Loop() {
			if _, err := Holders("", ask); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("1000 addresses", func(b *testing.B) {
		p := testnet.NewPair(b, 1)
		if err := p.NS.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(p.B.Name)
			if err != nil {
				return err
			}
			for i := range 1000 {
				ip := netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := Holders(p.NSPath(), ask); err != nil {
				b.Fatal(err)
			}
		}
	})
}
