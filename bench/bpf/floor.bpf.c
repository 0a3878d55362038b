// SPDX-License-Identifier: GPL-2.0
/* What single operations cost on this machine under BPF_PROG_TEST_RUN, to put the translator's figures in
 * context: an empty program, a clock read, a hash lookup, a per-CPU counter, and the packet helpers. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} floor_counter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, __u8[44]);
	__uint(max_entries, 1024);
} floor_hash SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u8[128]);
	__uint(max_entries, 1);
} floor_buffer SEC(".maps");

SEC("xdp") int floor_empty(struct xdp_md *ctx) { return XDP_DROP; }

SEC("xdp") int floor_clock(struct xdp_md *ctx) { return bpf_ktime_get_ns() ? XDP_DROP : XDP_PASS; }

SEC("xdp") int floor_counter_add(struct xdp_md *ctx)
{
	__u32 zero = 0;
	__u64 *value = bpf_map_lookup_elem(&floor_counter, &zero);

	if (value)
		*value += 1;
	return XDP_DROP;
}

SEC("xdp") int floor_hash_lookup(struct xdp_md *ctx)
{
	__u64 key = 7;

	return bpf_map_lookup_elem(&floor_hash, &key) ? XDP_DROP : XDP_PASS;
}

SEC("xdp") int floor_store_80(struct xdp_md *ctx)
{
	__u32 zero = 0;
	__u8 *buffer = bpf_map_lookup_elem(&floor_buffer, &zero);

	return buffer && !bpf_xdp_store_bytes(ctx, 0, buffer, 80) ? XDP_DROP : XDP_PASS;
}

SEC("xdp") int floor_grow_and_shrink(struct xdp_md *ctx)
{
	return !bpf_xdp_adjust_tail(ctx, 22) && !bpf_xdp_adjust_tail(ctx, -22) ? XDP_DROP : XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
