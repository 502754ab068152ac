/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * msg.h: the native protocol's messages (docs/protocol.md) as C: a parser
 * of the daemon's messages and a writer of the client's. Internal to the
 * xdpq client library; msg_test.c tests it on its own.
 */
#ifndef XDPQ_MSG_H
#define XDPQ_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* MSG_MAX_QUEUES bounds the queues of one message: 4096 bytes hold fewer. */
#define MSG_MAX_QUEUES 2048

/* struct msg is every message of the protocol; type says which fields
 * matter. Absent fields are zero; has_* says whether an object or array
 * was there. */
struct msg {
	char type[32];
	uint64_t version;
	char allocation[256];
	char netdev[256];
	bool has_queues;
	size_t nqueues;
	uint32_t queues[MSG_MAX_QUEUES];
	bool has_limits;
	uint64_t max_umem_bytes;
	uint32_t max_ring;
	bool tx_allowed;
	uint32_t max_queues;
	bool has_busy_poll;
	uint32_t busy_poll_timeout_us;
	uint32_t busy_poll_budget;
	uint32_t frame_size;
	uint32_t headroom;
	bool has_rings;
	uint32_t ring_fill, ring_completion, ring_rx, ring_tx;
	bool zero_copy;
	bool multi_buffer;
	char code[32];
	char reason[4096 + 1];
};

/*
 * msg_parse decodes one message of the daemon: one JSON object, nothing
 * after it but white space. Fields it does not know are skipped (a newer
 * daemon may add some); a known field of the wrong JSON type, an integer
 * out of its range, a string longer than its field, more than
 * MSG_MAX_QUEUES queues or nesting deeper than 32 are errors. It returns
 * 0, or -1 with why in err.
 */
int msg_parse(const char *buf, size_t len, struct msg *m, char *err, size_t errlen);

/* struct msg_writer builds one message in buf; overflow says it did not fit. */
struct msg_writer {
	char *buf;
	size_t cap;
	size_t len;
	bool overflow;
};

void msg_raw(struct msg_writer *w, const char *s);
void msg_str(struct msg_writer *w, const char *s);	/* a JSON string, escaped */
void msg_u64(struct msg_writer *w, uint64_t v);
void msg_queues(struct msg_writer *w, const uint32_t *q, size_t n);	/* a JSON array */

/* struct msg_request is the client's request (docs/protocol.md, step 3). */
struct msg_request {
	uint32_t frame_size;
	uint32_t headroom;
	uint32_t ring_fill, ring_completion, ring_rx, ring_tx;
	const uint32_t *queues;
	size_t nqueues;
	bool multi_buffer;	/* sockets bound with XDP_USE_SG */
};

/*
 * msg_request writes the request r. multi_buffer is written only when
 * true: a daemon older than the field refuses it as unknown, and a client
 * that does not ask for it must still reach such a daemon.
 */
void msg_request(struct msg_writer *w, const struct msg_request *r);

#endif /* XDPQ_MSG_H */
