package dra

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// checkLabel fails t unless name is a DNS label, as the API server
// checks a ResourceSlice's device names.
func checkLabel(t *testing.T, name string) {
	t.Helper()
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		t.Errorf("%q is not a DNS label: %v", name, errs)
	}
}

func TestDeviceName(t *testing.T) {
	for _, c := range []struct {
		netdev string
		queue  int
		want   string // "" when only validity and the prefix are checked
		prefix string
	}{
		{netdev: "eth1", queue: 3, want: "eth1-q3"},
		{netdev: "ens1f0np0", queue: 0, want: "ens1f0np0-q0"},
		{netdev: "eth1", queue: -1, want: "eth1"},
		{netdev: "enp59s0f1", queue: 65535, want: "enp59s0f1-q65535"},
		{netdev: "ens1f0.100", queue: 3, prefix: "ens1f0-100-"},
		{netdev: "eth_1", queue: 3, prefix: "eth-1-"},
		{netdev: "Eth1", queue: 3, prefix: "eth1-"},
		{netdev: "abcdefghijklmno", queue: 7, want: "abcdefghijklmno-q7"}, // 15: IFNAMSIZ-1
		{netdev: "ABCDEFGHIJKLMNO", queue: 65535, prefix: "abcdefghijklmno-"},
		{netdev: "_.@%!~", queue: 2},
		{netdev: "-", queue: -1},
		{netdev: "eth1-", queue: 1, prefix: "eth1-"},
		{netdev: "-eth1", queue: 1},
		{netdev: "xn--eth", queue: 1},
		{netdev: "été0", queue: 1},
		{netdev: "", queue: 0},
		{netdev: strings.Repeat("a", 60), queue: 4},
		{netdev: strings.Repeat("_", 200), queue: 1 << 40},
	} {
		got := DeviceName(c.netdev, c.queue)
		checkLabel(t, got)
		if c.want != "" && got != c.want {
			t.Errorf("DeviceName(%q, %d) = %q, want %q", c.netdev, c.queue, got, c.want)
		}
		if !strings.HasPrefix(got, c.prefix) {
			t.Errorf("DeviceName(%q, %d) = %q, want it to start %q", c.netdev, c.queue, got, c.prefix)
		}
		if c.queue >= 0 && !strings.HasSuffix(got, "-q"+itoa(c.queue)) {
			t.Errorf("DeviceName(%q, %d) = %q: no queue suffix", c.netdev, c.queue, got)
		}
		if again := DeviceName(c.netdev, c.queue); again != got {
			t.Errorf("DeviceName(%q, %d) is %q, then %q", c.netdev, c.queue, got, again)
		}
	}
}

func itoa(n int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		if n /= 10; n == 0 {
			return string(b)
		}
	}
}

// TestDeviceNameInjective: netdevs that look alike after lower-casing
// and replacing punctuation, and a netdev named as another's device
// name reads, still get names of their own.
func TestDeviceNameInjective(t *testing.T) {
	netdevs := []string{"eth-1", "eth_1", "eth.1", "eth@1", "Eth-1", "ETH-1", "eth--1", "eth1", "Eth1", "eth1-", "-eth1"}
	// Each (non-label) name's device name is a valid netdev name too;
	// a netdev so named must not take its device name.
	for _, n := range []string{"eth_1", "eth.1", "Eth1", "x@y"} {
		if dn := DeviceName(n, -1); len(dn) <= 15 {
			netdevs = append(netdevs, dn)
		}
	}
	for _, queue := range []int{-1, 0, 3} {
		seen := map[string]string{}
		for _, n := range netdevs {
			name := DeviceName(n, queue)
			checkLabel(t, name)
			if other, dup := seen[name]; dup {
				t.Errorf("queue %d: netdevs %q and %q are both %q", queue, other, n, name)
			}
			seen[name] = n
		}
	}
}

func FuzzDeviceName(f *testing.F) {
	f.Add("eth1", "eth_1", 3)
	f.Add("eth-1", "eth.1", 0)
	f.Add("Eth1", "eth1", -1)
	f.Add("ens1f0.100", "ens1f0-100", 65535)
	f.Add("eth1-q3", "eth1", 3)
	f.Add("", "-", 1)
	f.Add(strings.Repeat("x", 64), strings.Repeat("x", 65), 1<<30)
	f.Fuzz(func(t *testing.T, a, b string, queue int) {
		if queue < -1 {
			queue = -1 // every negative queue is the whole netdev
		}
		na, nb := DeviceName(a, queue), DeviceName(b, queue)
		checkLabel(t, na)
		checkLabel(t, nb)
		if a != b && na == nb {
			t.Errorf("netdevs %q and %q are both %q (queue %d)", a, b, na, queue)
		}
		if queue >= 0 && !strings.HasSuffix(na, "-q"+itoa(queue)) {
			t.Errorf("queue %d of %q is %q: no queue suffix", queue, a, na)
		}
	})
}

func TestPoolName(t *testing.T) {
	for _, c := range []struct {
		node, pool string
		ok         bool
		want       string
	}{
		{node: "node-1", pool: "node-1/upf", ok: true, want: "upf"},
		{node: "node-1.example.com", pool: "node-1.example.com/dns-0", ok: true, want: "dns-0"},
		{node: "a", pool: "ab/x"},                       // another node's, whose name starts the same
		{node: "ab", pool: "a/x"},                       // a node whose name is a prefix of ours
		{node: "a", pool: "a/"},                         // no xdpq pool
		{node: "a", pool: "a/x/y"},                      // not one this driver writes
		{node: "a", pool: "a"},                          // no '/'
		{node: "a", pool: "x/a/upf"},                    // our node in the wrong place
		{node: "a", pool: "b/upf"},                      // another node's
		{node: "", pool: "/upf", ok: true, want: "upf"}, // degenerate, but a round trip
	} {
		got, ok := xdpqPool(c.node, c.pool)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("xdpqPool(%q, %q) = %q, %v; want %q, %v", c.node, c.pool, got, ok, c.want, c.ok)
		}
	}
	for _, pool := range []string{"upf", "dns-0", "a"} {
		for _, node := range []string{"node-1", "a", "n.example.com"} {
			got, ok := xdpqPool(node, PoolName(node, pool))
			if !ok || got != pool {
				t.Errorf("xdpqPool(%q, PoolName(%q, %q)) = %q, %v", node, node, pool, got, ok)
			}
			if _, ok := xdpqPool(node+"x", PoolName(node, pool)); ok {
				t.Errorf("node %q takes node %q's pool %q", node+"x", node, pool)
			}
		}
	}
}

// TestPoolNameFits: a pool name is at most 253 characters, each part a
// DNS subdomain, whatever the node's name; two long node names alike
// but at their end give two pool names; xdpqPool reads each back.
func TestPoolNameFits(t *testing.T) {
	label := strings.Repeat("a", 63)
	long := strings.Join([]string{label, label, label, label[:61]}, ".") // 253
	pool := strings.Repeat("p", 63)
	nodes := []string{"node-1", long, long[:252] + "b", strings.Repeat("n-", 120) + "x", label[:60] + "." + strings.Repeat("b", 130)}
	seen := map[string]string{}
	for _, node := range nodes {
		if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 && len(node) <= 253 {
			t.Fatalf("test node name %q: %v", node, errs)
		}
		name := PoolName(node, pool)
		if len(name) > 253 {
			t.Errorf("node of %d: pool name of %d characters", len(node), len(name))
		}
		for _, part := range strings.Split(name, "/") {
			if errs := validation.IsDNS1123Subdomain(part); len(errs) > 0 {
				t.Errorf("node of %d: %q: %v", len(node), part, errs)
			}
		}
		if other, ok := seen[name]; ok {
			t.Errorf("nodes %q and %q have one pool name %q", other, node, name)
		}
		seen[name] = node
		if p, ok := xdpqPool(node, name); !ok || p != pool {
			t.Errorf("xdpqPool(%q) = %q, %v", name, p, ok)
		}
		if len(node) <= maxNodePart && name != node+"/"+pool {
			t.Errorf("node %q: %q, want it whole", node, name)
		}
	}
	if _, ok := xdpqPool(long[:252]+"b", PoolName(long, pool)); ok {
		t.Error("another long node's pool read as this node's")
	}
}
