package dra

// PreparedClaims is what a Node tells of the claims it holds
// allocations for, so that their status follows their devices'.
type PreparedClaims interface {
	Prepared() []PreparedClaim
}

// PreparedClaim is a claim with an allocation on this node.
type PreparedClaim struct {
	UID       string
	Namespace string
	Name      string
	// Pool and Devices are the xdpq pool and the devices' names in the
	// ResourceSlice (DeviceName).
	Pool    string
	Devices []string
	Data    ClaimData
	// Network is a netdev-mode pool's netdev in its pod, nil while it
	// is not there (or for queues): the devices' networkData.
	Network *Network
}

// Network is a netdev in a pod, as a claim's status tells it
// (status.devices[].networkData).
type Network struct {
	InterfaceName   string
	HardwareAddress string
	// IPs are its addresses with their prefix length ("192.0.2.7/24").
	IPs []string
}

// ClaimData is the data of each of a claim's devices in its status
// (status.devices[].data): what the claim holds on the node.
type ClaimData struct {
	Allocation string   `json:"allocation"`
	Netdev     string   `json:"netdev"`
	Queues     []uint32 `json:"queues"`
	// Socket is where the container finds its broker ($XDPQ_SOCKET).
	Socket string `json:"socket"`
}
