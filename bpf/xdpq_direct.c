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
 * Its section is xdp.frags (the program is loaded with BPF_F_XDP_HAS_FRAGS):
 * a frame larger than the driver's buffer (a 9000-byte jumbo frame) comes in
 * fragments, which the redirect hands whole to the socket (one descriptor per
 * fragment to a socket bound with XDP_USE_SG). Drivers refuse a program
 * without the flag on a netdev whose MTU does not fit one buffer, and the
 * flag changes nothing for smaller frames.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* Sized to the netdev's queue count when the program is loaded. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

SEC("xdp.frags")
int xdpq_direct(struct xdp_md *ctx)
{
	return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
