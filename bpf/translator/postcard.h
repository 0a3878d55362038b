/* translator.bpf.c: Postcarding. */
#ifndef SOFTDTA_TRANSLATOR_POSTCARD_H
#define SOFTDTA_TRANSLATOR_POSTCARD_H

static __noinline __u32 postcard_write(struct scratch *s, const struct postcard_copy *entry,
				       const struct structure_value *st, __u32 immediate, struct qp_ref *ref)
{
	const struct translator_config_value *cfg = config_get();
	__u32 pos = write_payload_at(immediate), hops = st->hops & (MAX_POSTCARD_HOPS * 2 - 1);
	__u64 offset = (__u64)(key_crc(entry->key, entry->key_len, crc32_slice8[0]) & (st->slot_count - 1)) *
		       st->slot_size;
	__u32 checksum = 0xffffffff;

	if (!cfg || !ref->q || !ref->qs || hops > MAX_POSTCARD_HOPS)
		return CNT_DROP_UNKNOWN_COLLECTOR;
	for (__u32 i = 0; i < MAX_KEY_LEN && i < entry->key_len; i++)
		checksum = crc32_byte(crc32_slice8[0], checksum,
				      entry->key[(entry->key_len - 1 - i) & (MAX_KEY_LEN - 1)]);
	for (__u32 i = 0; i < 4 * MAX_POSTCARD_HOPS && i < 4 * hops; i++)
		s->out[(pos + i) & OUT_MASK] = entry->values[i];
	s->frame.payload_len = 4 * hops;
	s->frame.immediate = checksum ^ 0xffffffff;
	single_frame(s, write_frame(s, 0, ref, cfg, offset, immediate), ref->q->ifindex);
	return s->out_count ? 0 : CNT_DROP_OUT_OF_REGION;
}

static __always_inline int same_key(const struct postcard_cache_value *entry, const struct report *r)
{
	if (entry->key_len != r->key_len)
		return 0;
	for (__u32 i = 0; i < MAX_KEY_LEN && i < r->key_len; i++)
		if (entry->key[i] != r->key[i])
			return 0;
	return 1;
}

/* Under the entry's lock: its path into s->postcard, for writing once the lock is released. */
static __always_inline void take_path(struct scratch *s, const struct postcard_cache_value *entry)
{
	__builtin_memcpy(s->postcard.key, entry->key, MAX_KEY_LEN);
	__builtin_memcpy(s->postcard.values, entry->values, 4 * MAX_POSTCARD_HOPS);
	s->postcard.key_len = entry->key_len;
}

static __always_inline __u32 on_postcard_body(struct xdp_md *ctx, struct scratch *s, const struct translator_config_value *cfg)
{
	struct report *r = &s->report;
	const struct structure_value *st = structure_find(s, s->collector_ip, DTA_OP_POSTCARDING);
	struct postcard_cache_value *entry;
	struct qp_ref ref;
	__u32 blocked, path_length, slot, encoded, hop = (r->hop - 1) & (MAX_POSTCARD_HOPS - 1);
	__u32 evicted = 0, single = 0, started = 0, complete = 0;
	__u64 now, first = 0;

	if (!st)
		return CNT_DROP_UNKNOWN_COLLECTOR;
	if (r->key_len != st->key_len)
		return CNT_DROP_BAD_LENGTH;
	path_length = r->path_length ? r->path_length : st->hops;
	if (r->hop > path_length || path_length > st->hops)
		return CNT_DROP_BAD_HOP;
	blocked = sender_lookup(s, st->qp_index, st->queues, &ref, CNT_DROP_UNKNOWN_COLLECTOR) ?:
		  qp_blocked(ctx, s, &ref);
	if (blocked)
		return blocked;
	slot = st->state_index + (key_crc(r->key, r->key_len, crc32_slice8[0]) & (st->cache_entries - 1));
	entry = bpf_map_lookup_elem(&postcard_cache, &slot);
	if (!entry)
		return CNT_DROP_UNKNOWN_COLLECTOR;
	encoded = get32(r->data) ^ key_crc(r->key, r->key_len, crc32_postcard_hop[hop]);
	/* As for Append: the clock only for a path that probably starts, the lock against the flusher. */
	now = entry->valid && same_key(entry, r) ? 1 : clock_ns(s);
	bpf_spin_lock(&entry->lock);
	if (entry->valid && !same_key(entry, r)) {
		if (path_length == 1) {
			single = 1;
		} else {
			take_path(s, entry);
			entry->valid = 0;
			evicted = 1;
		}
	}
	if (!single) {
		if (!entry->valid) {
			__builtin_memset(entry->values, 0, sizeof(entry->values));
			__builtin_memcpy(entry->key, r->key, MAX_KEY_LEN);
			entry->key_len = r->key_len;
			entry->path_length = path_length;
			entry->hop_mask = 0;
			entry->first_ns = now;
			entry->valid = 1;
			started = 1;
			first = now;
		}
		put32(entry->values + 4 * hop, encoded);
		entry->hop_mask |= 1 << hop;
		if (!evicted && __builtin_popcount(entry->hop_mask) >= entry->path_length) {
			take_path(s, entry);
			entry->valid = 0;
			complete = 1;
		}
	}
	bpf_spin_unlock(&entry->lock);
	if (single) {
		/* A one-hop path is complete on arrival: write it without evicting another flow's path. */
		__builtin_memset(&s->postcard, 0, sizeof(s->postcard));
		__builtin_memcpy(s->postcard.key, r->key, MAX_KEY_LEN);
		s->postcard.key_len = r->key_len;
		put32(s->postcard.values + 4 * hop, encoded);
		blocked = postcard_write(s, &s->postcard, st, r->immediate, &ref);
		if (!blocked)
			count(CNT_TX_FRAMES);
		return blocked;
	}
	if (started)
		flush_later(s, FLUSH_TARGET_POSTCARD_ENTRY, slot, s->collector_ip, first);
	if (evicted) {
		count(CNT_POSTCARD_EVICTIONS);
		blocked = postcard_write(s, &s->postcard, st, 0, &ref);
	} else if (complete) {
		blocked = postcard_write(s, &s->postcard, st, r->immediate, &ref);
	} else {
		count(CNT_POSTCARD_CACHED);
	}
	if (!blocked && s->out_count)
		count(CNT_TX_FRAMES);
	return blocked;
}

PRIMITIVE_HANDLER(on_postcard, CNT_DROP_UNKNOWN_COLLECTOR)

#endif /* SOFTDTA_TRANSLATOR_POSTCARD_H */
