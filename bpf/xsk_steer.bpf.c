// SPDX-License-Identifier: GPL-2.0
/* The python engine's XDP program: steers DTA reports (UDP 40040) and RoCEv2 ACKs from known collectors
 * (UDP 4791) into the AF_XDP socket of their RX queue; everything else goes up the stack, as the kernel
 * translator passes it.
 *
 * Its maps `counters`, `qp` and `qp_state` have the kernel translator's layouts (bpf/softdta_spec.h), so the
 * python engine publishes its counters and QP state where `softdta translator stats` reads them; it adds its
 * CPU time in `python_engine`.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "softdta_spec.h"
#include "wire.h"

#define XSK_QUEUES 64

TABLE(xsks, BPF_MAP_TYPE_XSKMAP, __u32, __u32, XSK_QUEUES);
TABLE(collector, BPF_MAP_TYPE_HASH, struct collector_key, struct collector_value, COLLECTOR_MAX_ENTRIES);
TABLE(qp, BPF_MAP_TYPE_ARRAY, __u32, struct qp_value, QP_MAX_ENTRIES);
TABLE(qp_state, BPF_MAP_TYPE_ARRAY, __u32, struct qp_state_value, QP_STATE_MAX_ENTRIES);
TABLE(counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, __u64, COUNTER_SLOTS);

/* written by the python engine only: its CPU time and frames, as `prog_*` run stats are for the kernel's */
struct python_engine_value {
	__u64 run_time_ns;
	__u64 runs;
	__u32 io;		/* 1 AF_XDP copy, 2 AF_XDP zero-copy, 3 AF_PACKET */
	__u32 pad;
};
TABLE(python_engine, BPF_MAP_TYPE_ARRAY, __u32, struct python_engine_value, 1);

SEC("xdp")
int softdta_xsk(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	struct udphdr *udp;

	if ((void *)(ip + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->protocol != IPPROTO_UDP ||
	    ip->ihl != 5 || (ip->frag_off & bpf_htons(0x3FFF)))
		return XDP_PASS;
	udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end)
		return XDP_PASS;
	if (udp->dest == bpf_htons(DTA_PORT))
		return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
	if (udp->dest == bpf_htons(ROCE_PORT)) {
		struct collector_key key = { .ip = ip->saddr };
		__u8 *opcode = (void *)(udp + 1);

		/* only ACKs are the translator's: CM MADs and a collector's SENDs go to the control plane */
		if ((void *)(opcode + 1) > end || (*opcode != ROCE_OP_RC_ACK && *opcode != ROCE_OP_RC_ATOMIC_ACK))
			return XDP_PASS;
		if (bpf_map_lookup_elem(&collector, &key))
			return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
	}
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
