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
// the next daemon to adopt.
//
// One core (core.go) owns the allocations and attachments over the
// ledger, the broker, the node agent and the mover; the faces (the
// device plugins, the DRA driver's node, the local API and its CNI
// verbs, the flows annotation, NRI's sandboxes, the XdpqNode writer)
// call down into it, and it tells them what changed only through its
// subscription (change). Daemon wires them. The files say what is in
// them: daemon.go (Options, New, Run, the changes routed to the faces),
// core.go (the core and its changes), local.go (the local API and the
// CNI face), kernel.go (the interfaces of the
// kernel-facing packages), start.go (recovery), reconcile.go (a config
// put in force), policy.go (a pool's settings as a netdev's policy),
// alloc.go (allocations from kubelet or xdpqctl, free), serve.go (how the
// broker serves allocations), cni.go (the CNI verbs), claim.go (binding
// an allocation to its pod), podresources.go (kubelet's PodResources),
// podflows.go (the core as pkg/podflows, the xdpq.io/flows annotation's
// face, sees it), plugins.go (kubelet's device plugins), dra.go (the DRA
// driver's node: Prepare, Unprepare, slices, stale claims), nri.go (the
// core as pkg/nri's Sandboxes sees it: netdev-mode claims moved in and
// out with the pod's sandbox), netdev.go, pods.go and moved.go (netdev-mode
// pools' netdevs moved into pods and back), recreated.go (a netdev made
// again under its name), collect.go (what no one else ends), status.go
// (status, netdevs' included), node.go (the XdpqNode and Events),
// metrics.go (/metrics and the probes), dpdk.go (DPDK's paths), caps.go
// (the capabilities it needs), fdlimit.go (what it may hold open),
// lock.go (one daemon per node's datapath), uninstall.go (removing it
// all when xdpq is uninstalled).
// docs/architecture.md is the whole picture: the path of an allocation,
// the ledger's two-phase records, and what each lock guards.
package daemon
