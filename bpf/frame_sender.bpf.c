// SPDX-License-Identifier: GPL-2.0
/* Any frames at kernel speed (softdta.kernel.frame_sender), sent as include/transmit.h says: the lab's reporters
 * send the demo's own reports this way, where the kernel report generator (bpf/reporter.bpf.c) sends variations
 * of one template.
 *
 * The program is attached to the interface it sends from, where it passes every frame that arrives: that keeps
 * it in the kernel's XDP dispatcher, outside of which every test run waits for an RCU grace period. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "softdta_spec.h"
#include "transmit.h"

SEC("xdp")
int softdta_send(struct xdp_md *ctx)
{
	if (ctx->ingress_ifindex != LOOPBACK_IFINDEX)
		return XDP_PASS;	/* a frame arriving where the program is attached */
	return transmit(ctx);
}

char LICENSE[] SEC("license") = "GPL";
