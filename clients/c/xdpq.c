// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The C client of xdpq's socket broker: the native protocol of
 * docs/protocol.md, the rings of the sockets it hands over, and resuming
 * a lease with the next daemon. It follows pkg/client, the Go client.
 */
#define _GNU_SOURCE
#include "xdpq.h"
#include "msg.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef SOL_XDP
#define SOL_XDP 283
#endif

/* Retrying a busy allocation: the Go client's pace. */
#define BUSY_RETRY_MS 20

__attribute__((format(printf, 4, 5)))
static void seterr(struct xdpq_error *e, int errnum, bool retry, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	if (errnum) {
		size_t n = strlen(e->msg);
		snprintf(e->msg + n, sizeof(e->msg) - n, ": %s", strerror(errnum));
	}
	e->code[0] = '\0';
	e->errnum = errnum;
	e->retry = retry;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void close_fds(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
}

/* dial connects to the daemon's socket. A daemon not there (yet) is worth
 * retrying. */
static int dial(const char *path, int timeout_ms, struct xdpq_error *err)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	strcpy(sa.sun_path, path); /* checked against sun_path by the callers */
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		seterr(err, errno, false, "xdpq: socket");
		return -1;
	}
	/* Bounds a connect to a full backlog and every send. */
	struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = timeout_ms % 1000 * 1000};
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		seterr(err, e, e == ENOENT || e == ECONNREFUSED || e == EAGAIN || e == EINTR,
		       "xdpq: connect %s", path);
		return -1;
	}
	return fd;
}

static int send_msg(int conn, const struct msg_writer *w, const int *fds, size_t nfds, const char *what,
		    struct xdpq_error *err)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * XDPQ_MAX_QUEUES)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = w->buf, .iov_len = w->len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

	if (w->overflow) {
		seterr(err, 0, false, "xdpq: %s: longer than %d bytes", what, XDPQ_MAX_MESSAGE);
		return -1;
	}
	if (nfds > 0) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	for (;;) {
		if (sendmsg(conn, &mh, MSG_NOSIGNAL) >= 0)
			return 0;
		if (errno != EINTR)
			break;
	}
	seterr(err, errno, true, "xdpq: send %s", what);
	return -1;
}

/*
 * recv_msg waits until deadline for one message with at most maxfds
 * descriptors (kept in fds, *nfds of them). It returns the message's
 * length, or 0 when the daemon closed the connection, or -1.
 */
static ssize_t recv_msg(int conn, char *buf, size_t cap, int *fds, size_t maxfds, size_t *nfds, int64_t deadline,
			const char *want, struct xdpq_error *err)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * XDPQ_MAX_QUEUES)];
		struct cmsghdr align;
	} ctl;
	ssize_t n;
	struct msghdr mh;

	*nfds = 0;
	for (;;) {
		int64_t left = deadline - now_ms();
		if (left <= 0) {
			seterr(err, 0, true, "xdpq: waiting for %s: no answer in time", want);
			return -1;
		}
		struct pollfd p = {.fd = conn, .events = POLLIN};
		int r = poll(&p, 1, (int)left);
		if (r < 0 && errno != EINTR) {
			seterr(err, errno, true, "xdpq: waiting for %s", want);
			return -1;
		}
		if (r <= 0)
			continue;
		struct iovec iov = {.iov_base = buf, .iov_len = cap};
		mh = (struct msghdr){.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
				     .msg_controllen = sizeof(ctl.buf)};
		n = recvmsg(conn, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n >= 0)
			break;
		if (errno == EAGAIN || errno == EINTR)
			continue;
		if (errno == ECONNRESET)
			return 0;
		seterr(err, errno, true, "xdpq: waiting for %s", want);
		return -1;
	}
	size_t extra = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (*nfds < maxfds) {
				fds[(*nfds)++] = fd;
			} else {
				close(fd);
				extra++;
			}
		}
	}
	if (extra > 0 || (mh.msg_flags & MSG_CTRUNC)) {
		close_fds(fds, *nfds);
		*nfds = 0;
		seterr(err, 0, false, "xdpq: waiting for %s: the daemon sent more than %zu descriptors", want, maxfds);
		return -1;
	}
	if (mh.msg_flags & MSG_TRUNC) {
		close_fds(fds, *nfds);
		*nfds = 0;
		seterr(err, 0, false, "xdpq: waiting for %s: a message longer than %zu bytes", want, cap);
		return -1;
	}
	if (n == 0) {
		close_fds(fds, *nfds);
		*nfds = 0;
	}
	return n;
}

/* copy_reason copies a daemon's text for a terminal: no control characters. */
static void copy_reason(char *out, size_t cap, const char *in)
{
	size_t i = 0;
	for (; in[i] && i + 1 < cap; i++)
		out[i] = ((unsigned char)in[i] < 0x20 || in[i] == 0x7f) ? '?' : in[i];
	out[i] = '\0';
}

/*
 * expect receives the daemon's next message, which must be of type want;
 * a refusal becomes err with the daemon's code and reason. Descriptors
 * come back only with a message of type want.
 */
static int expect(int conn, struct msg *m, const char *want, int *fds, size_t maxfds, size_t *nfds, int64_t deadline,
		  struct xdpq_error *err)
{
	char buf[XDPQ_MAX_MESSAGE];
	char perr[256];
	ssize_t n = recv_msg(conn, buf, sizeof(buf), fds, maxfds, nfds, deadline, want, err);

	if (n < 0)
		return -1;
	if (n == 0) {
		seterr(err, 0, true, "xdpq: the daemon closed the connection before %s", want);
		return -1;
	}
	if (msg_parse(buf, (size_t)n, m, perr, sizeof(perr)) < 0) {
		close_fds(fds, *nfds);
		*nfds = 0;
		seterr(err, 0, false, "xdpq: waiting for %s: not a protocol message: %s", want, perr);
		return -1;
	}
	if (strcmp(m->type, "error") == 0) {
		char code[sizeof(err->code)], reason[sizeof(err->msg)];
		close_fds(fds, *nfds);
		*nfds = 0;
		copy_reason(code, sizeof(code), m->code[0] ? m->code : "(no code)");
		copy_reason(reason, sizeof(reason), m->reason);
		seterr(err, 0, false, "xdpq: refused: %s: %s", code, reason);
		strcpy(err->code, code);
		err->retry = strcmp(code, "busy") == 0 || strcmp(code, "timeout") == 0 || strcmp(code, "internal") == 0;
		return -1;
	}
	if (strcmp(m->type, want) != 0) {
		char type[sizeof(m->type)];
		close_fds(fds, *nfds);
		*nfds = 0;
		copy_reason(type, sizeof(type), m->type);
		seterr(err, 0, false, "xdpq: got a \"%s\" message, want \"%s\"", type, want);
		return -1;
	}
	return 0;
}

/* hello opens a handshake and returns the daemon's welcome in m. */
static int hello(int conn, const char *name, struct msg *m, int64_t deadline, struct xdpq_error *err)
{
	char buf[XDPQ_MAX_MESSAGE];
	struct msg_writer w = {.buf = buf, .cap = sizeof(buf)};
	size_t nfds;

	msg_raw(&w, "{\"type\":\"hello\",\"version\":");
	msg_u64(&w, XDPQ_PROTOCOL_VERSION);
	msg_raw(&w, ",\"client\":");
	msg_str(&w, name);
	msg_raw(&w, "}");
	if (send_msg(conn, &w, NULL, 0, "hello", err) < 0)
		return -1;
	if (expect(conn, m, "welcome", NULL, 0, &nfds, deadline, err) < 0)
		return -1;
	if (m->version != XDPQ_PROTOCOL_VERSION) {
		seterr(err, 0, false, "xdpq: the daemon speaks protocol version %llu, this client %d",
		       (unsigned long long)m->version, XDPQ_PROTOCOL_VERSION);
		return -1;
	}
	if (m->nqueues == 0 || m->allocation[0] == '\0') {
		seterr(err, 0, false, "xdpq: the daemon's welcome names no allocation or no queues");
		return -1;
	}
	return 0;
}

static void unmap_ring(struct xdpq_ring *r)
{
	if (r->map)
		munmap(r->map, r->map_len);
	memset(r, 0, sizeof(*r));
}

/* map_ring maps one ring of socket fd, n entries of entry bytes each. */
static int map_ring(struct xdpq_ring *r, int fd, off_t pgoff, const struct xdp_ring_offset *off, uint32_t n,
		    size_t entry, bool producer)
{
	size_t len = off->desc + (size_t)n * entry;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, pgoff);

	if (p == MAP_FAILED)
		return -1;
	if (off->producer + 4 > len || off->consumer + 4 > len || off->flags + 4 > len) {
		munmap(p, len);
		errno = EPROTO;
		return -1;
	}
	r->map = p;
	r->map_len = len;
	r->producer = (uint32_t *)((char *)p + off->producer);
	r->consumer = (uint32_t *)((char *)p + off->consumer);
	r->flags = (uint32_t *)((char *)p + off->flags);
	r->ring = (char *)p + off->desc;
	r->size = n;
	r->mask = n - 1;
	r->cached_prod = __atomic_load_n(r->producer, __ATOMIC_ACQUIRE);
	r->cached_cons = __atomic_load_n(r->consumer, __ATOMIC_ACQUIRE);
	if (producer)
		r->cached_cons += n;
	return 0;
}

/* adopt maps the rings of a socket the daemon bound. */
static int adopt(struct xdpq_socket *s, uint32_t fill, uint32_t comp, uint32_t rx, uint32_t tx,
		 struct xdpq_error *err)
{
	struct xdp_mmap_offsets off;
	socklen_t len = sizeof(off);
	const char *what;

	if (getsockopt(s->fd, SOL_XDP, XDP_MMAP_OFFSETS, &off, &len) < 0) {
		seterr(err, errno, false, "xdpq: queue %u: read ring offsets", s->queue);
		return -1;
	}
	if (len != sizeof(off)) {
		seterr(err, 0, false, "xdpq: queue %u: the kernel's ring offsets have no flags (need_wakeup; Linux 5.4)",
		       s->queue);
		return -1;
	}
	what = "fill";
	if (map_ring(&s->fill, s->fd, XDP_UMEM_PGOFF_FILL_RING, &off.fr, fill, sizeof(uint64_t), true) < 0)
		goto fail;
	what = "completion";
	if (map_ring(&s->comp, s->fd, XDP_UMEM_PGOFF_COMPLETION_RING, &off.cr, comp, sizeof(uint64_t), false) < 0)
		goto fail;
	what = "rx";
	if (rx && map_ring(&s->rx, s->fd, XDP_PGOFF_RX_RING, &off.rx, rx, sizeof(struct xdp_desc), false) < 0)
		goto fail;
	what = "tx";
	if (tx && map_ring(&s->tx, s->fd, XDP_PGOFF_TX_RING, &off.tx, tx, sizeof(struct xdp_desc), true) < 0)
		goto fail;
	return 0;
fail:
	seterr(err, errno, false, "xdpq: queue %u: map the %s ring", s->queue, what);
	return -1;
}

static bool pow2(uint32_t v)
{
	return v && !(v & (v - 1));
}

static void free_lease(struct xdpq_lease *l)
{
	if (l->conn >= 0)
		close(l->conn);
	for (size_t i = 0; i < l->nsockets; i++) {
		struct xdpq_socket *s = &l->sockets[i];
		unmap_ring(&s->fill);
		unmap_ring(&s->comp);
		unmap_ring(&s->rx);
		unmap_ring(&s->tx);
		if (s->fd >= 0)
			close(s->fd);
	}
	free(l->sockets);
	if (l->umem)
		munmap(l->umem, l->umem_size);
	free(l);
}

/* make_umem creates the sealed memfd and maps it. */
static int make_umem(struct xdpq_lease *l, size_t size, struct xdpq_error *err)
{
	int mfd = memfd_create("xdpq-umem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (mfd < 0) {
		seterr(err, errno, false, "xdpq: memfd_create");
		return -1;
	}
	if (ftruncate(mfd, (off_t)size) < 0) {
		seterr(err, errno, false, "xdpq: memfd: set size %zu", size);
		goto fail;
	}
	/* The daemon refuses a memfd whose size could change under its mapping. */
	if (fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0) {
		seterr(err, errno, false, "xdpq: memfd: seal");
		goto fail;
	}
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, mfd, 0);
	if (p == MAP_FAILED) {
		seterr(err, errno, false, "xdpq: mmap umem of %zu bytes", size);
		goto fail;
	}
	l->umem = p;
	l->umem_size = size;
	return mfd;
fail:
	close(mfd);
	return -1;
}

/* open_once runs one handshake. */
static struct xdpq_lease *open_once(const char *path, const struct xdpq_opts *o, int64_t deadline,
				    struct xdpq_error *err)
{
	struct xdpq_lease *l = calloc(1, sizeof(*l));
	struct msg *m = malloc(sizeof(*m));
	char buf[XDPQ_MAX_MESSAGE];
	uint32_t queues[XDPQ_MAX_QUEUES];
	size_t nq;
	int fds[XDPQ_MAX_QUEUES];
	size_t nfds = 0;
	int mfd = -1;

	if (!l || !m) {
		free(l);
		free(m);
		seterr(err, ENOMEM, false, "xdpq");
		return NULL;
	}
	l->conn = -1;
	strcpy(l->path, path);
	snprintf(l->name, sizeof(l->name), "%s", o->name);
	l->timeout_ms = o->timeout_ms;
	if ((l->conn = dial(path, o->timeout_ms, err)) < 0)
		goto fail;
	if (hello(l->conn, l->name, m, deadline, err) < 0)
		goto fail;
	memcpy(l->allocation, m->allocation, sizeof(l->allocation));
	memcpy(l->netdev, m->netdev, sizeof(l->netdev));
	l->limits = (struct xdpq_limits){.max_umem_bytes = m->max_umem_bytes, .max_ring = m->max_ring,
					 .tx_allowed = m->tx_allowed, .max_queues = m->max_queues};
	l->busy_poll = m->has_busy_poll;
	l->busy_poll_timeout_us = m->busy_poll_timeout_us;
	l->busy_poll_budget = m->busy_poll_budget;

	if (o->queues) {
		for (size_t i = 0; i < o->nqueues; i++) {
			bool found = false;
			for (size_t j = 0; j < m->nqueues; j++)
				found = found || m->queues[j] == o->queues[i];
			if (!found) {
				seterr(err, 0, false, "xdpq: queue %u is not in allocation %s", o->queues[i],
				       l->allocation);
				goto fail;
			}
		}
		nq = o->nqueues;
		memcpy(queues, o->queues, nq * sizeof(uint32_t));
	} else {
		if (m->nqueues > XDPQ_MAX_QUEUES) {
			seterr(err, 0, false, "xdpq: allocation %s has %zu queues; ask for at most %d of them",
			       l->allocation, m->nqueues, XDPQ_MAX_QUEUES);
			goto fail;
		}
		nq = m->nqueues;
		memcpy(queues, m->queues, nq * sizeof(uint32_t));
	}

	/* Each socket: a fill ring's worth of frames to receive into, an RX
	 * ring's worth of spares (frames in the RX ring are on no fill ring),
	 * and a TX ring's worth to transmit from; as the Go client does. */
	uint32_t ring = o->ring, tx = o->tx ? o->ring : 0;
	size_t per = (size_t)ring * 2 + tx;
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t size = per * nq * o->frame_size;
	size = (size + page - 1) / page * page;
	if ((mfd = make_umem(l, size, err)) < 0)
		goto fail;
	l->frame_size = o->frame_size;
	l->headroom = o->headroom;

	struct msg_writer w = {.buf = buf, .cap = sizeof(buf)};
	msg_request(&w, &(struct msg_request){.frame_size = o->frame_size, .headroom = o->headroom,
					      .ring_fill = ring, .ring_completion = ring, .ring_rx = ring,
					      .ring_tx = tx, .queues = queues, .nqueues = nq,
					      .multi_buffer = o->multi_buffer});
	if (send_msg(l->conn, &w, &mfd, 1, "request", err) < 0)
		goto fail;
	close(mfd); /* the mapping keeps the memory; the daemon has its copy */
	mfd = -1;

	if (expect(l->conn, m, "sockets", fds, nq, &nfds, deadline, err) < 0)
		goto fail;
	if (nfds != nq) {
		seterr(err, 0, false, "xdpq: the daemon sent %zu sockets for %zu queues", nfds, nq);
		goto fail;
	}
	/* A multi-buffer socket hands over packets in pieces that a client
	 * not asking for it would take for whole ones; one without it drops
	 * what the client asked to receive. Either way: not these sockets. */
	if (m->multi_buffer != o->multi_buffer) {
		seterr(err, 0, false, "xdpq: asked for multi-buffer %s, the daemon bound the sockets with %s",
		       o->multi_buffer ? "true" : "false", m->multi_buffer ? "true" : "false");
		goto fail;
	}
	if (m->nqueues != nq || memcmp(m->queues, queues, nq * sizeof(uint32_t)) != 0 || !m->has_rings ||
	    m->ring_fill != ring || m->ring_completion != ring || m->ring_rx != ring || m->ring_tx != tx ||
	    m->frame_size != o->frame_size || m->headroom != o->headroom) {
		seterr(err, 0, false, "xdpq: the daemon's sockets are not the ones asked for (queues, rings or frames)");
		goto fail;
	}
	l->zero_copy = m->zero_copy;
	l->multi_buffer = m->multi_buffer;
	l->sockets = calloc(nq, sizeof(*l->sockets));
	if (!l->sockets) {
		seterr(err, ENOMEM, false, "xdpq");
		goto fail;
	}
	for (size_t i = 0; i < nq; i++)
		l->sockets[i].fd = -1;
	l->nsockets = nq;
	for (size_t i = 0; i < nq; i++) {
		struct xdpq_socket *s = &l->sockets[i];
		uint64_t base = (uint64_t)i * per * o->frame_size;
		uint32_t idx;

		s->fd = fds[i];
		fds[i] = -1;
		s->queue = queues[i];
		s->fill_frames = base;
		s->spare_frames = base + (uint64_t)ring * o->frame_size;
		s->tx_frames = base + (uint64_t)ring * 2 * o->frame_size;
		if (adopt(s, ring, ring, ring, tx, err) < 0)
			goto fail;
		if (xdpq_prod_reserve(&s->fill, ring, &idx) != ring) {
			seterr(err, 0, false, "xdpq: queue %u: the fill ring is not empty", s->queue);
			goto fail;
		}
		for (uint32_t k = 0; k < ring; k++)
			*xdpq_fill_addr(&s->fill, idx + k) = s->fill_frames + (uint64_t)k * o->frame_size;
		xdpq_prod_submit(&s->fill, ring);
	}
	nfds = 0;

	w = (struct msg_writer){.buf = buf, .cap = sizeof(buf)};
	msg_raw(&w, "{\"type\":\"ready\"}");
	if (send_msg(l->conn, &w, NULL, 0, "ready", err) < 0)
		goto fail;
	if (expect(l->conn, m, "active", NULL, 0, &nfds, deadline, err) < 0)
		goto fail;
	free(m);
	return l;
fail:
	for (size_t i = 0; i < nfds; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (mfd >= 0)
		close(mfd);
	free_lease(l);
	free(m);
	return NULL;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

struct xdpq_lease *xdpq_open(const char *path, const struct xdpq_opts *opts, struct xdpq_error *errp)
{
	struct xdpq_error scratch;
	struct xdpq_error *err = errp ? errp : &scratch;
	struct xdpq_opts o = {0};

	memset(err, 0, sizeof(*err));
	if (opts)
		o = *opts;
	if (!o.name || !*o.name)
		o.name = "xdpq-c";
	/* multi_buffer's defaults are the Go client's: a jumbo frame takes 3
	 * descriptors of 4 KiB frames, and rings of 4096 take a burst of 1024
	 * of them. */
	if (!o.frame_size)
		o.frame_size = o.multi_buffer ? 4096 : 2048;
	if (!o.ring)
		o.ring = o.multi_buffer ? 4096 : 2048;
	if (o.timeout_ms <= 0)
		o.timeout_ms = 30000;
	if (!path || !*path) {
		path = getenv(XDPQ_ENV_SOCKET);
		if (!path || !*path) {
			seterr(err, 0, false, "xdpq: no socket path given and %s is not set", XDPQ_ENV_SOCKET);
			return NULL;
		}
	}
	if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		seterr(err, 0, false, "xdpq: socket path %s: longer than %zu bytes", path,
		       sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
		return NULL;
	}
	if (o.frame_size != 2048 && o.frame_size != 4096) {
		seterr(err, 0, false, "xdpq: frame size %u: want 2048 or 4096", o.frame_size);
		return NULL;
	}
	if (!pow2(o.ring) || o.ring > 1u << 20) {
		seterr(err, 0, false, "xdpq: ring of %u entries: want a power of two up to %u", o.ring, 1u << 20);
		return NULL;
	}
	if (o.queues && (o.nqueues == 0 || o.nqueues > XDPQ_MAX_QUEUES)) {
		seterr(err, 0, false, "xdpq: %zu queues asked for: want 1 to %d", o.nqueues, XDPQ_MAX_QUEUES);
		return NULL;
	}
	int64_t give_up = now_ms() + o.timeout_ms;
	for (;;) {
		struct xdpq_lease *l = open_once(path, &o, now_ms() + o.timeout_ms, err);
		if (l)
			return l;
		/* A restarted container's predecessor may still hold the
		 * allocation, or the daemon's backlog be full: wait for it. */
		bool again = strcmp(err->code, "busy") == 0 || err->errnum == EAGAIN;
		if (!again || now_ms() >= give_up)
			return NULL;
		sleep_ms(BUSY_RETRY_MS);
	}
}

void xdpq_close(struct xdpq_lease *l)
{
	if (l)
		free_lease(l);
}

int xdpq_lease_fd(const struct xdpq_lease *l)
{
	return l->conn;
}

int xdpq_lease_check(struct xdpq_lease *l, struct xdpq_error *errp)
{
	struct xdpq_error scratch;
	struct xdpq_error *err = errp ? errp : &scratch;
	char buf[XDPQ_MAX_MESSAGE];
	union {
		char buf[CMSG_SPACE(sizeof(int) * 16)];
		struct cmsghdr align;
	} ctl;

	memset(err, 0, sizeof(*err));
	if (l->conn < 0) {
		seterr(err, 0, true, "xdpq: the lease is lost; resume it");
		return 1;
	}
	/* The daemon sends nothing once the lease is active; what a newer
	 * one might is read and dropped. */
	for (;;) {
		struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
				    .msg_controllen = sizeof(ctl.buf)};
		ssize_t n = recvmsg(l->conn, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return 0;
		for (struct cmsghdr *c = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
				close_fds((int *)CMSG_DATA(c), (c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		}
		if (n > 0)
			continue;
		if (n == 0)
			seterr(err, 0, true, "xdpq: the daemon closed the connection");
		else
			seterr(err, errno, true, "xdpq: connection to the daemon");
		close(l->conn);
		l->conn = -1;
		return 1;
	}
}

int xdpq_resume(struct xdpq_lease *l, struct xdpq_error *errp)
{
	struct xdpq_error scratch;
	struct xdpq_error *err = errp ? errp : &scratch;
	char buf[XDPQ_MAX_MESSAGE];
	uint32_t queues[XDPQ_MAX_QUEUES];
	int fds[XDPQ_MAX_QUEUES];
	size_t nfds;
	struct msg *m;
	int conn;

	memset(err, 0, sizeof(*err));
	if (l->conn >= 0) {
		seterr(err, 0, false, "xdpq: the lease is not lost; nothing to resume");
		return -1;
	}
	if (!(m = malloc(sizeof(*m)))) {
		seterr(err, ENOMEM, true, "xdpq");
		return -1;
	}
	int64_t deadline = now_ms() + l->timeout_ms;
	if ((conn = dial(l->path, l->timeout_ms, err)) < 0)
		goto fail;
	if (hello(conn, l->name, m, deadline, err) < 0)
		goto fail;
	if (strcmp(m->allocation, l->allocation) != 0) {
		char other[sizeof(m->allocation)];
		copy_reason(other, sizeof(other), m->allocation);
		seterr(err, 0, false, "xdpq: %s now serves allocation %s, not %s", l->path, other, l->allocation);
		goto fail;
	}
	for (size_t i = 0; i < l->nsockets; i++) {
		queues[i] = l->sockets[i].queue;
		fds[i] = l->sockets[i].fd;
	}
	struct msg_writer w = {.buf = buf, .cap = sizeof(buf)};
	msg_raw(&w, "{\"type\":\"resume\",\"queues\":");
	msg_queues(&w, queues, l->nsockets);
	msg_raw(&w, "}");
	if (send_msg(conn, &w, fds, l->nsockets, "resume", err) < 0)
		goto fail;
	if (expect(conn, m, "active", NULL, 0, &nfds, deadline, err) < 0)
		goto fail;
	l->conn = conn;
	free(m);
	return 0;
fail:
	if (conn >= 0)
		close(conn);
	free(m);
	return -1;
}

/* wakeup makes the empty non-blocking call that wakes an AF_XDP socket;
 * the errors of a transient condition (ring full, device busy or down)
 * are none. */
static int wakeup_ok(ssize_t r)
{
	if (r >= 0 || errno == EAGAIN || errno == EBUSY || errno == ENOBUFS || errno == ENETDOWN)
		return 0;
	return -1;
}

int xdpq_kick_rx(const struct xdpq_socket *s)
{
	return wakeup_ok(recvfrom(s->fd, NULL, 0, MSG_DONTWAIT, NULL, NULL));
}

int xdpq_kick_tx(const struct xdpq_socket *s)
{
	return wakeup_ok(sendto(s->fd, NULL, 0, MSG_DONTWAIT, NULL, 0));
}
