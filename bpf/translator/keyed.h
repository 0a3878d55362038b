/* translator.bpf.c: Key-Write and Key-Increment. */
#ifndef SOFTDTA_TRANSLATOR_KEYED_H
#define SOFTDTA_TRANSLATOR_KEYED_H

/* The structure and QP that copy `copy` goes to: the report's own, or with copies across the fleet's replicas,
 * replica copy % R's (Translator.copy_structures). 0, or the drop that skips this copy. */
static __always_inline __u32 copy_target(struct scratch *s, __u32 copy, const struct structure_value **st,
					 struct qp_ref *ref)
{
	struct structure_key key = { .primitive = s->report.opcode };
	const struct structure_value *found;
	__u32 missing;

	if (!s->across)
		return 0;
	key.collector_ip = s->copy_ip[copy & (MAX_REDUNDANCY - 1)];
	if (key.collector_ip == s->collector_ip)
		return 0;
	found = bpf_map_lookup_elem(&structure, &key);
	if (!found)
		return CNT_DROP_UNKNOWN_COLLECTOR;
	missing = sender_lookup(s, found->qp_index, found->queues, ref, CNT_DROP_UNKNOWN_COLLECTOR);
	if (missing)
		return missing;
	if (!qp_ready(ref->qs, s))
		return ref->qs->state == QP_STATE_FAILED ? CNT_DROP_QP_FAILED : CNT_DROP_GRACE;
	*st = found;
	return 0;
}

static __always_inline __u32 on_keyed_body(struct xdp_md *ctx, struct scratch *s, const struct translator_config_value *cfg)
{
	struct report *r = &s->report;
	const struct structure_value *st = structure_find(s, s->collector_ip, r->opcode);
	struct frame_params *fp = &s->frame;
	struct qp_ref ref;
	__u32 blocked, checksum, frame_len = 0, sent = 0;

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
		const struct structure_value *to = st;
		struct qp_ref via = ref;
		__u32 skip = copy_target(s, copy, &to, &via);
		__u32 slot, at = sent * (frame_len & 255), len;
		__u64 offset;

		if (skip) {
			count(skip);
			continue;
		}
		slot = key_slot_hash(r, copy, to->key_hash, checksum) & (to->slot_count - 1);
		offset = (__u64)slot * to->slot_size;
		if (r->opcode == DTA_OP_KEY_WRITE) {
			__u32 pos = at + write_payload_at(r->immediate);

			/* A Key-Write slot: the key checksum (little-endian), then the data, a word at a time: up to 7
			 * bytes past it land where the frame's padding and iCRC are written next. */
			*(__u32 *)(s->out + (pos & OUT_MASK)) = checksum;
			for (__u32 i = 0; i < MAX_DATA_LEN && i < r->data_len; i += 8)
				*(__u64 *)(s->out + ((pos + KEY_CHECKSUM_LEN + i) & OUT_MASK)) = *(__u64 *)(r->data + i);
			fp->payload_len = KEY_CHECKSUM_LEN + r->data_len;
			fp->immediate = checksum;
			len = write_frame(s, at, &via, cfg, offset, r->immediate);
		} else {
			if (offset + 8 > via.q->length)
				return CNT_DROP_OUT_OF_REGION;
			fp->opcode = ROCE_OP_RC_FETCH_ADD;
			fp->va = via.q->base_va + offset;
			fp->rkey = via.q->rkey;
			fp->swap_add = r->counter;
			fp->payload_len = 0;
			len = build_roce(s, at, &via, cfg);
		}
		if (!len)
			return CNT_DROP_OUT_OF_REGION;
		frame_len = len;
		sent++;
	}
	s->out_count = sent;
	/* The structure decides, not the report: every frame of its QPs takes one path (see emit). With copies
	 * across replicas, the engine admits only fleets whose structures of the primitive all decide alike. */
	s->out_redundant = st->redundancy > 1;
	s->out_frame_len = frame_len;
	s->out_ifindex = ref.q->ifindex;
	count_n(CNT_TX_FRAMES, sent);
	return 0;
}

PRIMITIVE_HANDLER(on_keyed, CNT_DROP_UNKNOWN_COLLECTOR)

#endif /* SOFTDTA_TRANSLATOR_KEYED_H */
