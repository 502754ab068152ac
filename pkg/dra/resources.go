package dra

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// Device is a ledger device of an xdpq pool as the ResourceSlice shows
// it: a queue of a queue pool, or a whole netdev of a netdev pool.
type Device struct {
	// ID is the ledger's device ID ("eth1-q3", or the netdev's name).
	ID string
	// Netdev is the netdev the device is (part of).
	Netdev string
	// Queue is the queue of a queue pool's device; -1 for a whole netdev.
	Queue int
	// Queues is how many queues the device has (1 for a queue).
	Queues int
	// Driver is the netdev's kernel driver ("" for a virtual one).
	Driver string
	// PCI is the netdev's PCI address, "" when it is not a PCI device.
	PCI string
	// PCIeRoot is the PCIe root complex it hangs off ("pci0000:00"), ""
	// when unknown.
	PCIeRoot string
	// NUMA is its NUMA node, -1 when unknown.
	NUMA int
	// Native says the netdev runs XDP in its driver (not generic).
	Native bool
	// ZeroCopy says AF_XDP sockets on it can be zero-copy.
	ZeroCopy bool
	// Steering is how flows reach the device's queues: "ntuple"
	// (hardware rules) or "filter" (xdpq's filter program); "" for a
	// whole netdev, which needs none.
	Steering string
	// SpeedMbps is the link's speed, 0 when unknown.
	SpeedMbps int
	// Unavailable is why new claims must not get the device now (a
	// foreign program holds the netdev's hook, the netdev is gone or
	// down), "" when it is well. The device is then tainted NoSchedule.
	Unavailable string
	// Reason is Unavailable's one-word form, the taint's value
	// ("Overridden", "Missing", "LinkDown").
	Reason string
}

// Attribute names (in the driver's domain unless qualified).
const (
	AttrPool     = "pool"
	AttrNetdev   = "netdev"
	AttrQueue    = "queue"
	AttrQueues   = "queues"
	AttrMode     = "mode"
	AttrDriver   = "driver"
	AttrNative   = "nativeXDP"
	AttrZeroCopy = "zeroCopy"
	AttrSteering = "steering"
	AttrSpeed    = "linkSpeedMbps"
	// AttrExtended marks the devices a pod asking for the pool's
	// extended resource may be given (the chart's DeviceClass
	// <pool>.extended.xdpq.io selects them): the claim the scheduler
	// makes for it cannot ask for one netdev, and an allocation's queues
	// are on one, so only one netdev's queues per node and pool are
	// offered to it. Every netdev of a netdev-mode pool is.
	AttrExtended = "extendedResource"
)

// TaintKey is the key of the taint of a device new claims must avoid.
const TaintKey = DriverName + "/unavailable"

// maxPerSlice is how many devices a slice holds: the API's limit for
// slices whose devices have taints, so that a device that becomes
// tainted never makes its slice too large.
const maxPerSlice = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

// Resources is what the node publishes: a ResourceSlice pool per xdpq
// pool (named PoolName(node, pool)), its devices in the order given, in
// slices of at most maxPerSlice. A pool without devices is published
// empty: the driver is there, and has none of them now.
func Resources(node string, pools map[string][]Device) resourceslice.DriverResources {
	res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{}}
	for name, devs := range pools {
		extended := extendedNetdev(devs)
		var ss []resourceslice.Slice
		for chunk := range slices.Chunk(devs, maxPerSlice) {
			s := resourceslice.Slice{Devices: make([]resourceapi.Device, 0, len(chunk))}
			for _, d := range chunk {
				s.Devices = append(s.Devices, apiDevice(name, d, d.Queue < 0 || d.Netdev == extended))
			}
			ss = append(ss, s)
		}
		if len(ss) == 0 {
			ss = []resourceslice.Slice{{}}
		}
		res.Pools[PoolName(node, name)] = resourceslice.Pool{Slices: ss}
	}
	return res
}

// extendedNetdev is the netdev whose queues a pool's extended resource
// is given: the first of devs's netdevs that is available (the first if
// none is). A netdev that becomes unavailable hands it to the next;
// allocations made already keep their queues.
func extendedNetdev(devs []Device) string {
	first := ""
	for _, d := range devs {
		if first == "" {
			first = d.Netdev
		}
		if d.Unavailable == "" {
			return d.Netdev
		}
	}
	return first
}

// apiDevice is a device of pool as its ResourceSlice shows it; extended
// says whether the pool's extended resource may be given it.
func apiDevice(pool string, d Device, extended bool) resourceapi.Device {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(s)} }
	num := func(n int) resourceapi.DeviceAttribute {
		return resourceapi.DeviceAttribute{IntValue: ptr.To(int64(n))}
	}
	flag := func(b bool) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{BoolValue: ptr.To(b)} }
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrPool:     str(pool),
		AttrNetdev:   str(d.Netdev),
		AttrQueues:   num(d.Queues),
		AttrNative:   flag(d.Native),
		AttrZeroCopy: flag(d.ZeroCopy),
		AttrExtended: flag(extended),
	}
	name := DeviceName(d.Netdev, d.Queue)
	if d.Queue >= 0 {
		attrs[AttrMode] = str("queue")
		attrs[AttrQueue] = num(d.Queue)
	} else {
		attrs[AttrMode] = str("netdev")
	}
	if d.Steering != "" {
		attrs[AttrSteering] = str(d.Steering)
	}
	if d.Driver != "" {
		attrs[AttrDriver] = str(d.Driver)
	}
	if d.SpeedMbps > 0 {
		attrs[AttrSpeed] = num(d.SpeedMbps)
	}
	if d.PCI != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIBusID] = str(d.PCI)
	}
	if d.PCIeRoot != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = str(d.PCIeRoot)
	}
	if d.NUMA >= 0 {
		// A device without NUMA affinity has no numaNode: -1 would
		// match every other such device under matchAttribute.
		attrs[deviceattribute.StandardDeviceAttributeNUMANode] = num(d.NUMA)
	}
	dev := resourceapi.Device{Name: name, Attributes: attrs}
	if d.Unavailable != "" {
		dev.Taints = []resourceapi.DeviceTaint{{Key: TaintKey, Value: d.Reason, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	}
	return dev
}
