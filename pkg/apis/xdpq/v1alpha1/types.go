package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// XdpqNode is what xdpq's daemon on one node reports: its netdevs and
// their XDP state, its pools, the allocations pods hold, its config and
// conditions. There is one per node, named after it and owned by the Node
// (it goes with it); only the daemon writes it, through its status.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=xqn,categories=xdpq
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Netdevs",type=integer,JSONPath=`.status.summary.netdevs`,description="Netdevs the daemon manages"
// +kubebuilder:printcolumn:name="Queues",type=string,JSONPath=`.status.summary.queues`,description="Queues allocated / queues in the node's pools"
// +kubebuilder:printcolumn:name="Overridden",type=integer,JSONPath=`.status.summary.overridden`,description="Netdevs on which a foreign XDP program has precedence"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Config",type=string,JSONPath=`.status.summary.config`,description="The config in force (its hash), and whether a newer one was refused"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Degraded",type=string,JSONPath=`.status.conditions[?(@.type=="Degraded")].reason`,priority=1
// +kubebuilder:printcolumn:name="Allocations",type=integer,JSONPath=`.status.summary.allocations`,priority=1
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.summary.version`,description="The daemon's release",priority=1
type XdpqNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Status is the daemon's report.
	// +optional
	Status XdpqNodeStatus `json:"status,omitzero"`
}

// XdpqNodeList is a list of XdpqNodes.
//
// +kubebuilder:object:root=true
type XdpqNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []XdpqNode `json:"items"`
}

// XdpqNodeStatus is the daemon's report of its node.
type XdpqNodeStatus struct {
	// Summary is what `kubectl get xdpqnodes` shows.
	// +optional
	Summary Summary `json:"summary,omitzero"`
	// Netdevs are the netdevs the daemon manages, by name.
	// +optional
	// +listType=map
	// +listMapKey=name
	Netdevs []Netdev `json:"netdevs,omitempty"`
	// Pools are the node's pools, by name.
	// +optional
	// +listType=map
	// +listMapKey=name
	Pools []Pool `json:"pools,omitempty"`
	// Allocations are the queues handed out, by id.
	// +optional
	// +listType=map
	// +listMapKey=id
	Allocations []Allocation `json:"allocations,omitempty"`
	// Config is the pool config in force.
	// +optional
	Config Config `json:"config,omitzero"`
	// Conditions are Ready, ConfigValid and Degraded.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Summary is the status at a glance, for the printer columns.
type Summary struct {
	// Netdevs counts the managed netdevs.
	Netdevs int32 `json:"netdevs"`
	// Overridden counts the netdevs on which a foreign program has
	// precedence.
	Overridden int32 `json:"overridden"`
	// QueuesAllocated counts the queues of the pools that allocations hold.
	QueuesAllocated int32 `json:"queuesAllocated"`
	// QueuesTotal counts the queues of the pools.
	QueuesTotal int32 `json:"queuesTotal"`
	// Queues is "allocated/total".
	Queues string `json:"queues"`
	// Allocations counts the allocations.
	Allocations int32 `json:"allocations"`
	// Config is the config's short hash, followed by " (refused newer)"
	// when the file on disk was refused.
	// +optional
	Config string `json:"config,omitempty"`
	// Version is the release of the daemon that wrote the status
	// (xdpqctl version says the same): during a rolling upgrade, which
	// nodes run which.
	// +optional
	Version string `json:"version,omitempty"`
}

// ProgramState is what a netdev has on its XDP hook.
// +kubebuilder:validation:Enum=Direct;Filter;Overridden;Idle;Missing
type ProgramState string

// Program states.
const (
	// StateDirect: xdpq's direct program, steering by the NIC.
	StateDirect ProgramState = "Direct"
	// StateFilter: xdpq's filter program, steering by its flow map.
	StateFilter ProgramState = "Filter"
	// StateOverridden: a foreign program has precedence; xdpq's XSKMAP
	// stays pinned for it to redirect into.
	StateOverridden ProgramState = "Overridden"
	// StateIdle: no program, as no socket is bound (or, with a reason, as
	// the program could not be attached).
	StateIdle ProgramState = "Idle"
	// StateMissing: the netdev is not there.
	StateMissing ProgramState = "Missing"
)

// Netdev is one managed netdev.
type Netdev struct {
	// Name is the netdev's name on the node (in a pod it may have another).
	Name string `json:"name"`
	// Driver is its kernel driver; empty for a virtual netdev.
	// +optional
	Driver string `json:"driver,omitempty"`
	// PCIAddress is its PCI address (0000:3b:00.0); empty if not PCI.
	// +optional
	PCIAddress string `json:"pciAddress,omitempty"`
	// NUMANode is its NUMA node; -1 when unknown.
	NUMANode int32 `json:"numaNode"`
	// XDPMode is where the program on its hook runs: native, generic,
	// offload, or none.
	// +optional
	XDPMode string `json:"xdpMode,omitempty"`
	// State is what its XDP hook has.
	State ProgramState `json:"state"`
	// ProgramID is the id of the program on its hook (xdpq's or the
	// foreign one); 0 when none.
	// +optional
	ProgramID uint32 `json:"programID,omitempty"`
	// ProgramName is that program's name.
	// +optional
	ProgramName string `json:"programName,omitempty"`
	// ForeignProgram is the foreign program's name, when Overridden.
	// +optional
	ForeignProgram string `json:"foreignProgram,omitempty"`
	// ZeroCopy is whether the driver offers AF_XDP zero-copy.
	ZeroCopy bool `json:"zeroCopy"`
	// Queues is its rx queue count.
	Queues int32 `json:"queues"`
	// ReservedQueues are the queues kept from RSS for pods.
	// +optional
	ReservedQueues []int32 `json:"reservedQueues,omitempty"`
	// Steering is how flows reach a queue: hardware (ntuple rules) or
	// software (the filter program's map).
	// +optional
	Steering string `json:"steering,omitempty"`
	// Flows counts the flows xdpq steers on it.
	// +optional
	Flows int32 `json:"flows,omitempty"`
	// LinkUp is whether its carrier is up.
	LinkUp bool `json:"linkUp"`
	// Reason says why it is in its state, or what failed.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// Pool is one pool's capacity.
type Pool struct {
	// Name is the pool's name in the config.
	Name string `json:"name"`
	// Resource is the extended resource pods ask for (xdpq.io/<pool>).
	Resource string `json:"resource"`
	// Capacity counts its devices (queues, or whole netdevs).
	Capacity int32 `json:"capacity"`
	// Allocated counts those held by allocations.
	Allocated int32 `json:"allocated"`
	// Reason says why it has fewer devices than its config names, or
	// takes no allocation now.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// Allocation is a set of queues held by a pod.
type Allocation struct {
	// ID is the allocation's id.
	ID string `json:"id"`
	// Pool is its pool.
	Pool string `json:"pool"`
	// Netdev is the netdev of its queues.
	Netdev string `json:"netdev"`
	// Queues are its queues.
	Queues []int32 `json:"queues"`
	// Pod is the pod it is bound to, once known.
	// +optional
	Pod *PodRef `json:"pod,omitempty"`
	// Claim is the DRA ResourceClaim it was prepared for ("namespace/name");
	// empty for the device plugin's.
	// +optional
	Claim string `json:"claim,omitempty"`
	// Flows are the flows steered to its queues, as "proto dst[:port]
	// [src[:port]] [vlan N]".
	// +optional
	Flows []string `json:"flows,omitempty"`
	// LeaseConnected is whether a client holds its bound sockets now.
	LeaseConnected bool `json:"leaseConnected"`
}

// PodRef names a pod.
type PodRef struct {
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	UID string `json:"uid,omitempty"`
}

// Config is the pool config in force.
type Config struct {
	// Hash is the SHA-256 of the config file in force, hex.
	// +optional
	Hash string `json:"hash,omitempty"`
	// LastGoodReload is when that config was put in force.
	// +optional
	LastGoodReload metav1.Time `json:"lastGoodReload,omitzero"`
	// LastError says why the file on disk is not in force, or what of it
	// could not be put in force on this node; empty when all is.
	// +optional
	LastError string `json:"lastError,omitempty"`
}

// Condition types of an XdpqNode.
const (
	// ConditionReady: the daemon serves (its device plugins or local API)
	// and every managed netdev is there.
	ConditionReady = "Ready"
	// ConditionConfigValid: the file on disk is the config in force, all
	// of it.
	ConditionConfigValid = "ConfigValid"
	// ConditionDegraded: something is wrong that does not stop the node:
	// a netdev overridden, down or missing, a policy not applied, a
	// record unreadable.
	ConditionDegraded = "Degraded"
)
