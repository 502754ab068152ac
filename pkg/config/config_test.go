package config

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestExampleParses(t *testing.T) {
	b, err := os.ReadFile("../../docs/config-example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	pools := c.ForNode("edge-1", map[string]string{"node-role.example.com/edge": "true"})
	if len(pools) != 3 || pools[0].Name != "upf" || pools[0].Devices.Netdevs[0] != "ens1f0#8-11" || len(pools[0].Devices.Netdevs) != 1 {
		t.Errorf("edge node pools: %+v", pools)
	}
	core := c.ForNode("core-1", nil)
	if len(core[0].Devices.Netdevs) != 2 || core[1].Linger.Duration != 30*time.Second || core[2].Mode != "netdev" ||
		core[1].Limits.MaxRing != DefaultMaxRing || core[1].Steering != "auto" {
		t.Errorf("core node pools: %+v", core)
	}
	if c.Resource(core[0]) != "xdpq.io/upf" {
		t.Errorf("resource %q", c.Resource(core[0]))
	}
}

// TestValidation: good files parse; each bad one is refused with the
// field path and what is wrong.
func TestValidation(t *testing.T) {
	for _, c := range []struct {
		name, file string
		want       []string // substrings of the error; none: the file is good
	}{
		{"minimal", "pools: [{name: a, devices: {netdevs: [eth1#8-15]}}]", nil},
		{"json", `{"pools":[{"name":"a","queues":"0,2,4-7","devices":{"drivers":["ice"]}}]}`, nil},
		{"no pools is allowed", "pools: []", nil},
		{"unknown top field", "pools: []\npool: []", []string{"pool: unknown field; allowed: nodes, pools, resourcePrefix"}},
		{"unknown nested field", "pools: [{name: a, devices: {drvers: [ice]}, queues: '1'}]", []string{"pools[0].devices.drvers: unknown field; allowed: deviceIDs, drivers, netdevs, pciAddresses, vendors"}},
		{"wrong type", "pools: [{name: a, devices: {netdevs: [eth1#1]}, limits: {maxRing: big}}]", []string{"pools[0].limits.maxRing: got a string, want a whole number, not negative"}},
		{"negative", "pools: [{name: a, devices: {netdevs: [eth1#1]}, limits: {maxRing: -8}}]", []string{"pools[0].limits.maxRing: got a number, want a whole number, not negative"}},
		{"list wanted", "pools: [{name: a, devices: {netdevs: eth1#1}}]", []string{"pools[0].devices.netdevs: got a string, want a list"}},
		{"no name", "pools: [{devices: {netdevs: [eth1#1]}}]", []string{"pools[0].name: required"}},
		{"bad name", "pools: [{name: UPF_1, devices: {netdevs: [eth1#1]}}]", []string{"pools[0].name: \"UPF_1\""}},
		{"duplicate name", "pools: [{name: a, devices: {netdevs: [eth1#1]}}, {name: a, devices: {netdevs: [eth2#1]}}]", []string{"pools[1].name: \"a\" is also the name of pools[0]"}},
		{"bad mode", "pools: [{name: a, mode: shared, devices: {netdevs: [eth1#1]}}]", []string{"pools[0].mode: \"shared\"; allowed: queue, netdev"}},
		{"bad steering", "pools: [{name: a, steering: magic, devices: {netdevs: [eth1#1]}}]", []string{"pools[0].steering"}},
		{"bad shared destination", "pools: [{name: a, sharedDestinations: [192.0.2.10, 10.0.0.0/33, vip], devices: {netdevs: [eth1#1]}}]",
			[]string{"pools[0].sharedDestinations[1]", "pools[0].sharedDestinations[2]"}},
		{"selects nothing", "pools: [{name: a, queues: '1', devices: {}}]", []string{"pools[0].devices: selects nothing"}},
		{"queues needed", "pools: [{name: a, devices: {drivers: [ice]}}]", []string{"pools[0].queues: required"}},
		{"bad range", "pools: [{name: a, devices: {netdevs: [eth1#9-3]}}]", []string{"pools[0].devices.netdevs[0]: netdev eth1: queue range \"9-3\" runs backwards"}},
		{"bad queues", "pools: [{name: a, queues: '1,x', devices: {drivers: [ice]}}]", []string{"pools[0].queues: queue \"x\""}},
		{"bad vendor", "pools: [{name: a, queues: '1', devices: {vendors: ['0x8086']}}]", []string{"pools[0].devices.vendors[0]: \"0x8086\": want 4 lower-case hex digits"}},
		{"bad pci", "pools: [{name: a, queues: '1', devices: {pciAddresses: ['3b:00.0']}}]", []string{"pools[0].devices.pciAddresses[0]"}},
		{"ring not pow2", "pools: [{name: a, devices: {netdevs: [eth1#1]}, limits: {maxRing: 1000}}]", []string{"pools[0].limits.maxRing: 1000: a power of two"}},
		{"bad linger", "pools: [{name: a, devices: {netdevs: [eth1#1]}, linger: soon}]", []string{"duration \"soon\""}},
		{"dpdk on a queue pool", "pools: [{name: a, devices: {netdevs: [eth1#1]}, dpdk: {iface: net1}}]", []string{"pools[0].dpdk"}},
		{"dpdk without iface", "pools: [{name: a, mode: netdev, devices: {netdevs: [eth1]}, dpdk: {pinnedMap: true}}]", []string{"pools[0].dpdk.iface"}},
		{"dpdk iface too long", "pools: [{name: a, mode: netdev, devices: {netdevs: [eth1]}, dpdk: {iface: abcdefghijklmnop}}]", []string{"pools[0].dpdk.iface"}},
		{"dpdk iface with a slash", "pools: [{name: a, mode: netdev, devices: {netdevs: [eth1]}, dpdk: {iface: ../x}}]", []string{"pools[0].dpdk.iface"}},
		{"bad busy poll", "pools: [{name: a, devices: {netdevs: [eth1#1]}, busyPoll: {timeoutMicros: 0, budget: 64}}]", []string{"pools[0].busyPoll.timeoutMicros"}},
		{"netdev mode with queues", "pools: [{name: a, mode: netdev, devices: {netdevs: [eth1#1-2]}}]", []string{"pools[0].devices.netdevs[0]: a netdev-mode pool takes whole netdevs"}},
		{"queue claimed twice", "pools: [{name: a, devices: {netdevs: [eth1#8-15]}}, {name: b, devices: {netdevs: [eth1#15-20]}}]", []string{"pools[1].devices.netdevs[0]: queue 15 of eth1 is claimed by pool \"a\" too (pools[0].devices.netdevs[0])"}},
		{"whole netdev claimed", "pools: [{name: a, mode: netdev, devices: {netdevs: [eth1]}}, {name: b, devices: {netdevs: [eth1#1]}}]", []string{"pools[1].devices.netdevs[0]"}},
		{"disjoint queues fine", "pools: [{name: a, devices: {netdevs: [eth1#8-11]}}, {name: b, devices: {netdevs: [eth1#12-15]}}]", nil},
		{"override selects nothing", "pools: []\nnodes: [{pools: []}]", []string{"nodes[0]: selects no node"}},
		{"override conflicts", "pools: [{name: a, devices: {netdevs: [eth1#1-4]}}]\nnodes: [{names: [n1], pools: [{name: b, devices: {netdevs: [eth1#4]}}]}]", []string{"queue 4 of eth1 is claimed by pool \"a\""}},
		{"bad prefix", "resourcePrefix: Xdpq_io\npools: []", []string{"resourcePrefix"}},
		{"not yaml", "pools: [", []string{"(file): not YAML or JSON"}},
		{"empty", "", []string{"(file): empty"}},
		{"several at once", "pools: [{name: A, devices: {}}]", []string{"pools[0].name", "pools[0].devices: selects nothing"}},
	} {
		_, err := Parse([]byte(c.file))
		if c.want == nil {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		var ce *Error
		if !errors.As(err, &ce) {
			t.Errorf("%s: error %v is not a config.Error", c.name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error lacks %q:\n%v", c.name, w, err)
			}
		}
	}
}

func TestParseQueues(t *testing.T) {
	q, err := ParseQueues("8-10, 2,0")
	if err != nil || len(q) != 5 || q[0] != 0 || q[4] != 10 {
		t.Errorf("%v %v", q, err)
	}
	for _, bad := range []string{"", "1,1", "a", "5-", "-5", "0-70000", "0-5000"} {
		if _, err := ParseQueues(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzParse(f *testing.F) {
	b, _ := os.ReadFile("../../docs/config-example.yaml")
	f.Add(b)
	f.Add([]byte("pools: [{name: a, devices: {netdevs: [eth1#8-15]}}]"))
	f.Add([]byte(`{"pools":[{"name":"a","queues":"1","devices":{"drivers":["ice"]}}],"nodes":[{"names":["x"],"pools":[]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b)
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) || len(ce.Errors) == 0 {
				t.Fatalf("error %v is not a config.Error with problems", err)
			}
			return
		}
		// A config that parsed is valid and its pools resolve to queue lists.
		if errs := c.Validate(); len(errs) > 0 {
			t.Fatalf("parsed but invalid: %v", errs)
		}
		for _, p := range c.ForNode("n", nil) {
			if p.Mode == "" || p.Limits.MaxRing == 0 {
				t.Fatalf("defaults not filled: %+v", p)
			}
		}
	})
}
