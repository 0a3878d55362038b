// SPDX-License-Identifier: GPL-2.0
/* softdta's kernel-speed report generator (`softdta report --engine kernel`), the xdp-trafficgen idea: userspace
 * runs it with BPF_PROG_TEST_RUN in live-frames mode on the reporter's interface, and every run sends one report
 * with XDP_TX. Report i is the template of map `report_generator` with its key, data and seqnum set from i,
 * and, in a fleet, its destination and IPv4 checksum from map `report_destinations` (softdta.core.generator says
 * where they are and predicts every report).
 *
 * The whole template is written again on every run: live-frames mode recycles its pages without resetting
 * their bytes, and a translator down the line may have rewritten a page into a RoCEv2 frame in place. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "softdta_spec.h"
#include "maps.h"

TABLE(report_generator, BPF_MAP_TYPE_ARRAY, __u32, struct report_generator_value, 1);

/* entry k: where the reports of key k (key_base + k) go; userspace sizes it to key_span before loading */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct report_destination);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
} report_destinations SEC(".maps");

/* value, big-endian, at byte `offset` of the frame; offset 0 means the template has no such field */
static __always_inline void put_field(struct xdp_md *ctx, __u32 offset, __u32 width, __u32 value)
{
	__u8 *data = (void *)(long)ctx->data, *at;
	void *end = (void *)(long)ctx->data_end;

	if (!offset || offset > GENERATOR_FRAME_MAX - width)
		return;
	at = data + offset;
	if ((void *)(at + width) > end)
		return;
	if (width == 4)
		put32(at, value);
	else if (width == 2)
		put16(at, value);
	else
		put8(at, value);
}

SEC("xdp")
int softdta_report(struct xdp_md *ctx)
{
	struct report_generator_value *generator;
	struct report_destination *destination;
	__u32 zero = 0, len, key_index;
	__u64 index;

	generator = bpf_map_lookup_elem(&report_generator, &zero);
	if (!generator || ctx->ingress_ifindex != generator->ifindex)
		return XDP_PASS;	/* not a test run: a frame on the loopback it is linked to */
	len = generator->frame_len;
	if (len < ETHERNET_SIZE || len > GENERATOR_FRAME_MAX || len != ctx->data_end - ctx->data)
		return XDP_DROP;
	if (bpf_xdp_store_bytes(ctx, 0, generator->frame, len))
		return XDP_DROP;
	/* atomic: userspace may run the generator on several CPUs at once */
	index = __sync_fetch_and_add(&generator->next_index, 1);
	key_index = generator->key_span ? index % generator->key_span : 0;
	put_field(ctx, generator->key_offset, 4, generator->key_base + key_index);
	if (generator->destination_offset) {
		destination = bpf_map_lookup_elem(&report_destinations, &key_index);
		if (!destination)
			return XDP_DROP;
		put_field(ctx, generator->destination_offset, 4, destination->ip);
		put_field(ctx, generator->checksum_offset, 2, destination->checksum);
	}
	put_field(ctx, generator->data_offset, 4, generator->data_base + index);
	put_field(ctx, generator->seq_offset, 1, generator->seq_base + index);
	return XDP_TX;
}

char LICENSE[] SEC("license") = "GPL";
