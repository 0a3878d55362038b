/* translator.bpf.c: Output. */
#ifndef SOFTDTA_TRANSLATOR_OUTPUT_H
#define SOFTDTA_TRANSLATOR_OUTPUT_H

/* Frame 0 into the packet, a word at a time (cheaper here than bpf_xdp_store_bytes): its fixed part from the
 * frame cache where build_roce left it there, the rest from s->out. */
static __always_inline int copy_to_packet(struct xdp_md *ctx, struct scratch *s, __u32 len)
{
	__u8 *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	__u32 i = 0;

	if (s->out_fixed_cache) {
		__u32 index = s->out_fixed_cache - 1;
		const struct frame_cache *c = bpf_map_lookup_elem(&frame_cache, &index);

		if (!c || data + FRAME_FIXED_WORDS * 8 > end || len < FRAME_FIXED_WORDS * 8)
			return -1;
		for (int k = 0; k < FRAME_FIXED_WORDS; k++)
			*(__u64 *)(data + 8 * k) = *(__u64 *)(c->headers + 8 * k);
		i = FRAME_FIXED_LEN;
	}
	for (; i < OUT_LIMIT && i + 8 <= len; i += 8) {
		if (data + i + 8 > end)
			return -1;
		*(__u64 *)(data + i) = *(__u64 *)(s->out + (i & OUT_MASK));
	}
	for (int k = 0; k < 8 && i < len; k++, i++) {
		if (data + i + 1 > end)
			return -1;
		data[i] = s->out[i & OUT_MASK];
	}
	return 0;
}

/* The report payload into s->raw, a word at a time (at most RAW_MAX bytes). */
static __always_inline int copy_payload(struct xdp_md *ctx, struct scratch *s, __u32 off, __u32 len)
{
	__u8 *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end, *p;
	__u32 i;

	if (off > 128)
		return -1;
	p = data + off;
	for (i = 0; i + 8 <= RAW_MAX && i + 8 <= len; i += 8) {
		if (p + i + 8 > end)
			return -1;
		*(__u64 *)(s->raw + i) = *(__u64 *)(p + i);
	}
	for (int k = 0; k < 8 && i < RAW_MAX && i < len; k++, i++) {
		if (p + i + 1 > end)
			return -1;
		s->raw[i] = p[i];
	}
	return 0;
}

/* Parks frames 2..N of a report for softdta_copy or the tc stage; the packet carries frame 1 and the meta. */
static __noinline int park_frames(struct scratch *s, struct fanout_meta *meta)
{
	__u32 slot, len = s->out_frame_len;
	struct fanout_value *entry;

	meta->cpu = bpf_get_smp_processor_id();
	meta->sequence = s->fanout_sequence++;
	slot = meta->cpu * FANOUT_MAX_ENTRIES + meta->sequence % FANOUT_MAX_ENTRIES;
	entry = bpf_map_lookup_elem(&fanout, &slot);
	if (!entry || len > FANOUT_FRAME_MAX || s->out_count > MAX_REDUNDANCY)
		return -1;
	entry->sequence = meta->sequence;
	entry->count = s->out_count;
	entry->frame_len = len;
	entry->ifindex = s->out_ifindex;
	for (__u32 i = 0; i + 8 <= (MAX_REDUNDANCY - 1) * FANOUT_FRAME_MAX && i < (s->out_count - 1) * len; i += 8)
		*(__u64 *)(entry->frames + i) = *(__u64 *)(s->out + ((len + i) & OUT_MASK));
	return 0;
}

/* Replaces the packet with the first frame the handler built. The frames of a QP that takes redundant reports
 * (Key-Write and Key-Increment structures whose redundancy is above 1, which may need several frames) always
 * take one path, N = 1 too: frames of one QP must never take two, or a NAPI poll could put them on the wire out
 * of PSN order. The others are parked, and the packet goes to the `copies` devmap of the report's frame count,
 * whose program makes clone i frame i (softdta_copy); without a `copies` entry (generic XDP) it goes up to the
 * tc stage, which sends them all. Any other frame leaves with XDP_TX or a redirect. */
static __always_inline int emit(struct xdp_md *ctx, struct scratch *s)
{
	__u64 len = s->out_frame_len, have = ctx->data_end - ctx->data;
	struct fanout_meta meta = { .magic = FANOUT_META_MAGIC }, *room;
	struct copies_key copies_key;
	void *data, *devmap = 0;

	if (!s->out_count || s->out_executed)
		return XDP_DROP;
	if (len > OUT_LIMIT || len < ETHERNET_SIZE) {
		count(CNT_DROP_BAD_LENGTH);
		return XDP_DROP;
	}
	/* Grow into the tailroom, or else the headroom: drivers (veth with small skbs) may offer only one. The
	 * tailroom first, though the kernel zeroes what it adds there: a frame that leaves with less headroom than
	 * XDP_PACKET_HEADROOM cost 10-20 % of the reports per second live, more than the zeroing saves
	 * (docs/translator.md). */
	if (len != have && bpf_xdp_adjust_tail(ctx, (int)len - (int)have) &&
	    (len < have || bpf_xdp_adjust_head(ctx, (int)have - (int)len))) {
		count(CNT_DROP_NO_ROOM);
		return XDP_DROP;
	}
	if (copy_to_packet(ctx, s, len)) {
		count(CNT_DROP_NO_ROOM);
		return XDP_DROP;
	}
	if (s->out_redundant) {
		meta.count = s->out_count;
		meta.ifindex = s->out_ifindex;
		copies_key.ifindex = s->out_ifindex ? s->out_ifindex : ctx->ingress_ifindex;
		copies_key.count = s->out_count;
		devmap = bpf_map_lookup_elem(&copies, &copies_key);
		/* the meta replaces any a program before this one left */
		if ((s->out_count > 1 && park_frames(s, &meta)) ||
		    bpf_xdp_adjust_meta(ctx, (int)(ctx->data - ctx->data_meta) - (int)sizeof(meta))) {
			count(CNT_DROP_NO_ROOM);
			return XDP_DROP;
		}
		data = (void *)(long)ctx->data;
		room = (void *)(long)ctx->data_meta;
		if ((void *)(room + 1) > data)
			return XDP_DROP;
		*room = meta;
		return devmap ? bpf_redirect_map(devmap, 0, BPF_F_BROADCAST) : XDP_PASS;
	}
	/* metadata a program before this one left could pass for softdta_copy's, which may run on this frame too */
	if (ctx->data_meta < ctx->data && bpf_xdp_adjust_meta(ctx, (int)(ctx->data - ctx->data_meta))) {
		count(CNT_DROP_NO_ROOM);
		return XDP_DROP;
	}
	if (s->out_ifindex && s->out_ifindex != ctx->ingress_ifindex) {
		/* Through `copies` (count 1, no broadcast) where it has the interface: the devmap bulk queue this opens
		 * runs softdta_copy then, on the clones of a broadcast that follow in the same NAPI poll too. */
		copies_key.ifindex = s->out_ifindex;
		copies_key.count = 1;
		devmap = bpf_map_lookup_elem(&copies, &copies_key);
		return devmap ? bpf_redirect_map(devmap, 0, 0) : bpf_redirect(s->out_ifindex, 0);
	}
	return XDP_TX;
}

static __always_inline struct scratch *begin(__u32 data_path, __u32 rx_queue)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &zero);

	if (s) {
		s->now_ns = 0;
		s->data_path = data_path;
		s->rx_queue = rx_queue;
		s->out_count = 0;
		s->out_redundant = 0;
		s->out_ifindex = 0;
		s->out_executed = 0;
		s->out_fixed_cache = 0;
	}
	return s;
}

#endif /* SOFTDTA_TRANSLATOR_OUTPUT_H */
