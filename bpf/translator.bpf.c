// SPDX-License-Identifier: GPL-2.0
/* softdta translator fast path: DTA reports in, RoCEv2 frames out, byte for byte like softdta.core.translator.
 *
 * softdta_xdp    translates reports and consumes collector ACK/NAKs (XDP, one frame out per frame in);
 * softdta_fanout sends the frames of a Key-Write or Key-Increment report: the packet XDP passed up with
 *                metadata, then the ones it parked in the `fanout` map (tc ingress);
 * softdta_flush  writes out one idle Append batch or Postcarding path per run (control plane, live test_run).
 * Maps named after spec.TRANSLATOR_TABLES are the whole contract with the control plane.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "softdta_spec.h"
#include "crc.h"
#include "wire.h"

#define RAW_MAX 160		/* longer than any report payload, so every length check sees all it needs */
#define RAW_MASK 127		/* valid reports end before byte 128 (extended Key-Write: 7 + 32 + 64) */
#define OUT_SIZE 2048		/* frames being built; a power of two for index masks */
#define OUT_MASK (OUT_SIZE - 1)
#define OUT_LIMIT 1024		/* the frames of one report, back to back, end before this */
#define DEFER_FRAME_MAX 256	/* an essential report frame parked for userspace */
#define ROCE_HEADERS (ETHERNET_SIZE + IPV4_SIZE + UDP_SIZE + BTH_SIZE)
#define PSN_MASK 0xffffff
#define SEQ_WINDOW 128
#define DEFERRED 1		/* qp_blocked(): the report went to userspace */
#define PASS_UP 2		/* not a reply: a CM MAD or a collector's SEND, for the control plane */
#define FLUSH_APPEND 1
#define FLUSH_POSTCARD 2
/* n, for 1 <= n <= limit (a power of two), in a form the verifier bounds to 1..limit for helper sizes */
#define NONZERO(n, limit) ((((n) - 1) & ((limit) - 1)) + 1)
_Static_assert((FANOUT_FRAME_MAX & (FANOUT_FRAME_MAX - 1)) == 0, "FANOUT_FRAME_MAX must be a power of two");

struct report {
	__u64 counter;
	__u32 list_id;
	__u16 reporter;
	__u16 column;
	__u8 opcode;
	__u8 seqnum;
	__u8 immediate;
	__u8 essential;
	__u8 retransmit;
	__u8 extended;
	__u8 redundancy;
	__u8 key_len;
	__u8 data_len;
	__u8 hop;
	__u8 path_length;
	__u8 rows;
	__u8 key[MAX_KEY_LEN];
	__u8 data[MAX_DATA_LEN];
	__u32 counters[MAX_SKETCH_ROWS];
};

struct frame_params {
	__u64 va;
	__u64 swap_add;
	__u32 rkey;
	__u32 immediate;
	__u32 payload_len;
	__u8 opcode;
};

struct postcard_copy {
	__u8 key[MAX_KEY_LEN];
	__u8 values[4 * MAX_POSTCARD_HOPS];
	__u32 key_len;
};

/* Per-CPU working memory: XDP programs never run nested on one CPU. */
struct scratch {
	__u64 now_ns;		/* read from the clock on first use: most reports never need it */
	__u32 data_path;	/* frames come from reports, not from a flush */
	__u32 src_ip;		/* of the report, network order */
	__u32 dst_ip;
	__u8 peer_mac[6];
	__u8 raw[RAW_MAX];
	struct report report;
	struct frame_params frame;
	__u32 out_count;	/* frames in out, back to back from its start */
	__u32 out_via_tc;	/* the QP's frames always leave through the tc stage */
	__u32 fanout_sequence;
	__u32 out_frame_len;
	__u32 out_ifindex;
	struct postcard_copy postcard;	/* a cache entry taken out under its lock, to be written */
	__u8 out[OUT_SIZE + 8];	/* + 8: word loads at any masked index stay inside */
};

struct flush_entry {
	__u64 first_ns;
	__u32 kind;
	__u32 index;		/* append_state or postcard_cache slot */
	__u32 owner;		/* list id (Append) or collector IP (Postcarding) */
	__u32 pad;
};

struct deferred_report {
	__u32 qp_index;
	__u32 len;
	__u32 ingress_ifindex;
	__u32 pad;
	__u8 frame[DEFER_FRAME_MAX];
};

TABLE(translator_config, BPF_MAP_TYPE_ARRAY, __u32, struct translator_config_value, 1);
TABLE(qp, BPF_MAP_TYPE_ARRAY, __u32, struct qp_value, QP_MAX_ENTRIES);
TABLE(qp_state, BPF_MAP_TYPE_ARRAY, __u32, struct qp_state_value, QP_STATE_MAX_ENTRIES);
TABLE(qp_by_local_qpn, BPF_MAP_TYPE_HASH, struct qp_by_local_qpn_key, struct qp_by_local_qpn_value,
      QP_BY_LOCAL_QPN_MAX_ENTRIES);
TABLE(collector, BPF_MAP_TYPE_HASH, struct collector_key, struct collector_value, COLLECTOR_MAX_ENTRIES);
TABLE(structure, BPF_MAP_TYPE_HASH, struct structure_key, struct structure_value, STRUCTURE_MAX_ENTRIES);
TABLE(append_list, BPF_MAP_TYPE_HASH, struct append_list_key, struct append_list_value, APPEND_LIST_MAX_ENTRIES);
TABLE(append_state, BPF_MAP_TYPE_ARRAY, __u32, struct append_state_value, APPEND_STATE_MAX_ENTRIES);
TABLE(postcard_cache, BPF_MAP_TYPE_ARRAY, __u32, struct postcard_cache_value, POSTCARD_CACHE_MAX_ENTRIES);
TABLE(sketch_column, BPF_MAP_TYPE_HASH, struct sketch_column_key, struct sketch_column_value,
      SKETCH_COLUMN_MAX_ENTRIES);
TABLE(sketch_reporter, BPF_MAP_TYPE_HASH, struct sketch_reporter_key, struct sketch_reporter_value,
      SKETCH_REPORTER_MAX_ENTRIES);
TABLE(fanout, BPF_MAP_TYPE_ARRAY, __u32, struct fanout_value, FANOUT_MAX_ENTRIES);	/* x CPUs at load */
TABLE(reporter_seq, BPF_MAP_TYPE_LRU_HASH, struct reporter_seq_key, struct reporter_seq_value,
      REPORTER_SEQ_MAX_ENTRIES);
TABLE(counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, __u64, COUNTER_SLOTS);
TABLE(scratch, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct scratch, 1);

struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__type(value, struct flush_entry);
	__uint(max_entries, 65536);
} flush_queue SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} deferred SEC(".maps");

static __always_inline struct scratch *scratch_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&scratch, &zero);
}

static __always_inline struct translator_config_value *config_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&translator_config, &zero);
}

/* The global entry point of a primitive's handler: the verifier checks a global function once, not once per
 * call path, which keeps the program within its complexity limit. */
#define PRIMITIVE_HANDLER(name, fail)                                                                      \
	__noinline __u32 name(struct xdp_md *ctx)                                                          \
	{                                                                                                  \
		struct scratch *s = scratch_get();                                                         \
		const struct translator_config_value *cfg = config_get();                                  \
                                                                                                           \
		return s && cfg ? name##_body(ctx, s, cfg) : (fail);                                       \
	}

static __always_inline void count_n(__u32 slot, __u32 n)
{
	__u64 *value = bpf_map_lookup_elem(&counters, &slot);

	if (value)
		*value += n;
}

static __always_inline void count(__u32 slot)
{
	count_n(slot, 1);
}


/* ------------------------------------------------------------------------------------------------ */
/* report decoding: the same checks in the same order as softdta.wire.dta.decode */

static __always_inline __u32 decode_report_body(struct scratch *s, __u32 len, __u32 profile)
{
	struct report *r = &s->report;
	const __u8 *p = s->raw;
	__u32 off, end, key_at = 0, data_at = 0;

	__builtin_memset(r, 0, __builtin_offsetof(struct report, key));	/* arrays are read only up to their lengths */
	r->redundancy = 1;
	if (len == 0)
		return CNT_DROP_TRUNCATED;
	if (p[0] & EXTENDED_MARKER) {
		if (len < DTA_BASE_EXT_SIZE)
			return CNT_DROP_TRUNCATED;
		if (p[0] != EXTENDED_FIRST_BYTE)
			return CNT_DROP_BAD_PROFILE;
		r->opcode = p[1];
		r->immediate = !!(p[2] & DTA_BASE_EXT_IMMEDIATE_MASK);
		r->essential = !!(p[2] & DTA_BASE_EXT_ESSENTIAL_MASK);
		r->retransmit = !!(p[2] & DTA_BASE_EXT_RETRANSMIT_MASK);
		r->seqnum = p[3];
		r->extended = 1;
		off = DTA_BASE_EXT_SIZE;
		switch (r->opcode) {
		case DTA_OP_KEY_WRITE:
			if (len < off + KEY_WRITE_EXT_SIZE)
				return CNT_DROP_TRUNCATED;
			r->redundancy = p[4];
			r->key_len = p[5];
			r->data_len = p[6];
			key_at = off + KEY_WRITE_EXT_SIZE;
			data_at = key_at + r->key_len;
			end = data_at + r->data_len;
			if (len < data_at || len < end)
				return CNT_DROP_TRUNCATED;
			break;
		case DTA_OP_KEY_INCREMENT:
			if (len < off + KEY_INCREMENT_EXT_SIZE)
				return CNT_DROP_TRUNCATED;
			r->redundancy = p[4];
			r->key_len = p[5];
			r->counter = (__u64)get32(p + 6) << 32 | get32(p + 10);
			key_at = off + KEY_INCREMENT_EXT_SIZE;
			end = key_at + r->key_len;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			break;
		case DTA_OP_APPEND:
			if (len < off + APPEND_EXT_SIZE)
				return CNT_DROP_TRUNCATED;
			r->list_id = get32(p + 4);
			r->data_len = p[8];
			data_at = off + APPEND_EXT_SIZE;
			end = data_at + r->data_len;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			break;
		case DTA_OP_POSTCARDING:
			if (len < off + POSTCARD_EXT_SIZE)
				return CNT_DROP_TRUNCATED;
			r->hop = p[4];
			r->path_length = p[5];
			r->key_len = p[6];
			r->data_len = 4;
			data_at = 7;
			key_at = off + POSTCARD_EXT_SIZE;
			end = key_at + r->key_len;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			break;
		case DTA_OP_SKETCH_MERGE:
			if (len < off + SKETCH_MERGE_EXT_SIZE)
				return CNT_DROP_TRUNCATED;
			r->reporter = (__u16)p[4] << 8 | p[5];
			r->column = (__u16)p[6] << 8 | p[7];
			r->rows = p[8];
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
		r->opcode = p[0];
		if (profile) {
			r->immediate = !!(p[1] & DTA_BASE_V1_SHORT_IMMEDIATE_MASK);
		} else {
			r->seqnum = p[1];
			r->immediate = !!(p[2] & DTA_BASE_V1_SEQ_IMMEDIATE_MASK);
			r->retransmit = !!(p[2] & DTA_BASE_V1_SEQ_RETRANSMIT_MASK);
		}
		off = base;
		r->key_len = 4;
		r->data_len = 4;
		switch (r->opcode) {
		case DTA_OP_KEY_WRITE:
			end = off + KEY_WRITE_V1_SIZE;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			r->redundancy = p[off];
			key_at = off + 1;
			data_at = off + 5;
			break;
		case DTA_OP_KEY_INCREMENT:
			end = off + KEY_INCREMENT_V1_SIZE;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			r->redundancy = p[off];
			key_at = off + 1;
			r->counter = (__u64)get32(p + off + 5) << 32 | get32(p + off + 9);
			break;
		case DTA_OP_APPEND:
			end = off + APPEND_V1_SIZE;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			r->list_id = get32(p + off);
			data_at = off + 4;
			break;
		case DTA_OP_POSTCARDING:
			end = off + POSTCARD_V1_SIZE;
			if (len < end)
				return CNT_DROP_TRUNCATED;
			key_at = off;
			r->hop = p[off + 4];
			data_at = off + 5;
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

	if (r->opcode != DTA_OP_APPEND && r->opcode != DTA_OP_SKETCH_MERGE)
		for (__u32 i = 0; i < MAX_KEY_LEN && i < r->key_len; i++)
			r->key[i] = p[(key_at + i) & RAW_MASK];
	if (r->opcode == DTA_OP_SKETCH_MERGE)
		for (__u32 i = 0; i < MAX_SKETCH_ROWS && i < r->rows; i++)
			r->counters[i] = get32(p + ((data_at + 4 * i) & RAW_MASK));
	else if (r->opcode != DTA_OP_KEY_INCREMENT)
		for (__u32 i = 0; i < MAX_DATA_LEN && i < r->data_len; i++)
			r->data[i] = p[(data_at + i) & RAW_MASK];
	return 0;
}

/* Global, so the verifier checks it once rather than once per call path. */
__noinline __u32 decode_report(__u32 len, __u32 profile)
{
	struct scratch *s = scratch_get();

	return s ? decode_report_body(s, len, profile) : CNT_DROP_TRUNCATED;
}

/* ------------------------------------------------------------------------------------------------ */
/* hashes (softdta.wire.hashing) */

/* Raw CRC-32 state over the key bytes reversed, as Key-Write and Key-Increment hash them. */
static __always_inline __u32 reversed_key_state(const struct report *r, const __u32 *table)
{
	__u32 crc = 0xffffffff;

	for (__u32 i = 0; i < MAX_KEY_LEN && i < r->key_len; i++)
		crc = crc32_byte(table, crc, r->key[(r->key_len - 1 - i) & (MAX_KEY_LEN - 1)]);
	return crc;
}

static __always_inline __u32 key_checksum(const struct report *r)
{
	return reversed_key_state(r, crc32_slice8[0]) ^ 0xffffffff;
}

static __noinline __u32 key_slot_hash(const struct report *r, __u32 copy, __u32 scheme)
{
	const __u32 *table = crc32_slice8[0];

	copy &= MAX_REDUNDANCY - 1;
	if (scheme == KEY_HASH_INDEPENDENT)
		table = crc32_key_hash[copy];
	return crc32_byte(table, reversed_key_state(r, table), copy) ^ 0xffffffff;
}

/* CRC over the key in wire order with a byte table (Postcarding slot and hop hashes). */
static __always_inline __u32 key_crc(const __u8 *key, __u32 key_len, const __u32 *table)
{
	__u32 crc = 0xffffffff;

	for (__u32 i = 0; i < MAX_KEY_LEN && i < key_len; i++)
		crc = crc32_byte(table, crc, key[i]);
	return crc ^ 0xffffffff;
}

/* ------------------------------------------------------------------------------------------------ */
/* frames */

/* iCRC over s->out[start, start + len): a global function, so the verifier checks its loop only once. */
__noinline __u32 out_crc(struct scratch *s, __u32 start, __u32 len)
{
	if (!s)
		return 0;
	return ~crc32_slice8_update(0xffffffff, s->out, OUT_MASK, start, len);
}

static __always_inline __u32 request_ext_len(__u8 opcode)
{
	switch (opcode) {
	case ROCE_OP_RC_WRITE_ONLY:
	case ROCE_OP_UC_WRITE_ONLY:
		return RETH_SIZE;
	case ROCE_OP_RC_WRITE_ONLY_IMM:
	case ROCE_OP_UC_WRITE_ONLY_IMM:
		return RETH_SIZE + IMMDT_SIZE;
	default:
		return ATOMIC_ETH_SIZE;
	}
}


/* One RoCEv2 frame at s->out[at] from s->frame; the payload already sits after the headers. Allocates the
 * QP's next PSN. Returns the frame length, 0 if the frame would not fit. */
static __noinline __u32 build_roce(struct scratch *s, __u32 at, const struct qp_value *q, struct qp_state_value *qs,
				   const struct translator_config_value *cfg)
{
	struct frame_params *fp = &s->frame;
	__u32 ext = request_ext_len(fp->opcode);
	__u32 payload = fp->payload_len & 511;
	__u32 pad = (4 - (payload & 3)) & 3;
	__u32 ip_len = IPV4_SIZE + UDP_SIZE + BTH_SIZE + ext + payload + pad + ICRC_LEN;
	__u32 ack_req = 0, crc;
	__u8 *f, *ip, *udp, *bth, *eh;

	if (at > OUT_LIMIT || ETHERNET_SIZE + ip_len > OUT_LIMIT)
		return 0;
	f = s->out + at;
	ip = f + ETHERNET_SIZE;
	udp = ip + IPV4_SIZE;
	bth = udp + UDP_SIZE;
	eh = bth + BTH_SIZE;

	qs->frames_sent += 1;
	if (q->transport == TRANSPORT_RC && cfg->ack_req_interval && qs->frames_sent % cfg->ack_req_interval == 0)
		ack_req = 1;

	ipv4_header(ip, ip_len, cfg->src_ip, q->collector_ip);
	put16(udp, cfg->udp_sport);
	put16(udp + 2, ROCE_PORT);
	put16(udp + 4, ip_len - IPV4_SIZE);
	bth[0] = fp->opcode;
	bth[1] = 1 << 6 | pad << 4;	/* MigReq set, as rdma_rxe sends */
	put16(bth + 2, DEFAULT_PKEY);
	put32(bth + 4, q->remote_qpn & PSN_MASK);
	put32(bth + 8, ack_req << 31 | (qs->next_psn & PSN_MASK));
	qs->next_psn = (qs->next_psn + 1) & PSN_MASK;
	put64(eh, fp->va);
	put32(eh + 8, q->rkey);
	if (ext == ATOMIC_ETH_SIZE) {
		put64(eh + 12, fp->swap_add);
		put64(eh + 20, 0);
	} else {
		put32(eh + 12, payload);
		if (ext == RETH_SIZE + IMMDT_SIZE)
			put32(eh + 16, fp->immediate);
	}
	for (__u32 i = 0; i < 3 && i < pad; i++)
		s->out[(at + ROCE_HEADERS + ext + payload + i) & OUT_MASK] = 0;

	/* iCRC: eight 0xff bytes stand for the LRH, then the IP packet with its variant fields set to ones. */
	__builtin_memset(f + 6, 0xff, 8);
	ip[1] = 0xff;
	ip[8] = 0xff;
	ip[10] = 0xff;
	ip[11] = 0xff;
	udp[6] = 0xff;
	udp[7] = 0xff;
	bth[4] = 0xff;
	crc = out_crc(s, at + 6, 8 + ip_len - ICRC_LEN);
	bth[4] = 0;
	udp[6] = 0;
	udp[7] = 0;
	ipv4_finish(ip, cfg->dscp, cfg->ttl);
	__builtin_memcpy(f, q->collector_mac, 6);
	__builtin_memcpy(f + 6, cfg->src_mac, 6);
	f[12] = ETH_P_IP >> 8;
	f[13] = ETH_P_IP & 0xff;
	for (int i = 0; i < 4; i++)
		s->out[(at + ETHERNET_SIZE + ip_len - ICRC_LEN + i) & OUT_MASK] = crc >> (8 * i);
	return ETHERNET_SIZE + ip_len;
}

/* Appends one RDMA WRITE (with Immediate if asked) of the payload already at the frame's payload offset. */
static __always_inline __u32 write_frame(struct scratch *s, __u32 at, const struct qp_value *q,
					 struct qp_state_value *qs, const struct translator_config_value *cfg,
					 __u64 offset, __u32 immediate)
{
	struct frame_params *fp = &s->frame;

	if (offset + fp->payload_len > q->length) {
		count(CNT_DROP_OUT_OF_REGION);
		return 0;
	}
	fp->va = q->base_va + offset;
	fp->rkey = q->rkey;
	if (q->transport == TRANSPORT_RC)
		fp->opcode = immediate ? ROCE_OP_RC_WRITE_ONLY_IMM : ROCE_OP_RC_WRITE_ONLY;
	else
		fp->opcode = immediate ? ROCE_OP_UC_WRITE_ONLY_IMM : ROCE_OP_UC_WRITE_ONLY;
	return build_roce(s, at, q, qs, cfg);
}

/* Where the payload of a WRITE built at the start of out begins. */
static __always_inline __u32 write_payload_at(__u32 immediate)
{
	return ROCE_HEADERS + RETH_SIZE + (immediate ? IMMDT_SIZE : 0);
}

static __always_inline void single_frame(struct scratch *s, __u32 len, __u32 ifindex)
{
	s->out_count = len ? 1 : 0;
	s->out_frame_len = len;
	s->out_ifindex = ifindex;
}

/* ------------------------------------------------------------------------------------------------ */
/* queue pairs */

static __always_inline __u64 clock_ns(struct scratch *s)
{
	if (!s->now_ns)
		s->now_ns = bpf_ktime_get_ns();
	return s->now_ns;
}

static __always_inline int qp_ready(struct qp_state_value *qs, struct scratch *s)
{
	if (qs->state == QP_STATE_GRACE && clock_ns(s) >= qs->grace_until_ns)
		qs->state = QP_STATE_ACTIVE;
	return qs->state == QP_STATE_ACTIVE;
}

/* Parks an essential report for userspace, which re-injects it once the QP can send again. */
static __noinline __u32 defer_report(struct xdp_md *ctx, __u32 qp_index)
{
	__u32 len = ctx->data_end - ctx->data;
	struct deferred_report *rec;

	if (len > DEFER_FRAME_MAX)
		return CNT_DROP_BAD_LENGTH;
	rec = bpf_ringbuf_reserve(&deferred, sizeof(*rec), 0);
	if (!rec)
		return CNT_DROP_DEFER_FULL;
	rec->qp_index = qp_index;
	rec->len = len;
	rec->ingress_ifindex = ctx->ingress_ifindex;
	rec->pad = 0;
	if (len < 1 || bpf_xdp_load_bytes(ctx, 0, rec->frame, NONZERO(len, DEFER_FRAME_MAX))) {
		bpf_ringbuf_discard(rec, 0);
		return CNT_DROP_BAD_LENGTH;
	}
	bpf_ringbuf_submit(rec, 0);
	count(CNT_ESSENTIAL_DEFERRED);
	return DEFERRED;
}

/* 0 if the QP may send now; otherwise DEFERRED (an essential report) or the drop reason. */
static __always_inline __u32 qp_blocked(struct xdp_md *ctx, struct scratch *s, __u32 qp_index,
					struct qp_state_value *qs)
{
	if (qp_ready(qs, s))
		return 0;
	if (s->report.essential)
		return defer_report(ctx, qp_index);
	return qs->state == QP_STATE_FAILED ? CNT_DROP_QP_FAILED : CNT_DROP_GRACE;
}

struct qp_ref {
	struct qp_value *q;
	struct qp_state_value *qs;
};

static __always_inline int qp_lookup(__u32 qp_index, struct qp_ref *ref)
{
	ref->q = bpf_map_lookup_elem(&qp, &qp_index);
	ref->qs = bpf_map_lookup_elem(&qp_state, &qp_index);
	return ref->q && ref->qs && ref->q->remote_qpn;
}

/* ------------------------------------------------------------------------------------------------ */
/* reporter NACKs */

static __noinline void build_nack(struct scratch *s, const struct translator_config_value *cfg, __u32 kind,
				  __u32 value, __u32 reporter)
{
	__u8 *f = s->out;
	__u8 *ip = f + ETHERNET_SIZE, *udp = ip + IPV4_SIZE, *body = udp + UDP_SIZE;
	__u32 body_len = s->report.extended ? NACK_EXT_SIZE : NACK_V1_SIZE;

	__builtin_memcpy(f, s->peer_mac, 6);
	__builtin_memcpy(f + 6, cfg->src_mac, 6);
	f[12] = ETH_P_IP >> 8;
	f[13] = ETH_P_IP & 0xff;
	ipv4_header(ip, IPV4_SIZE + UDP_SIZE + body_len, s->dst_ip, s->src_ip);
	ipv4_finish(ip, cfg->dscp, cfg->ttl);
	put16(udp, DTA_PORT);
	put16(udp + 2, DTA_NACK_PORT);
	put16(udp + 4, UDP_SIZE + body_len);
	put16(udp + 6, 0);
	if (s->report.extended) {
		body[0] = EXTENDED_FIRST_BYTE;
		body[1] = kind;
		put16(body + 2, reporter);
		put32(body + 4, value);
	} else {
		body[0] = value;
		body[1] = 0x80;
	}
	single_frame(s, ETHERNET_SIZE + IPV4_SIZE + UDP_SIZE + body_len, 0);
	count(CNT_TX_NACKS);
}

/* Go-back-N per reporter IP: accept the next seqnum, NACK a gap, drop a duplicate. */
static __always_inline __u32 check_sequence_body(struct scratch *s, const struct translator_config_value *cfg)
{
	struct reporter_seq_key key = { .reporter_ip = s->src_ip };
	struct reporter_seq_value *last = bpf_map_lookup_elem(&reporter_seq, &key);
	__u32 seq = s->report.seqnum;

	if (!last || seq == ((last->last_seqnum + 1) & 0xff)) {
		struct reporter_seq_value next = { .last_seqnum = seq };

		bpf_map_update_elem(&reporter_seq, &key, &next, BPF_ANY);
		return 0;
	}
	if (((last->last_seqnum - seq) & 0xff) < SEQ_WINDOW)
		return CNT_DROP_DUPLICATE;
	build_nack(s, cfg, NACK_KIND_SEQUENCE, last->last_seqnum, 0);
	return CNT_DROP_SEQUENCE_GAP;
}

/* Global, so the verifier checks it once rather than once per call path. */
__noinline __u32 check_sequence(void)
{
	struct scratch *s = scratch_get();
	const struct translator_config_value *cfg = config_get();

	if (!s || !cfg)
		return CNT_DROP_TRUNCATED;
	return check_sequence_body(s, cfg);
}

/* ------------------------------------------------------------------------------------------------ */
/* primitives */

static __always_inline __u32 on_keyed_body(struct xdp_md *ctx, struct scratch *s, const struct translator_config_value *cfg)
{
	struct report *r = &s->report;
	struct structure_key sk = { .collector_ip = s->dst_ip, .primitive = r->opcode };
	struct structure_value *st = bpf_map_lookup_elem(&structure, &sk);
	struct frame_params *fp = &s->frame;
	struct qp_ref ref;
	__u32 blocked, checksum, frame_len = 0;

	if (!st || !qp_lookup(st->qp_index, &ref))
		return CNT_DROP_UNKNOWN_COLLECTOR;
	if (r->key_len != st->key_len || (r->opcode == DTA_OP_KEY_WRITE && r->data_len != st->data_len))
		return CNT_DROP_BAD_LENGTH;
	blocked = qp_blocked(ctx, s, st->qp_index, ref.qs);
	if (blocked)
		return blocked;
	checksum = key_checksum(r);
	for (__u32 copy = 0; copy < MAX_REDUNDANCY && copy < r->redundancy; copy++) {
		__u64 offset = (__u64)(key_slot_hash(r, copy, st->key_hash) & (st->slot_count - 1)) * st->slot_size;
		__u32 at = copy * (frame_len & 255), len;

		if (r->opcode == DTA_OP_KEY_WRITE) {
			__u32 pos = at + write_payload_at(r->immediate);

			for (int i = 0; i < 4; i++)
				s->out[(pos + i) & OUT_MASK] = checksum >> (8 * i);
			for (__u32 i = 0; i < MAX_DATA_LEN && i < r->data_len; i++)
				s->out[(pos + 4 + i) & OUT_MASK] = r->data[i];
			fp->payload_len = 4 + r->data_len;
			fp->immediate = checksum;
			len = write_frame(s, at, ref.q, ref.qs, cfg, offset, r->immediate);
		} else {
			if (offset + 8 > ref.q->length)
				return CNT_DROP_OUT_OF_REGION;
			fp->opcode = ROCE_OP_RC_FETCH_ADD;
			fp->va = ref.q->base_va + offset;
			fp->rkey = ref.q->rkey;
			fp->swap_add = r->counter;
			fp->payload_len = 0;
			len = build_roce(s, at, ref.q, ref.qs, cfg);
		}
		if (!len)
			return CNT_DROP_OUT_OF_REGION;
		frame_len = len;
	}
	s->out_count = r->redundancy;
	s->out_via_tc = 1;
	s->out_frame_len = frame_len;
	s->out_ifindex = ref.q->ifindex;
	count_n(CNT_TX_FRAMES, r->redundancy);
	return 0;
}

PRIMITIVE_HANDLER(on_keyed, CNT_DROP_UNKNOWN_COLLECTOR)

/* A WRITE of the batch already copied into the frame's payload, at ring position `head` of the list. */
static __noinline __u32 append_write(struct scratch *s, const struct append_list_value *al,
				     const struct translator_config_value *cfg, __u32 list_id, __u32 head)
{
	__u32 immediate = s->data_path && s->report.immediate;
	__u64 offset = ((__u64)al->first_slot + head) * al->entry_size;
	struct qp_ref ref;

	if (!qp_lookup(al->qp_index, &ref))
		return CNT_DROP_UNKNOWN_LIST;
	s->frame.payload_len = al->batch * al->entry_size;
	s->frame.immediate = list_id;
	single_frame(s, write_frame(s, 0, ref.q, ref.qs, cfg, offset, immediate), ref.q->ifindex);
	return s->out_count ? 0 : CNT_DROP_OUT_OF_REGION;
}

static __always_inline void flush_later(__u32 kind, __u32 index, __u32 owner, __u64 now)
{
	struct flush_entry entry = { .first_ns = now, .kind = kind, .index = index, .owner = owner };

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
	struct append_list_key key = { .list_id = r->list_id };
	struct append_list_value *al = bpf_map_lookup_elem(&append_list, &key);
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
	if (!as || !qp_lookup(al->qp_index, &ref) || !al->slot_count)
		return CNT_DROP_UNKNOWN_LIST;
	blocked = qp_blocked(ctx, s, al->qp_index, ref.qs);
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
		flush_later(FLUSH_APPEND, index, r->list_id, first);
	if (!full) {
		count(CNT_APPEND_BATCHED);
		return 0;
	}
	blocked = append_write(s, al, cfg, r->list_id, head);
	if (!blocked)
		count(CNT_TX_FRAMES);
	return blocked;
}

PRIMITIVE_HANDLER(on_append, CNT_DROP_UNKNOWN_LIST)

static __noinline __u32 postcard_write(struct scratch *s, const struct postcard_copy *entry,
				       const struct structure_value *st, const struct translator_config_value *cfg,
				       __u32 immediate)
{
	__u32 pos = write_payload_at(immediate), hops = st->hops & (MAX_POSTCARD_HOPS * 2 - 1);
	__u64 offset = (__u64)(key_crc(entry->key, entry->key_len, crc32_slice8[0]) & (st->slot_count - 1)) *
		       st->slot_size;
	__u32 checksum = 0xffffffff;
	struct qp_ref ref;

	if (!qp_lookup(st->qp_index, &ref) || hops > MAX_POSTCARD_HOPS)
		return CNT_DROP_UNKNOWN_COLLECTOR;
	for (__u32 i = 0; i < MAX_KEY_LEN && i < entry->key_len; i++)
		checksum = crc32_byte(crc32_slice8[0], checksum,
				      entry->key[(entry->key_len - 1 - i) & (MAX_KEY_LEN - 1)]);
	for (__u32 i = 0; i < 4 * MAX_POSTCARD_HOPS && i < 4 * hops; i++)
		s->out[(pos + i) & OUT_MASK] = entry->values[i];
	s->frame.payload_len = 4 * hops;
	s->frame.immediate = checksum ^ 0xffffffff;
	single_frame(s, write_frame(s, 0, ref.q, ref.qs, cfg, offset, immediate), ref.q->ifindex);
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
	struct structure_key sk = { .collector_ip = s->dst_ip, .primitive = PRIM_POSTCARDING };
	struct structure_value *st = bpf_map_lookup_elem(&structure, &sk);
	struct postcard_cache_value *entry;
	struct qp_ref ref;
	__u32 blocked, path_length, slot, encoded, hop = (r->hop - 1) & (MAX_POSTCARD_HOPS - 1);
	__u32 evicted = 0, single = 0, started = 0, complete = 0;
	__u64 now, first = 0;

	if (!st || !qp_lookup(st->qp_index, &ref))
		return CNT_DROP_UNKNOWN_COLLECTOR;
	if (r->key_len != st->key_len)
		return CNT_DROP_BAD_LENGTH;
	path_length = r->path_length ? r->path_length : st->hops;
	if (r->hop > path_length || path_length > st->hops)
		return CNT_DROP_BAD_HOP;
	blocked = qp_blocked(ctx, s, st->qp_index, ref.qs);
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
		blocked = postcard_write(s, &s->postcard, st, cfg, r->immediate);
		if (!blocked)
			count(CNT_TX_FRAMES);
		return blocked;
	}
	if (started)
		flush_later(FLUSH_POSTCARD, slot, s->dst_ip, first);
	if (evicted) {
		count(CNT_POSTCARD_EVICTIONS);
		blocked = postcard_write(s, &s->postcard, st, cfg, 0);
	} else if (complete) {
		blocked = postcard_write(s, &s->postcard, st, cfg, r->immediate);
	} else {
		count(CNT_POSTCARD_CACHED);
	}
	if (!blocked && s->out_count)
		count(CNT_TX_FRAMES);
	return blocked;
}

PRIMITIVE_HANDLER(on_postcard, CNT_DROP_UNKNOWN_COLLECTOR)

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
	struct structure_key sk = { .collector_ip = s->dst_ip, .primitive = PRIM_SKETCH_MERGE };
	struct structure_value *st = bpf_map_lookup_elem(&structure, &sk);
	struct sketch_reporter_key rk = {};
	struct sketch_reporter_value *progress, fresh = {};
	struct sketch_column_key ck = {};
	struct sketch_column_value *column, empty = {};
	struct qp_ref ref;
	__u32 blocked, expected, first, batch;

	if (!st || !qp_lookup(st->qp_index, &ref))
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
	blocked = qp_blocked(ctx, s, st->qp_index, ref.qs);
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
	single_frame(s, write_frame(s, 0, ref.q, ref.qs, cfg, (__u64)first * st->slot_size, r->immediate),
		     ref.q->ifindex);
	if (!s->out_count)
		return CNT_DROP_OUT_OF_REGION;
	count(CNT_TX_FRAMES);
	return 0;
}

PRIMITIVE_HANDLER(on_sketch, CNT_DROP_UNKNOWN_COLLECTOR)

/* ------------------------------------------------------------------------------------------------ */
/* collector replies: ACK, NAK, Atomic ACK */

static __always_inline __u32 on_reply_body(struct xdp_md *ctx, struct scratch *s,
						 const struct translator_config_value *cfg, __u32 ip_off,
						 __u64 ip_header_len)
{
	__u64 ip_len, body_len;
	__u32 pad, crc, dest_qp, psn, syndrome;
	int ext;
	struct qp_by_local_qpn_value *index;
	struct qp_by_local_qpn_key key;
	struct qp_ref ref;
	__u8 *ip = s->out + 8, *body;

	/* The frame was checked by the caller: ip_off + ip_len lies inside the packet. */
	ip_len = s->frame.payload_len;
	if (ip_len > OUT_LIMIT || ip_header_len > 60 || ip_len < ip_header_len + UDP_SIZE)
		return CNT_DROP_BAD_LENGTH;
	body_len = ip_len - ip_header_len - UDP_SIZE;
	if (body_len < BTH_SIZE + ICRC_LEN)
		return CNT_DROP_TRUNCATED;
	if (bpf_xdp_load_bytes(ctx, ip_off, ip, NONZERO(ip_len, OUT_LIMIT)))
		return CNT_DROP_TRUNCATED;
	body = ip + ((ip_header_len + UDP_SIZE) & 127);
	ext = roce_ext_len(body[0]);
	if (ext < 0)
		return CNT_DROP_UNKNOWN_OPCODE;
	if (body_len - ICRC_LEN < BTH_SIZE + ext)
		return CNT_DROP_TRUNCATED;
	pad = (body[1] >> 4) & 3;
	if (body_len - ICRC_LEN - pad < BTH_SIZE + ext)
		return CNT_DROP_BAD_LENGTH;
	if (body[0] != ROCE_OP_RC_ACK && body[0] != ROCE_OP_RC_ATOMIC_ACK)
		return PASS_UP;
	dest_qp = (__u32)body[5] << 16 | (__u32)body[6] << 8 | body[7];
	psn = (__u32)body[9] << 16 | (__u32)body[10] << 8 | body[11];
	syndrome = body[BTH_SIZE];

	icrc_mask(s->out, ip, ip_header_len);
	crc = out_crc(s, 0, 8 + ip_len - ICRC_LEN);
	for (int i = 0; i < 4; i++)
		if (s->out[(8 + ip_len - ICRC_LEN + i) & OUT_MASK] != ((crc >> (8 * i)) & 0xff))
			return CNT_DROP_BAD_ICRC;

	key.local_qpn = dest_qp;
	index = bpf_map_lookup_elem(&qp_by_local_qpn, &key);
	if (!index || !qp_lookup(index->qp_index, &ref) || ref.q->collector_ip != s->src_ip)
		return CNT_DROP_UNKNOWN_QP;
	if (ref.q->transport != TRANSPORT_RC)
		return CNT_DROP_REPLY_ON_UC;
	/* An RC requester takes a reply only for an outstanding PSN, in [unacked_psn, next_psn) mod 2^24:
	 * a stale or forged one must neither fail the QP nor move its PSN. */
	if (((psn - ref.qs->unacked_psn) & PSN_MASK) >= ((ref.qs->next_psn - ref.qs->unacked_psn) & PSN_MASK))
		return CNT_DROP_REPLY_PSN_OUTSIDE_WINDOW;
	switch (syndrome >> 5) {
	case AETH_ACK:
		count(CNT_RX_ACKS);
		ref.qs->unacked_psn = (psn + 1) & PSN_MASK; /* an ACK covers every PSN up to its own */
		break;
	case AETH_RNR_NAK:
		count(CNT_RX_RNR_NAKS);
		break;
	default:
		if (syndrome >> 5 == AETH_NAK && (syndrome & 0x1f) == NAK_PSN_SEQUENCE_ERROR) {
			count(CNT_RX_NAK_SEQUENCE);
			ref.qs->next_psn = psn;
			ref.qs->unacked_psn = psn;
			ref.qs->state = QP_STATE_GRACE;
			ref.qs->grace_until_ns = clock_ns(s) + cfg->grace_ns;
		} else {
			count(CNT_RX_NAK_FATAL);
			ref.qs->state = QP_STATE_FAILED;
		}
	}
	return 0;
}

__noinline __u32 on_reply(struct xdp_md *ctx, __u32 ip_off, __u64 ip_header_len)
{
	struct scratch *s = scratch_get();
	const struct translator_config_value *cfg = config_get();

	if (!s || !cfg)
		return CNT_DROP_TRUNCATED;
	return on_reply_body(ctx, s, cfg, ip_off, ip_header_len);
}

/* ------------------------------------------------------------------------------------------------ */
/* output */

/* s->out[0, len) into the packet, a word at a time: cheaper here than bpf_xdp_store_bytes. */
static __always_inline int copy_to_packet(struct xdp_md *ctx, struct scratch *s, __u32 len)
{
	__u8 *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	__u32 i;

	for (i = 0; i < OUT_LIMIT && i + 8 <= len; i += 8) {
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

struct fanout_meta {
	__u32 magic;
	__u32 cpu;
	__u32 sequence;
};

/* Parks frames 2..N of a report for the tc stage; the packet carries frame 1 and the meta. */
static __noinline int park_frames(struct scratch *s, struct fanout_meta *meta)
{
	__u32 slot, len = s->out_frame_len;
	struct fanout_value *entry;

	meta->magic = FANOUT_META_MAGIC;
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
	for (__u32 i = 0; i < (MAX_REDUNDANCY - 1) * FANOUT_FRAME_MAX && i < (s->out_count - 1) * len; i++)
		entry->frames[i] = s->out[(len + i) & OUT_MASK];
	return 0;
}

/* Replaces the packet with the first frame the handler built: sent with XDP_TX or a redirect, or, for
 * Key-Write and Key-Increment (which may need several), passed up to the tc stage, which sends them all. Their
 * QPs use the tc stage for every report, N = 1 too: frames of one QP must never take two paths, or a NAPI poll
 * could put them on the wire out of PSN order. */
static __always_inline int emit(struct xdp_md *ctx, struct scratch *s)
{
	__u64 len = s->out_frame_len, have = ctx->data_end - ctx->data;
	struct fanout_meta meta, *room;
	void *data;

	if (!s->out_count)
		return XDP_DROP;
	if (len > OUT_LIMIT || len < ETHERNET_SIZE) {
		count(CNT_DROP_BAD_LENGTH);
		return XDP_DROP;
	}
	/* Grow into the tailroom, or else the headroom: drivers (veth with small skbs) may offer only one. */
	if (len != have && bpf_xdp_adjust_tail(ctx, (int)len - (int)have) &&
	    (len < have || bpf_xdp_adjust_head(ctx, (int)have - (int)len))) {
		count(CNT_DROP_NO_ROOM);
		return XDP_DROP;
	}
	if (copy_to_packet(ctx, s, len)) {
		count(CNT_DROP_NO_ROOM);
		return XDP_DROP;
	}
	if (s->out_via_tc) {
		if (park_frames(s, &meta) || bpf_xdp_adjust_meta(ctx, -(int)sizeof(meta))) {
			count(CNT_DROP_NO_ROOM);
			return XDP_DROP;
		}
		data = (void *)(long)ctx->data;
		room = (void *)(long)ctx->data_meta;
		if ((void *)(room + 1) > data)
			return XDP_DROP;
		*room = meta;
		return XDP_PASS;
	}
	if (s->out_ifindex && s->out_ifindex != ctx->ingress_ifindex)
		return bpf_redirect(s->out_ifindex, 0);
	return XDP_TX;
}

static __always_inline struct scratch *begin(__u32 data_path)
{
	__u32 zero = 0;
	struct scratch *s = bpf_map_lookup_elem(&scratch, &zero);

	if (s) {
		s->now_ns = 0;
		s->data_path = data_path;
		s->out_count = 0;
		s->out_via_tc = 0;
		s->out_ifindex = 0;
	}
	return s;
}

static __always_inline int translate(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct translator_config_value *cfg;
	struct ethhdr_min { __u8 dst[6]; __u8 src[6]; __u16 proto; } *eth = data;
	__u32 zero = 0, ip_off = ETHERNET_SIZE, ihl, ip_total, udp_len, payload_off, payload_len, reason = 0;
	struct scratch *s;
	__u8 *ip, *udp;
	__u16 dport;

	if ((void *)(eth + 1) > data_end || eth->proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	ip = data + ip_off;
	if ((void *)(ip + IPV4_SIZE) > data_end || ip[0] >> 4 != 4 || (ip[0] & 0xf) < 5 || ip[9] != IPPROTO_UDP)
		return XDP_PASS;
	if ((ip[6] & 0x3f) || ip[7])	/* MF flag or a fragment offset */
		return XDP_PASS;
	ihl = (ip[0] & 0xf) * 4;
	ip_total = (__u32)ip[2] << 8 | ip[3];
	if (ip_off + ip_total > (__u32)(data_end - data) || ip_total < ihl + UDP_SIZE)
		return XDP_PASS;
	udp = ip + ihl;
	if ((void *)(udp + UDP_SIZE) > data_end)
		return XDP_PASS;
	udp_len = (__u32)udp[4] << 8 | udp[5];
	if (udp_len < UDP_SIZE || ihl + udp_len > ip_total)
		return XDP_PASS;
	dport = (__u16)udp[2] << 8 | udp[3];
	payload_off = ip_off + ihl + UDP_SIZE;
	payload_len = udp_len - UDP_SIZE;

	cfg = bpf_map_lookup_elem(&translator_config, &zero);
	s = begin(1);
	if (!cfg || !s)
		return XDP_PASS;
	__builtin_memcpy(&s->src_ip, ip + 12, 4);
	__builtin_memcpy(&s->dst_ip, ip + 16, 4);
	__builtin_memcpy(s->peer_mac, eth->src, 6);

	if (dport == DTA_PORT) {
		__u64 take = payload_len < RAW_MAX ? payload_len : RAW_MAX;

		count(CNT_RX_REPORTS);
		if (copy_payload(ctx, s, payload_off, take))
			reason = CNT_DROP_TRUNCATED;
		if (!reason)
			reason = decode_report(payload_len, cfg->profile);
		if (!reason)
			count(CNT_RX_KEY_WRITE + s->report.opcode - 1);
		if (!reason && s->report.retransmit)
			reason = check_sequence();
		if (!reason) {
			switch (s->report.opcode) {
			case DTA_OP_KEY_WRITE:
			case DTA_OP_KEY_INCREMENT:
				reason = on_keyed(ctx);
				break;
			case DTA_OP_APPEND:
				reason = on_append(ctx);
				break;
			case DTA_OP_POSTCARDING:
				reason = on_postcard(ctx);
				break;
			default:
				reason = on_sketch(ctx);
			}
		}
	} else if (dport == ROCE_PORT) {
		struct collector_key ck = { .ip = s->src_ip };

		if (!bpf_map_lookup_elem(&collector, &ck))
			return XDP_PASS;
		s->frame.payload_len = ip_total;
		reason = on_reply(ctx, ip_off, ihl);
		if (reason == PASS_UP)
			return XDP_PASS;
	} else {
		return XDP_PASS;
	}
	if (reason == DEFERRED)
		return XDP_DROP;
	if (reason)
		count(reason);
	return emit(ctx, s);
}

SEC("xdp")
int softdta_xdp(struct xdp_md *ctx)
{
	return translate(ctx);
}

/* ------------------------------------------------------------------------------------------------ */
/* idle flush, one entry per run (the control plane runs it with BPF_F_TEST_XDP_LIVE_FRAMES) */

/* Whether the flusher may emit on a QP: the data path has not emitted on it since a flush pass looked at least
 * `idle` ago. The flusher runs on another CPU; this keeps the two from interleaving PSNs on one QP. */
static __always_inline int flushable(struct qp_state_value *qs, struct scratch *s, __u64 idle)
{
	if (!qp_ready(qs, s))
		return 0;
	if (qs->frames_sent != qs->flush_mark) {
		qs->flush_mark = qs->frames_sent;
		qs->flush_mark_ns = s->now_ns;
		return 0;
	}
	return s->now_ns - qs->flush_mark_ns >= idle;
}

SEC("xdp")
int softdta_flush(struct xdp_md *ctx)
{
	struct translator_config_value *cfg;
	struct flush_entry entry;
	struct scratch *s;
	struct qp_ref ref;
	__u32 zero = 0, reason;
	__u64 now;

	cfg = bpf_map_lookup_elem(&translator_config, &zero);
	s = begin(0);
	if (!cfg || !s || bpf_map_peek_elem(&flush_queue, &entry))
		return XDP_DROP;
	now = clock_ns(s);
	if (entry.kind == FLUSH_APPEND) {
		struct append_state_value *as = bpf_map_lookup_elem(&append_state, &entry.index);
		struct append_list_key key = { .list_id = entry.owner };
		struct append_list_value *al = bpf_map_lookup_elem(&append_list, &key);
		__u32 taken, head = 0, filled = 0;

		if (!as || !al || !as->pending || as->first_pending_ns != entry.first_ns) {
			bpf_map_pop_elem(&flush_queue, &entry);
			return XDP_DROP;
		}
		if (now - entry.first_ns < cfg->flush_idle_ns)
			return XDP_DROP;
		bpf_map_pop_elem(&flush_queue, &entry);
		if (!qp_lookup(al->qp_index, &ref) || !flushable(ref.qs, s, cfg->flush_idle_ns)) {
			bpf_map_push_elem(&flush_queue, &entry, BPF_EXIST);
			return XDP_DROP;
		}
		if (!al->slot_count || al->batch * al->entry_size > MAX_WRITE_PAYLOAD)
			return XDP_DROP;
		/* The data path may have filled the batch since the first look: then it is no longer ours. */
		bpf_spin_lock(&as->lock);
		taken = as->pending && as->first_pending_ns == entry.first_ns;
		if (taken)
			head = take_batch(s, as, al, write_payload_at(0), &filled);
		bpf_spin_unlock(&as->lock);
		if (!taken)
			return XDP_DROP;
		for (__u32 i = 0; i < MAX_WRITE_PAYLOAD && filled + i < al->batch * al->entry_size; i++)
			s->out[(write_payload_at(0) + filled + i) & OUT_MASK] = 0;	/* pad with empty entries */
		count(CNT_APPEND_FLUSHES);
		reason = append_write(s, al, cfg, entry.owner, head);
	} else {
		struct postcard_cache_value *pc = bpf_map_lookup_elem(&postcard_cache, &entry.index);
		struct structure_key key = { .collector_ip = entry.owner, .primitive = PRIM_POSTCARDING };
		struct structure_value *st = bpf_map_lookup_elem(&structure, &key);
		__u32 taken;

		if (!pc || !st || !pc->valid || pc->first_ns != entry.first_ns) {
			bpf_map_pop_elem(&flush_queue, &entry);
			return XDP_DROP;
		}
		if (now - entry.first_ns < cfg->flush_idle_ns)
			return XDP_DROP;
		bpf_map_pop_elem(&flush_queue, &entry);
		if (!qp_lookup(st->qp_index, &ref) || !flushable(ref.qs, s, cfg->flush_idle_ns)) {
			bpf_map_push_elem(&flush_queue, &entry, BPF_EXIST);
			return XDP_DROP;
		}
		bpf_spin_lock(&pc->lock);
		taken = pc->valid && pc->first_ns == entry.first_ns;
		if (taken) {
			take_path(s, pc);
			pc->valid = 0;
		}
		bpf_spin_unlock(&pc->lock);
		if (!taken)
			return XDP_DROP;
		count(CNT_POSTCARD_FLUSHES);
		reason = postcard_write(s, &s->postcard, st, cfg, 0);
	}
	if (reason) {
		count(reason);
		return XDP_DROP;
	}
	ref.qs->flush_mark = ref.qs->frames_sent;	/* its own frames do not make the QP busy */
	return emit(ctx, s);
}

/* ------------------------------------------------------------------------------------------------ */
/* tc ingress: send every frame of a redundant report, in order */

SEC("tc")
int softdta_fanout(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	struct fanout_meta *meta = (void *)(long)skb->data_meta;
	struct fanout_value *entry;
	__u32 slot, len, ifindex;

	if ((void *)(meta + 1) > data || meta->magic != FANOUT_META_MAGIC)
		return TC_ACT_OK;
	slot = meta->cpu * FANOUT_MAX_ENTRIES + meta->sequence % FANOUT_MAX_ENTRIES;
	entry = bpf_map_lookup_elem(&fanout, &slot);
	if (!entry || entry->sequence != meta->sequence || entry->count < 1 || entry->count > MAX_REDUNDANCY ||
	    entry->frame_len != skb->len || entry->frame_len > FANOUT_FRAME_MAX) {
		count(CNT_DROP_FANOUT_LOST);
		return TC_ACT_SHOT;
	}
	len = entry->frame_len;
	ifindex = entry->ifindex ? entry->ifindex : skb->ifindex;
	for (__u32 i = 1; i < MAX_REDUNDANCY && i < entry->count; i++) {
		bpf_clone_redirect(skb, ifindex, 0);
		if (bpf_skb_store_bytes(skb, 0, entry->frames + (((i - 1) * len) & (2 * FANOUT_FRAME_MAX - 1)),
					NONZERO(len, FANOUT_FRAME_MAX),
					0)) {
			count(CNT_DROP_FANOUT_LOST);
			return TC_ACT_SHOT;
		}
	}
	return bpf_redirect(ifindex, 0);
}

/* For the far end of a veth pair: XDP_TX and redirected frames reach a veth only if its peer runs XDP. */
SEC("xdp")
int softdta_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
