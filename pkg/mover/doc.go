// Package mover hands a whole netdev (an SR-IOV VF, say) to a pod's network
// namespace and brings it back exactly as it was, like containernetworking's
// host-device plugin, but so that a process killed between any two netlink
// calls leaves something its successor can find and put right.
//
// The protocol is write-ahead. Prepare reads the netdev's node-side state
// into a Record and changes nothing; the caller persists the Record; only
// then does MoveIn move anything. MoveOut brings the netdev back from
// wherever it is found, and Locate and Recover tell a restarted caller
// where that is. Every one of them works from the Record alone.
//
// Between any two netlink calls the netdev carries at least one of these
// marks, so a Record always finds it:
//
//   - on the node, its own name and ifindex;
//   - anywhere, its temporary name, xdpq<ifindex>;
//   - anywhere, its alias set to its node name (the alias is set before it
//     leaves its node name and cleared only under the temporary name);
//   - for a netdev with a device of its own, its parent device and permanent
//     address, whatever it is called.
//
// A pod with CAP_NET_ADMIN in its namespace can change the first three, or
// delete a virtual netdev and give a link of its own the same names: only
// the hardware identity is beyond its reach, so virtual netdevs (veth)
// suit tests and trusted pods only.
//
// The order of the steps makes a half-done move visible as such: a name a
// watcher waits for appears only when everything that can precede it is
// done. MoveIn goes down, sets the alias, drops the alternative names,
// takes the temporary name, moves into the pod, sets the MTU asked for,
// takes the pod's name and goes up. MoveOut goes down, drops the
// alternative names, takes the temporary name, moves to the node, restores
// MAC, MTU, queue length, alias, flags and alternative names, takes its
// node name and goes up if it was. Linux before 6.2 refuses to rename an up
// netdev (EBUSY), so a name always precedes up; the return of MoveIn or
// MoveOut is the one signal that a move is done.
//
// When a pod's namespace is destroyed, the kernel returns a netdev with a
// driver of its own (Record.Kind "device") to the initial namespace, under
// the name it had if free there, else dev<ifindex>; MoveOut finds it there
// by its alias or hardware identity, waiting a bounded time for one on its
// way. A virtual netdev (veth) is destroyed with the namespace: MoveOut and
// Recover say so with ErrGone.
//
// All netlink calls go through a netlink.Handle per namespace; only
// HoldNetNS enters a namespace, on a locked thread.
package mover
