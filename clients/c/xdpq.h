/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * xdpq.h: the C client of xdpq's socket broker (docs/protocol.md).
 *
 * A pod's process connects to $XDPQ_SOCKET, hands over a memfd it
 * allocated as UMEM, and receives one bound AF_XDP socket per queue; it
 * maps the rings itself and needs no capability. xdpq_open does the whole
 * handshake; the lease lasts while the returned lease is open.
 *
 *	struct xdpq_error err;
 *	struct xdpq_lease *l = xdpq_open(NULL, NULL, &err);
 *	if (!l) { fprintf(stderr, "%s\n", err.msg); exit(1); }
 *	struct xdpq_socket *s = &l->sockets[0];
 *	uint32_t idx, fidx, n = xdpq_cons_peek(&s->rx, 64, &idx);
 *	xdpq_prod_reserve(&s->fill, n, &fidx);      // frames in rx came from fill
 *	for (uint32_t i = 0; i < n; i++) {
 *		const struct xdp_desc *d = xdpq_rx_desc(&s->rx, idx + i);
 *		use(xdpq_frame(l, d->addr), d->len);
 *		*xdpq_fill_addr(&s->fill, fidx + i) = xdpq_frame_base(l, d->addr);
 *	}
 *	xdpq_prod_submit(&s->fill, n);
 *	xdpq_cons_release(&s->rx, n);
 *	...
 *	xdpq_close(l);
 *
 * With xdpq_opts.multi_buffer, a packet larger than a UMEM frame (a jumbo
 * frame) comes in several descriptors, and use() above sees its pieces in
 * order: every descriptor but a packet's last has XDP_PKT_CONTD in its
 * options (xdpq_desc_continues). Without it such a packet is dropped.
 *
 * The ring accessors are the kernel's single-producer single-consumer
 * protocol (Documentation/networking/af_xdp.rst, net/xdp/xsk_queue.h):
 * read the other side's index with acquire, publish one's own with
 * release. One thread per socket; the lease functions are not
 * thread-safe against each other.
 */
#ifndef XDPQ_H
#define XDPQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <linux/if_xdp.h>

#ifdef __cplusplus
extern "C" {
#endif

/* XDPQ_PROTOCOL_VERSION is the native protocol version this client speaks. */
#define XDPQ_PROTOCOL_VERSION 1
/* XDPQ_MAX_MESSAGE is the largest message either side sends. */
#define XDPQ_MAX_MESSAGE 4096
/* XDPQ_MAX_QUEUES is the most sockets one lease holds: the daemon sends
 * them in one message, and the kernel passes at most 253 descriptors in
 * one (SCM_MAX_FD). */
#define XDPQ_MAX_QUEUES 253
/* XDPQ_ENV_SOCKET is the environment variable that holds the socket's path. */
#define XDPQ_ENV_SOCKET "XDPQ_SOCKET"

/* XDP_PKT_CONTD (Linux 6.6, linux/if_xdp.h) marks a descriptor whose
 * packet goes on in the next one; older headers lack it. */
#ifndef XDP_PKT_CONTD
#define XDP_PKT_CONTD (1 << 0)
#endif

/* struct xdpq_opts says what to ask for; zero fields take the defaults. */
struct xdpq_opts {
	const char *name;	  /* shown in the daemon's log; default "xdpq-c" */
	const uint32_t *queues;	  /* NULL: every queue of the allocation */
	size_t nqueues;
	uint32_t frame_size;	  /* 2048 (default) or 4096 (default with multi_buffer) */
	uint32_t headroom;	  /* bytes kept free before each received frame */
	uint32_t ring;		  /* entries of every ring; a power of two, default 2048
				   * (4096 with multi_buffer) */
	bool tx;		  /* ask for a TX ring too (the pool must allow it) */
	/* multi_buffer asks for sockets bound with XDP_USE_SG, which take
	 * packets larger than a UMEM frame (jumbo frames: 9014 bytes at a
	 * 9000-byte MTU). Such a packet comes in several RX descriptors,
	 * every one but the last marked XDP_PKT_CONTD (xdpq_desc_continues);
	 * without multi_buffer the kernel drops it (rx_dropped). A received
	 * descriptor holds a frame less the kernel's 256 bytes of headroom
	 * (copy mode): a 9014-byte frame takes 3 descriptors of 4 KiB frames,
	 * 6 of 2 KiB. Rings count descriptors, not packets, hence the larger
	 * defaults, as in the Go client: a UMEM of 32 MiB a queue (48 MiB
	 * with tx). The daemon refuses it where the kernel (before Linux 6.6)
	 * or a zero-copy driver cannot; xdpq_open refuses sockets the daemon
	 * did not bind so. */
	bool multi_buffer;
	/* timeout_ms bounds each handshake (of xdpq_open and of
	 * xdpq_resume), and how long xdpq_open retries an allocation still
	 * held by a connection the daemon has not seen close (a restarted
	 * container's predecessor); default 30000. */
	int timeout_ms;
};

/* struct xdpq_error says why a call failed, in one line for a person. */
struct xdpq_error {
	/* code is the daemon's refusal code ("forbidden", "limit", "busy",
	 * ..., docs/protocol.md) or "" when the daemon did not refuse. */
	char code[32];
	/* msg is the whole line, the daemon's reason included. */
	char msg[1024];
	/* errnum is the errno of a failed system call, else 0. */
	int errnum;
	/* retry: trying again later may succeed (the daemon is not there
	 * yet, busy, timed out, or failed on its side). */
	bool retry;
};

/* struct xdpq_ring is one ring shared with the kernel. Use the accessors
 * below. Its first fields are those of libxdp's struct xsk_ring_prod and
 * xsk_ring_cons, in their order: an application that prefers libxdp's
 * inline helpers may copy them into one. */
struct xdpq_ring {
	uint32_t cached_prod;
	uint32_t cached_cons;
	uint32_t mask;
	uint32_t size;		/* entries; 0 if the socket has no such ring */
	uint32_t *producer;
	uint32_t *consumer;
	void *ring;
	uint32_t *flags;
	void *map;		/* the mapping, for xdpq_close */
	size_t map_len;
};

/* struct xdpq_socket is one bound AF_XDP socket of a lease. Its frames are
 * three runs of the UMEM, each given by the address of its first frame
 * (the next ones follow every frame_size bytes). */
struct xdpq_socket {
	int fd;			/* for poll, recvfrom/sendto (wakeups) */
	uint32_t queue;
	struct xdpq_ring fill, comp, rx, tx;
	uint64_t fill_frames;	/* fill.size frames, on the fill ring after xdpq_open */
	uint64_t spare_frames;	/* rx.size frames on no ring, to refill from while
				 * received frames are still in use */
	uint64_t tx_frames;	/* tx.size frames to transmit from */
};

/* struct xdpq_limits are what the allocation's pool allows. */
struct xdpq_limits {
	uint64_t max_umem_bytes;
	uint32_t max_ring;
	bool tx_allowed;
	uint32_t max_queues;
};

/* struct xdpq_lease is an active lease. Its fields are read-only. */
struct xdpq_lease {
	char allocation[256];
	char netdev[256];
	struct xdpq_limits limits;
	/* busy_poll: the pool prefers busy polling and the daemon set
	 * SO_PREFER_BUSY_POLL, SO_BUSY_POLL (busy_poll_timeout_us) and
	 * SO_BUSY_POLL_BUDGET (busy_poll_budget) on the sockets; drive them
	 * with non-blocking recvfrom/sendto every round rather than poll. */
	bool busy_poll;
	uint32_t busy_poll_timeout_us;
	uint32_t busy_poll_budget;
	bool zero_copy;
	/* multi_buffer: the sockets are bound with XDP_USE_SG
	 * (xdpq_opts.multi_buffer): a packet may come in several descriptors. */
	bool multi_buffer;
	uint32_t frame_size;
	uint32_t headroom;
	void *umem;		/* the UMEM: frame addresses are offsets into it */
	size_t umem_size;
	size_t nsockets;
	struct xdpq_socket *sockets;	/* in the order of the queues asked for */

	/* private */
	int conn;		/* the connection to the daemon; -1 while lost */
	char path[108];
	char name[64];
	int timeout_ms;
};

/*
 * xdpq_open runs the handshake with the daemon at path (NULL or "":
 * $XDPQ_SOCKET): hello, welcome, a sealed memfd as UMEM with the request,
 * the bound sockets, their rings mapped and fill rings filled, ready,
 * active. opts may be NULL. On failure it returns NULL, fills err (if not
 * NULL) and leaves nothing open.
 */
struct xdpq_lease *xdpq_open(const char *path, const struct xdpq_opts *opts, struct xdpq_error *err);

/* xdpq_close gives the sockets back (they leave the XSKMAP) and frees the
 * lease. NULL is a no-op. */
void xdpq_close(struct xdpq_lease *l);

/*
 * xdpq_lease_fd returns the connection to the daemon (-1 while the lease
 * is lost): poll it for POLLIN along with the sockets, and call
 * xdpq_lease_check when it is readable.
 */
int xdpq_lease_fd(const struct xdpq_lease *l);

/*
 * xdpq_lease_check reads what the daemon sent without blocking. It
 * returns 0 while the connection is open, and 1 when it closed (err says
 * how): the daemon stopped or restarted, or ended the lease. The sockets
 * keep working; call xdpq_resume until it succeeds or err->retry is
 * false.
 */
int xdpq_lease_check(struct xdpq_lease *l, struct xdpq_error *err);

/*
 * xdpq_resume hands the lease's sockets to the daemon again after
 * xdpq_lease_check said it was lost (docs/protocol.md, "Resuming a
 * lease"). It returns 0 once the lease is tracked again, -1 otherwise:
 * retry later while err->retry (no daemon yet, busy, timeout, internal;
 * the Go client backs off from 50 ms to 2 s); else the lease cannot be
 * resumed (a refusal such as forbidden: the lease ended; or the socket
 * serves another allocation): close it and open a new one.
 */
int xdpq_resume(struct xdpq_lease *l, struct xdpq_error *err);

/* xdpq_kick_rx wakes the kernel to fill socket s's RX ring (an empty
 * non-blocking recvfrom); call it when xdpq_needs_wakeup(&s->fill). */
int xdpq_kick_rx(const struct xdpq_socket *s);

/* xdpq_kick_tx makes the kernel send what is on s's TX ring (an empty
 * non-blocking sendto); call it when xdpq_needs_wakeup(&s->tx). */
int xdpq_kick_tx(const struct xdpq_socket *s);

/* xdpq_frame returns the bytes of the frame at UMEM address addr. */
static inline void *xdpq_frame(const struct xdpq_lease *l, uint64_t addr)
{
	return (char *)l->umem + addr;
}

/* xdpq_frame_base returns the start of the frame that addr points into:
 * a received descriptor's address is past the headroom. */
static inline uint64_t xdpq_frame_base(const struct xdpq_lease *l, uint64_t addr)
{
	return addr & ~(uint64_t)(l->frame_size - 1);
}

/*
 * xdpq_desc_continues says whether the packet of descriptor d goes on in
 * the next descriptor of the ring (XDP_PKT_CONTD). Only sockets of a
 * multi_buffer lease receive such descriptors: a packet is its
 * descriptors up to and including the first one for which this is false.
 * A packet's descriptors come in order, but may span two peeks of the RX
 * ring; each descriptor's frame goes back to the fill ring on its own.
 */
static inline bool xdpq_desc_continues(const struct xdp_desc *d)
{
	return d->options & XDP_PKT_CONTD;
}

/* xdpq_needs_wakeup says whether the kernel asks for a wakeup (a syscall)
 * to go on with ring r: fill (then xdpq_kick_rx or poll) or tx. */
static inline bool xdpq_needs_wakeup(const struct xdpq_ring *r)
{
	return __atomic_load_n(r->flags, __ATOMIC_RELAXED) & XDP_RING_NEED_WAKEUP;
}

/* xdpq_prod_free returns how many entries a producer ring (fill, tx) can
 * take, loading the kernel's consumer index only when the cached one
 * shows fewer than n. */
static inline uint32_t xdpq_prod_free(struct xdpq_ring *r, uint32_t n)
{
	uint32_t free = r->cached_cons - r->cached_prod;

	if (free >= n)
		return free;
	/* cached_cons is kept size ahead, so that free is one subtraction.
	 * Acquire: the kernel is done with the entries it consumed. */
	r->cached_cons = __atomic_load_n(r->consumer, __ATOMIC_ACQUIRE) + r->size;
	return r->cached_cons - r->cached_prod;
}

/* xdpq_prod_reserve reserves n entries of a producer ring and sets *idx to
 * the first; it returns n, or 0 if fewer are free. Write them
 * (xdpq_fill_addr, xdpq_tx_desc), then xdpq_prod_submit. */
static inline uint32_t xdpq_prod_reserve(struct xdpq_ring *r, uint32_t n, uint32_t *idx)
{
	*idx = r->cached_prod;
	if (xdpq_prod_free(r, n) < n)
		return 0;
	r->cached_prod += n;
	return n;
}

/* xdpq_prod_submit hands the n entries written to the kernel. */
static inline void xdpq_prod_submit(struct xdpq_ring *r, uint32_t n)
{
	/* Release: the entries are written before the kernel sees the index. */
	__atomic_store_n(r->producer, *r->producer + n, __ATOMIC_RELEASE);
}

/* xdpq_cons_peek returns how many entries (at most n) a consumer ring (rx,
 * completion) holds, and sets *idx to the first. Read them
 * (xdpq_rx_desc, xdpq_comp_addr), then xdpq_cons_release. */
static inline uint32_t xdpq_cons_peek(struct xdpq_ring *r, uint32_t n, uint32_t *idx)
{
	uint32_t avail = r->cached_prod - r->cached_cons;

	if (avail == 0) {
		/* Acquire: the entries are read after the kernel wrote them. */
		r->cached_prod = __atomic_load_n(r->producer, __ATOMIC_ACQUIRE);
		avail = r->cached_prod - r->cached_cons;
	}
	if (avail > n)
		avail = n;
	*idx = r->cached_cons;
	r->cached_cons += avail;
	return avail;
}

/* xdpq_cons_release gives the n entries read back to the kernel. */
static inline void xdpq_cons_release(struct xdpq_ring *r, uint32_t n)
{
	/* Release: the entries are read before the kernel may overwrite them. */
	__atomic_store_n(r->consumer, *r->consumer + n, __ATOMIC_RELEASE);
}

/* xdpq_fill_addr is entry idx of a fill ring. */
static inline uint64_t *xdpq_fill_addr(struct xdpq_ring *fill, uint32_t idx)
{
	return &((uint64_t *)fill->ring)[idx & fill->mask];
}

/* xdpq_comp_addr is entry idx of a completion ring. */
static inline const uint64_t *xdpq_comp_addr(const struct xdpq_ring *comp, uint32_t idx)
{
	return &((const uint64_t *)comp->ring)[idx & comp->mask];
}

/* xdpq_rx_desc is entry idx of an RX ring. */
static inline const struct xdp_desc *xdpq_rx_desc(const struct xdpq_ring *rx, uint32_t idx)
{
	return &((const struct xdp_desc *)rx->ring)[idx & rx->mask];
}

/* xdpq_tx_desc is entry idx of a TX ring. */
static inline struct xdp_desc *xdpq_tx_desc(struct xdpq_ring *tx, uint32_t idx)
{
	return &((struct xdp_desc *)tx->ring)[idx & tx->mask];
}

#ifdef __cplusplus
}
#endif

#endif /* XDPQ_H */
