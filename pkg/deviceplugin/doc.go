// Package deviceplugin serves one xdpq pool to kubelet as a device plugin
// (k8s.io/kubelet device plugin API v1beta1): each reserved queue is a
// device "<netdev>-q<N>", healthy or not, with its NIC's NUMA node as
// topology. The plugin serves before it registers, re-registers when
// kubelet re-creates its socket (a kubelet restart wipes the
// device-plugins directory, so nothing is kept there), prefers queues of
// one netdev, contiguous and NUMA-local, and leaves what an allocation
// means (mounts, environment) to the daemon through Config.Allocate.
//
// Plugins is the daemon's device plugin face: one Plugin a pool that the
// allocation core (Core) has them serve, kubelet's Allocate answered by
// the core's allocation, and the device-info files CNI meta-plugins read
// written for a PCI NIC's devices and removed when the core says an
// allocation is no longer served.
package deviceplugin
