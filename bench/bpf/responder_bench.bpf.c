// SPDX-License-Identifier: GPL-2.0
/* Benchmark harness around the XDP responder: BPF_PROG_TEST_RUN repeats a program on one packet buffer, which a
 * reply overwrites, so each run restores the request from `bench_request` and sets its QP to expect the request's
 * PSN. bench_restore alone measures that, and the benchmarks subtract it. */
#include "responder.bpf.c"

#define BENCH_FRAME 256

struct bench_request {
	__u32 len;
	__u32 qpn;
	__u32 psn;
	__u32 pad;
	__u8 frame[BENCH_FRAME];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct bench_request);
	__uint(max_entries, 1);
} bench_request SEC(".maps");

static __always_inline int restore(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct bench_request *request = bpf_map_lookup_elem(&bench_request, &zero);
	struct responder_config_value *cfg = bpf_map_lookup_elem(&responder_config, &zero);
	struct responder_qp_state_value *qs;
	struct responder_qp_state_key key;
	__u64 len, have;

	if (!request || !cfg || request->len < 1 || request->len > BENCH_FRAME)
		return -1;
	key.slot = responder_qp_slot(cfg, request->qpn);
	qs = bpf_map_lookup_elem(&responder_qp_state, &key);
	if (!qs)
		return -1;
	qs->expected_psn = request->psn;
	len = request->len;
	have = ctx->data_end - ctx->data;
	if (len != have && bpf_xdp_adjust_tail(ctx, (int)len - (int)have))
		return -1;
	return bpf_xdp_store_bytes(ctx, 0, request->frame, ((len - 1) & (BENCH_FRAME - 1)) + 1);
}

SEC("xdp")
int bench_restore(struct xdp_md *ctx)
{
	return restore(ctx) ? XDP_ABORTED : XDP_DROP;
}

SEC("xdp")
int bench_respond(struct xdp_md *ctx)
{
	return restore(ctx) ? XDP_ABORTED : respond(ctx);
}
