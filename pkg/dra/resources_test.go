package dra

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// checkResources fails t for what the API server (or the
// ResourceSlice controller, whose validateDriverResources is not
// exported) would refuse in res: pool and device names, the limits on
// a slice's devices and a device's attributes and taints, a device
// named twice in a pool.
func checkResources(t *testing.T, res resourceslice.DriverResources) {
	t.Helper()
	for pool, p := range res.Pools {
		if len(pool) > resourceapi.PoolNameMaxLength {
			t.Errorf("pool %q: longer than %d", pool, resourceapi.PoolNameMaxLength)
		}
		for _, seg := range strings.Split(pool, "/") {
			if errs := content.IsDNS1123Subdomain(seg); len(errs) > 0 {
				t.Errorf("pool %q: %q: %v", pool, seg, errs)
			}
		}
		if len(p.Slices) == 0 {
			t.Errorf("pool %q: no slice", pool)
		}
		seen := map[string]bool{}
		for i, s := range p.Slices {
			limit := resourceapi.ResourceSliceMaxDevices
			for _, d := range s.Devices {
				if len(d.Taints) > 0 {
					limit = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
				}
			}
			if len(s.Devices) > limit {
				t.Errorf("pool %q slice %d: %d devices, at most %d", pool, i, len(s.Devices), limit)
			}
			for _, d := range s.Devices {
				if seen[d.Name] {
					t.Errorf("pool %q: device %q twice", pool, d.Name)
				}
				seen[d.Name] = true
				checkDevice(t, pool, d)
			}
		}
	}
}

func checkDevice(t *testing.T, pool string, d resourceapi.Device) {
	t.Helper()
	where := fmt.Sprintf("pool %q device %q", pool, d.Name)
	if errs := content.IsDNS1123Label(d.Name); len(errs) > 0 {
		t.Errorf("%s: name: %v", where, errs)
	}
	if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		t.Errorf("%s: %d attributes and capacities, at most %d", where, n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
	}
	for name, a := range d.Attributes {
		domain, id, qualified := strings.Cut(string(name), "/")
		if !qualified {
			id = domain
		} else if errs := content.IsDNS1123Subdomain(domain); len(errs) > 0 || len(domain) > resourceapi.DeviceMaxDomainLength {
			t.Errorf("%s: attribute %q: domain: %v", where, name, errs)
		}
		if errs := content.IsCIdentifier(id); len(errs) > 0 || len(id) > resourceapi.DeviceMaxIDLength {
			t.Errorf("%s: attribute %q: %v", where, name, errs)
		}
		set := 0
		for _, p := range []bool{a.IntValue != nil, a.BoolValue != nil, a.StringValue != nil, a.VersionValue != nil,
			a.IntValues != nil, a.BoolValues != nil, a.StringValues != nil, a.VersionValues != nil} {
			if p {
				set++
			}
		}
		if set != 1 {
			t.Errorf("%s: attribute %q has %d values", where, name, set)
		}
		if a.StringValue != nil && len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength {
			t.Errorf("%s: attribute %q: %q is longer than %d", where, name, *a.StringValue, resourceapi.DeviceAttributeMaxValueLength)
		}
	}
	if len(d.Taints) > resourceapi.DeviceTaintsMaxLength {
		t.Errorf("%s: %d taints", where, len(d.Taints))
	}
	for _, tn := range d.Taints {
		if errs := content.IsLabelKey(tn.Key); len(errs) > 0 {
			t.Errorf("%s: taint key %q: %v", where, tn.Key, errs)
		}
		if errs := content.IsLabelValue(tn.Value); len(errs) > 0 {
			t.Errorf("%s: taint value %q: %v", where, tn.Value, errs)
		}
		switch tn.Effect {
		case resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute, resourceapi.DeviceTaintEffectNone:
		default:
			t.Errorf("%s: taint effect %q", where, tn.Effect)
		}
	}
}

// queueDevices are n queue devices of netdev, the first queue first.
func queueDevices(netdev string, first, n int) []Device {
	var out []Device
	for q := first; q < first+n; q++ {
		out = append(out, Device{ID: fmt.Sprintf("%s-q%d", netdev, q), Netdev: netdev, Queue: q, Queues: 1, Driver: "ice",
			PCI: "0000:3b:00.0", PCIeRoot: "pci0000:3a", NUMA: 1, Native: true, ZeroCopy: true, Steering: "ntuple", SpeedMbps: 25000})
	}
	return out
}

func TestResources(t *testing.T) {
	upf := queueDevices("eth1", 0, 3)
	upf[1].Unavailable, upf[1].Reason = "a foreign XDP program (xdp_dummy) holds netdev eth1's hook", "Overridden"
	dns := []Device{
		{ID: "veth0", Netdev: "veth0", Queue: -1, Queues: 4, NUMA: -1},
		{ID: "ens1f0.100", Netdev: "ens1f0.100", Queue: -1, Queues: 8, Driver: "mlx5_core", PCI: "0000:5e:00.0", NUMA: 0, Native: true},
	}
	res := Resources("node-1", map[string][]Device{"upf": upf, "dns": dns})
	checkResources(t, res)

	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
	num := func(n int64) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{IntValue: &n} }
	flag := func(b bool) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{BoolValue: &b} }
	queueAttrs := func(q int64) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"pool": str("upf"), "netdev": str("eth1"), "queue": num(q), "queues": num(1), "mode": str("queue"),
			"steering": str("ntuple"), "driver": str("ice"), "nativeXDP": flag(true), "zeroCopy": flag(true),
			"linkSpeedMbps": num(25000), "extendedResource": flag(true),
			"resource.kubernetes.io/pciBusID": str("0000:3b:00.0"),
			"resource.kubernetes.io/pcieRoot": str("pci0000:3a"),
			"resource.kubernetes.io/numaNode": num(1),
		}
	}
	want := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		"node-1/upf": {Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{
			{Name: "eth1-q0", Attributes: queueAttrs(0)},
			{Name: "eth1-q1", Attributes: queueAttrs(1), Taints: []resourceapi.DeviceTaint{
				{Key: "xdpq.io/unavailable", Value: "Overridden", Effect: resourceapi.DeviceTaintEffectNoSchedule}}},
			{Name: "eth1-q2", Attributes: queueAttrs(2)},
		}}}},
		"node-1/dns": {Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{
			{Name: "veth0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"pool": str("dns"), "netdev": str("veth0"), "queues": num(4), "mode": str("netdev"),
				"nativeXDP": flag(false), "zeroCopy": flag(false), "extendedResource": flag(true),
			}},
			{Name: DeviceName("ens1f0.100", -1), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"pool": str("dns"), "netdev": str("ens1f0.100"), "queues": num(8), "mode": str("netdev"),
				"driver": str("mlx5_core"), "nativeXDP": flag(true), "zeroCopy": flag(false), "extendedResource": flag(true),
				"resource.kubernetes.io/pciBusID": str("0000:5e:00.0"),
				"resource.kubernetes.io/numaNode": num(0), // node 0 is known
			}},
		}}}},
	}}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("Resources (-want +got):\n%s", diff)
	}
	// The names the package says are the ones the API knows.
	for _, n := range []resourceapi.QualifiedName{deviceattribute.StandardDeviceAttributePCIBusID,
		deviceattribute.StandardDeviceAttributePCIeRoot, deviceattribute.StandardDeviceAttributeNUMANode} {
		if _, ok := res.Pools["node-1/upf"].Slices[0].Devices[0].Attributes[n]; !ok {
			t.Errorf("no attribute %s", n)
		}
	}
	if TaintKey != "xdpq.io/unavailable" {
		t.Errorf("TaintKey %q", TaintKey)
	}
}

// TestExtendedResourceOneNetdev: of a queue pool of two netdevs, the
// queues of one are offered to the pool's extended resource (the claim
// the scheduler makes for it cannot ask for one netdev, and an
// allocation is on one): the first that is available, the first at all
// when none is. Every netdev of a netdev-mode pool is offered.
func TestExtendedResourceOneNetdev(t *testing.T) {
	extended := func(devs []Device) []string {
		var out []string
		for _, d := range Resources("n", map[string][]Device{"p": devs}).Pools["n/p"].Slices[0].Devices {
			if v := d.Attributes[AttrExtended].BoolValue; v != nil && *v {
				out = append(out, d.Name)
			}
		}
		return out
	}
	down := func(devs []Device) []Device {
		for i := range devs {
			devs[i].Unavailable, devs[i].Reason = "netdev "+devs[i].Netdev+"'s link is down", "LinkDown"
		}
		return devs
	}
	for _, c := range []struct {
		name string
		devs []Device
		want []string
	}{
		{"both well", append(queueDevices("eth1", 0, 2), queueDevices("eth2", 0, 2)...), []string{"eth1-q0", "eth1-q1"}},
		{"the first down", append(down(queueDevices("eth1", 0, 2)), queueDevices("eth2", 0, 2)...), []string{"eth2-q0", "eth2-q1"}},
		{"both down", down(append(queueDevices("eth1", 0, 2), queueDevices("eth2", 0, 2)...)), []string{"eth1-q0", "eth1-q1"}},
		{"netdevs", []Device{{ID: "vf0", Netdev: "vf0", Queue: -1, Queues: 2, NUMA: -1}, {ID: "vf1", Netdev: "vf1", Queue: -1, Queues: 2, NUMA: -1}},
			[]string{"vf0", "vf1"}},
	} {
		if got := extended(c.devs); !slices.Equal(got, c.want) {
			t.Errorf("%s: offered to the extended resource %v, want %v", c.name, got, c.want)
		}
	}
}

func TestResourcesSlices(t *testing.T) {
	for _, c := range []struct {
		name  string
		devs  []Device
		sizes []int
	}{
		{name: "200 queues", devs: append(queueDevices("eth1", 0, 100), queueDevices("eth2", 0, 100)...), sizes: []int{64, 64, 64, 8}},
		{name: "64 queues", devs: queueDevices("eth1", 0, 64), sizes: []int{64}},
		{name: "65 queues", devs: queueDevices("eth1", 0, 65), sizes: []int{64, 1}},
		{name: "one", devs: queueDevices("eth1", 5, 1), sizes: []int{1}},
		{name: "empty", devs: nil, sizes: []int{0}},
		{name: "empty, not nil", devs: []Device{}, sizes: []int{0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Every device tainted: the most the API allows a slice.
			for i := range c.devs {
				c.devs[i].Unavailable, c.devs[i].Reason = "netdev "+c.devs[i].Netdev+"'s link is down", "LinkDown"
			}
			res := Resources("n", map[string][]Device{"p": c.devs})
			checkResources(t, res)
			if len(res.Pools) != 1 {
				t.Fatalf("%d pools, want 1", len(res.Pools))
			}
			p, ok := res.Pools["n/p"]
			if !ok {
				t.Fatalf("no pool n/p: %v", res.Pools)
			}
			var sizes []int
			var names []string
			for _, s := range p.Slices {
				sizes = append(sizes, len(s.Devices))
				for _, d := range s.Devices {
					names = append(names, d.Name)
				}
			}
			if !cmp.Equal(sizes, c.sizes) {
				t.Errorf("slices of %v devices, want %v", sizes, c.sizes)
			}
			var want []string
			for _, d := range c.devs {
				want = append(want, DeviceName(d.Netdev, d.Queue))
			}
			if diff := cmp.Diff(want, names); diff != "" {
				t.Errorf("devices not in the order given (-want +got):\n%s", diff)
			}
		})
	}
	if res := Resources("n", nil); len(res.Pools) != 0 {
		t.Errorf("no pools: %v", res.Pools)
	}
}

// TestResourcesLimits: a device with every attribute set to its longest
// still passes the API's limits.
func TestResourcesLimits(t *testing.T) {
	d := Device{ID: "x", Netdev: strings.Repeat("N", 15), Queue: 1 << 20, Queues: 1 << 20, Driver: strings.Repeat("d", 64),
		PCI: "ffff:ff:1f.7", PCIeRoot: "pciffff:ff", NUMA: 1023, Native: true, ZeroCopy: true, Steering: "filter",
		SpeedMbps: 800000, Unavailable: strings.Repeat("u", 500), Reason: "QueueGone"}
	res := Resources(strings.Repeat("n", 63)+".example.com", map[string][]Device{strings.Repeat("p", 63): {d}})
	checkResources(t, res)
	for _, p := range res.Pools {
		if got := p.Slices[0].Devices[0].Taints; len(got) != 1 || got[0].Value != "QueueGone" {
			t.Errorf("taints %v", got)
		}
	}
}
