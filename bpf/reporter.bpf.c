// SPDX-License-Identifier: GPL-2.0
/* A report generator at kernel speed, the mechanism of xdp-trafficgen: userspace runs this program with
 * BPF_PROG_TEST_RUN in live-frames mode, and every run turns its frame into the next report of `reporter_frames`
 * and transmits it with XDP_TX. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define REPORT_FRAME_MAX 256

struct report_frame {
	__u32 len;
	__u8 bytes[REPORT_FRAME_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);	/* userspace writes a whole batch of frames with one copy */
	__type(key, __u32);
	__type(value, struct report_frame);
	__uint(max_entries, 1);	/* sized at load */
} reporter_frames SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} reporter_cursor SEC(".maps");

SEC("xdp")
int softdta_reporter(struct xdp_md *ctx)
{
	__u32 zero = 0, *cursor = bpf_map_lookup_elem(&reporter_cursor, &zero), index;
	struct report_frame *frame;
	__u64 len, have;

	if (!cursor)
		return XDP_ABORTED;
	index = *cursor;
	*cursor += 1;
	frame = bpf_map_lookup_elem(&reporter_frames, &index);
	if (!frame || frame->len < 14 || frame->len > REPORT_FRAME_MAX)
		return XDP_DROP;
	len = frame->len;
	have = ctx->data_end - ctx->data;
	if (len != have && bpf_xdp_adjust_tail(ctx, (int)len - (int)have))
		return XDP_DROP;
	if (bpf_xdp_store_bytes(ctx, 0, frame->bytes, ((len - 1) & (REPORT_FRAME_MAX - 1)) + 1))
		return XDP_DROP;
	return XDP_TX;
}

char LICENSE[] SEC("license") = "GPL";
