// SPDX-License-Identifier: GPL-2.0
/* The python engine's XDP program: steers DTA reports (UDP 40040) and RoCEv2 ACKs from known collectors
 * (UDP 4791) into the AF_XDP socket of their RX queue; everything else goes up the stack, as the kernel
 * translator passes it.
 *
 * Its maps `counters`, `qp` and `qp_state` have the kernel translator's layouts (bpf/include/softdta_spec.h), so the
 * python engine publishes its counters and QP state where `softdta translator stats` reads them; it adds its
 * CPU time in `python_engine`.
 *
 * It also transmits the engine's frames: a BPF_PROG_TEST_RUN in live-frames mode on the loopback sends slot
 * `next` of `transmit_frames` out of the engine's interface on every run (softdta.kernel.xdp_transmit). One
 * program does both so that it stays in the kernel's XDP dispatcher while attached: a test run of a program
 * outside it waits for an RCU grace period. Real frames never arrive here on the loopback: the program is
 * attached only to the engine's interface, which is never lo.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "softdta_spec.h"
#include "maps.h"
#include "parsing.h"
#include "roce.h"
#include "transmit.h"

#define XSK_QUEUES 64

TABLE(xsks, BPF_MAP_TYPE_XSKMAP, __u32, __u32, XSK_QUEUES);
TABLE(collector, BPF_MAP_TYPE_HASH, struct collector_key, struct collector_value, COLLECTOR_MAX_ENTRIES);
TABLE(qp, BPF_MAP_TYPE_ARRAY, __u32, struct qp_value, QP_MAX_ENTRIES);
TABLE(qp_state, BPF_MAP_TYPE_ARRAY, __u32, struct qp_state_value, QP_STATE_MAX_ENTRIES);
TABLE(counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, __u64, COUNTER_SLOTS);

/* written by the python engine only: its CPU time and frames, as `prog_*` run stats are for the kernel's */
TABLE(python_engine, BPF_MAP_TYPE_ARRAY, __u32, struct python_engine_value, 1);
/* written by the python engine only, per RX queue */
TABLE(xsk_io, BPF_MAP_TYPE_ARRAY, __u32, struct xsk_io_value, XSK_QUEUES);

/* Reports off the link, for a sender that paces itself by what the link holds (the lab's demo); the engine
 * publishes every other counter. */
static __always_inline void count_to_socket(void)
{
	__u32 slot = CNT_RX_TO_SOCKET;
	__u64 *n = bpf_map_lookup_elem(&counters, &slot);

	if (n)
		*n += 1;
}

SEC("xdp")
int softdta_xsk(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct udp4 d;

	if (ctx->ingress_ifindex == LOOPBACK_IFINDEX)
		return transmit(ctx);
	if (parse_udp4(data, end, &d))
		return XDP_PASS;
	if (d.dport == DTA_PORT) {
		long action = bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);

		if (action == XDP_REDIRECT)
			count_to_socket();
		return action;
	}
	if (d.dport == ROCE_PORT) {
		struct collector_key key = {};
		__u8 *bth = d.udp + UDP_SIZE;

		/* only ACKs are the translator's: CM MADs and a collector's SENDs go to the control plane */
		if ((void *)(bth + BTH_OPCODE_LEN) > end ||
		    (bth_get_opcode(bth) != ROCE_OP_RC_ACK && bth_get_opcode(bth) != ROCE_OP_RC_ATOMIC_ACK))
			return XDP_PASS;
		__builtin_memcpy(&key.ip, d.ip + IPV4_SRC_OFF, IPV4_SRC_LEN);
		if (bpf_map_lookup_elem(&collector, &key))
			return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
	}
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
