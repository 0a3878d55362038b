/* translator.bpf.c: Report decoding: the same checks in the same order as softdta.wire.dta.decode. */
#ifndef SOFTDTA_TRANSLATOR_REPORT_H
#define SOFTDTA_TRANSLATOR_REPORT_H

/* Inline in the one caller: a call would cost more than the checks (docs/translator.md, "Cost per report"). */
static __always_inline __u32 decode_report(struct scratch *s, __u32 len, __u32 profile)
{
	struct report *r = &s->report;
	const __u8 *p = s->raw;
	__u32 off, end, key_at = 0, data_at = 0;

	__builtin_memset(r, 0, __builtin_offsetof(struct report, key));	/* arrays are read only up to their lengths */
	r->redundancy = 1;
	if (len == 0)
		return CNT_DROP_TRUNCATED;
	if (dta_base_ext_get_marker(p) & EXTENDED_MARKER) {
		const __u8 *sub = p + DTA_BASE_EXT_SIZE;

		if (len < DTA_BASE_EXT_SIZE)
			return CNT_DROP_TRUNCATED;
		if (dta_base_ext_get_marker(p) != EXTENDED_FIRST_BYTE)
			return CNT_DROP_BAD_PROFILE;
		r->opcode = dta_base_ext_get_opcode(p);
		r->immediate = dta_base_ext_get_immediate(p);
		r->essential = dta_base_ext_get_essential(p);
		r->retransmit = dta_base_ext_get_retransmit(p);
		r->seqnum = dta_base_ext_get_seqnum(p);
		r->extended = 1;
		off = DTA_BASE_EXT_SIZE;
		switch (r->opcode) {
		case DTA_OP_KEY_WRITE:
			if (len < off + KEY_WRITE_EXT_SIZE)
				return CNT_DROP_TRUNCATED;
			r->redundancy = key_write_ext_get_redundancy(sub);
			r->key_len = key_write_ext_get_key_len(sub);
			r->data_len = key_write_ext_get_data_len(sub);
			key_at = off + KEY_WRITE_EXT_SIZE;
			data_at = key_at + r->key_len;
			end = data_at + r->data_len;
			if (len < data_at || len < end)
				return CNT_DROP_TRUNCATED;
			break;
		case DTA_OP_KEY_INCREMENT:
			if (len < off + KEY_INCREMENT_EXT_SIZE)
				return CNT_DROP_TRUNCATED;
			r->redundancy = key_increment_ext_get_redundancy(sub);
			r->key_len = key_increment_ext_get_key_len(sub);
			r->counter = key_increment_ext_get_counter(sub);
			key_at = off + KEY_INCREMENT_EXT_SIZE;
			end = key_at + r->key_len;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			break;
		case DTA_OP_APPEND:
			if (len < off + APPEND_EXT_SIZE)
				return CNT_DROP_TRUNCATED;
			r->list_id = append_ext_get_list_id(sub);
			r->data_len = append_ext_get_data_len(sub);
			data_at = off + APPEND_EXT_SIZE;
			end = data_at + r->data_len;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			break;
		case DTA_OP_POSTCARDING:
			if (len < off + POSTCARD_EXT_SIZE)
				return CNT_DROP_TRUNCATED;
			r->hop = postcard_ext_get_hop(sub);
			r->path_length = postcard_ext_get_path_length(sub);
			r->key_len = postcard_ext_get_key_len(sub);
			r->data_len = POSTCARD_EXT_DATA_LEN;
			data_at = off + POSTCARD_EXT_DATA_OFF;
			key_at = off + POSTCARD_EXT_SIZE;
			end = key_at + r->key_len;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			break;
		case DTA_OP_SKETCH_MERGE:
			if (len < off + SKETCH_MERGE_EXT_SIZE)
				return CNT_DROP_TRUNCATED;
			r->reporter = sketch_merge_ext_get_reporter(sub);
			r->column = sketch_merge_ext_get_column(sub);
			r->rows = sketch_merge_ext_get_rows(sub);
			data_at = off + SKETCH_MERGE_EXT_SIZE;
			end = data_at + 4 * r->rows;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			break;
		default:
			return CNT_DROP_UNKNOWN_OPCODE;
		}
	} else {
		__u32 base = profile ? DTA_BASE_V1_SHORT_SIZE : DTA_BASE_V1_SEQ_SIZE;

		if (len < base)
			return CNT_DROP_TRUNCATED;
		if (profile) {
			r->opcode = dta_base_v1_short_get_opcode(p);
			r->immediate = dta_base_v1_short_get_immediate(p);
		} else {
			r->opcode = dta_base_v1_seq_get_opcode(p);
			r->seqnum = dta_base_v1_seq_get_seqnum(p);
			r->immediate = dta_base_v1_seq_get_immediate(p);
			r->retransmit = dta_base_v1_seq_get_retransmit(p);
		}
		off = base;
		r->key_len = 4;
		r->data_len = 4;
		switch (r->opcode) {
		case DTA_OP_KEY_WRITE:
			end = off + KEY_WRITE_V1_SIZE;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			r->redundancy = key_write_v1_get_redundancy(p + off);
			key_at = off + KEY_WRITE_V1_KEY_OFF;
			data_at = off + KEY_WRITE_V1_DATA_OFF;
			break;
		case DTA_OP_KEY_INCREMENT:
			end = off + KEY_INCREMENT_V1_SIZE;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			r->redundancy = key_increment_v1_get_redundancy(p + off);
			key_at = off + KEY_INCREMENT_V1_KEY_OFF;
			r->counter = key_increment_v1_get_counter(p + off);
			break;
		case DTA_OP_APPEND:
			end = off + APPEND_V1_SIZE;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			r->list_id = append_v1_get_list_id(p + off);
			data_at = off + APPEND_V1_DATA_OFF;
			break;
		case DTA_OP_POSTCARDING:
			end = off + POSTCARD_V1_SIZE;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			key_at = off + POSTCARD_V1_KEY_OFF;
			r->hop = postcard_v1_get_hop(p + off);
			data_at = off + POSTCARD_V1_DATA_OFF;
			break;
		default:
			return CNT_DROP_UNKNOWN_OPCODE;
		}
	}
	if (end != len)
		return CNT_DROP_BAD_LENGTH;
	switch (r->opcode) {
	case DTA_OP_KEY_WRITE:
	case DTA_OP_KEY_INCREMENT:
		if (r->redundancy < 1 || r->redundancy > MAX_REDUNDANCY)
			return CNT_DROP_BAD_REDUNDANCY;
	}
	if (r->opcode != DTA_OP_APPEND && r->opcode != DTA_OP_SKETCH_MERGE &&
	    (r->key_len < 1 || r->key_len > MAX_KEY_LEN))
		return CNT_DROP_BAD_LENGTH;
	if ((r->opcode == DTA_OP_KEY_WRITE || r->opcode == DTA_OP_APPEND) &&
	    (r->data_len < 1 || r->data_len > MAX_DATA_LEN))
		return CNT_DROP_BAD_LENGTH;
	if (r->opcode == DTA_OP_POSTCARDING &&
	    (r->hop < 1 || r->hop > MAX_POSTCARD_HOPS || r->path_length > MAX_POSTCARD_HOPS ||
	     (r->path_length && r->hop > r->path_length)))
		return CNT_DROP_BAD_HOP;
	if (r->opcode == DTA_OP_SKETCH_MERGE && (r->rows < 1 || r->rows > MAX_SKETCH_ROWS))
		return CNT_DROP_BAD_LENGTH;

	/* A word at a time: the last word may take up to 7 bytes past the field, which nothing reads (raw has
	 * room for them, and the arrays are sized in words). */
	if (r->opcode != DTA_OP_APPEND && r->opcode != DTA_OP_SKETCH_MERGE)
		for (__u32 i = 0; i < MAX_KEY_LEN && i < r->key_len; i += 8)
			*(__u64 *)(r->key + i) = *(const __u64 *)(p + ((key_at + i) & RAW_MASK));
	if (r->opcode == DTA_OP_SKETCH_MERGE)
		for (__u32 i = 0; i < MAX_SKETCH_ROWS && i < r->rows; i++)
			r->counters[i] = get32(p + ((data_at + 4 * i) & RAW_MASK));
	else if (r->opcode != DTA_OP_KEY_INCREMENT)
		for (__u32 i = 0; i < MAX_DATA_LEN && i < r->data_len; i += 8)
			*(__u64 *)(r->data + i) = *(const __u64 *)(p + ((data_at + i) & RAW_MASK));
	return 0;
}

#endif /* SOFTDTA_TRANSLATOR_REPORT_H */
