package flow

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/xdpq/xdpq/pkg/api"
)

func TestParseList(t *testing.T) {
	ips := []netip.Addr{netip.MustParseAddr("10.244.0.7")}
	for _, c := range []struct {
		in, want, err string
	}{
		{in: `[{"protocol":"udp","destinationPort":"2152"}]`, want: "udp 10.244.0.7/32:2152"},
		{in: `[{"protocol":"tcp","destination":"ipam","destinationPort":"80-81"}]`, want: "tcp 10.244.0.7/32:80 tcp 10.244.0.7/32:81"},
		{in: `[{"protocol":"udp","destination":"10.9.0.0/16"}]`, want: "udp 10.9.0.0/16:0"},
		{in: `[]`, want: ""},
		{in: `[{"protocol":"icmp"}]`, err: "flows[0].protocol"},
		{in: `[{"protocol":"udp","port":5}]`, err: `unknown field "port"`},
		{in: `{"protocol":"udp"}`, err: "cannot unmarshal object"},
		{in: `[] []`, err: "more than one JSON value"},
		{in: `[{"protocol":"udp","destinationPort":"1-100"}]`, err: "flows[0].destinationPort"},
	} {
		fs, err := ParseList([]byte(c.in), "flows")
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		got, err := Resolve(fs, ips)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		var s []string
		for _, f := range got {
			s = append(s, f.Protocol+" "+f.Dst.String()+":"+itoa(f.DstPort))
		}
		if strings.Join(s, " ") != c.want {
			t.Errorf("%s: %q, want %q", c.in, strings.Join(s, " "), c.want)
		}
	}
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }

func FuzzParseList(f *testing.F) {
	f.Add([]byte(`[{"protocol":"udp","destination":"10.0.0.1","destinationPort":"2000-2063","source":"10.1.0.0/16","sourcePort":"5","vlan":7}]`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fs, err := ParseList(b, "flows")
		if err != nil {
			return
		}
		if len(fs) > MaxFlows {
			t.Fatalf("%d flows", len(fs))
		}
		for _, f := range fs {
			if f.Protocol != "udp" && f.Protocol != "tcp" || len(f.DstPorts) > MaxPortRange {
				t.Fatalf("accepted %+v", f)
			}
		}
	})
}

// TestCheckOwn: a destination is the pod's own address or within what
// the pool grants; everything else is refused naming the flow.
func TestCheckOwn(t *testing.T) {
	own := []netip.Addr{netip.MustParseAddr("10.77.0.4"), netip.MustParseAddr("fd00::4")}
	shared := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/28"), netip.MustParsePrefix("198.51.100.7/32")}
	f := func(dst string, port uint16) api.CNIFlow {
		return api.CNIFlow{Protocol: "udp", Dst: netip.MustParsePrefix(dst), DstPort: port}
	}
	for _, c := range []struct {
		name    string
		flows   []api.CNIFlow
		shared  []netip.Prefix
		refused string // "" accepted
	}{
		{"own v4 and v6", []api.CNIFlow{f("10.77.0.4/32", 53), f("fd00::4/128", 53)}, nil, ""},
		{"another pod's", []api.CNIFlow{f("10.77.0.2/32", 5001)}, nil, "flow udp 10.77.0.2:5001: destination 10.77.0.2/32"},
		{"a prefix holding the pod's", []api.CNIFlow{f("10.77.0.0/24", 0)}, nil, "flow udp 10.77.0.0/24: destination"},
		{"the second of two", []api.CNIFlow{f("10.77.0.4/32", 1), f("10.99.0.1/32", 22)}, nil, "flow udp 10.99.0.1:22"},
		{"granted address in a granted prefix", []api.CNIFlow{f("192.0.2.9/32", 80)}, shared, ""},
		{"granted prefix inside a granted prefix", []api.CNIFlow{f("192.0.2.8/29", 80)}, shared, ""},
		{"a prefix wider than the grant", []api.CNIFlow{f("192.0.2.0/24", 80)}, shared, "flow udp 192.0.2.0/24 port 80"},
		{"granted single address", []api.CNIFlow{f("198.51.100.7/32", 80)}, shared, ""},
		{"next to the granted address", []api.CNIFlow{f("198.51.100.8/32", 80)}, shared, "flow udp 198.51.100.8:80"},
	} {
		err := CheckOwn(c.flows, own, c.shared)
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.refused != "" && (err == nil || !strings.Contains(err.Error(), c.refused) || !errors.Is(err, ErrNotOwn)):
			t.Errorf("%s: %v; want a refusal naming %q", c.name, err, c.refused)
		}
	}
	if err := CheckOwn([]api.CNIFlow{f("10.77.0.4/32", 53)}, nil, nil); err == nil || !strings.Contains(err.Error(), "its addresses: none") {
		t.Errorf("a pod without addresses: %v", err)
	}
}

// TestCheckOwnNotOwnable: an address no one host owns is refused as a
// pod's own even when its IPAM named it (static IPAM names any), unless
// the pool grants it: a market-data pool's multicast groups.
func TestCheckOwnNotOwnable(t *testing.T) {
	granted := []netip.Prefix{netip.MustParsePrefix("239.1.0.0/16")}
	for _, c := range []struct {
		addr, says string // says "": accepted
	}{
		{"224.0.0.18", "destination 224.0.0.18 is a multicast group, never one pod's own address"}, // VRRP
		{"ff02::fb", "is a multicast group"},            // mDNS
		{"::ffff:224.0.0.251", "is a multicast group"},  // mapped
		{"255.255.255.255", "is the broadcast address"}, // DHCP
		{"0.0.0.0", "is the unspecified address"},
		{"::", "is the unspecified address"},
		{"127.0.0.1", "is a loopback address"},
		{"::1", "is a loopback address"},
		{"239.1.2.3", ""}, // granted
		{"10.77.0.4", ""},
	} {
		a := netip.MustParseAddr(c.addr)
		flows := []api.CNIFlow{{Protocol: "udp", Dst: netip.PrefixFrom(a, a.BitLen()), DstPort: 5353}}
		err := CheckOwn(flows, []netip.Addr{a}, granted)
		switch {
		case c.says == "" && err != nil:
			t.Errorf("%s: %v", c.addr, err)
		case c.says != "" && (err == nil || !strings.Contains(err.Error(), c.says) || !errors.Is(err, ErrNotOwn) ||
			!strings.Contains(err.Error(), "sharedDestinations")):
			t.Errorf("%s as the pod's own: %v; want a refusal saying %q", c.addr, err, c.says)
		}
	}
}

// TestCheckNode: a destination the node holds is refused, naming the
// flow, the address and the netdev that holds it, unless the pool
// grants it; Claimed asks the node only about what CheckNode judges.
func TestCheckNode(t *testing.T) {
	node := map[netip.Addr]string{netip.MustParseAddr("10.0.0.5"): "eth0", netip.MustParseAddr("fd00::5"): "eth0",
		netip.MustParseAddr("192.0.2.1"): "xa"}
	shared := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/28")}
	f := func(dst string, port uint16) api.CNIFlow {
		return api.CNIFlow{Protocol: "tcp", Dst: netip.MustParsePrefix(dst), DstPort: port}
	}
	for _, c := range []struct {
		name    string
		flows   []api.CNIFlow
		claimed string
		refused string // "" accepted
	}{
		{"the pod's own, not the node's", []api.CNIFlow{f("10.77.0.4/32", 53)}, "[10.77.0.4]", ""},
		{"the node's SSH", []api.CNIFlow{f("10.77.0.4/32", 53), f("10.0.0.5/32", 22)}, "[10.77.0.4 10.0.0.5]",
			"flow tcp 10.0.0.5:22: destination 10.0.0.5 is an address of the node (eth0): a pod's flows may not take the node's own traffic; " +
				"an operator grants it with the pool's sharedDestinations"},
		{"the node's v6 address", []api.CNIFlow{f("fd00::5/128", 0)}, "[fd00::5]", "flow tcp fd00::5: destination fd00::5 is an address of the node (eth0)"},
		{"the node's address, granted", []api.CNIFlow{f("192.0.2.1/32", 80)}, "[]", ""},
		{"a granted prefix holding a node address", []api.CNIFlow{f("192.0.2.0/29", 80)}, "[]", ""},
		{"one address, many ports: asked once", []api.CNIFlow{f("10.0.0.5/32", 80), f("10.0.0.5/32", 81)}, "[10.0.0.5]", "flow tcp 10.0.0.5:80"},
	} {
		if got := fmt.Sprint(Claimed(c.flows, shared)); got != c.claimed {
			t.Errorf("%s: claimed %s; want %s", c.name, got, c.claimed)
		}
		err := CheckNode(c.flows, node, shared)
		switch {
		case c.refused == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.refused != "" && (err == nil || !strings.Contains(err.Error(), c.refused) || !errors.Is(err, ErrNodeAddress)):
			t.Errorf("%s: %v; want a refusal naming %q", c.name, err, c.refused)
		}
	}
}
