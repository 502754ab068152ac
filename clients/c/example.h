/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * example.h: what the examples (xdpq-rxdrop, xdpq-l2fwd) share and an
 * application does not need from the library: argument parsing, clocks,
 * and keeping a lease across a daemon restart.
 */
#ifndef XDPQ_EXAMPLE_H
#define XDPQ_EXAMPLE_H

#include "xdpq.h"

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

static inline int64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline int64_t now_ms(void)
{
	return now_us() / 1000;
}

/* number parses a whole non-negative decimal of at most max. */
static inline int number(const char *s, unsigned long long max, unsigned long long *v)
{
	char *end;
	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	*v = strtoull(s, &end, 10);
	return (errno || *end || *v > max) ? -1 : 0;
}

/* parse_queues parses "q,q,..." (at most XDPQ_MAX_QUEUES) into q; it
 * writes into s. */
static inline int parse_queues(char *s, uint32_t *q, size_t *n)
{
	char *save = NULL;
	*n = 0;
	for (char *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		unsigned long long v;
		if (*n == XDPQ_MAX_QUEUES || number(tok, UINT32_MAX, &v) < 0)
			return -1;
		q[(*n)++] = (uint32_t)v;
	}
	return *n > 0 ? 0 : -1;
}

/* struct example_args holds what example_opt parsed besides opts. */
struct example_args {
	const char *path;	/* -s; NULL: $XDPQ_SOCKET */
	unsigned long long seconds;	/* -d; 0: until stopped */
	uint32_t queues[XDPQ_MAX_QUEUES];	/* -q, for opts->queues */
	char qarg[4096];
};

/* example_opt's results besides an exit status. */
#define OPT_TAKEN (-1)	/* c was one of the options it knows, taken */
#define OPT_OTHER (-2)	/* c is the example's own */

/*
 * example_opt takes getopt's c if every example has it: -s socket,
 * -q queues, -r ring, -f frame size, -d seconds, -h, and getopt's
 * errors (':' a value missing, '?' an unknown option; the optstring must
 * start with ':'). It returns OPT_TAKEN, OPT_OTHER, or the status to exit
 * with: 0 after -h, 2 after a bad value or option (said on stderr).
 */
static inline int example_opt(const char *prog, const char *usage, int c, struct xdpq_opts *o, struct example_args *a)
{
	unsigned long long v;

	switch (c) {
	case 's':
		a->path = optarg;
		return OPT_TAKEN;
	case 'q':
		strncpy(a->qarg, optarg, sizeof(a->qarg) - 1);
		if (strlen(optarg) >= sizeof(a->qarg) || parse_queues(a->qarg, a->queues, &o->nqueues) < 0) {
			fprintf(stderr, "%s: -q %s: want queue numbers separated by commas\n", prog, optarg);
			return 2;
		}
		o->queues = a->queues;
		return OPT_TAKEN;
	case 'r':
		if (number(optarg, 1u << 20, &v) < 0) {
			fprintf(stderr, "%s: -r %s: want a ring size\n", prog, optarg);
			return 2;
		}
		o->ring = (uint32_t)v;
		return OPT_TAKEN;
	case 'f':
		if (number(optarg, 4096, &v) < 0) {
			fprintf(stderr, "%s: -f %s: want 2048 or 4096\n", prog, optarg);
			return 2;
		}
		o->frame_size = (uint32_t)v;
		return OPT_TAKEN;
	case 'd':
		if (number(optarg, INT_MAX / 1000, &a->seconds) < 0 || a->seconds == 0) {
			fprintf(stderr, "%s: -d %s: want a number of seconds\n", prog, optarg);
			return 2;
		}
		return OPT_TAKEN;
	case 'h':
		fputs(usage, stdout);
		return 0;
	case ':':
		fprintf(stderr, "%s: -%c needs a value\n%s", prog, optopt, usage);
		return 2;
	case '?':
		fprintf(stderr, "%s: unknown option -%c\n%s", prog, optopt, usage);
		return 2;
	}
	return OPT_OTHER;
}

/* stop is set by SIGINT or SIGTERM (catch_stop). */
static volatile sig_atomic_t stop;

static void on_stop_signal(int sig)
{
	(void)sig;
	stop = 1;
}

/* catch_stop makes SIGINT and SIGTERM set stop. They are blocked but in
 * ppoll with *wait_mask, so that one arriving between a check of stop and
 * the wait still ends the wait. */
static inline void catch_stop(sigset_t *wait_mask)
{
	sigset_t block;
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigprocmask(SIG_BLOCK, &block, wait_mask);
	sigdelset(wait_mask, SIGINT);
	sigdelset(wait_mask, SIGTERM);
	struct sigaction sa = {.sa_handler = on_stop_signal};
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

/* print_lease writes "<prog>: allocation A netdev N queues q,q" to
 * stderr, for the caller to end the line. */
static inline void print_lease(const char *prog, const struct xdpq_lease *l)
{
	fprintf(stderr, "%s: allocation %s netdev %s queues", prog, l->allocation, l->netdev);
	for (size_t i = 0; i < l->nsockets; i++)
		fprintf(stderr, "%s%" PRIu32, i ? "," : " ", l->sockets[i].queue);
}

/* struct keeper keeps a lease across the daemon's restarts: the sockets
 * go on working while it is lost, and it is resumed with the next daemon,
 * backing off from 50 ms to 2 s as the Go client does. */
struct keeper {
	const char *prog;	/* the example's name, for its messages */
	int64_t next_resume;	/* ms (now_ms) of the next try while lost */
	int64_t backoff;	/* ms */
};

/* keeper_wait bounds a wait of wait_ms so that a lost lease's next try is
 * not missed. */
static inline int64_t keeper_wait(const struct keeper *k, const struct xdpq_lease *l, int64_t wait_ms)
{
	if (xdpq_lease_fd(l) < 0 && k->next_resume - now_ms() < wait_ms)
		wait_ms = k->next_resume - now_ms();
	return wait_ms < 0 ? 0 : wait_ms;
}

/* keeper_step runs after a poll that included the lease's fd (revents:
 * what poll said of it; 0 if not polled): it notices a lease lost and
 * tries to resume one that is. It returns -1 when the lease cannot be
 * resumed (the example should stop), else 0. */
static inline int keeper_step(struct keeper *k, struct xdpq_lease *l, short revents)
{
	struct xdpq_error err;
	if (xdpq_lease_fd(l) >= 0 && (revents & (POLLIN | POLLHUP | POLLERR)) && xdpq_lease_check(l, &err) == 1) {
		fprintf(stderr, "%s: lease lost (%s); resuming\n", k->prog, err.msg);
		k->next_resume = now_ms();
		k->backoff = 0;
	}
	if (xdpq_lease_fd(l) >= 0 || now_ms() < k->next_resume)
		return 0;
	if (xdpq_resume(l, &err) == 0) {
		fprintf(stderr, "%s: lease resumed\n", k->prog);
		return 0;
	}
	if (!err.retry) {
		fprintf(stderr, "%s: cannot resume the lease: %s\n", k->prog, err.msg);
		return -1;
	}
	k->backoff = k->backoff ? (k->backoff * 2 > 2000 ? 2000 : k->backoff * 2) : 50;
	k->next_resume = now_ms() + k->backoff;
	return 0;
}

#endif /* XDPQ_EXAMPLE_H */
