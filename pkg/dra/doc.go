// Package dra is xdpq's face as a Dynamic Resource Allocation driver
// (driver name xdpq.io), beside the device plugin: kubelet asks it to
// prepare and unprepare ResourceClaims through
// k8s.io/dynamic-resource-allocation's kubeletplugin helper, and it
// publishes the node's queues as ResourceSlices through the same helper.
//
// The package knows the DRA API; the daemon knows the node. A pool's
// devices are described to this package as [Device]s (what the ledger
// holds, with what discovery and the agent know of their netdev), and
// a claim is handed to the daemon as a [Claim]: the xdpq pool and ledger
// device IDs the scheduler chose, the pods it is reserved for and the
// flows its configuration asks for. The daemon makes (or finds) the
// ledger allocation of the claim and says what the container gets, the
// same environment and mounts as the device plugin's Allocate; this
// package writes them as a CDI spec of the claim, which containerd
// applies to the pod's containers.
//
// [Face] is that node side as the daemon runs it: Prepare's decisions
// (the pool's way, one netdev per claim, the claim's flows and
// interface, a deallocated claim's devices taken back), Unprepare, the
// slices' devices and their taints, the claims' networkData, and the
// claims gone from the API server (Collect) or not reserved for a pod
// (ReservedFor), over the daemon's allocation core ([Core]), which it
// calls down into and never back.
//
// Names: a ResourceSlice pool is "<node>/<pool>" (pool names are one
// namespace per driver across the cluster); a device is a DNS label made
// of its netdev's name and queue, see [DeviceName].
package dra
