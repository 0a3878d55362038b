/* translator.bpf.c: Sketch-Merge. */
#ifndef SOFTDTA_TRANSLATOR_SKETCH_H
#define SOFTDTA_TRANSLATOR_SKETCH_H

/* Whether every column of the write group has all its reporters (global: verified once). */
__noinline int sketch_group_complete(__u32 state_index, __u32 first, __u32 batch, __u32 reporters)
{
	struct sketch_column_key key = { .state_index = state_index };

	for (__u32 c = 0; c < MAX_WRITE_PAYLOAD / 4 && c < batch; c++) {
		struct sketch_column_value *column;

		key.column = first + c;
		column = bpf_map_lookup_elem(&sketch_column, &key);
		if (!column || column->contributors < reporters)
			return 0;
	}
	return 1;
}

/* Moves the group's aggregates into the frame payload at s->out[pos] (little-endian) and starts their next
 * epoch. One flat loop over the group's counters keeps verification linear. */
__noinline int sketch_group_take(__u32 state_index, __u32 first, __u32 batch, __u32 rows, __u32 pos)
{
	struct sketch_column_key key = { .state_index = state_index };
	struct scratch *s = scratch_get();

	if (!s || !rows)
		return 0;
	struct sketch_column_value *column = NULL;

	for (__u32 i = 0; i < MAX_WRITE_PAYLOAD / 4 && i < batch * rows; i++) {
		__u32 row = i % rows, *cell;

		if (row == 0) {
			key.column = first + i / rows;
			column = bpf_map_lookup_elem(&sketch_column, &key);
		}
		if (!column)
			return 0;
		cell = (__u32 *)column->counters + (row & (MAX_SKETCH_ROWS - 1));
		for (int b = 0; b < 4; b++)
			s->out[(pos + 4 * i + b) & OUT_MASK] = *cell >> (8 * b);
		*cell = 0;
		if (row + 1 == rows) {
			column->contributors = 0;
			column->epoch += 1;
		}
	}
	return 1;
}

static __always_inline __u32 on_sketch_body(struct xdp_md *ctx, struct scratch *s, const struct translator_config_value *cfg)
{
	struct report *r = &s->report;
	const struct structure_value *st = structure_find(s, s->collector_ip, DTA_OP_SKETCH_MERGE);
	struct sketch_reporter_key rk = {};
	struct sketch_reporter_value *progress, fresh = {};
	struct sketch_column_key ck = {};
	struct sketch_column_value *column, empty = {};
	struct qp_ref ref;
	__u32 blocked, expected, first, batch;

	if (!st)
		return CNT_DROP_UNKNOWN_COLLECTOR;
	if (r->reporter >= st->reporters)
		return CNT_DROP_UNKNOWN_REPORTER;
	if (r->rows != st->rows || r->column >= st->columns)
		return CNT_DROP_BAD_LENGTH;
	rk.state_index = st->state_index;
	rk.reporter = r->reporter;
	progress = bpf_map_lookup_elem(&sketch_reporter, &rk);
	if (!progress) {
		bpf_map_update_elem(&sketch_reporter, &rk, &fresh, BPF_NOEXIST);
		progress = bpf_map_lookup_elem(&sketch_reporter, &rk);
		if (!progress)
			return CNT_DROP_UNKNOWN_REPORTER;
	}
	expected = progress->next_column;
	ck.state_index = st->state_index;
	ck.column = expected;
	column = bpf_map_lookup_elem(&sketch_column, &ck);
	/* A reporter that wrapped into its next epoch waits (NACKed) until the column's last epoch is written:
	 * it has contributed to `expected` `wraps` times, the column was written `epoch` times. */
	if (r->column != expected || (column && progress->wraps > column->epoch) || (!column && progress->wraps)) {
		build_nack(s, cfg, NACK_KIND_SKETCH_COLUMN, expected, r->reporter);
		return r->column > expected ? CNT_DROP_SKETCH_GAP : CNT_DROP_SKETCH_STALE;
	}
	blocked = sender_lookup(s, st->qp_index, st->queues, &ref, CNT_DROP_UNKNOWN_COLLECTOR) ?:
		  qp_blocked(ctx, s, &ref);
	if (blocked)
		return blocked;
	if (!column) {
		bpf_map_update_elem(&sketch_column, &ck, &empty, BPF_NOEXIST);
		column = bpf_map_lookup_elem(&sketch_column, &ck);
		if (!column)
			return CNT_DROP_BAD_LENGTH;
	}
	progress->next_column = expected + 1 == st->columns ? 0 : expected + 1;
	if (expected + 1 == st->columns)
		progress->wraps += 1;
	for (__u32 row = 0; row < MAX_SKETCH_ROWS && row < r->rows; row++) {
		__u32 *cell = (__u32 *)column->counters + row;
		__u32 value = r->counters[row];

		*cell = st->merge == SKETCH_MERGE_MAX ? (*cell > value ? *cell : value) : *cell + value;
	}
	column->contributors += 1;
	count(CNT_SKETCH_MERGED);

	batch = st->batch;
	first = r->column - r->column % batch;
	if (batch * r->rows * 4 > MAX_WRITE_PAYLOAD)
		return CNT_DROP_BAD_LENGTH;
	/* The report's own column decides most reports without looking at the rest of its group. */
	if (column->contributors < st->reporters ||
	    !sketch_group_complete(st->state_index, first, batch, st->reporters))
		return 0;
	sketch_group_take(st->state_index, first, batch, r->rows, write_payload_at(r->immediate));
	s->frame.payload_len = batch * r->rows * 4;
	s->frame.immediate = first;
	single_frame(s, write_frame(s, 0, &ref, cfg, (__u64)first * st->slot_size, r->immediate),
		     ref.q->ifindex);
	if (!s->out_count)
		return CNT_DROP_OUT_OF_REGION;
	count(CNT_TX_FRAMES);
	return 0;
}

PRIMITIVE_HANDLER(on_sketch, CNT_DROP_UNKNOWN_COLLECTOR)

#endif /* SOFTDTA_TRANSLATOR_SKETCH_H */
