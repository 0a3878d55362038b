/* Frames that userspace wrote into an mmapped map, sent from XDP: a BPF_PROG_TEST_RUN in live-frames mode on the
 * loopback sends slot `next` of `transmit_frames` out of interface `ifindex` on every run, so a batch of frames
 * leaves with one system call and no socket buffer per frame. The python engine transmits this way
 * (bpf/xsk_steer.bpf.c, softdta.kernel.xdp_transmit), and so do the lab's reporters (bpf/frame_sender.bpf.c). */
#ifndef SOFTDTA_TRANSMIT_H
#define SOFTDTA_TRANSMIT_H

#include "softdta_spec.h"

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

/* One run of a transmit call: the call's next frame, in slot order. */
static __always_inline int transmit(struct xdp_md *ctx)
{
	struct transmit_control *control;
	struct transmit_frame *frame;
	__u32 zero = 0, slot, len;

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

#endif /* SOFTDTA_TRANSMIT_H */
