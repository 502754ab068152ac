// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/*
 * xdpq_filter: software steering for netdevs without ntuple rules.
 *
 * A frame goes to the AF_XDP socket of the queue it arrived on only when its
 * flow (queue, VLAN, IP version, L4 protocol, destination address,
 * destination port) is in the flows map; a flow entry with port 0 matches
 * every port. Everything else is XDP_PASS: a queue shared with the host
 * never steals the host's traffic.
 *
 * Not matched (so passed to the kernel): IPv6 frames whose first next header
 * is an extension header, and IPv4 fragments other than the first, unless a
 * wildcard-port flow covers their address.
 *
 * Its section is xdp.frags, as the direct program's (see there): a jumbo
 * frame in fragments is matched on the headers in its first fragment and
 * redirected whole; one whose headers are not all in the first fragment is
 * passed to the kernel.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define IP_MF 0x2000
#define IP_OFFSET 0x1fff

/* The key of the flows map. Go fills it through the generated type. */
struct xdpq_flow {
	__u32 queue;    /* rx queue the flow is steered to */
	__u16 vlan;     /* 802.1Q/802.1ad VLAN id of the outer tag, 0 untagged */
	__u8 family;    /* 4 or 6 */
	__u8 proto;     /* IPPROTO_UDP or IPPROTO_TCP */
	__u8 addr[16];  /* destination address; IPv4 in the first 4 bytes */
	__u16 port;     /* destination port, host byte order; 0 = any */
	__u16 pad;      /* must be zero */
};

/* Per-queue counters, one slot per CPU. */
struct xdpq_counters {
	__u64 redirected;      /* flow matched, frame handed to the socket */
	__u64 passed;          /* no flow matched, frame given to the kernel */
	__u64 redirect_failed; /* flow matched but the queue has no socket */
};

struct vlan_hdr {
	__be16 tci;
	__be16 proto;
};

/* Sized to the netdev's queue count when the program is loaded. */
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

/* Value: an owner cookie chosen by user space; the program ignores it. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct xdpq_flow);
	__type(value, __u32);
} flows SEC(".maps");

/* Sized to the netdev's queue count when the program is loaded. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xdpq_counters);
} counters SEC(".maps");

static __always_inline int parse(struct xdp_md *ctx, struct xdpq_flow *key)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	void *l3 = eth + 1;
	__be16 *ports;
	__be16 proto;
	int first = 1; /* the frame carries the L4 header */

	if (l3 > end)
		return -1;
	proto = eth->h_proto;
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		struct vlan_hdr *vh = l3;

		if ((void *)(vh + 1) > end)
			return -1;
		key->vlan = bpf_ntohs(vh->tci) & 0x0fff;
		proto = vh->proto;
		l3 = vh + 1;
	}

	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = l3;

		if ((void *)(ip + 1) > end || ip->ihl < 5)
			return -1;
		key->family = 4;
		key->proto = ip->protocol;
		__builtin_memcpy(key->addr, &ip->daddr, 4);
		if (ip->frag_off & bpf_htons(IP_OFFSET))
			first = 0;
		ports = l3 + ip->ihl * 4;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = l3;

		if ((void *)(ip6 + 1) > end)
			return -1;
		key->family = 6;
		key->proto = ip6->nexthdr;
		__builtin_memcpy(key->addr, &ip6->daddr, 16);
		ports = (void *)(ip6 + 1);
	} else {
		return -1;
	}

	if (key->proto != IPPROTO_UDP && key->proto != IPPROTO_TCP)
		return -1;
	if (first) {
		/* UDP and TCP both start with source and destination port. */
		if ((void *)(ports + 2) > end)
			return -1;
		key->port = bpf_ntohs(ports[1]);
	}
	return 0;
}

SEC("xdp.frags")
int xdpq_filter(struct xdp_md *ctx)
{
	__u32 q = ctx->rx_queue_index;
	struct xdpq_flow key = {};
	struct xdpq_counters *c;
	int action;

	c = bpf_map_lookup_elem(&counters, &q);
	key.queue = q;
	if (parse(ctx, &key) < 0)
		goto pass;
	if (!bpf_map_lookup_elem(&flows, &key)) {
		if (key.port == 0)
			goto pass;
		key.port = 0;
		if (!bpf_map_lookup_elem(&flows, &key))
			goto pass;
	}

	action = bpf_redirect_map(&xsks, q, XDP_PASS);
	if (c) {
		if (action == XDP_REDIRECT)
			c->redirected++;
		else
			c->redirect_failed++;
	}
	return action;

pass:
	if (c)
		c->passed++;
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
