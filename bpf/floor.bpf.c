// SPDX-License-Identifier: GPL-2.0
/* The benchmarks' floor, not the product: what the direct path's generators, veth pairs and CPUs carry when the
 * translator's place holds a forwarder that only rewrites the MACs, sizes the frame as the translator's WRITE and
 * redirects it, and the responder's place a sink that only counts and drops (softdta.lab.direct, `bare`). */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_helpers.h>

#include "softdta_spec.h"
#include "maps.h"

TABLE(floor_config, BPF_MAP_TYPE_ARRAY, __u32, struct floor_config_value, FLOOR_CONFIG_MAX_ENTRIES);
TABLE(floor_counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, __u64, FLOOR_COUNTER_SLOTS);

static __always_inline void add(__u32 counter, __u64 n)
{
	__u64 *value = bpf_map_lookup_elem(&floor_counters, &counter);

	if (value)
		*value += n;
}

SEC("xdp")
int softdta_floor_forward(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct floor_config_value *config = bpf_map_lookup_elem(&floor_config, &zero);
	void *data, *data_end;
	struct ethhdr *eth;
	int grow;

	if (!config)
		return XDP_DROP;
	grow = (int)config->frame_len - (int)(ctx->data_end - ctx->data);
	if (grow && bpf_xdp_adjust_tail(ctx, grow))
		return XDP_DROP;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return XDP_DROP;
	__builtin_memcpy(eth->h_dest, config->dst_mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, config->src_mac, ETH_ALEN);
	add(FLOOR_CNT_FORWARDED, 1);
	return bpf_redirect(config->ifindex, 0);
}

SEC("xdp")
int softdta_floor_sink(struct xdp_md *ctx)
{
	add(FLOOR_CNT_SUNK, 1);
	add(FLOOR_CNT_SUNK_BYTES, ctx->data_end - ctx->data);
	return XDP_DROP;
}

char LICENSE[] SEC("license") = "GPL";
