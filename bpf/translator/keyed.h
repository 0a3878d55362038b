/* translator.bpf.c: Key-Write and Key-Increment. */
#ifndef SOFTDTA_TRANSLATOR_KEYED_H
#define SOFTDTA_TRANSLATOR_KEYED_H

static __always_inline __u32 on_keyed_body(struct xdp_md *ctx, struct scratch *s, const struct translator_config_value *cfg)
{
	struct report *r = &s->report;
	const struct structure_value *st = structure_find(s, s->dst_ip, r->opcode);
	struct frame_params *fp = &s->frame;
	struct qp_ref ref;
	__u32 blocked, checksum, frame_len = 0;

	if (!st)
		return CNT_DROP_UNKNOWN_COLLECTOR;
	if (r->key_len != st->key_len || (r->opcode == DTA_OP_KEY_WRITE && r->data_len != st->data_len))
		return CNT_DROP_BAD_LENGTH;
	if (r->redundancy > st->redundancy)
		return CNT_DROP_BAD_REDUNDANCY;
	blocked = sender_lookup(s, st->qp_index, st->queues, &ref, CNT_DROP_UNKNOWN_COLLECTOR) ?:
		  qp_blocked(ctx, s, &ref);
	if (blocked)
		return blocked;
	checksum = key_checksum(r);
	for (__u32 copy = 0; copy < MAX_REDUNDANCY && copy < r->redundancy; copy++) {
		__u32 slot = key_slot_hash(r, copy, st->key_hash, checksum) & (st->slot_count - 1);
		__u64 offset = (__u64)slot * st->slot_size;
		__u32 at = copy * (frame_len & 255), len;

		if (r->opcode == DTA_OP_KEY_WRITE) {
			__u32 pos = at + write_payload_at(r->immediate);

			/* A Key-Write slot: the key checksum (little-endian), then the data, a word at a time: up to 7
			 * bytes past it land where the frame's padding and iCRC are written next. */
			*(__u32 *)(s->out + (pos & OUT_MASK)) = checksum;
			for (__u32 i = 0; i < MAX_DATA_LEN && i < r->data_len; i += 8)
				*(__u64 *)(s->out + ((pos + KEY_CHECKSUM_LEN + i) & OUT_MASK)) = *(__u64 *)(r->data + i);
			fp->payload_len = KEY_CHECKSUM_LEN + r->data_len;
			fp->immediate = checksum;
			len = write_frame(s, at, &ref, cfg, offset, r->immediate);
		} else {
			if (offset + 8 > ref.q->length)
				return CNT_DROP_OUT_OF_REGION;
			fp->opcode = ROCE_OP_RC_FETCH_ADD;
			fp->va = ref.q->base_va + offset;
			fp->rkey = ref.q->rkey;
			fp->swap_add = r->counter;
			fp->payload_len = 0;
			len = build_roce(s, at, &ref, cfg);
		}
		if (!len)
			return CNT_DROP_OUT_OF_REGION;
		frame_len = len;
	}
	s->out_count = r->redundancy;
	/* The structure decides, not the report: every frame of its QPs takes one path (see emit). */
	s->out_via_tc = st->redundancy > 1;
	s->out_frame_len = frame_len;
	s->out_ifindex = ref.q->ifindex;
	count_n(CNT_TX_FRAMES, r->redundancy);
	return 0;
}

PRIMITIVE_HANDLER(on_keyed, CNT_DROP_UNKNOWN_COLLECTOR)

#endif /* SOFTDTA_TRANSLATOR_KEYED_H */
