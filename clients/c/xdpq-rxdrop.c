// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * xdpq-rxdrop: receive on every queue of an xdpq allocation and drop,
 * counting frames and bytes; no privilege needed. It leases the queues
 * through $XDPQ_SOCKET (or -s), and resumes the lease when the daemon
 * restarts. With -x it writes every frame to stdout as a line
 * "<queue> <hex bytes>", for a test to compare byte for byte. With -m its
 * sockets take jumbo frames in several descriptors: it counts (and
 * writes) whole frames, and gives every descriptor's frame back.
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
#include <time.h>
#include <unistd.h>

#define BATCH 64

static const char usage[] =
	"usage: xdpq-rxdrop [-s socket] [-q queue,...] [-r ring] [-f frame-size] [-m] [-d seconds] [-n frames] [-x]\n"
	"  -s socket      the allocation's socket (default $XDPQ_SOCKET)\n"
	"  -q queue,...   the queues to lease (default all of the allocation's)\n"
	"  -r ring        entries of each ring, a power of two (default 2048; 4096 with -m)\n"
	"  -f frame-size  2048 (default) or 4096 (default with -m)\n"
	"  -m             multi-buffer sockets: frames larger than a UMEM frame (jumbo\n"
	"                 frames) come in several descriptors and count as one\n"
	"  -d seconds     stop after this long\n"
	"  -n frames      stop after this many frames (all queues); with -d, exit 1 if fewer came\n"
	"  -x             write each frame to stdout: \"<queue> <hex>\" per line\n"
	"It stops on SIGINT or SIGTERM too. The summary and messages go to stderr.\n";

/* While frames came less than IDLE_AFTER_US ago, a loop that finds none
 * naps NAP_US between looks instead of sleeping in poll: a loop asleep in
 * poll must be woken for the next frame, from the core that received it,
 * a wakeup every few frames while traffic flows. pkg/client's Receiver
 * does the same. */
#define NAP_US 50
#define IDLE_AFTER_US 1000

/* struct rxq is what is counted of one socket. */
struct rxq {
	uint64_t frames;	/* whole frames: descriptors without XDP_PKT_CONTD */
	uint64_t bytes;		/* of whole frames */
	uint64_t partial;	/* bytes of the frame whose last piece is still to come */
	char *hex;		/* with -x: that frame in hex, hex_len digits */
	size_t hex_len, hex_cap;
};

/* hexpart adds len bytes of a frame to q's hex; with last, the frame is
 * whole and goes out as the line "<queue> <hex>". A frame's pieces are
 * gathered first: the lines of several queues must not interleave. */
static int hexpart(FILE *out, uint32_t queue, struct rxq *q, const unsigned char *b, uint32_t len, bool last)
{
	static const char digits[] = "0123456789abcdef";
	if (q->hex_len + 2 * (size_t)len > q->hex_cap) {
		size_t cap = q->hex_cap ? q->hex_cap : 8192;
		while (cap < q->hex_len + 2 * (size_t)len)
			cap *= 2;
		char *p = realloc(q->hex, cap);
		if (!p)
			return -1;
		q->hex = p;
		q->hex_cap = cap;
	}
	for (uint32_t i = 0; i < len; i++) {
		q->hex[q->hex_len++] = digits[b[i] >> 4];
		q->hex[q->hex_len++] = digits[b[i] & 15];
	}
	if (last) {
		fprintf(out, "%" PRIu32 " %.*s\n", queue, (int)q->hex_len, q->hex);
		q->hex_len = 0;
	}
	return 0;
}

/*
 * rx takes what socket s received, at most limit descriptors (so at most
 * limit frames), counts it in q, and gives every descriptor's UMEM frame
 * back to the fill ring. It returns the descriptors it took, or -1 out of
 * memory. A frame in several descriptors (a multi-buffer socket's)
 * counts once, when its last one comes, and may span two calls.
 */
static int64_t rx(struct xdpq_lease *l, struct xdpq_socket *s, uint32_t limit, bool dump, struct rxq *q)
{
	uint32_t idx, fidx;
	uint32_t n = xdpq_cons_peek(&s->rx, limit < BATCH ? limit : BATCH, &idx);

	if (n == 0)
		return 0;
	/* Every frame in the RX ring came from the fill ring, so there is
	 * room for it there again, once the kernel has published how far
	 * it consumed the fill ring (it does so right after the RX ring). */
	while (xdpq_prod_reserve(&s->fill, n, &fidx) != n) {
		if (xdpq_needs_wakeup(&s->fill))
			xdpq_kick_rx(s);
	}
	for (uint32_t i = 0; i < n; i++) {
		const struct xdp_desc *d = xdpq_rx_desc(&s->rx, idx + i);
		bool last = !xdpq_desc_continues(d);
		if (dump && hexpart(stdout, s->queue, q, xdpq_frame(l, d->addr), d->len, last) < 0)
			return -1;
		q->partial += d->len;
		if (last) {
			q->frames++;
			q->bytes += q->partial;
			q->partial = 0;
		}
		*xdpq_fill_addr(&s->fill, fidx + i) = xdpq_frame_base(l, d->addr);
	}
	xdpq_prod_submit(&s->fill, n);
	xdpq_cons_release(&s->rx, n);
	return n;
}

int main(int argc, char **argv)
{
	struct xdpq_opts opts = {.name = "xdpq-rxdrop"};
	struct example_args args = {0};
	unsigned long long max_frames = 0;
	bool dump = false;
	int c;

	while ((c = getopt(argc, argv, ":s:q:r:f:md:n:xh")) != -1) {
		int r = example_opt("xdpq-rxdrop", usage, c, &opts, &args);
		if (r == OPT_TAKEN)
			continue;
		if (r != OPT_OTHER)
			return r;
		switch (c) {
		case 'm':
			opts.multi_buffer = true;
			break;
		case 'n':
			if (number(optarg, UINT64_MAX, &max_frames) < 0 || max_frames == 0) {
				fprintf(stderr, "xdpq-rxdrop: -n %s: want a number of frames\n", optarg);
				return 2;
			}
			break;
		case 'x':
			dump = true;
			break;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "xdpq-rxdrop: unexpected argument %s\n%s", argv[optind], usage);
		return 2;
	}

	sigset_t wait_mask;
	catch_stop(&wait_mask);

	struct xdpq_error err;
	struct xdpq_lease *l = xdpq_open(args.path, &opts, &err);
	if (!l) {
		fprintf(stderr, "xdpq-rxdrop: %s\n", err.msg);
		return 1;
	}
	print_lease("xdpq-rxdrop", l);
	fprintf(stderr, ": active (%s%s)\n", l->zero_copy ? "zero-copy" : "copy", l->multi_buffer ? ", multi-buffer" : "");

	if (dump) {
		static char obuf[1 << 20];
		setvbuf(stdout, obuf, _IOFBF, sizeof(obuf));
	}
	struct rxq *q = calloc(l->nsockets, sizeof(*q));
	struct pollfd *pfd = calloc(l->nsockets + 1, sizeof(struct pollfd));
	if (!q || !pfd) {
		fprintf(stderr, "xdpq-rxdrop: out of memory\n");
		return 1;
	}
	int64_t start = now_ms(), end = args.seconds ? start + (int64_t)args.seconds * 1000 : INT64_MAX;
	uint64_t total = 0;
	struct keeper keep = {.prog = "xdpq-rxdrop"};
	int status = 0;

	int64_t last_frame = 0;
	/* The longest the loop left the rings unlooked-at while frames came
	 * (as pkg/client's Receiver.LongestAway): away longer than a ring
	 * holds at the arrival rate, the kernel drops. A wait that began once
	 * no frame had come for IDLE_AFTER_US is not counted. */
	int64_t looked = 0, away = 0;
	int flowing = 0;
	while (!stop && now_ms() < end && (!max_frames || total < max_frames)) {
		uint32_t got = 0;
		for (size_t i = 0; i < l->nsockets; i++) {
			uint64_t left = max_frames ? max_frames - total : UINT32_MAX;
			uint64_t before = q[i].frames;
			int64_t n = rx(l, &l->sockets[i], left < UINT32_MAX ? (uint32_t)left : UINT32_MAX, dump, &q[i]);
			if (n < 0) {
				fprintf(stderr, "xdpq-rxdrop: out of memory\n");
				return 1;
			}
			got += (uint32_t)n;
			total += q[i].frames - before;
		}
		int64_t t = now_us();
		if (flowing && t - looked > away)
			away = t - looked;
		if (got)
			last_frame = t;
		looked = t;
		flowing = t - last_frame < IDLE_AFTER_US;
		if (got)
			continue;
		if (now_us() - last_frame < IDLE_AFTER_US) {
			/* A nap, in ppoll with no descriptor: SIGINT and SIGTERM
			 * end it as they end the wait below. */
			for (size_t i = 0; i < l->nsockets; i++)
				if (xdpq_needs_wakeup(&l->sockets[i].fill))
					xdpq_kick_rx(&l->sockets[i]);
			struct timespec nap = {.tv_nsec = NAP_US * 1000};
			ppoll(NULL, 0, &nap, &wait_mask);
			continue;
		}

		/* Nothing came: the frames written so far go out, the kernel
		 * is woken where the fill ring asks for it, and the loop
		 * sleeps until a socket or the daemon has something. */
		if (dump && fflush(stdout) != 0) {
			fprintf(stderr, "xdpq-rxdrop: write frames: %s\n", strerror(errno));
			status = 1;
			break;
		}
		for (size_t i = 0; i < l->nsockets; i++) {
			if (xdpq_needs_wakeup(&l->sockets[i].fill))
				xdpq_kick_rx(&l->sockets[i]);
			pfd[i] = (struct pollfd){.fd = l->sockets[i].fd, .events = POLLIN};
		}
		pfd[l->nsockets] = (struct pollfd){.fd = xdpq_lease_fd(l), .events = POLLIN};
		int64_t wait = keeper_wait(&keep, l, end - now_ms());
		if (wait > 1000)
			wait = 1000;
		struct timespec ts = {.tv_sec = wait / 1000, .tv_nsec = wait % 1000 * 1000000};
		if (ppoll(pfd, l->nsockets + 1, &ts, &wait_mask) < 0 && errno != EINTR) {
			fprintf(stderr, "xdpq-rxdrop: poll: %s\n", strerror(errno));
			status = 1;
			break;
		}

		/* The daemon went (it restarts, or the node drains): the
		 * sockets keep receiving; resume the lease with the next one. */
		if (keeper_step(&keep, l, pfd[l->nsockets].revents) < 0) {
			status = 1;
			break;
		}
	}

	if (dump && fflush(stdout) != 0) {
		fprintf(stderr, "xdpq-rxdrop: write frames: %s\n", strerror(errno));
		status = 1;
	}
	double secs = (double)(now_ms() - start) / 1000;
	uint64_t total_bytes = 0;
	for (size_t i = 0; i < l->nsockets; i++) {
		fprintf(stderr, "queue %" PRIu32 ": %" PRIu64 " frames, %" PRIu64 " bytes\n", l->sockets[i].queue,
			q[i].frames, q[i].bytes);
		total_bytes += q[i].bytes;
	}
	fprintf(stderr, "total: %" PRIu64 " frames, %" PRIu64 " bytes in %.1f s\n", total, total_bytes, secs);
	fprintf(stderr, "away: longest %" PRId64 "us\n", away);
	if (max_frames && total < max_frames && !stop && status == 0) {
		fprintf(stderr, "xdpq-rxdrop: %" PRIu64 " of %llu frames came within %llu s\n", total, max_frames,
			args.seconds);
		status = 1;
	}
	xdpq_close(l);
	for (size_t i = 0; i < l->nsockets; i++)
		free(q[i].hex);
	free(q);
	free(pfd);
	return status;
}
