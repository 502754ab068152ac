// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * xdpq_direct: the "direct receive" program.
 *
 * Every frame goes to the AF_XDP socket bound to the queue it arrived on;
 * frames on a queue without a socket go to the kernel stack. The program
 * never parses a packet: hardware steering (ethtool ntuple rules, RSS kept
 * off reserved queues) decides what reaches a queue.
 *
 * The flags argument of bpf_redirect_map (XDP_PASS) is the action taken when
 * the map has no socket at that index.
 *
 * It counts, per rx queue, the frames it redirected and those it passed
 * because the queue had no socket: a per-CPU array (no atomic operation,
 * no cache line shared between CPUs) of the filter program's layout, so
 * that both kinds report the same counters (xdpq_agent_program_packets_total)
 * and a netdev whose program changes kind keeps counting in the same map.
 * The lookup is inlined by the verifier (PERCPU_ARRAY, Linux 6.9): two
 * loads and an increment per frame (BenchmarkDirect in pkg/xdp).
 *
 * Its section is xdp.frags (the program is loaded with BPF_F_XDP_HAS_FRAGS):
 * a frame larger than the driver's buffer (a 9000-byte jumbo frame) comes in
 * fragments, which the redirect hands whole to the socket (one descriptor per
 * fragment to a socket bound with XDP_USE_SG). Drivers refuse a program
 * without the flag on a netdev whose MTU does not fit one buffer, and the
 * flag changes nothing for smaller frames.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* Per-queue counters, one slot per CPU: the layout of xdpq_filter.c's. */
struct xdpq_counters {
	__u64 redirected;      /* frame handed to the queue's socket */
	__u64 passed;          /* the queue had no socket: frame given to the kernel */
	__u64 redirect_failed; /* the filter's only; never counted here */
};

/* Sized to the netdev's queue count when the program is loaded. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

/* Sized to the netdev's queue count when the program is loaded. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xdpq_counters);
} counters SEC(".maps");

SEC("xdp.frags")
int xdpq_direct(struct xdp_md *ctx)
{
	__u32 q = ctx->rx_queue_index;
	struct xdpq_counters *c = bpf_map_lookup_elem(&counters, &q);
	int action = bpf_redirect_map(&xsks, q, XDP_PASS);

	if (c) {
		if (action == XDP_REDIRECT)
			c->redirected++;
		else
			c->passed++;
	}
	return action;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
