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
// device plugins, pkg/deviceplugin's Plugins; the DRA driver, pkg/dra's
// Face; the local API and its CNI verbs, pkg/localapi; the flows
// annotation, pkg/podflows; NRI's sandboxes, pkg/nri; the XdpqNode
// writer, pkg/nodestatus) call down into it through the adapters here,
// and it tells them what changed only through its subscription
// (change). Daemon wires them. The files say what is in them:
// daemon.go (Options, New, Run, the changes routed to the faces),
// core.go (the core and its changes), kernel.go (the interfaces of the
// kernel-facing packages and kubelet's PodResources), start.go
// (recovery), reconcile.go (a config put in force), policy.go (a pool's
// settings as a netdev's policy), alloc.go (allocate and free),
// attach.go (attachments made, checked and undone), serve.go (how the
// broker serves allocations), netdev.go, pods.go and moved.go
// (netdev-mode pools' netdevs moved into pods and back), recreated.go (a
// netdev made again under its name), status.go (status, netdevs'
// included), uninstall.go (removing it all when xdpq is uninstalled),
// dpdk.go (DPDK's paths): the core's. plugins.go, dra.go, local.go,
// podflows.go and nri.go are the adapters (pluginsCore, draCore,
// localCore, podFlowsCore, nriCore) that are the core as each face's
// package sees it; claim.go (binding an allocation to its pod),
// podresources.go (kubelet's PodResources), collect.go (what no one
// else ends), node.go (the XdpqNode and Events), metrics.go (/metrics
// and the probes), caps.go (the capabilities it needs), fdlimit.go (what
// it may hold open) and lock.go (one daemon per node's datapath) the
// daemon's own. TestCoreCallsNoFace keeps the core's files free of
// Kubernetes and of the faces.
// docs/architecture.md is the whole picture: the path of an allocation,
// the ledger's two-phase records, and what each lock guards.
package daemon
