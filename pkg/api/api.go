package api

import (
	"net/netip"
	"time"
)

// DefaultSocket is where the daemon serves its local API.
const DefaultSocket = "/run/xdpq/xdpq-api.sock"

// Version is the version of the API this package speaks, answered by
// GET /v1/version. It changes when a request or answer changes in a way an
// older peer cannot read; added fields do not change it.
//
// Version 2 bounded GET /v1/status by the pools and netdevs: it gives the
// number of allocations and attachments (in all, and per pool) where
// version 1 listed them, and GET /v1/allocations lists them. A version 1
// client fails to read the new status (a number where it wants a list)
// rather than read that there are no allocations.
const Version = 2

// Allocation is a set of queues handed out, as the API reports it.
type Allocation struct {
	ID     string   `json:"id"`
	Pool   string   `json:"pool"`
	Netdev string   `json:"netdev"`
	Queues []uint32 `json:"queues"`
	Socket string   `json:"socket"` // the broker socket the holder connects to
	UID    *uint32  `json:"uid,omitempty"`
	// Created is when the allocation was made.
	Created time.Time `json:"created"`
	// Devices are the device ids of the queues.
	Devices []string `json:"devices"`
	// PodUID is the pod the allocation is bound to (Kubernetes): only its
	// processes may take the allocation's sockets. Empty until the pod is
	// known (its CNI ADD, or kubelet's PodResources).
	PodUID string `json:"podUID,omitempty"`
	// Pod is that pod's "namespace/name", as its CNI attachment named it.
	Pod string `json:"pod,omitempty"`
	// Claim is the DRA ResourceClaim the allocation was prepared for,
	// "namespace/name"; empty for the device plugin's and the local
	// API's.
	Claim string `json:"claim,omitempty"`
	// Lease lists the queues whose bound sockets a client of the broker
	// holds, as the daemon last recorded the lease; empty when none does.
	// A lease outlives a daemon restart: its client resumes it.
	Lease []uint32 `json:"lease,omitempty"`
	// Holder is the process that holds the lease now, as this daemon saw
	// it connect; nil when none does, or when a lease recorded before a
	// restart has not been resumed yet.
	Holder *Holder `json:"holder,omitempty"`
}

// Holder is a process holding an allocation's lease.
type Holder struct {
	PID int32  `json:"pid"`
	UID uint32 `json:"uid"`
	// PodUID is the pod its cgroup names; empty for a process in no pod.
	PodUID string `json:"podUID,omitempty"`
}

// Status reports pools, netdevs and how many allocations there are: what
// monitoring polls, of a size bounded by the pools and netdevs whatever
// the number of pods. [AllocationList] lists the allocations.
type Status struct {
	Pools []PoolStatus `json:"pools"`
	// Allocations is how many allocations there are, of every pool.
	// (Version 1 listed them under the same key.)
	Allocations int `json:"allocations"`
	// Attachments is how many CNI attachments they have.
	Attachments int            `json:"attachments"`
	Netdevs     []NetdevStatus `json:"netdevs"`
	// ConfigError says why the config in force is not the file on disk,
	// or what of it could not be put in force on this node.
	ConfigError string `json:"configError,omitempty"`
	// StateErrors are the daemon's records it cannot read: each keeps its
	// pool from new allocations until it is repaired or removed.
	StateErrors []string `json:"stateErrors,omitempty"`
	// Collected is when the daemon last finished looking for attachments
	// of gone pods (and, with kubelet, allocations no container holds).
	Collected time.Time `json:"collected,omitzero"`
	// Config is the config in force.
	Config ConfigStatus `json:"config,omitzero"`
}

// AllocationList answers GET /v1/allocations: the allocations, of every
// pool or of the one asked for, and their CNI attachments. Neither list
// is ever null.
type AllocationList struct {
	// Allocations are by id.
	Allocations []Allocation `json:"allocations"`
	// Attachments are the CNI attachments of the allocations, by
	// container and interface.
	Attachments []AttachmentStatus `json:"attachments"`
}

// ConfigStatus is the config in force.
type ConfigStatus struct {
	// Hash is the SHA-256 of the file in force, hex.
	Hash string `json:"hash"`
	// Loaded is when it was put in force.
	Loaded time.Time `json:"loaded"`
}

// PoolStatus is one pool's capacity.
type PoolStatus struct {
	Name     string `json:"name"`
	Resource string `json:"resource"`
	Queues   int    `json:"queues"`
	Free     int    `json:"free"`
	// Allocations is how many allocations of the pool there are.
	Allocations int `json:"allocations"`
	// Reason says why the pool has fewer queues than its config names, or
	// takes no allocation now.
	Reason string `json:"reason,omitempty"`
}

// NetdevStatus is what the agent reports of a netdev.
type NetdevStatus struct {
	Netdev   string `json:"netdev"`
	State    string `json:"state"`
	Mode     string `json:"mode"`
	Steering string `json:"steering"`
	Flows    int    `json:"flows"`
	// UnknownFlows counts the steering entries (ntuple rules, or filter
	// map entries: one per queue of a flow) xdpq installed that no record
	// it can read owns (see Status.StateErrors); they stay until the
	// record is repaired or removed.
	UnknownFlows int      `json:"unknownFlows,omitempty"`
	Sockets      []uint32 `json:"sockets"`
	LinkUp       bool     `json:"linkUp"`
	Reason       string   `json:"reason,omitempty"`
	// PolicyError says which of its pool's settings could not be put in
	// force on the netdev, and why.
	PolicyError string `json:"policyError,omitempty"`
	// Program is the id of the program on its hook, xdpq's or a foreign
	// one; 0 when none.
	Program uint32 `json:"program,omitempty"`
	// Foreign is the foreign program's name, when State is Overridden.
	Foreign string `json:"foreign,omitempty"`
	// RXQueues is its rx queue count now.
	RXQueues int `json:"rxQueues,omitempty"`
	// Reserved are the queues its pool keeps RSS off.
	Reserved []uint32 `json:"reserved,omitempty"`
	// ZeroCopy is whether the driver offers AF_XDP zero-copy.
	ZeroCopy bool `json:"zeroCopy,omitempty"`
	// Driver, PCI and NUMANode are what discovery found of it: its kernel
	// driver ("" when virtual), PCI address ("" when not PCI) and NUMA
	// node (-1 when unknown).
	Driver   string `json:"driver,omitempty"`
	PCI      string `json:"pci,omitempty"`
	NUMANode int    `json:"numaNode"`
}

// CNIFlow is a flow the CNI plugin asks for, its destination resolved
// (the IPAM address filled in) and its port ranges expanded.
type CNIFlow struct {
	Protocol string       `json:"protocol"`
	Dst      netip.Prefix `json:"dst"`
	DstPort  uint16       `json:"dstPort,omitempty"`
	Src      netip.Prefix `json:"src,omitzero"`
	SrcPort  uint16       `json:"srcPort,omitempty"`
	VLAN     uint16       `json:"vlan,omitempty"`
}

// CNIAddRequest is an attachment the CNI plugin makes.
type CNIAddRequest struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	// The allocation: by its id (standalone, CNI_ARGS XDPQ_ALLOCATION), by
	// a device it holds (Kubernetes, Multus's deviceID), or else the one
	// kubelet's PodResources reports for the pod (PodNamespace, PodName).
	Allocation   string    `json:"allocation,omitempty"`
	Resource     string    `json:"resource,omitempty"`
	DeviceID     string    `json:"deviceID,omitempty"`
	PodUID       string    `json:"podUID,omitempty"`
	PodNamespace string    `json:"podNamespace,omitempty"`
	PodName      string    `json:"podName,omitempty"`
	Flows        []CNIFlow `json:"flows,omitempty"`
	// Addresses are the pod's addresses on this attachment (the IPAM
	// plugin's, or in a chain the previous plugin's): in a queue pool a
	// flow may steer only traffic to them, or to a destination the pool
	// grants (sharedDestinations).
	Addresses []netip.Addr `json:"addresses,omitempty"`
	// Netns is the pod's network namespace (CNI_NETNS): a netdev-mode
	// pool's netdev moves there, renamed IfName, with MTU if not zero.
	Netns string `json:"netns,omitempty"`
	MTU   int    `json:"mtu,omitempty"`
	// Chained says the plugin runs after another in the node's chain: the
	// interface IfName is that plugin's, so a netdev-mode pool's netdev
	// cannot be moved in under its name.
	Chained bool `json:"chained,omitempty"`
}

// Attachment is a pod's attachment as the daemon keeps it.
type Attachment struct {
	CNIAddRequest
	AllocationID string   `json:"allocationID"`
	Netdev       string   `json:"netdev"` // its name in the daemon's namespace
	Queues       []uint32 `json:"queues"`
	// Mode is the pool's: queue (flows steered onto the allocation's queues
	// of a netdev that stays on the node) or netdev (the netdev moved into
	// Netns as IfName; Mac is its address there).
	Mode string `json:"mode"`
	Mac  string `json:"mac,omitempty"`
	// NetnsInode identifies Netns as ADD found it: when the path is gone or
	// names another namespace, the pod is gone and the daemon ends the
	// attachment on its own (containerd never calls CNI GC).
	NetnsInode uint64 `json:"netnsInode,omitempty"`
}

// AttachmentStatus is an attachment as status reports it.
type AttachmentStatus struct {
	Attachment
	// State is "active", or what is being done to it: "pending" (ADD in
	// progress) or "ending" (DEL in progress).
	State string `json:"state"`
}

// Pool modes.
const (
	ModeQueue  = "queue"
	ModeNetdev = "netdev"
)

// AllocRequest asks for queues of a pool (standalone).
type AllocRequest struct {
	Pool  string `json:"pool"`
	Count int    `json:"count"`
	UID   uint32 `json:"uid"`
}

// FreeRequest ends an allocation.
type FreeRequest struct {
	ID string `json:"id"`
}

// AttachmentRef names an attachment.
type AttachmentRef struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// GCRequest lists the attachments to keep.
type GCRequest struct {
	Valid []string `json:"valid"` // "containerID/ifName"
}

// FreeAnswer answers POST /v1/free.
type FreeAnswer struct {
	Freed string `json:"freed"` // the allocation's id
}

// GCAnswer answers POST /v1/cni/gc.
type GCAnswer struct {
	Removed []string `json:"removed"` // "containerID/ifName", never null
}

// VersionInfo answers GET /v1/version.
type VersionInfo struct {
	API int `json:"api"` // the daemon's [Version]
	// Release is the daemon's release (xdpq.Version, "0.1.0"); empty
	// from a daemon before releases were.
	Release string `json:"release,omitempty"`
}

// Error is the body of every answer that is not 200: the refusal's
// message, for a person, and its code (one of the Code constants), for a
// program. Daemons before codes existed sent only the message.
type Error struct {
	Error string `json:"error"`
	Code  string `json:"code,omitempty"`
}
