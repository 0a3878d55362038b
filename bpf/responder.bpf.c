// SPDX-License-Identifier: GPL-2.0
/* softdta's xdp collector backend: an XDP program that is the collector's RDMA NIC, byte for byte like
 * softdta.core.responder (the reference).
 *
 * RoCEv2 frames (UDP 4791) to the collector's IP are checked as rdma_rxe checks them: iCRC, destination QP,
 * source GID, the PSN rules of RC and UC, R_Key, bounds and access rights. WRITEs land in `arena`, an
 * mmapable array that userspace maps as the collector's memory; Fetch&Add is atomic there. RC ACKs, NAKs and
 * Atomic ACKs go back with XDP_TX. DTA reports (UDP to DTA_PORT) go on to the local translator by a tail call
 * when the collector translates locally (responder_local; bpf/local.bpf.c). Everything else passes up the stack
 * untouched. Executing a request is include/execute.h's, shared with the local translator.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "softdta_spec.h"
#include "crc.h"
#include "maps.h"
#include "parsing.h"
#include "roce.h"
#include "execute.h"

#define BUF_SIZE 2048		/* the frame being checked, then the reply; a power of two for index masks */
#define BUF_MASK (BUF_SIZE - 1)
#define IP_AT 16		/* where the IP packet sits: after 8 bytes that stand for the LRH in the iCRC,
				 * which a reply's Ethernet header then overwrites */
#define LRH_AT (IP_AT - LRH_STAND_IN_LEN)
#define IP_LIMIT RESPONDER_IP_LIMIT
#define SYNDROME_NAK(code) ((AETH_NAK << AETH_KIND_SHIFT) | (code))

_Static_assert(IP_LIMIT <= BUF_SIZE, "a request must fit the scratch buffer");

/* The iCRC's first ICRC_PREFIX bytes, up to the BTH's PSN word, are the same in every request of one QP and
 * opcode, and in every reply of one QP and kind: the LRH stand-in, the IPv4 and UDP headers with their variant
 * fields masked, and the BTH's opcode, flags, P_Key and destination QP. So each CPU keeps the last request's,
 * compared byte for byte, with the CRC state after them (and the last reply's, below). */
#define ICRC_PREFIX (LRH_STAND_IN_LEN + IPV4_SIZE + UDP_SIZE + BTH_SIZE - 4)
#define ICRC_PREFIX_WORDS (ICRC_PREFIX / 8)

struct icrc_kept {
	__u64 words[ICRC_PREFIX_WORDS];	/* the first ICRC_PREFIX bytes, masked; all zero (matching nothing: the */
	__u32 tail;			/* LRH stand-in is all ones) until the first */
	__u32 crc;			/* the raw CRC state after them */
};

/* The last reply's headers, from the Ethernet header to the BTH's PSN word, are the same for every reply of one
 * kind to one QP: each CPU keeps them, with what they were built from and the iCRC state after them. */
#define REPLY_KEPT_WORDS 7
struct reply_kept {
	__u64 from[4];			/* the IPs, the remote QPN and the kind, both MACs and the UDP source port;
					 * all zero (matching nothing: `from[1]` has a bit set) until the first */
	__u64 headers[REPLY_KEPT_WORDS];	/* the reply's first 56 bytes, of which the first 50 are kept ones */
	__u32 crc;			/* the raw CRC state after its first ICRC_PREFIX bytes, masked */
};
_Static_assert(8 * REPLY_KEPT_WORDS >= ETHERNET_SIZE + IPV4_SIZE + UDP_SIZE + BTH_SIZE - 4,
	       "the kept words reach the BTH's PSN word");

/* The kept headers live in the part of the scratch past the largest request (IP_LIMIT bytes at IP_AT, and the
 * 8 bytes a word load may read after it), so that the map keeps its size: a collector adopts the pinned maps of
 * a killed one only if each is the same size. */
struct scratch {
	union {
		__u8 buf[IP_AT + BUF_SIZE + 8];	/* + 8: word loads at any masked index stay inside; IP_AT +
						 * BUF_SIZE: a request of up to BUF_SIZE bytes loads at IP_AT */
		struct {
			__u8 request_bytes[IP_AT + IP_LIMIT + 8];
			struct icrc_kept request;
			struct reply_kept reply;
		};
	};
};
_Static_assert(sizeof(struct scratch) == IP_AT + BUF_SIZE + 8, "the scratch map keeps its size");
_Static_assert(ICRC_PREFIX == 8 * ICRC_PREFIX_WORDS + 4, "the prefix is whole words and a half");

TABLE(responder_qp_state, BPF_MAP_TYPE_ARRAY, struct responder_qp_state_key, struct responder_qp_state_value,
      RESPONDER_QP_STATE_MAX_ENTRIES);	/* by slot, as responder_qp (responder_qp_slot) */
TABLE(responder_scratch, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct scratch, 1);

/* Local translation (bpf/local.bpf.c): reports to DTA_PORT go to slot 0's program, if there is one. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, 1);
} responder_local SEC(".maps");

/* What one frame asks for, as parsed: a WRITE's fields in `w` (a Fetch&Add's address and R_Key too). */
struct request {
	struct exec_write w;
	__u64 add;
	__u32 psn;
	__u8 ack_req;
};

static __always_inline void count(__u32 slot)
{
	responder_count(slot);
}

static __always_inline struct scratch *scratch_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&responder_scratch, &zero);
}

/* icrc_mask with the LRH stand-in stored as one word (buf[LRH_AT] is 8-byte aligned). */
static __always_inline void mask_variant_fields(struct scratch *s, __u8 *ip, __u8 *udp, __u8 *bth)
{
	_Static_assert(LRH_STAND_IN_LEN == 8 && LRH_AT % 8 == 0, "the LRH stand-in is one aligned word");
	*(__u64 *)(s->buf + LRH_AT) = ~0ULL;
	ipv4_icrc_variant_ones(ip);
	udp_icrc_variant_ones(udp);
	bth_icrc_variant_ones(bth);
}

/* The raw CRC state `crc` continued over buf[start, start + len): global, so the verifier checks its loop once. */
__noinline __u32 buf_crc(__u32 crc, __u32 start, __u32 len)
{
	struct scratch *s = scratch_get();

	return s ? crc32_slice8_update(crc, s->buf, BUF_MASK, start, len) : 0;
}

/* The raw CRC state after the first ICRC_PREFIX bytes at buf[LRH_AT] (masked): the one kept when they are
 * the ones kept, else computed and kept. */
static __always_inline __u32 icrc_prefix(struct scratch *s, struct icrc_kept *kept)
{
	const __u8 *p = s->buf + LRH_AT;
	__u64 differ = *(const __u32 *)(p + 8 * ICRC_PREFIX_WORDS) ^ kept->tail;
	__u32 crc;

#pragma unroll
	for (int i = 0; i < ICRC_PREFIX_WORDS; i++)
		differ |= *(const __u64 *)(p + 8 * i) ^ kept->words[i];
	if (!differ)
		return kept->crc;
	crc = crc32_slice8_update_short(0xffffffff, s->buf, BUF_MASK, LRH_AT, ICRC_PREFIX);
#pragma unroll
	for (int i = 0; i < ICRC_PREFIX_WORDS; i++)
		kept->words[i] = *(const __u64 *)(p + 8 * i);
	kept->tail = *(const __u32 *)(p + 8 * ICRC_PREFIX_WORDS);
	kept->crc = crc;
	return crc;
}

/* 0 when the request's iCRC (its last 4 bytes, at buf[IP_AT + ip_total - ICRC_LEN]) is right. The request's
 * variant fields are masked in buf. Tails of up to 100 bytes (a multiple of 4) hash inline. */
static __always_inline int icrc_wrong(struct scratch *s, __u64 ip_total)
{
	__u32 covered = LRH_STAND_IN_LEN + ip_total - ICRC_LEN, rest = covered - ICRC_PREFIX;
	__u32 crc = icrc_prefix(s, &s->request);

	if (rest % 4 == 0 && rest <= 8 * CRC_SHORT_WORDS + 4)
		crc = crc32_slice8_update_short(crc, s->buf, BUF_MASK, LRH_AT + ICRC_PREFIX, rest);
	else
		crc = buf_crc(crc, LRH_AT + ICRC_PREFIX, rest);
	/* the iCRC goes on the wire least significant byte first: a little-endian word */
	return *(const __u32 *)(s->buf + ((IP_AT + ip_total - ICRC_LEN) & BUF_MASK)) != ~crc;
}

/* buf[from, from + len) to the arena at byte `offset`. */
static __always_inline int arena_write(struct scratch *s, __u64 offset, __u32 from, __u32 len)
{
	return arena_copy(s->buf, BUF_MASK, IP_LIMIT, offset, from, len);
}

struct reply {
	__u64 original;		/* Atomic ACK only */
	__u32 psn;
	__u32 syndrome;
	__u32 msn;
	__u32 atomic;
};

/* What differs from reply to reply of one kind to one QP: AckReq (clear), PSN, AETH, and the original value. */
static __always_inline void reply_fields(__u8 *bth, __u8 *aeth, const struct reply *r)
{
	put8(bth + BTH_ACK_REQ_OFF, 0);
	bth_set_psn(bth, r->psn);
	aeth_set_syndrome(aeth, r->syndrome);
	aeth_set_msn(aeth, r->msn);
	if (r->atomic)
		atomic_ack_eth_set_original(aeth + AETH_SIZE, r->original);
}

#define ACK_IP_LEN (IPV4_SIZE + UDP_SIZE + BTH_SIZE + ROCE_EXT_LEN_RC_ACK + ICRC_LEN)
#define ATOMIC_ACK_IP_LEN (IPV4_SIZE + UDP_SIZE + BTH_SIZE + ROCE_EXT_LEN_RC_ATOMIC_ACK + ICRC_LEN)
_Static_assert((LRH_STAND_IN_LEN + ATOMIC_ACK_IP_LEN - ICRC_LEN) % 4 == 0 &&
	       LRH_STAND_IN_LEN + ATOMIC_ACK_IP_LEN - ICRC_LEN - ICRC_PREFIX <= 8 * CRC_SHORT_WORDS + 4 &&
	       (LRH_STAND_IN_LEN + ACK_IP_LEN - ICRC_LEN) % 4 == 0, "a reply's iCRC runs inline");

/* An ACK, NAK or Atomic ACK in buf; returns its length. Inline, with its iCRC: its one call site is respond.
 * The headers up to the BTH's PSN word come from the kept ones when they were built from the same fields. */
static __always_inline __u32 build_reply(struct scratch *s, const struct responder_config_value *cfg,
					 const struct responder_qp_value *qp, const struct reply *r)
{
	__u32 ext = r->atomic ? ROCE_EXT_LEN_RC_ATOMIC_ACK : ROCE_EXT_LEN_RC_ACK;
	__u32 ip_len = IPV4_SIZE + UDP_SIZE + BTH_SIZE + ext + ICRC_LEN, crc;
	__u8 *f = s->buf + IP_AT - ETHERNET_SIZE, *ip = s->buf + IP_AT, *udp = ip + IPV4_SIZE, *bth = udp + UDP_SIZE;
	__u8 *aeth = bth + BTH_SIZE;
	struct reply_kept *kept = &s->reply;
	__u64 from[4] = {
		(__u64)qp->remote_ip << 32 | cfg->ip,
		(__u64)qp->remote_qpn | (__u64)(r->atomic ? 3 : 1) << 32,
		*(const __u64 *)qp->remote_mac,	/* with the QP's transport and access bytes after it */
		*(const __u64 *)cfg->mac,	/* with udp_sport after it */
	};

	_Static_assert(__builtin_offsetof(struct responder_qp_value, remote_mac) % 8 == 0 &&
		       __builtin_offsetof(struct responder_qp_value, remote_mac) + 8 <= sizeof(struct responder_qp_value) &&
		       __builtin_offsetof(struct responder_config_value, mac) == 0 &&
		       __builtin_offsetof(struct responder_config_value, udp_sport) == 6, "whole words of fields");
	if (!((from[0] ^ kept->from[0]) | (from[1] ^ kept->from[1]) | (from[2] ^ kept->from[2]) |
	      (from[3] ^ kept->from[3]))) {
#pragma unroll
		for (int i = 0; i < REPLY_KEPT_WORDS; i++)
			*(__u64 *)(f + 8 * i) = kept->headers[i];
		reply_fields(bth, aeth, r);
		/* nothing after the prefix is a variant field */
		crc = ~crc32_slice8_update_short(kept->crc, s->buf, BUF_MASK, LRH_AT + ICRC_PREFIX,
						 LRH_STAND_IN_LEN + ip_len - ICRC_LEN - ICRC_PREFIX);
		*(__u32 *)(s->buf + ((IP_AT + ip_len - ICRC_LEN) & BUF_MASK)) = crc;
		count(RCNT_REPLIES_SENT);
		return ETHERNET_SIZE + ip_len;
	}
	ipv4_header(ip, ip_len, cfg->ip, qp->remote_ip);
	udp_set_sport(udp, cfg->udp_sport);
	udp_set_dport(udp, ROCE_PORT);
	udp_set_length(udp, ip_len - IPV4_SIZE);
	bth_set_opcode(bth, r->atomic ? ROCE_OP_RC_ATOMIC_ACK : ROCE_OP_RC_ACK);
	put8(bth + BTH_MIGREQ_OFF, BTH_MIGREQ_MASK);	/* MigReq set, no padding */
	bth_set_pkey(bth, DEFAULT_PKEY);
	bth_set_dest_qp(bth, qp->remote_qpn);
	reply_fields(bth, aeth, r);
	mask_variant_fields(s, ip, udp, bth);
	kept->crc = crc32_slice8_update_short(0xffffffff, s->buf, BUF_MASK, LRH_AT, ICRC_PREFIX);
	crc = ~crc32_slice8_update_short(kept->crc, s->buf, BUF_MASK, LRH_AT + ICRC_PREFIX,
					 LRH_STAND_IN_LEN + ip_len - ICRC_LEN - ICRC_PREFIX);
	icrc_unmask(udp, bth);
	ipv4_finish(ip, 0, REPLY_TTL);
	*(__u32 *)(s->buf + ((IP_AT + ip_len - ICRC_LEN) & BUF_MASK)) = crc;	/* little-endian, as the iCRC goes */
	/* The Ethernet header goes last: it overlaps the LRH stand-in the iCRC needed. */
	_Static_assert(ETHERNET_DST_LEN == 6 && ETHERNET_SRC_LEN == 6, "MACs are copied as a word and a half");
	*(__u32 *)(f + ETHERNET_DST_OFF) = *(const __u32 *)qp->remote_mac;
	*(__u16 *)(f + ETHERNET_DST_OFF + 4) = *(const __u16 *)(qp->remote_mac + 4);
	*(__u32 *)(f + ETHERNET_SRC_OFF) = *(const __u32 *)cfg->mac;
	*(__u16 *)(f + ETHERNET_SRC_OFF + 4) = *(const __u16 *)(cfg->mac + 4);
	ethernet_set_ethertype(f, ETH_P_IP);
#pragma unroll
	for (int i = 0; i < REPLY_KEPT_WORDS; i++)
		kept->headers[i] = *(const __u64 *)(f + 8 * i);
#pragma unroll
	for (int i = 0; i < 4; i++)
		kept->from[i] = from[i];
	count(RCNT_REPLIES_SENT);
	return ETHERNET_SIZE + ip_len;
}

/* The reply serve_rc asks for: an ACK or NAK, */
static __always_inline __u32 ack(struct reply *r, __u32 psn, __u32 syndrome, __u32 msn)
{
	r->psn = psn;
	r->syndrome = syndrome;
	r->msn = msn;
	r->atomic = 0;
	return 1;
}

/* or an Atomic ACK. */
static __always_inline __u32 atomic_ack(struct reply *r, __u32 psn, __u32 msn, __u64 original)
{
	r->original = original;
	r->psn = psn;
	r->syndrome = ACK_SYNDROME;
	r->msn = msn;
	r->atomic = 1;
	return 1;
}

/* Copies `len` bytes, a constant of 8 or more, from `from` to `to` in words: whole ones, then one that ends where
 * the bytes end. */
static __always_inline void copy_words(__u8 *to, const __u8 *from, __u32 len)
{
#pragma unroll
	for (__u32 i = 0; i + 8 <= len; i += 8)
		*(__u64 *)(to + i) = *(const __u64 *)(from + i);
	if (len % 8)
		*(__u64 *)(to + len - 8) = *(const __u64 *)(from + len - 8);
}

/* Replaces the packet with the reply of `len` bytes at buf[IP_AT - ETHERNET_SIZE] and sends it back. */
static __always_inline int send_reply(struct xdp_md *ctx, struct scratch *s, __u64 len)
{
	__u64 have = ctx->data_end - ctx->data;
	__u8 *data, *end, *from = s->buf + IP_AT - ETHERNET_SIZE;

	if ((len != ETHERNET_SIZE + ACK_IP_LEN && len != ETHERNET_SIZE + ATOMIC_ACK_IP_LEN) ||
	    (len != have && bpf_xdp_adjust_tail(ctx, (int)len - (int)have)))
		return XDP_DROP;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (len == ETHERNET_SIZE + ACK_IP_LEN) {
		if (data + ETHERNET_SIZE + ACK_IP_LEN > end)
			return XDP_DROP;
		copy_words(data, from, ETHERNET_SIZE + ACK_IP_LEN);
	} else {
		if (data + ETHERNET_SIZE + ATOMIC_ACK_IP_LEN > end)
			return XDP_DROP;
		copy_words(data, from, ETHERNET_SIZE + ATOMIC_ACK_IP_LEN);
	}
	return XDP_TX;
}

static __always_inline __u32 write_payload(struct scratch *s, const struct responder_qp_value *qp,
					   const struct request *rq)
{
	const struct exec_write *w = &rq->w;

	if (!write_allowed(qp, w) || arena_write(s, write_offset(qp, w), w->payload_at, w->payload_len))
		return 0;
	execute_write_done(qp, w);
	return 1;
}

/* Parses the RoCE frame now in buf; returns 0 or a responder counter for a malformed frame. */
static __always_inline __u32 parse_request(struct scratch *s, __u32 ip_header_len, __u64 ip_len, struct request *rq)
{
	__u8 *body = s->buf + IP_AT + ((ip_header_len + UDP_SIZE) & 127), *eh = body + BTH_SIZE;
	__u64 body_len = ip_len - ip_header_len - UDP_SIZE, end;
	int ext;

	if (body_len < BTH_SIZE + ICRC_LEN)
		return RCNT_MALFORMED;
	rq->w.opcode = bth_get_opcode(body);
	ext = roce_ext_len(rq->w.opcode);
	if (ext < 0 || body_len - ICRC_LEN < BTH_SIZE + (__u64)ext)
		return RCNT_MALFORMED;
	end = body_len - ICRC_LEN - bth_get_pad_count(body);
	if (end < BTH_SIZE + (__u64)ext)
		return RCNT_MALFORMED;
	rq->w.qpn = bth_get_dest_qp(body);
	rq->ack_req = bth_get_ack_req(body);
	rq->psn = bth_get_psn(body);
	/* RETH and AtomicETH start alike: the address, then the R_Key */
	rq->w.va = reth_get_va(eh);
	rq->w.rkey = reth_get_rkey(eh);
	if (ext == ROCE_EXT_LEN_RC_FETCH_ADD) {
		rq->add = atomic_eth_get_swap_add(eh);
	} else if (ext >= RETH_SIZE) {
		rq->w.dma_len = reth_get_dma_length(eh);
		if (ext == RETH_SIZE + IMMDT_SIZE)
			rq->w.immediate = immdt_get_immediate(eh + RETH_SIZE);
	}
	rq->w.payload_at = IP_AT + ip_header_len + UDP_SIZE + BTH_SIZE + ext;
	rq->w.payload_len = end - BTH_SIZE - ext;
	return 0;
}

static __always_inline void advance(struct responder_qp_state_value *qs)
{
	qs->expected_psn = (qs->expected_psn + 1) & PSN_MASK;
	qs->msn = (qs->msn + 1) & PSN_MASK;
	count(RCNT_EXECUTED);
}

/* Access errors NAK once and move the QP to ERROR, as rxe does; only re-creating it helps. */
static __always_inline __u32 fatal(struct reply *r, struct responder_qp_state_value *qs, __u32 syndrome,
				   __u32 reason)
{
	count(reason);
	qs->error = 1;
	return ack(r, qs->expected_psn, syndrome, qs->msn);
}

/* The RC rules; returns 1 when they call for the reply they leave in r. */
static __always_inline __u32 serve_rc(struct scratch *s, const struct responder_qp_value *qp,
				       struct responder_qp_state_value *qs, const struct request *rq, struct reply *r)
{
	__u32 distance = (rq->psn - qs->expected_psn) & PSN_MASK;

	if (distance && distance < PSN_WINDOW) {
		count(RCNT_OUT_OF_SEQ_REQUEST);
		if (qs->nak_sent) {
			count(RCNT_OUT_OF_SEQUENCE_AFTER_NAK);
			return 0;
		}
		qs->nak_sent = 1;
		return ack(r, qs->expected_psn, SYNDROME_NAK(NAK_PSN_SEQUENCE_ERROR), qs->msn);
	}
	if (distance) {
		count(RCNT_DUPLICATE_REQUEST);
		if (rq->w.opcode == ROCE_OP_RC_FETCH_ADD && qs->atomic_valid && qs->atomic_psn == rq->psn)
			return atomic_ack(r, rq->psn, qs->msn, qs->atomic_original);
		return ack(r, qs->expected_psn - 1, ACK_SYNDROME, qs->msn);
	}
	qs->nak_sent = 0;
	if (rq->w.opcode == ROCE_OP_RC_FETCH_ADD) {
		__u32 refused = fetch_add_refused(qp, rq->w.va, rq->w.rkey);
		__u64 original;

		if (refused == RCNT_MISALIGNED_ATOMIC)
			return fatal(r, qs, SYNDROME_NAK(NAK_INVALID_REQUEST), refused);
		if (refused || execute_fetch_add(qp, rq->w.va, rq->add, &original))
			return fatal(r, qs, SYNDROME_NAK(NAK_REMOTE_ACCESS_ERROR), RCNT_REMOTE_ACCESS_ERRORS);
		advance(qs);
		qs->atomic_valid = 1;
		qs->atomic_psn = rq->psn;
		qs->atomic_original = original;
		return atomic_ack(r, rq->psn, qs->msn, original);
	}
	if (!write_payload(s, qp, rq))
		return fatal(r, qs, SYNDROME_NAK(NAK_REMOTE_ACCESS_ERROR), RCNT_REMOTE_ACCESS_ERRORS);
	advance(qs);
	return rq->ack_req ? ack(r, rq->psn, ACK_SYNDROME, qs->msn) : 0;
}

static __always_inline int respond(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct responder_config_value *cfg;
	struct responder_qp_state_key state_key;
	struct responder_qp_state_value *qs;
	struct responder_qp_value *qp;
	struct request rq = {};
	struct reply r = {};
	__u32 zero = 0, ihl, reason, src, dst;
	__u64 ip_total;
	struct scratch *s;
	struct udp4 d;
	__u8 *ip, *udp;

	if (parse_udp4(data, data_end, &d))
		return XDP_PASS;
	if (d.dport != ROCE_PORT) {
		if (d.dport == DTA_PORT)
			bpf_tail_call(ctx, &responder_local, 0);	/* returns only without local translation */
		return XDP_PASS;
	}
	ihl = d.ihl;

	/* A RoCEv2 frame: from here every outcome is counted. */
	cfg = bpf_map_lookup_elem(&responder_config, &zero);
	s = scratch_get();
	if (!cfg || !s)
		return XDP_PASS;
	_Static_assert(IPV4_SRC_LEN == 4 && IPV4_DST_LEN == 4, "addresses are loaded as words");
	src = *(const __u32 *)(d.ip + IPV4_SRC_OFF);	/* network order, as the maps keep them */
	dst = *(const __u32 *)(d.ip + IPV4_DST_OFF);
	/* The RoCE payload ends where UDP says; bytes after it (Ethernet padding) are not part of it. */
	ip_total = ihl + d.udp_len;
	/* ip_total is in [1, IP_LIMIT] here, so the mask keeps it whole and shows the verifier it fits. */
	if (ip_total > IP_LIMIT ||
	    bpf_xdp_load_bytes(ctx, ETHERNET_SIZE, s->buf + IP_AT, ((ip_total - 1) & BUF_MASK) + 1)) {
		count(RCNT_MALFORMED);
		return XDP_DROP;
	}
	reason = parse_request(s, ihl, ip_total, &rq);
	if (!reason && dst != cfg->ip)
		reason = RCNT_NOT_FOR_THIS_PORT;
	if (!reason) {
		ip = s->buf + IP_AT;
		udp = ip + (ihl & IPV4_MAX_HEADER_LEN);
		mask_variant_fields(s, ip, udp, udp + UDP_SIZE);
		if (icrc_wrong(s, ip_total))
			reason = RCNT_ICRC_ERRORS;
	}
	if (reason) {
		count(reason);
		return XDP_DROP;
	}
	qp = responder_qp_find(cfg, rq.w.qpn);
	state_key.slot = responder_qp_slot(cfg, rq.w.qpn);
	qs = bpf_map_lookup_elem(&responder_qp_state, &state_key);
	if (!qp || !qs)
		reason = RCNT_UNKNOWN_QPN;
	else if (qp->remote_ip != src)
		reason = RCNT_SOURCE_GID_MISMATCH;
	else if (qs->error)
		reason = RCNT_QP_IN_ERROR;
	else if (qp->transport == TRANSPORT_RC ? rq.w.opcode != ROCE_OP_RC_WRITE_ONLY &&
					 rq.w.opcode != ROCE_OP_RC_WRITE_ONLY_IMM && rq.w.opcode != ROCE_OP_RC_FETCH_ADD
				       : rq.w.opcode != ROCE_OP_UC_WRITE_ONLY && rq.w.opcode != ROCE_OP_UC_WRITE_ONLY_IMM)
		reason = RCNT_OPCODE_NOT_VALID;
	if (reason || !qp || !qs) {
		count(reason);
		return XDP_DROP;
	}
	if (qp->transport == TRANSPORT_UC) {
		/* UC has no ACKs: a single-packet WRITE executes whatever its PSN, and a bad one is just dropped. */
		qs->expected_psn = (rq.psn + 1) & PSN_MASK;
		if (write_payload(s, qp, &rq))
			count(RCNT_EXECUTED);
		else
			count(RCNT_UC_ACCESS_ERROR);
		return XDP_DROP;
	}
	if (!serve_rc(s, qp, qs, &rq, &r))
		return XDP_DROP;
	return send_reply(ctx, s, build_reply(s, cfg, qp, &r));
}

SEC("xdp")
int softdta_responder(struct xdp_md *ctx)
{
	return respond(ctx);
}

char LICENSE[] SEC("license") = "GPL";
