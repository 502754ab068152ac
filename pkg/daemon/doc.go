// Package daemon is xdpq's node daemon: the device plugins kubelet
// allocates from, the CNI plugin's local API, the socket broker that
// hands pods their bound AF_XDP sockets, and the node agent that attaches
// xdpq's program and steers flows, met over one ledger of allocations
// and attachments.
//
// New checks what must hold before anything on the node is touched (one
// daemon per state and pin directory, the API socket, the config, the
// records); Run recovers what a previous daemon left half done, then
// serves until its context ends, the datapath staying in the kernel for
// the next daemon to adopt. The files say what is in them: alloc.go
// (allocations from kubelet or xdpqctl, free), cni.go (the CNI verbs),
// netdev.go and pods.go (netdev-mode pools' netdevs moved into pods),
// reconcile.go (a config put in force), collect.go (what no one else
// ends), start.go (recovery), status.go (status, netdevs' included),
// policy.go (a pool's settings as a netdev's policy), serve.go (how the
// broker serves allocations), plugins.go (kubelet's device plugins),
// recreated.go (a netdev made again under its name), lock.go (one daemon
// per node's datapath).
// docs/architecture.md is the whole picture: the path of an allocation,
// the ledger's two-phase records, and what each lock guards.
package daemon
