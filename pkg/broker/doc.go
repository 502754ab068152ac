// Package broker hands bound AF_XDP sockets to pods that have no
// privileges. Each allocation gets its own Unix socket (SOCK_SEQPACKET) in
// a directory that only the allocation's container sees. A client proves
// who it is by its credentials (SO_PEERCRED, pinned with a pidfd, mapped to
// a pod through its cgroup), sends a memfd it allocated, and receives
// sockets bound to its queues with that memfd as their UMEM. The
// connection is the lease: when it closes, the sockets leave the XSKMAP.
// The peer is identified as the connection is accepted: a local user
// who is not the owner is refused at once, and the owner's handshakes in
// progress are bounded, so that a flood of connections costs the owner
// nothing.
//
// A lease outlives the daemon. Server.Close leaves the leases in the
// kernel (sockets in the XSKMAP, traffic flowing); Config.OnLease reports
// every lease's sockets (queue and inode) for the daemon to record, and
// the next daemon passes them back as Allocation.Resumable. The client,
// which kept its sockets, reconnects and resumes the lease by sending
// them back; the server checks each against the record and the
// connection is the lease again.
//
// The native protocol is JSON messages with descriptors attached
// (docs/protocol.md). The same socket also speaks the AF_XDP device plugin
// handshake of DPDK's af_xdp PMD and CNDP (raw ASCII commands such as
// "/xsk_map_fd,eth0"), for applications that create their own sockets.
//
// The broker meets the node agent through the Datapath interface only.
package broker
