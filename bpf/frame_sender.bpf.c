// SPDX-License-Identifier: GPL-2.0
/* Any frames at kernel speed (softdta.kernel.frame_sender): a BPF_PROG_TEST_RUN in live-frames mode on the
 * loopback sends slot `next` of the mmapped map `transmit_frames` out of interface `ifindex` on every run, the way
 * the python engine transmits (bpf/xsk_steer.bpf.c). Userspace writes a batch of frames into the slots and sends
 * them with one system call, with no socket buffer per frame: the lab's reporters send the demo's own reports
 * this way, where the kernel report generator (bpf/reporter.bpf.c) sends variations of one template.
 *
 * The program is attached to the interface it sends from, where it passes every frame that arrives: that keeps
 * it in the kernel's XDP dispatcher, outside of which every test run waits for an RCU grace period. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "softdta_spec.h"
#include "maps.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct transmit_control);
	__uint(max_entries, 1);
} transmit_control SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct transmit_frame);
	__uint(max_entries, TRANSMIT_SLOTS);
} transmit_frames SEC(".maps");

SEC("xdp")
int softdta_send(struct xdp_md *ctx)
{
	struct transmit_control *control;
	struct transmit_frame *frame;
	__u32 zero = 0, slot, len;

	if (ctx->ingress_ifindex != LOOPBACK_IFINDEX)
		return XDP_PASS;	/* a frame arriving where the program is attached */
	control = bpf_map_lookup_elem(&transmit_control, &zero);
	if (!control || control->next >= control->count)
		return XDP_DROP;
	slot = control->next++;	/* one caller at a time */
	frame = bpf_map_lookup_elem(&transmit_frames, &slot);
	if (!frame)
		return XDP_DROP;
	len = *(volatile __u32 *)&frame->len;	/* read once: the bound checked is the length copied */
	if (len < ETHERNET_SIZE || len > TRANSMIT_FRAME_MAX)
		return XDP_DROP;
	if (bpf_xdp_adjust_tail(ctx, (int)len - (int)bpf_xdp_get_buff_len(ctx)))
		return XDP_DROP;
	if (bpf_xdp_store_bytes(ctx, 0, frame->frame, len))
		return XDP_DROP;
	return bpf_redirect(control->ifindex, 0);
}

char LICENSE[] SEC("license") = "GPL";
