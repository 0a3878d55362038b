// SPDX-License-Identifier: GPL-2.0
/* Benchmark harness around the translator: BPF_PROG_TEST_RUN repeats a program on one packet buffer without
 * resetting it, so each run first restores the next report from `bench_reports`. bench_restore alone measures
 * that restore, which the benchmarks subtract. */
#include "translator.bpf.c"

#define BENCH_REPORTS 16
#define BENCH_FRAME 256

struct bench_reports {
	__u32 count;
	__u32 len[BENCH_REPORTS];
	__u8 frame[BENCH_REPORTS][BENCH_FRAME];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct bench_reports);
	__uint(max_entries, 1);
} bench_reports SEC(".maps");

/* One per RX queue, not per CPU: a test run the scheduler moves to another CPU must go on with the next report,
 * or the stateful primitives see reports out of order. A cache line each, so that runs on several queues at once
 * (the scaling benchmark) do not share one. */
struct bench_cursor {
	__u32 next;
	__u8 pad[60];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct bench_cursor);
	__uint(max_entries, MAX_RX_QUEUES);
} bench_cursor SEC(".maps");

static __always_inline int restore(struct xdp_md *ctx)
{
	__u32 zero = 0, queue = ctx->rx_queue_index, next;
	struct bench_cursor *cursor = bpf_map_lookup_elem(&bench_cursor, &queue);
	struct bench_reports *reports = bpf_map_lookup_elem(&bench_reports, &zero);
	__u64 len, have;

	if (!cursor || !reports || !reports->count)
		return -1;
	next = cursor->next % reports->count % BENCH_REPORTS;
	cursor->next += 1;
	len = reports->len[next];
	if (len < 1 || len > BENCH_FRAME)
		return -1;
	if (ctx->data_meta < ctx->data && bpf_xdp_adjust_meta(ctx, ctx->data - ctx->data_meta))
		return -1;
	have = ctx->data_end - ctx->data;
	if (len != have && bpf_xdp_adjust_tail(ctx, (int)len - (int)have))
		return -1;
	return bpf_xdp_store_bytes(ctx, 0, reports->frame[next], NONZERO(len, BENCH_FRAME));
}

SEC("xdp")
int bench_restore(struct xdp_md *ctx)
{
	return restore(ctx) ? XDP_ABORTED : XDP_DROP;
}

SEC("xdp")
int bench_translate(struct xdp_md *ctx)
{
	return restore(ctx) ? XDP_ABORTED : translate(ctx);
}
