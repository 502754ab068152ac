// Package xsk implements AF_XDP sockets (XSKs) in Go on golang.org/x/sys/unix.
//
// xdpq owns this code because no maintained Go library does the job: the
// known ones order ring accesses incorrectly and allow only one UMEM per
// socket. The ring protocol here follows libbpf's xsk.h: producers publish
// with a release store after writing entries, consumers read the producer
// index with an acquire load before reading entries (sync/atomic operations
// are sequentially consistent, which is at least that strong).
//
// The package has two sides of one API.
//
// The privileged side (the xdpq daemon) calls [Bind]: it creates sockets in
// the netdev's network namespace, registers a memfd it received as the UMEM
// the sockets share, sets the ring sizes, binds each socket to its queue
// with need_wakeup, and returns the socket fds. Its own mapping of the memfd
// is gone when Bind returns: the kernel holds the pages.
//
// The unprivileged side (a pod) creates the memfd with [NewMemfd], maps it
// with [MapUMEM], receives the bound fds (see [RecvFDs]) and calls [Adopt]
// for each, which maps the rings and returns a [Socket] ready for the
// datapath. A bound socket cannot be bound again, so the holder of the fd
// can reach only the queue it was given. Creating an AF_XDP socket needs
// CAP_NET_RAW; adopting one needs no capability.
//
// The datapath methods of [Socket] (Fill, Receive, Transmit, Complete) copy
// descriptors in batches, never allocate and never panic on bad input.
// A Socket is not safe for concurrent use: give each goroutine its own.
package xsk
