// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * msg_test: the message parser against the daemon's messages, malformed
 * and hostile ones, and a deterministic mutation fuzz of them. Built with
 * AddressSanitizer and UBSan (Makefile): every input lies in a heap
 * buffer of exactly its length, so a read past it aborts the test. The Go
 * test in this directory runs it; it exits non-zero on any failure.
 */
#include "msg.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                                                                               \
	do {                                                                                                           \
		if (!(cond)) {                                                                                         \
			failures++;                                                                                    \
			fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                                \
			fprintf(stderr, __VA_ARGS__);                                                                  \
			fputc('\n', stderr);                                                                           \
		}                                                                                                      \
	} while (0)

static struct msg m;

/* parse parses s from a heap copy of exactly its length. */
static int parse_n(const char *s, size_t n, char *err, size_t errlen)
{
	char *b = malloc(n ? n : 1);
	memcpy(b, s, n);
	int rc = msg_parse(b, n, &m, err, errlen);
	free(b);
	return rc;
}

static int parse(const char *s, char *err, size_t errlen)
{
	return parse_n(s, strlen(s), err, errlen);
}

static const char welcome[] =
	"{\"type\":\"welcome\",\"version\":1,\"allocation\":\"alloc-1\",\"netdev\":\"eth1\",\"queues\":[8,9],"
	"\"limits\":{\"max_umem_bytes\":268435456,\"max_ring\":8192,\"tx_allowed\":false,\"max_queues\":64},"
	"\"busy_poll\":{\"timeout_us\":50,\"budget\":64}}";
static const char sockets[] =
	"{\"type\":\"sockets\",\"frame_size\":2048,\"headroom\":128,"
	"\"rings\":{\"fill\":2048,\"completion\":1024,\"rx\":512,\"tx\":0},\"queues\":[8,9],\"zero_copy\":true}";
static const char refusal[] =
	"{\"type\":\"error\",\"code\":\"limit\",\"reason\":\"umem memfd of 2097152 bytes; this allocation allows at most "
	"1048576\"}";

static void test_valid(void)
{
	char err[256];

	CHECK(parse(welcome, err, sizeof(err)) == 0, "welcome: %s", err);
	CHECK(strcmp(m.type, "welcome") == 0 && m.version == 1, "welcome: type %s version %" PRIu64, m.type,
	      m.version);
	CHECK(strcmp(m.allocation, "alloc-1") == 0 && strcmp(m.netdev, "eth1") == 0, "welcome: %s %s", m.allocation,
	      m.netdev);
	CHECK(m.has_queues && m.nqueues == 2 && m.queues[0] == 8 && m.queues[1] == 9, "welcome: queues");
	CHECK(m.has_limits && m.max_umem_bytes == 268435456 && m.max_ring == 8192 && !m.tx_allowed &&
		      m.max_queues == 64,
	      "welcome: limits");
	CHECK(m.has_busy_poll && m.busy_poll_timeout_us == 50 && m.busy_poll_budget == 64, "welcome: busy_poll");

	CHECK(parse(sockets, err, sizeof(err)) == 0, "sockets: %s", err);
	CHECK(m.frame_size == 2048 && m.headroom == 128 && m.has_rings && m.ring_fill == 2048 &&
		      m.ring_completion == 1024 && m.ring_rx == 512 && m.ring_tx == 0 && m.zero_copy,
	      "sockets: fields");
	CHECK(!m.has_limits && !m.has_busy_poll, "sockets: limits or busy_poll set");
	CHECK(!m.multi_buffer, "sockets: multi_buffer set though absent");

	CHECK(parse(refusal, err, sizeof(err)) == 0, "error: %s", err);
	CHECK(strcmp(m.code, "limit") == 0 && strstr(m.reason, "at most 1048576"), "error: %s %s", m.code, m.reason);

	CHECK(parse(" \t\r\n{\"type\":\"active\"} \n", err, sizeof(err)) == 0, "active with white space: %s", err);
	CHECK(strcmp(m.type, "active") == 0, "active: %s", m.type);
}

/* A newer daemon may add fields, of any JSON type: they are skipped. */
static void test_unknown_fields(void)
{
	char err[256];
	const char *in =
		"{\"future\":{\"a\":[1,2,{\"b\":null}],\"c\":\"x\\\"}\"},\"type\":\"welcome\",\"n\":-1.5e+3,"
		"\"t\":true,\"f\":false,\"z\":null,\"arr\":[],\"obj\":{},"
		"\"limits\":{\"new\":[[]],\"max_ring\":4},\"rings\":{\"extra\":1,\"fill\":2},"
		"\"a_key_much_longer_than_any_field_the_client_knows_of\":7,"
		"\"allocation\":\"a\",\"queues\":[1]}";

	CHECK(parse(in, err, sizeof(err)) == 0, "unknown fields: %s", err);
	CHECK(strcmp(m.type, "welcome") == 0 && m.max_ring == 4 && m.ring_fill == 2 && m.nqueues == 1 &&
		      strcmp(m.allocation, "a") == 0,
	      "unknown fields: known ones lost");
}

static void test_strings(void)
{
	char err[256];

	CHECK(parse("{\"type\":\"error\",\"reason\":\"a\\\"b\\\\c\\/d\\n\\t\\u00e9\\u20ac\\ud83d\\ude00\"}", err,
		    sizeof(err)) == 0,
	      "escapes: %s", err);
	CHECK(strcmp(m.reason, "a\"b\\c/d\n\t\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80") == 0, "escapes: got %s", m.reason);
	/* Unpaired surrogates become U+FFFD, as in Go. */
	CHECK(parse("{\"type\":\"error\",\"reason\":\"\\ud800x\\udc00\\ud800\\u0041\"}", err, sizeof(err)) == 0,
	      "surrogates: %s", err);
	CHECK(strcmp(m.reason, "\xef\xbf\xbdx\xef\xbf\xbd\xef\xbf\xbd" "A") == 0, "surrogates: got %s", m.reason);
	/* The writer's escaping comes back as it went. */
	char buf[512];
	struct msg_writer w = {.buf = buf, .cap = sizeof(buf)};
	const char *odd = "q\"uo\\te\x01\x1f\x7f tab\t";
	msg_raw(&w, "{\"type\":\"error\",\"reason\":");
	msg_str(&w, odd);
	msg_raw(&w, "}");
	CHECK(!w.overflow && parse(buf, err, sizeof(err)) == 0 && strcmp(m.reason, odd) == 0, "writer round trip: %s",
	      buf);
	w = (struct msg_writer){.buf = buf, .cap = 8};
	msg_raw(&w, "{\"type\":");
	CHECK(w.overflow, "writer: no overflow past its capacity");
}

/* multi_buffer: the request carries it only when asked for (a daemon
 * older than the field refuses it), and the sockets message echoes it. */
static void test_multi_buffer(void)
{
	char buf[512], err[256];
	uint32_t q[] = {8, 9};
	struct msg_request r = {.frame_size = 4096, .headroom = 64, .ring_fill = 4096, .ring_completion = 4096,
				.ring_rx = 4096, .ring_tx = 0, .queues = q, .nqueues = 2, .multi_buffer = true};
	struct msg_writer w = {.buf = buf, .cap = sizeof(buf)};

	msg_request(&w, &r);
	CHECK(!w.overflow && strcmp(buf, "{\"type\":\"request\",\"frame_size\":4096,\"headroom\":64,"
					 "\"rings\":{\"fill\":4096,\"completion\":4096,\"rx\":4096,\"tx\":0},"
					 "\"queues\":[8,9],\"multi_buffer\":true}") == 0,
	      "request with multi_buffer: %s", buf);
	r.multi_buffer = false;
	w = (struct msg_writer){.buf = buf, .cap = sizeof(buf)};
	msg_request(&w, &r);
	CHECK(!w.overflow && strstr(buf, "multi_buffer") == NULL && strcmp(buf + strlen(buf) - 15, "\"queues\":[8,9]}") == 0,
	      "request without multi_buffer: %s", buf);
	w = (struct msg_writer){.buf = buf, .cap = 40};
	msg_request(&w, &r);
	CHECK(w.overflow, "request: no overflow past the writer's capacity");

	CHECK(parse("{\"type\":\"sockets\",\"queues\":[8],\"multi_buffer\":true}", err, sizeof(err)) == 0 &&
		      m.multi_buffer,
	      "sockets with multi_buffer true: %s", err);
	CHECK(parse("{\"type\":\"sockets\",\"multi_buffer\":false}", err, sizeof(err)) == 0 && !m.multi_buffer,
	      "sockets with multi_buffer false: %s", err);
	CHECK(parse("{\"type\":\"sockets\",\"multi_buffer\":null}", err, sizeof(err)) == 0 && !m.multi_buffer,
	      "sockets with multi_buffer null: %s", err);
	/* A nested multi_buffer is some other object's field. */
	CHECK(parse("{\"type\":\"sockets\",\"future\":{\"multi_buffer\":true}}", err, sizeof(err)) == 0 &&
		      !m.multi_buffer,
	      "nested multi_buffer taken: %s", err);
}

static void test_queues_writer(void)
{
	char buf[64], err[256];
	uint32_t q[] = {0, 7, 4294967295u};
	struct msg_writer w = {.buf = buf, .cap = sizeof(buf)};
	msg_raw(&w, "{\"type\":\"x\",\"queues\":");
	msg_queues(&w, q, 3);
	msg_raw(&w, "}");
	CHECK(!w.overflow && strcmp(buf, "{\"type\":\"x\",\"queues\":[0,7,4294967295]}") == 0, "queues: %s", buf);
	CHECK(parse(buf, err, sizeof(err)) == 0 && m.nqueues == 3 && m.queues[2] == 4294967295u, "queues back: %s",
	      err);
}

struct bad {
	const char *in;
	const char *err; /* a part of the error */
};

/* Malformed replies: each is refused with an error that says why. */
static const struct bad bads[] = {
	{"", "empty message"},
	{"   ", "an object"},
	{"[]", "an object"},
	{"null", "an object"},
	{"{", "should be"},
	{"{\"type\"", "':'"},
	{"{\"type\":", "should be"},
	{"{\"type\":\"welcome\"", "',' or '}'"},
	{"{\"type\":\"welcome", "does not end"},
	{"{\"type\":\"welcome\",}", "want a string"},
	{"{\"type\":\"welcome\"}x", "data after the message"},
	{"{\"type\":\"welcome\"}{}", "data after the message"},
	{"{}", "no type"},
	{"{\"type\":null}", "no type"},
	{"{\"type\":1}", "type: want a string"},
	{"{\"type\":\"a\\u0000b\"}", "\\u0000"},
	{"{\"type\":\"a\tb\"}", "control character"},
	{"{\"type\":\"a\\x\"}", "unknown escape"},
	{"{\"type\":\"a\\u12\"}", "4 hex digits"},
	{"{\"type\":\"a\\u12g4\"}", "4 hex digits"},
	{"{\"type\":\"an overly long type name, longer than 31\"}", "type: longer than 31 bytes"},
	{"{\"type\":\"welcome\",\"version\":-1}", "not a non-negative integer"},
	{"{\"type\":\"welcome\",\"version\":1.0}", "not a non-negative integer"},
	{"{\"type\":\"welcome\",\"version\":1e2}", "not a non-negative integer"},
	{"{\"type\":\"welcome\",\"version\":99999999999999999999999}", "out of range"},
	{"{\"type\":\"welcome\",\"version\":\"1\"}", "version: not a number"},
	{"{\"type\":\"welcome\",\"version\":-}", "not a number"},
	{"{\"type\":\"welcome\",\"version\":1.}", "not a number"},
	{"{\"type\":\"welcome\",\"version\":1e}", "not a number"},
	{"{\"type\":\"welcome\",\"queues\":[4294967296]}", "queues: 4294967296 is out of range"},
	{"{\"type\":\"welcome\",\"queues\":[1,]}", "queues: not a number"},
	{"{\"type\":\"welcome\",\"queues\":[1 2]}", "',' or ']'"},
	{"{\"type\":\"welcome\",\"queues\":{}}", "queues: an array"},
	{"{\"type\":\"welcome\",\"queues\":[\"1\"]}", "queues: not a number"},
	{"{\"type\":\"welcome\",\"limits\":[]}", "limits: want an object"},
	{"{\"type\":\"welcome\",\"limits\":{\"max_ring\":4294967296}}", "limits.max_ring"},
	{"{\"type\":\"welcome\",\"limits\":{\"max_umem_bytes\":9223372036854775808}}", "limits.max_umem_bytes"},
	{"{\"type\":\"welcome\",\"limits\":{\"tx_allowed\":1}}", "limits.tx_allowed: want true or false"},
	{"{\"type\":\"sockets\",\"zero_copy\":\"yes\"}", "zero_copy: want true or false"},
	{"{\"type\":\"sockets\",\"rings\":{\"fill\":-2}}", "rings.fill"},
	{"{\"type\":\"sockets\",\"multi_buffer\":\"true\"}", "multi_buffer: want true or false"},
	{"{\"type\":\"sockets\",\"multi_buffer\":1}", "multi_buffer: want true or false"},
	{"{\"type\":\"sockets\",\"multi_buffer\":[true]}", "multi_buffer: want true or false"},
	{"{\"type\":\"x\",\"unknown\":tru}", "not a JSON value"},
	{"{\"type\":\"x\",\"unknown\":[1,}", "value: not a number"},
	{"{\"type\":\"x\",\"unknown\":@}", "not a number"},
	{"{\"type\":\"x\" \"y\":1}", "',' or '}'"},
	{"{'type':'x'}", "want a string"},
};

static void test_bad(void)
{
	char err[256];
	for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
		err[0] = '\0';
		int rc = parse(bads[i].in, err, sizeof(err));
		CHECK(rc < 0, "accepted %s", bads[i].in);
		CHECK(rc >= 0 || strstr(err, bads[i].err), "%s: error \"%s\" lacks \"%s\"", bads[i].in, err, bads[i].err);
	}
	/* A NUL inside the message is no end of it. */
	const char nul[] = "{\"type\":\"x\"}\0junk";
	CHECK(parse_n(nul, sizeof(nul) - 1, err, sizeof(err)) < 0 && strstr(err, "data after"), "NUL: %s", err);
	/* A tiny error buffer is never overrun. */
	char small[4] = "xxx";
	CHECK(parse_n("{", 1, small, sizeof(small)) < 0 && strlen(small) < sizeof(small), "small error buffer");
	CHECK(parse_n("{", 1, NULL, 0) < 0, "no error buffer");
}

static void test_limits(void)
{
	char err[256];
	static char buf[1 << 16];

	/* Nesting: the message's object and 31 arrays in it are read, 32 are refused. */
	for (int arrays = 30; arrays <= 32; arrays++) {
		size_t n = (size_t)sprintf(buf, "{\"type\":\"x\",\"a\":");
		for (int i = 0; i < arrays; i++)
			buf[n++] = '[';
		for (int i = 0; i < arrays; i++)
			buf[n++] = ']';
		buf[n++] = '}';
		buf[n] = '\0';
		int rc = parse(buf, err, sizeof(err));
		CHECK(arrays <= 31 ? rc == 0 : (rc < 0 && strstr(err, "nested deeper") != NULL), "%d arrays: rc %d %s",
		      arrays, rc, err);
	}
	/* A deep unknown member cannot exhaust the stack. */
	size_t n = (size_t)sprintf(buf, "{\"type\":\"x\",\"a\":");
	while (n < sizeof(buf) - 2)
		buf[n++] = '[';
	buf[n] = '\0';
	CHECK(parse(buf, err, sizeof(err)) < 0 && strstr(err, "nested deeper"), "deep: %s", err);
	/* More queues than a message can hold are refused, not overflowed. */
	n = (size_t)sprintf(buf, "{\"type\":\"x\",\"queues\":[");
	for (int i = 0; i < MSG_MAX_QUEUES + 1; i++)
		n += (size_t)sprintf(buf + n, "%s1", i ? "," : "");
	n += (size_t)sprintf(buf + n, "]}");
	CHECK(parse(buf, err, sizeof(err)) < 0 && strstr(err, "queues: more than"), "queues: %s", err);
	/* A reason as long as a whole message fits. */
	n = (size_t)sprintf(buf, "{\"type\":\"error\",\"reason\":\"");
	memset(buf + n, 'r', 4096);
	n += 4096;
	n += (size_t)sprintf(buf + n, "\"}");
	CHECK(parse(buf, err, sizeof(err)) == 0 && strlen(m.reason) == 4096, "long reason: %s", err);
	/* A longer allocation than its field is refused. */
	n = (size_t)sprintf(buf, "{\"type\":\"welcome\",\"allocation\":\"");
	memset(buf + n, 'a', 256);
	n += 256;
	n += (size_t)sprintf(buf + n, "\"}");
	CHECK(parse(buf, err, sizeof(err)) < 0 && strstr(err, "allocation: longer than 255"), "long allocation: %s",
	      err);
	/* Duplicate keys: the last wins, as in Go. */
	CHECK(parse("{\"type\":\"a\",\"queues\":[1,2,3],\"type\":\"b\",\"queues\":[4]}", err, sizeof(err)) == 0 &&
		      strcmp(m.type, "b") == 0 && m.nqueues == 1 && m.queues[0] == 4,
	      "duplicates: %s", err);
}

/* fuzz mutates the seed messages (flips, deletions, insertions of JSON's
 * special characters, truncations, splices) and parses each mutant; it
 * checks only that the parser returns and that a success holds a type. */
static void fuzz(unsigned rounds)
{
	static const char *seeds[] = {welcome, sockets, refusal, "{\"type\":\"active\"}",
				      "{\"type\":\"sockets\",\"queues\":[3],\"multi_buffer\":true}",
				      "{\"type\":\"x\",\"u\":[{\"a\":\"\\ud83d\\ude00\"},-0.5e-7,true,null]}"};
	static const char special[] = "{}[]\":,\\u0123456789-+.eE tfn\x00\x1f\x7f\xff";
	uint64_t x = 0x9e3779b97f4a7c15u;
	char buf[8192], err[256];
	unsigned ok = 0;

	for (unsigned r = 0; r < rounds; r++) {
		const char *seed = seeds[r % (sizeof(seeds) / sizeof(seeds[0]))];
		size_t n = strlen(seed);
		memcpy(buf, seed, n);
		int muts = 1 + (int)(r % 8);
		for (int k = 0; k < muts; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			size_t at = n ? (size_t)(x >> 8) % n : 0;
			switch ((x >> 40) % 6) {
			case 0: /* flip a byte */
				if (n)
					buf[at] ^= (char)(1u << ((x >> 50) % 8));
				break;
			case 1: /* replace with a special one */
				if (n)
					buf[at] = special[(x >> 50) % (sizeof(special) - 1)];
				break;
			case 2: /* delete */
				if (n) {
					memmove(buf + at, buf + at + 1, n - at - 1);
					n--;
				}
				break;
			case 3: /* insert a special one */
				if (n < sizeof(buf) - 1) {
					memmove(buf + at + 1, buf + at, n - at);
					buf[at] = special[(x >> 50) % (sizeof(special) - 1)];
					n++;
				}
				break;
			case 4: /* truncate */
				n = at;
				break;
			case 5: /* splice a copy of a run in */
				if (n && n < sizeof(buf) / 2) {
					size_t len = 1 + (size_t)(x >> 52) % (n - at);
					memmove(buf + at + len, buf + at, n - at);
					n += len;
				}
				break;
			}
		}
		if (parse_n(buf, n, err, sizeof(err)) == 0) {
			ok++;
			CHECK(m.type[0] != '\0' && m.nqueues <= MSG_MAX_QUEUES, "fuzz: accepted without a type");
		} else {
			CHECK(err[0] != '\0', "fuzz: refused without a reason: %.*s", (int)n, buf);
		}
	}
	fprintf(stderr, "fuzz: %u mutants, %u parsed\n", rounds, ok);
	CHECK(ok > 0 && ok < rounds, "fuzz: %u of %u parsed; the mutations are not mutating", ok, rounds);
}

int main(int argc, char **argv)
{
	unsigned rounds = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 200000;

	test_valid();
	test_unknown_fields();
	test_strings();
	test_multi_buffer();
	test_queues_writer();
	test_bad();
	test_limits();
	fuzz(rounds);
	if (failures) {
		fprintf(stderr, "msg_test: %d failures\n", failures);
		return 1;
	}
	fprintf(stderr, "msg_test: ok\n");
	return 0;
}
