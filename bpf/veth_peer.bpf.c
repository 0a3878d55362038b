// SPDX-License-Identifier: GPL-2.0
/* For the lab and the tests, not the product: an XDP program that passes every frame, for the far end of a veth
 * pair. XDP_TX'd and redirected frames enter a veth only if its peer runs XDP. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int softdta_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
