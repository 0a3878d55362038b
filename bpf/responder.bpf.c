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

struct scratch {
	__u8 buf[IP_AT + BUF_SIZE + 8];	/* + 8: word loads at any masked index stay inside; IP_AT + BUF_SIZE:
					 * a request of up to BUF_SIZE bytes loads at IP_AT */
};

TABLE(responder_config, BPF_MAP_TYPE_ARRAY, __u32, struct responder_config_value, 1);
TABLE(responder_qp_state, BPF_MAP_TYPE_HASH, struct responder_qp_state_key, struct responder_qp_state_value,
      RESPONDER_QP_STATE_MAX_ENTRIES);
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

/* iCRC over buf[LRH_AT, LRH_AT + len): global, so the verifier checks its loop once. */
__noinline __u32 buf_crc(__u32 len)
{
	struct scratch *s = scratch_get();

	return s ? ~crc32_slice8_update(0xffffffff, s->buf, BUF_MASK, LRH_AT, len) : 0;
}

/* buf[from, from + len) to the arena at byte `offset`. Global: verified once. */
__noinline int arena_write(__u64 offset, __u32 from, __u32 len)
{
	struct scratch *s = scratch_get();

	return s ? arena_copy(s->buf, BUF_MASK, IP_LIMIT, offset, from, len) : -1;
}

struct reply {
	__u64 original;		/* Atomic ACK only */
	__u32 psn;
	__u32 syndrome;
	__u32 msn;
	__u32 atomic;
};

/* An ACK, NAK or Atomic ACK in buf; returns its length. */
static __noinline __u32 build_reply(struct scratch *s, const struct responder_config_value *cfg,
				    const struct responder_qp_value *qp, const struct reply *r)
{
	__u32 ext = r->atomic ? ROCE_EXT_LEN_RC_ATOMIC_ACK : ROCE_EXT_LEN_RC_ACK;
	__u32 ip_len = IPV4_SIZE + UDP_SIZE + BTH_SIZE + ext + ICRC_LEN, crc;
	__u8 *f = s->buf + IP_AT - ETHERNET_SIZE, *ip = s->buf + IP_AT, *udp = ip + IPV4_SIZE, *bth = udp + UDP_SIZE;
	__u8 *aeth = bth + BTH_SIZE;

	ipv4_header(ip, ip_len, cfg->ip, qp->remote_ip);
	udp_set_sport(udp, cfg->udp_sport);
	udp_set_dport(udp, ROCE_PORT);
	udp_set_length(udp, ip_len - IPV4_SIZE);
	bth_set_opcode(bth, r->atomic ? ROCE_OP_RC_ATOMIC_ACK : ROCE_OP_RC_ACK);
	put8(bth + BTH_MIGREQ_OFF, BTH_MIGREQ_MASK);	/* MigReq set, no padding */
	bth_set_pkey(bth, DEFAULT_PKEY);
	bth_set_dest_qp(bth, qp->remote_qpn);
	put8(bth + BTH_ACK_REQ_OFF, 0);
	bth_set_psn(bth, r->psn);
	aeth_set_syndrome(aeth, r->syndrome);
	aeth_set_msn(aeth, r->msn);
	if (r->atomic)
		atomic_ack_eth_set_original(aeth + AETH_SIZE, r->original);
	icrc_mask(s->buf + LRH_AT, ip, udp, bth);
	crc = buf_crc(LRH_STAND_IN_LEN + ip_len - ICRC_LEN);
	icrc_unmask(udp, bth);
	ipv4_finish(ip, 0, REPLY_TTL);
	for (int i = 0; i < ICRC_LEN; i++)
		s->buf[(IP_AT + ip_len - ICRC_LEN + i) & BUF_MASK] = crc >> (8 * i);
	/* The Ethernet header goes last: it overlaps the LRH stand-in the iCRC needed. */
	__builtin_memcpy(f + ETHERNET_DST_OFF, qp->remote_mac, ETHERNET_DST_LEN);
	__builtin_memcpy(f + ETHERNET_SRC_OFF, cfg->mac, ETHERNET_SRC_LEN);
	ethernet_set_ethertype(f, ETH_P_IP);
	count(RCNT_REPLIES_SENT);
	return ETHERNET_SIZE + ip_len;
}

static __always_inline __u32 ack(struct scratch *s, const struct responder_config_value *cfg,
				 const struct responder_qp_value *qp, __u32 psn, __u32 syndrome, __u32 msn)
{
	struct reply r = { .psn = psn, .syndrome = syndrome, .msn = msn };

	return build_reply(s, cfg, qp, &r);
}

static __always_inline __u32 atomic_ack(struct scratch *s, const struct responder_config_value *cfg,
					const struct responder_qp_value *qp, __u32 psn, __u32 msn, __u64 original)
{
	struct reply r = { .original = original, .psn = psn, .syndrome = ACK_SYNDROME, .msn = msn, .atomic = 1 };

	return build_reply(s, cfg, qp, &r);
}

/* Replaces the packet with the reply in buf and sends it back. */
static __always_inline int send_reply(struct xdp_md *ctx, struct scratch *s, __u64 len)
{
	__u64 have = ctx->data_end - ctx->data;
	__u8 *data, *end;

	if (len > 128 || len < ETHERNET_SIZE ||
	    (len != have && bpf_xdp_adjust_tail(ctx, (int)len - (int)have)))
		return XDP_DROP;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	for (__u32 i = 0; i < 128 && i < len; i++) {
		if (data + i + 1 > end)
			return XDP_DROP;
		data[i] = s->buf[(IP_AT - ETHERNET_SIZE + i) & BUF_MASK];
	}
	return XDP_TX;
}

static __always_inline __u32 write_payload(struct scratch *s, const struct responder_qp_value *qp,
					   const struct request *rq)
{
	const struct exec_write *w = &rq->w;

	if (!write_allowed(qp, w) || arena_write(write_offset(qp, w), w->payload_at, w->payload_len))
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
static __always_inline __u32 fatal(struct scratch *s, const struct responder_config_value *cfg,
				   const struct responder_qp_value *qp, struct responder_qp_state_value *qs,
				   __u32 syndrome, __u32 reason)
{
	count(reason);
	qs->error = 1;
	return ack(s, cfg, qp, qs->expected_psn, syndrome, qs->msn);
}

/* The RC rules; returns the length of a reply in buf, or 0. */
static __noinline __u32 serve_rc(struct scratch *s, const struct responder_config_value *cfg,
				 const struct responder_qp_value *qp, struct responder_qp_state_value *qs,
				 const struct request *rq)
{
	__u32 distance = (rq->psn - qs->expected_psn) & PSN_MASK;

	if (distance && distance < PSN_WINDOW) {
		count(RCNT_OUT_OF_SEQ_REQUEST);
		if (qs->nak_sent) {
			count(RCNT_OUT_OF_SEQUENCE_AFTER_NAK);
			return 0;
		}
		qs->nak_sent = 1;
		return ack(s, cfg, qp, qs->expected_psn, SYNDROME_NAK(NAK_PSN_SEQUENCE_ERROR), qs->msn);
	}
	if (distance) {
		count(RCNT_DUPLICATE_REQUEST);
		if (rq->w.opcode == ROCE_OP_RC_FETCH_ADD && qs->atomic_valid && qs->atomic_psn == rq->psn)
			return atomic_ack(s, cfg, qp, rq->psn, qs->msn, qs->atomic_original);
		return ack(s, cfg, qp, qs->expected_psn - 1, ACK_SYNDROME, qs->msn);
	}
	qs->nak_sent = 0;
	if (rq->w.opcode == ROCE_OP_RC_FETCH_ADD) {
		__u32 refused = fetch_add_refused(qp, rq->w.va, rq->w.rkey);
		__u64 original;

		if (refused == RCNT_MISALIGNED_ATOMIC)
			return fatal(s, cfg, qp, qs, SYNDROME_NAK(NAK_INVALID_REQUEST), refused);
		if (refused || execute_fetch_add(qp, rq->w.va, rq->add, &original))
			return fatal(s, cfg, qp, qs, SYNDROME_NAK(NAK_REMOTE_ACCESS_ERROR), RCNT_REMOTE_ACCESS_ERRORS);
		advance(qs);
		qs->atomic_valid = 1;
		qs->atomic_psn = rq->psn;
		qs->atomic_original = original;
		return atomic_ack(s, cfg, qp, rq->psn, qs->msn, original);
	}
	if (!write_payload(s, qp, rq))
		return fatal(s, cfg, qp, qs, SYNDROME_NAK(NAK_REMOTE_ACCESS_ERROR), RCNT_REMOTE_ACCESS_ERRORS);
	advance(qs);
	return rq->ack_req ? ack(s, cfg, qp, rq->psn, ACK_SYNDROME, qs->msn) : 0;
}

static __always_inline int respond(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct responder_config_value *cfg;
	struct responder_qp_state_value *qs;
	struct responder_qp_value *qp;
	struct request rq = {};
	__u32 zero = 0, ihl, crc, reason, reply = 0, src, dst;
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
	__builtin_memcpy(&src, d.ip + IPV4_SRC_OFF, IPV4_SRC_LEN);
	__builtin_memcpy(&dst, d.ip + IPV4_DST_OFF, IPV4_DST_LEN);
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
		icrc_mask(s->buf + LRH_AT, ip, udp, udp + UDP_SIZE);
		crc = buf_crc(LRH_STAND_IN_LEN + ip_total - ICRC_LEN);
		for (int i = 0; i < ICRC_LEN; i++)
			if (s->buf[(IP_AT + ip_total - ICRC_LEN + i) & BUF_MASK] != ((crc >> (8 * i)) & 0xff))
				reason = RCNT_ICRC_ERRORS;
	}
	if (reason) {
		count(reason);
		return XDP_DROP;
	}
	qp = bpf_map_lookup_elem(&responder_qp, &rq.w.qpn);
	qs = bpf_map_lookup_elem(&responder_qp_state, &rq.w.qpn);
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
	reply = serve_rc(s, cfg, qp, qs, &rq);
	return reply ? send_reply(ctx, s, reply) : XDP_DROP;
}

SEC("xdp")
int softdta_responder(struct xdp_md *ctx)
{
	return respond(ctx);
}

char LICENSE[] SEC("license") = "GPL";
