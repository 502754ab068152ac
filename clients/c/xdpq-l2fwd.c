// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * xdpq-l2fwd: forward every frame received on each queue of an xdpq
 * allocation back out of the same queue with its MAC addresses swapped,
 * without copying it: an RX descriptor goes to the TX ring as it is, and
 * the frame comes back to the fill ring when the kernel completes it. No
 * privilege needed; the allocation's pool must allow TX (allowTX). It
 * leases the queues through $XDPQ_SOCKET (or -s), and resumes the lease
 * when the daemon restarts.
 *
 * A socket's frames are all in circulation: the fill ring's (filled by
 * xdpq_open) and its spare and TX frames, three rings' worth, so that the
 * fill ring stays full while frames wait on the TX ring for the kernel to
 * send and complete them; while the TX ring is full, received frames wait
 * on the RX ring. What the loop cannot keep up with the kernel drops at the RX
 * ring (rx_ring_full) or for want of fill frames (fill_ring_empty), as
 * xdpsock's l2fwd does.
 */
#define _GNU_SOURCE
#include "example.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64

/* As in xdpq-rxdrop: a loop that found nothing naps NAP_US while frames
 * came less than IDLE_AFTER_US ago, and sleeps in poll after that. */
#define NAP_US 50
#define IDLE_AFTER_US 1000

static const char usage[] =
	"usage: xdpq-l2fwd [-s socket] [-q queue,...] [-r ring] [-f frame-size] [-d seconds]\n"
	"  -s socket      the allocation's socket (default $XDPQ_SOCKET)\n"
	"  -q queue,...   the queues to lease (default all of the allocation's)\n"
	"  -r ring        entries of each ring, a power of two (default 2048)\n"
	"  -f frame-size  2048 (default) or 4096\n"
	"  -d seconds     stop after this long\n"
	"Each frame goes back out of the queue it came in on, MAC addresses swapped.\n"
	"It stops on SIGINT or SIGTERM too. The summary and messages go to stderr.\n";

/* struct fwdq is one socket's frames on no ring, and what is counted. */
struct fwdq {
	uint64_t *free;		/* frames on no ring, a stack */
	uint32_t nfree;
	uint64_t rx;		/* frames received */
	uint64_t tx;		/* frames put on the TX ring */
	uint64_t done;		/* of those, completed by the kernel */
};

static void swap_macs(unsigned char *b, uint32_t len)
{
	unsigned char tmp[6];
	if (len < 12)
		return;
	memcpy(tmp, b, 6);
	memcpy(b, b + 6, 6);
	memcpy(b + 6, tmp, 6);
}

/*
 * forward runs one round on socket s: completed frames back to the fill
 * ring, received ones (MACs swapped) to the TX ring, and the kernel kicked
 * to send them. It returns how many frames it received.
 */
static uint32_t forward(struct xdpq_lease *l, struct xdpq_socket *s, struct fwdq *q)
{
	uint32_t idx, fidx, tidx;
	uint32_t n = xdpq_cons_peek(&s->comp, BATCH, &idx);

	for (uint32_t i = 0; i < n; i++)
		q->free[q->nfree++] = *xdpq_comp_addr(&s->comp, idx + i);
	xdpq_cons_release(&s->comp, n);
	q->done += n;
	/* The fill ring topped up from the frames on no ring. */
	n = xdpq_prod_free(&s->fill, q->nfree);
	if (n > q->nfree)
		n = q->nfree;
	if (n && xdpq_prod_reserve(&s->fill, n, &fidx) == n) {
		for (uint32_t i = 0; i < n; i++)
			*xdpq_fill_addr(&s->fill, fidx + i) = q->free[--q->nfree];
		xdpq_prod_submit(&s->fill, n);
	}
	/* At most what the TX ring has room for: a ring's worth may wait
	 * there for the kernel, who is kicked below. */
	uint32_t room = xdpq_prod_free(&s->tx, BATCH);
	n = xdpq_cons_peek(&s->rx, room < BATCH ? room : BATCH, &idx);
	if (n && xdpq_prod_reserve(&s->tx, n, &tidx) == n) {
		for (uint32_t i = 0; i < n; i++) {
			const struct xdp_desc *d = xdpq_rx_desc(&s->rx, idx + i);
			struct xdp_desc *t = xdpq_tx_desc(&s->tx, tidx + i);
			swap_macs(xdpq_frame(l, d->addr), d->len);
			/* The received address, past the headroom, is within
			 * its frame: the kernel sends from there. */
			*t = (struct xdp_desc){.addr = d->addr, .len = d->len};
		}
		xdpq_prod_submit(&s->tx, n);
		xdpq_cons_release(&s->rx, n);
		q->rx += n;
		q->tx += n;
	}
	/* In copy mode a send is a syscall, of at most the socket's TX
	 * budget (32 frames unless raised): kick while the kernel has not
	 * taken all that is on the ring. */
	if (__atomic_load_n(s->tx.consumer, __ATOMIC_ACQUIRE) != s->tx.cached_prod && xdpq_needs_wakeup(&s->tx))
		xdpq_kick_tx(s);
	if (xdpq_needs_wakeup(&s->fill) || (l->busy_poll && !n))
		xdpq_kick_rx(s);
	return n;
}

int main(int argc, char **argv)
{
	struct xdpq_opts opts = {.name = "xdpq-l2fwd", .tx = true};
	struct example_args args = {0};
	int c;

	while ((c = getopt(argc, argv, ":s:q:r:f:d:h")) != -1) {
		int r = example_opt("xdpq-l2fwd", usage, c, &opts, &args);
		if (r != OPT_TAKEN)
			return r == OPT_OTHER ? 2 : r; /* getopt returns only the letters above */
	}
	if (optind < argc) {
		fprintf(stderr, "xdpq-l2fwd: unexpected argument %s\n%s", argv[optind], usage);
		return 2;
	}

	sigset_t wait_mask;
	catch_stop(&wait_mask);

	struct xdpq_error err;
	struct xdpq_lease *l = xdpq_open(args.path, &opts, &err);
	if (!l) {
		fprintf(stderr, "xdpq-l2fwd: %s\n", err.msg);
		return 1;
	}
	print_lease("xdpq-l2fwd", l);
	fprintf(stderr, ": forwarding (%s%s)\n", l->zero_copy ? "zero-copy" : "copy", l->busy_poll ? ", busy polling" : "");

	struct fwdq *q = calloc(l->nsockets, sizeof(*q));
	struct pollfd *pfd = calloc(l->nsockets + 1, sizeof(struct pollfd));
	if (!q || !pfd) {
		fprintf(stderr, "xdpq-l2fwd: out of memory\n");
		return 1;
	}
	for (size_t i = 0; i < l->nsockets; i++) {
		struct xdpq_socket *s = &l->sockets[i];
		/* Room for every frame: the fill ring's, the spare and the TX ones. */
		q[i].free = calloc((size_t)s->fill.size + s->rx.size + s->tx.size, sizeof(uint64_t));
		if (!q[i].free) {
			fprintf(stderr, "xdpq-l2fwd: out of memory\n");
			return 1;
		}
		for (uint32_t k = 0; k < s->rx.size; k++)
			q[i].free[q[i].nfree++] = s->spare_frames + (uint64_t)k * l->frame_size;
		for (uint32_t k = 0; k < s->tx.size; k++)
			q[i].free[q[i].nfree++] = s->tx_frames + (uint64_t)k * l->frame_size;
	}
	int64_t start = now_ms(), end = args.seconds ? start + (int64_t)args.seconds * 1000 : INT64_MAX;
	struct keeper keep = {.prog = "xdpq-l2fwd"};
	int64_t last_frame = 0;
	int status = 0;
	while (!stop && now_ms() < end) {
		uint32_t got = 0;
		bool completed = false;
		for (size_t i = 0; i < l->nsockets; i++) {
			uint64_t done = q[i].done;
			got += forward(l, &l->sockets[i], &q[i]);
			completed = completed || q[i].done != done;
		}
		if (got || completed) {
			/* Frames came, or the kernel is completing sends: come
			 * back at once. A round with neither naps below, so that
			 * sends the kernel does not complete (the netdev went
			 * down) do not spin the core; each round kicks them. */
			if (got)
				last_frame = now_us();
			continue;
		}
		if (l->busy_poll || now_us() - last_frame < IDLE_AFTER_US) {
			/* Busy polling spins (its recvfrom polls the queue);
			 * otherwise a nap, in ppoll so that a signal ends it. */
			if (!l->busy_poll) {
				struct timespec nap = {.tv_nsec = NAP_US * 1000};
				ppoll(NULL, 0, &nap, &wait_mask);
			}
			if (xdpq_lease_fd(l) < 0 && keeper_step(&keep, l, 0) < 0) {
				status = 1;
				break;
			}
			continue;
		}
		for (size_t i = 0; i < l->nsockets; i++)
			pfd[i] = (struct pollfd){.fd = l->sockets[i].fd, .events = POLLIN};
		pfd[l->nsockets] = (struct pollfd){.fd = xdpq_lease_fd(l), .events = POLLIN};
		int64_t wait = keeper_wait(&keep, l, end - now_ms());
		if (wait > 1000)
			wait = 1000;
		struct timespec ts = {.tv_sec = wait / 1000, .tv_nsec = wait % 1000 * 1000000};
		if (ppoll(pfd, l->nsockets + 1, &ts, &wait_mask) < 0 && errno != EINTR) {
			fprintf(stderr, "xdpq-l2fwd: poll: %s\n", strerror(errno));
			status = 1;
			break;
		}
		/* The daemon went: the sockets keep forwarding; resume. */
		if (keeper_step(&keep, l, pfd[l->nsockets].revents) < 0) {
			status = 1;
			break;
		}
	}

	double secs = (double)(now_ms() - start) / 1000;
	uint64_t rx = 0, tx = 0;
	for (size_t i = 0; i < l->nsockets; i++) {
		fprintf(stderr, "queue %" PRIu32 ": %" PRIu64 " frames received, %" PRIu64 " forwarded\n",
			l->sockets[i].queue, q[i].rx, q[i].done);
		rx += q[i].rx;
		tx += q[i].done;
	}
	fprintf(stderr, "total: %" PRIu64 " frames forwarded, %" PRIu64 " received in %.1f s\n", tx, rx, secs);
	xdpq_close(l);
	for (size_t i = 0; i < l->nsockets; i++)
		free(q[i].free);
	free(q);
	free(pfd);
	return status;
}
