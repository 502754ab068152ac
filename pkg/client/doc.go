// Package client is the pod side of xdpq's socket broker: it connects to
// the allocation's socket ($XDPQ_SOCKET), proves nothing itself (the
// daemon reads its credentials), hands over a memfd it allocated as the
// UMEM, and returns sockets bound to its queues, ready for the datapath.
// It needs no privilege.
//
// # The lease
//
// Connect returns a Lease; its connection to the daemon is the lease, and
// Close gives the sockets back. The sockets do not depend on the daemon:
// the XDP program and its XSKMAP stay in the kernel when the daemon stops
// or restarts, and traffic keeps flowing.
//
// When the daemon's end of the connection goes (a daemon restart), the
// lease keeps its sockets, reports EventLost, and redials the same socket
// path, backing off from 50 ms to 2 s, until a daemon answers; it then
// resumes the lease with the sockets it holds (no new bind, no new UMEM)
// and reports EventResumed. If the daemon refuses the resume (it does not
// know the lease, for example because the allocation moved or the daemon
// lost its record), the lease reports EventFailed with the refusal and
// stops trying: the sockets still work, but the daemon no longer tracks
// them, so the application should Close the lease and Connect again.
// Options.OnEvent hears of all three. Close stops the redialing at any
// point and leaves no goroutine behind.
//
// # The receive loop
//
// Lease.Receiver(i) is socket i's receive fast path: it takes frames off
// the RX ring in batches, keeps the fill ring topped up from the frames
// the lease gave the socket, and waits the way the pool says (see
// Receiver). Run one goroutine per socket (ExampleLease_Receiver) when
// the process has a core per socket; on fewer cores, Lease.Poller runs
// one loop over them all, which looks at every socket each round and
// waits only when none has frames. Peek and Recycle are for loops that
// keep frames, such as forwarders.
//
// # Jumbo frames
//
// With Options.MultiBuffer the sockets are bound with XDP_USE_SG: a frame
// larger than a UMEM frame (up to 9014 bytes at a 9000-byte MTU) comes in
// several descriptors, which Receive gathers into one buffer for the
// application (one copy of such a frame's bytes; a frame that fits one
// UMEM frame is handed over in place, as always). Rings count
// descriptors, so MultiBuffer's defaults are 4 KiB frames (3 descriptors
// a 9014-byte frame; 6 of 2 KiB, which hold a frame less the kernel's 256
// bytes of headroom when received) and rings of 4096, a UMEM of 32 MiB a
// queue (48 MiB with TX; see Options.MultiBuffer for the pool's limit):
// a burst of 1024 jumbo frames fits
// (TestReceiverJumbo shows it, and that rings of 2048 lose frames). To
// send one, xsk.UMEM.Scatter writes it over as many TX frames as it needs.
//
// # Busy polling
//
// When the pool has busy polling, Lease.BusyPoll says so: the daemon has
// set SO_PREFER_BUSY_POLL, SO_BUSY_POLL and SO_BUSY_POLL_BUDGET on the
// sockets. The NIC's interrupts may then be deferred, and the application
// drives its queues itself: each round of its loop makes a non-blocking
// recvfrom on a socket it receives on (a Receiver does; with xsk.Socket
// alone, WakeRX, since Receive makes one only when the fill ring asks for
// a wakeup) and a sendto on one it transmits on (xsk.Socket.Kick),
// instead of sleeping in poll.
package client
