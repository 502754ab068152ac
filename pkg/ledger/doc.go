// Package ledger is the node daemon's single record of what is given to
// whom: the pools and their devices, the allocations made of them, and the
// CNI attachments of each allocation. It is plain Go: no kernel, no
// network, no root. The kubelet device plugin, the standalone API and the
// CNI verbs read and change it through its methods only.
//
// # Two phases
//
// The daemon changes the kernel (the broker's sockets, steering rules, a
// netdev moved into a pod) between two steps of the ledger, never while
// the ledger's lock is held:
//
//	Reserve → (broker serves the allocation) → Commit, or Abort
//	BeginFree → (attachments undone, broker stops serving) → EndFree
//	BeginAttach → (flows steered, netdev moved) → EndAttach
//	BeginDetach → (flows removed, netdev back) → EndDetach
//
// Between the steps the allocation or attachment is marked as in
// progress, so that a second operation on it is refused with ErrConflict
// instead of racing the first, and status never waits for the kernel.
//
// # Persistence
//
// Each allocation is one record, written atomically to its own file, with
// its attachments and its lease's sockets in it, so that an attachment can
// never outlive its allocation nor the other way round. The record is
// written ahead of the kernel work: an attachment is recorded as pending
// before its flows are steered or its netdev moved, and an allocation or
// attachment as ending before it is undone. A daemon that restarts after a
// crash at any point finds in the records what to finish or roll back
// (see Recovery).
//
// A record that cannot be read removes nothing: it stays on disk, is
// reported (Broken), and its pool takes no new allocations until the
// operator repairs or removes the file, since it may name queues that a
// running pod still holds.
package ledger
