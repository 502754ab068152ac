// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * The protocol's messages: a small JSON reader for the daemon's messages
 * (flat objects, a few nested ones, one array of numbers) and a writer for
 * the client's. The reader is defensive: it never reads past len, bounds
 * every string and array, limits nesting, and skips what it does not know.
 */
#include "msg.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_DEPTH 32

struct parser {
	const char *start, *p, *end;
	char *err;
	size_t errlen;
	bool failed;
};

__attribute__((format(printf, 2, 3)))
static int fail(struct parser *ps, const char *fmt, ...)
{
	if (ps->failed)
		return -1;
	ps->failed = true;
	if (ps->errlen == 0)
		return -1;
	int n = snprintf(ps->err, ps->errlen, "at byte %td: ", ps->p - ps->start);
	if (n < 0 || (size_t)n >= ps->errlen)
		return -1;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(ps->err + n, ps->errlen - n, fmt, ap);
	va_end(ap);
	return -1;
}

static void ws(struct parser *ps)
{
	while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
		ps->p++;
}

static bool peek(struct parser *ps, char c)
{
	return ps->p < ps->end && *ps->p == c;
}

static int expect(struct parser *ps, char c, const char *what)
{
	if (!peek(ps, c)) {
		if (ps->p >= ps->end)
			return fail(ps, "the message ends where %s should be", what);
		return fail(ps, "want %s, found '%c'", what, *ps->p);
	}
	ps->p++;
	return 0;
}

/* literal consumes word if it is next. */
static bool literal(struct parser *ps, const char *word)
{
	size_t n = strlen(word);
	if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
		return false;
	ps->p += n;
	return true;
}

static int hex4(struct parser *ps, uint32_t *cp)
{
	if (ps->end - ps->p < 4)
		return fail(ps, "a \\u escape needs 4 hex digits");
	uint32_t v = 0;
	for (int i = 0; i < 4; i++) {
		char c = ps->p[i];
		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= c - '0';
		else if (c >= 'a' && c <= 'f')
			v |= c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			v |= c - 'A' + 10;
		else
			return fail(ps, "a \\u escape needs 4 hex digits");
	}
	ps->p += 4;
	*cp = v;
	return 0;
}

static size_t utf8(uint32_t cp, char out[4])
{
	if (cp < 0x80) {
		out[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		out[0] = (char)(0xc0 | cp >> 6);
		out[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		out[0] = (char)(0xe0 | cp >> 12);
		out[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		out[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | cp >> 18);
	out[1] = (char)(0x80 | (cp >> 12 & 0x3f));
	out[2] = (char)(0x80 | (cp >> 6 & 0x3f));
	out[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/*
 * string reads a JSON string into out (cap bytes, the NUL included); with
 * out NULL it only checks it. One longer than out sets *toolong if given,
 * else it is an error naming field. Like Go's encoding/json, an unpaired
 * surrogate becomes U+FFFD; a NUL (\u0000) is refused: it would cut a C
 * string short.
 */
static int string(struct parser *ps, char *out, size_t cap, const char *field, bool *toolong)
{
	if (ps->p >= ps->end)
		return fail(ps, "%s: the message ends where a string should be", field);
	if (!peek(ps, '"'))
		return fail(ps, "%s: want a string", field);
	ps->p++;
	size_t n = 0;
	bool over = false;
	for (;;) {
		if (ps->p >= ps->end)
			return fail(ps, "%s: the string does not end", field);
		unsigned char c = (unsigned char)*ps->p++;
		char enc[4];
		size_t k = 1;
		if (c == '"')
			break;
		if (c < 0x20)
			return fail(ps, "%s: control character %#x in a string", field, c);
		enc[0] = (char)c;
		if (c == '\\') {
			if (ps->p >= ps->end)
				return fail(ps, "%s: the string does not end", field);
			char e = *ps->p++;
			uint32_t cp, lo;
			switch (e) {
			case '"':
			case '\\':
			case '/':
				enc[0] = e;
				break;
			case 'b':
				enc[0] = '\b';
				break;
			case 'f':
				enc[0] = '\f';
				break;
			case 'n':
				enc[0] = '\n';
				break;
			case 'r':
				enc[0] = '\r';
				break;
			case 't':
				enc[0] = '\t';
				break;
			case 'u':
				if (hex4(ps, &cp) < 0)
					return -1;
				if (cp >= 0xd800 && cp < 0xdc00) {
					const char *save = ps->p;
					if (ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
						ps->p += 2;
						if (hex4(ps, &lo) < 0)
							return -1;
						if (lo >= 0xdc00 && lo < 0xe000) {
							cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
						} else {
							cp = 0xfffd;
							ps->p = save;	/* the next escape stands on its own */
						}
					} else {
						cp = 0xfffd;
					}
				} else if (cp >= 0xdc00 && cp < 0xe000) {
					cp = 0xfffd;
				}
				if (cp == 0)
					return fail(ps, "%s: \\u0000 in a string", field);
				k = utf8(cp, enc);
				break;
			default:
				return fail(ps, "%s: unknown escape \\%c", field, e);
			}
		}
		if (out) {
			if (n + k < cap) {
				memcpy(out + n, enc, k);
				n += k;
			} else {
				over = true;
			}
		}
	}
	if (out)
		out[n] = '\0';
	if (over) {
		if (!toolong)
			return fail(ps, "%s: longer than %zu bytes", field, cap - 1);
		*toolong = true;
	}
	return 0;
}

/*
 * number reads a JSON number. For a field (v not NULL) it must be a
 * non-negative integer of at most max.
 */
static int number(struct parser *ps, uint64_t *v, uint64_t max, const char *field)
{
	const char *s = ps->p;
	bool neg = false, frac = false, over = false;
	uint64_t x = 0;

	if (peek(ps, '-')) {
		neg = true;
		ps->p++;
	}
	if (ps->p >= ps->end)
		return fail(ps, "%s: the message ends where a number should be", field);
	if (*ps->p < '0' || *ps->p > '9')
		return fail(ps, "%s: not a number", field);
	if (*ps->p == '0') {
		ps->p++;
	} else {
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
			unsigned d = (unsigned)(*ps->p++ - '0');
			if (x > (UINT64_MAX - d) / 10)
				over = true;
			else
				x = x * 10 + d;
		}
	}
	if (peek(ps, '.')) {
		ps->p++;
		frac = true;
		if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
			return fail(ps, "%s: not a number", field);
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
			ps->p++;
	}
	if (peek(ps, 'e') || peek(ps, 'E')) {
		ps->p++;
		frac = true;
		if (peek(ps, '+') || peek(ps, '-'))
			ps->p++;
		if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
			return fail(ps, "%s: not a number", field);
		while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9')
			ps->p++;
	}
	if (!v)
		return 0;
	int len = (int)(ps->p - s);
	if (neg || frac || over || x > max) {
		ps->p = s; /* the error points at the number */
		if (neg || frac)
			return fail(ps, "%s: %.*s is not a non-negative integer", field, len, s);
		return fail(ps, "%s: %.*s is out of range (at most %" PRIu64 ")", field, len, s, max);
	}
	*v = x;
	return 0;
}

typedef int (*member_fn)(struct parser *ps, const char *key, void *ctx, int depth);

static int object(struct parser *ps, member_fn fn, void *ctx, int depth);

/* skip reads any JSON value and drops it. */
static int skip(struct parser *ps, int depth)
{
	ws(ps);
	if (ps->p >= ps->end)
		return fail(ps, "the message ends where a value should be");
	switch (*ps->p) {
	case '{':
		return object(ps, NULL, NULL, depth + 1);
	case '[':
		if (depth + 1 > MAX_DEPTH)
			return fail(ps, "nested deeper than %d", MAX_DEPTH);
		ps->p++;
		ws(ps);
		if (peek(ps, ']')) {
			ps->p++;
			return 0;
		}
		for (;;) {
			if (skip(ps, depth + 1) < 0)
				return -1;
			ws(ps);
			if (peek(ps, ']')) {
				ps->p++;
				return 0;
			}
			if (expect(ps, ',', "',' or ']'") < 0)
				return -1;
		}
	case '"':
		return string(ps, NULL, 0, "value", NULL);
	case 't':
	case 'f':
	case 'n':
		if (literal(ps, "true") || literal(ps, "false") || literal(ps, "null"))
			return 0;
		return fail(ps, "not a JSON value");
	default:
		return number(ps, NULL, 0, "value");
	}
}

/*
 * object reads a JSON object; fn reads the value of each member (and
 * skips those it does not know); with fn NULL the object is skipped. A
 * key too long for any known field is skipped.
 */
static int object(struct parser *ps, member_fn fn, void *ctx, int depth)
{
	if (depth > MAX_DEPTH)
		return fail(ps, "nested deeper than %d", MAX_DEPTH);
	ws(ps);
	if (expect(ps, '{', "an object") < 0)
		return -1;
	ws(ps);
	if (peek(ps, '}')) {
		ps->p++;
		return 0;
	}
	for (;;) {
		char key[32];
		bool toolong = false;
		ws(ps);
		if (string(ps, key, sizeof(key), "key", &toolong) < 0)
			return -1;
		ws(ps);
		if (expect(ps, ':', "':'") < 0)
			return -1;
		ws(ps);
		int rc = fn && !toolong ? fn(ps, key, ctx, depth) : skip(ps, depth);
		if (rc < 0)
			return -1;
		ws(ps);
		if (peek(ps, '}')) {
			ps->p++;
			return 0;
		}
		if (expect(ps, ',', "',' or '}'") < 0)
			return -1;
	}
}

/* null consumes a JSON null: a known field given as null stays zero, as
 * with Go's encoding/json. */
static bool null(struct parser *ps)
{
	return literal(ps, "null");
}

static int u64(struct parser *ps, uint64_t *v, uint64_t max, const char *field)
{
	if (null(ps))
		return 0;
	return number(ps, v, max, field);
}

static int u32(struct parser *ps, uint32_t *v, const char *field)
{
	uint64_t x = *v;
	if (u64(ps, &x, UINT32_MAX, field) < 0)
		return -1;
	*v = (uint32_t)x;
	return 0;
}

static int boolean(struct parser *ps, bool *v, const char *field)
{
	if (literal(ps, "true"))
		*v = true;
	else if (literal(ps, "false"))
		*v = false;
	else if (!null(ps))
		return fail(ps, "%s: want true or false", field);
	return 0;
}

static int str(struct parser *ps, char *out, size_t cap, const char *field)
{
	if (null(ps))
		return 0;
	return string(ps, out, cap, field, NULL);
}

static int limits_member(struct parser *ps, const char *key, void *ctx, int depth)
{
	struct msg *m = ctx;
	if (strcmp(key, "max_umem_bytes") == 0)
		return u64(ps, &m->max_umem_bytes, INT64_MAX, "limits.max_umem_bytes");
	if (strcmp(key, "max_ring") == 0)
		return u32(ps, &m->max_ring, "limits.max_ring");
	if (strcmp(key, "tx_allowed") == 0)
		return boolean(ps, &m->tx_allowed, "limits.tx_allowed");
	if (strcmp(key, "max_queues") == 0)
		return u32(ps, &m->max_queues, "limits.max_queues");
	return skip(ps, depth);
}

static int busy_poll_member(struct parser *ps, const char *key, void *ctx, int depth)
{
	struct msg *m = ctx;
	if (strcmp(key, "timeout_us") == 0)
		return u32(ps, &m->busy_poll_timeout_us, "busy_poll.timeout_us");
	if (strcmp(key, "budget") == 0)
		return u32(ps, &m->busy_poll_budget, "busy_poll.budget");
	return skip(ps, depth);
}

static int rings_member(struct parser *ps, const char *key, void *ctx, int depth)
{
	struct msg *m = ctx;
	if (strcmp(key, "fill") == 0)
		return u32(ps, &m->ring_fill, "rings.fill");
	if (strcmp(key, "completion") == 0)
		return u32(ps, &m->ring_completion, "rings.completion");
	if (strcmp(key, "rx") == 0)
		return u32(ps, &m->ring_rx, "rings.rx");
	if (strcmp(key, "tx") == 0)
		return u32(ps, &m->ring_tx, "rings.tx");
	return skip(ps, depth);
}

/* nested reads a known object member; null leaves it absent. */
static int nested(struct parser *ps, member_fn fn, struct msg *m, bool *has, int depth, const char *field)
{
	if (null(ps))
		return 0;
	if (!peek(ps, '{'))
		return fail(ps, "%s: want an object", field);
	*has = true;
	return object(ps, fn, m, depth + 1);
}

static int queues(struct parser *ps, struct msg *m)
{
	if (null(ps))
		return 0;
	if (expect(ps, '[', "queues: an array") < 0)
		return -1;
	m->has_queues = true;
	m->nqueues = 0;
	ws(ps);
	if (peek(ps, ']')) {
		ps->p++;
		return 0;
	}
	for (;;) {
		uint64_t q;
		ws(ps);
		if (m->nqueues == MSG_MAX_QUEUES)
			return fail(ps, "queues: more than %d", MSG_MAX_QUEUES);
		if (number(ps, &q, UINT32_MAX, "queues") < 0)
			return -1;
		m->queues[m->nqueues++] = (uint32_t)q;
		ws(ps);
		if (peek(ps, ']')) {
			ps->p++;
			return 0;
		}
		if (expect(ps, ',', "',' or ']'") < 0)
			return -1;
	}
}

static int top_member(struct parser *ps, const char *key, void *ctx, int depth)
{
	struct msg *m = ctx;
	if (strcmp(key, "type") == 0)
		return str(ps, m->type, sizeof(m->type), "type");
	if (strcmp(key, "version") == 0)
		return u64(ps, &m->version, INT64_MAX, "version");
	if (strcmp(key, "allocation") == 0)
		return str(ps, m->allocation, sizeof(m->allocation), "allocation");
	if (strcmp(key, "netdev") == 0)
		return str(ps, m->netdev, sizeof(m->netdev), "netdev");
	if (strcmp(key, "queues") == 0)
		return queues(ps, m);
	if (strcmp(key, "limits") == 0)
		return nested(ps, limits_member, m, &m->has_limits, depth, "limits");
	if (strcmp(key, "busy_poll") == 0)
		return nested(ps, busy_poll_member, m, &m->has_busy_poll, depth, "busy_poll");
	if (strcmp(key, "frame_size") == 0)
		return u32(ps, &m->frame_size, "frame_size");
	if (strcmp(key, "headroom") == 0)
		return u32(ps, &m->headroom, "headroom");
	if (strcmp(key, "rings") == 0)
		return nested(ps, rings_member, m, &m->has_rings, depth, "rings");
	if (strcmp(key, "zero_copy") == 0)
		return boolean(ps, &m->zero_copy, "zero_copy");
	if (strcmp(key, "multi_buffer") == 0)
		return boolean(ps, &m->multi_buffer, "multi_buffer");
	if (strcmp(key, "code") == 0)
		return str(ps, m->code, sizeof(m->code), "code");
	if (strcmp(key, "reason") == 0)
		return str(ps, m->reason, sizeof(m->reason), "reason");
	return skip(ps, depth);
}

int msg_parse(const char *buf, size_t len, struct msg *m, char *err, size_t errlen)
{
	struct parser ps = {.start = buf, .p = buf, .end = buf + len, .err = err, .errlen = errlen};

	memset(m, 0, sizeof(*m));
	if (errlen > 0)
		err[0] = '\0';
	if (len == 0)
		return fail(&ps, "empty message");
	if (object(&ps, top_member, m, 1) < 0)
		return -1;
	ws(&ps);
	if (ps.p != ps.end)
		return fail(&ps, "data after the message");
	if (m->type[0] == '\0')
		return fail(&ps, "no type");
	return 0;
}

void msg_raw(struct msg_writer *w, const char *s)
{
	size_t n = strlen(s);
	if (w->overflow || w->len + n >= w->cap) {
		w->overflow = true;
		return;
	}
	memcpy(w->buf + w->len, s, n + 1);
	w->len += n;
}

void msg_str(struct msg_writer *w, const char *s)
{
	msg_raw(w, "\"");
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		char e[8] = {(char)*c, 0};
		if (*c == '"' || *c == '\\')
			snprintf(e, sizeof(e), "\\%c", *c);
		else if (*c < 0x20 || *c == 0x7f)
			snprintf(e, sizeof(e), "\\u%04x", *c);
		msg_raw(w, e);
	}
	msg_raw(w, "\"");
}

void msg_u64(struct msg_writer *w, uint64_t v)
{
	char s[24];
	snprintf(s, sizeof(s), "%" PRIu64, v);
	msg_raw(w, s);
}

void msg_queues(struct msg_writer *w, const uint32_t *q, size_t n)
{
	msg_raw(w, "[");
	for (size_t i = 0; i < n; i++) {
		if (i > 0)
			msg_raw(w, ",");
		msg_u64(w, q[i]);
	}
	msg_raw(w, "]");
}

void msg_request(struct msg_writer *w, const struct msg_request *r)
{
	msg_raw(w, "{\"type\":\"request\",\"frame_size\":");
	msg_u64(w, r->frame_size);
	msg_raw(w, ",\"headroom\":");
	msg_u64(w, r->headroom);
	msg_raw(w, ",\"rings\":{\"fill\":");
	msg_u64(w, r->ring_fill);
	msg_raw(w, ",\"completion\":");
	msg_u64(w, r->ring_completion);
	msg_raw(w, ",\"rx\":");
	msg_u64(w, r->ring_rx);
	msg_raw(w, ",\"tx\":");
	msg_u64(w, r->ring_tx);
	msg_raw(w, "},\"queues\":");
	msg_queues(w, r->queues, r->nqueues);
	if (r->multi_buffer)
		msg_raw(w, ",\"multi_buffer\":true");
	msg_raw(w, "}");
}
