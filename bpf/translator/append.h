/* translator.bpf.c: Append. */
#ifndef SOFTDTA_TRANSLATOR_APPEND_H
#define SOFTDTA_TRANSLATOR_APPEND_H

/* A WRITE of the batch already copied into the frame's payload, at ring position `head` of the list. */
static __noinline __u32 append_write(struct scratch *s, const struct append_list_value *al, __u32 list_id,
				     __u32 head, struct qp_ref *ref)
{
	const struct translator_config_value *cfg = config_get();
	__u32 immediate = s->data_path && s->report.immediate;
	__u64 offset = ((__u64)al->first_slot + head) * al->entry_size;

	if (!cfg || !ref->q || !ref->qs)
		return CNT_DROP_UNKNOWN_LIST;
	s->frame.payload_len = al->batch * al->entry_size;
	s->frame.immediate = list_id;
	single_frame(s, write_frame(s, 0, ref, cfg, offset, immediate), ref->q->ifindex);
	return s->out_count ? 0 : CNT_DROP_OUT_OF_REGION;
}

static __always_inline void flush_later(struct scratch *s, __u32 kind, __u32 index, __u32 owner, __u64 now)
{
	struct flush_entry entry = { .first_ns = now, .kind = kind, .index = index, .owner = owner,
				     .rx_queue = s->rx_queue };

	bpf_map_push_elem(&flush_queue, &entry, BPF_EXIST);
}

/* Under the list's lock: the batch into the frame's payload, word by word (a short lock; bytes past the batch
 * land where the frame's padding and iCRC are written later), the ring head moved on, and `*filled` set to the
 * bytes of real entries (the flusher zeroes the rest, after the lock). Returns the batch's ring position. */
static __always_inline __u32 take_batch(struct scratch *s, struct append_state_value *as,
					const struct append_list_value *al, __u32 payload_at, __u32 *filled)
{
	__u32 size = al->batch * al->entry_size, head = as->head;

	*filled = as->pending * al->entry_size;
	for (__u32 i = 0; i < MAX_WRITE_PAYLOAD / 8 && 8 * i < size; i++)
		*(__u64 *)(s->out + ((payload_at + 8 * i) & OUT_MASK)) =
			*(__u64 *)(as->data + ((8 * i) & (MAX_WRITE_PAYLOAD - 8)));
	as->pending = 0;
	as->head = (head + al->batch) % al->slot_count;
	return head;
}

static __always_inline __u32 on_append_body(struct xdp_md *ctx, struct scratch *s, const struct translator_config_value *cfg)
{
	struct report *r = &s->report;
	const struct append_list_value *al = append_list_find(s, r->list_id);
	struct append_state_value *as;
	struct qp_ref ref;
	__u32 blocked, pos, index, head = 0, started, full, filled;
	__u64 now, first;

	if (!al)
		return CNT_DROP_UNKNOWN_LIST;
	if (r->data_len != al->entry_size)
		return CNT_DROP_BAD_LENGTH;
	index = al->state_index;
	as = bpf_map_lookup_elem(&append_state, &index);
	if (!as || !al->slot_count)
		return CNT_DROP_UNKNOWN_LIST;
	blocked = sender_lookup(s, al->qp_index, al->queues, &ref, CNT_DROP_UNKNOWN_LIST) ?: qp_blocked(ctx, s, &ref);
	if (blocked)
		return blocked;
	if (al->batch * al->entry_size > MAX_WRITE_PAYLOAD || al->batch > MAX_APPEND_BATCH)
		return CNT_DROP_BAD_LENGTH;
	/* The clock is read only for a batch that starts; the lock keeps the flusher (another CPU) out. A batch the
	 * flusher emptied between the peek and the lock starts with time 1: flushed early, never lost. */
	now = as->pending ? 1 : clock_ns(s);
	bpf_spin_lock(&as->lock);
	started = !as->pending;
	if (started)
		as->first_pending_ns = now;
	first = as->first_pending_ns;
	pos = (as->pending & (MAX_APPEND_BATCH - 1)) * al->entry_size;
	/* 4- and 8-byte entries are integers, stored little-endian (host order) for the collector. */
	for (__u32 i = 0; i < MAX_DATA_LEN && i < r->data_len; i++) {
		__u32 from = (r->data_len == 4 || r->data_len == 8) ? r->data_len - 1 - i : i;

		as->data[(pos + i) & (MAX_WRITE_PAYLOAD - 1)] = r->data[from & (MAX_DATA_LEN - 1)];
	}
	as->pending += 1;
	full = as->pending >= al->batch;
	if (full)
		head = take_batch(s, as, al, write_payload_at(r->immediate), &filled);
	bpf_spin_unlock(&as->lock);
	if (started)
		flush_later(s, FLUSH_TARGET_APPEND_LIST, index, r->list_id, first);
	if (!full) {
		count(CNT_APPEND_BATCHED);
		return 0;
	}
	blocked = append_write(s, al, r->list_id, head, &ref);
	if (!blocked)
		count(CNT_TX_FRAMES);
	return blocked;
}

PRIMITIVE_HANDLER(on_append, CNT_DROP_UNKNOWN_LIST)

#endif /* SOFTDTA_TRANSLATOR_APPEND_H */
