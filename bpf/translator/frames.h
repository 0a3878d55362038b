/* translator.bpf.c: Frames. */
#ifndef SOFTDTA_TRANSLATOR_FRAMES_H
#define SOFTDTA_TRANSLATOR_FRAMES_H

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


/* The sizes of the frame s->frame describes: its extended transport header, payload, pad and IP length. */
struct frame_shape {
	__u32 ext;
	__u32 payload;
	__u32 pad;
	__u32 ip_len;
};

static __always_inline struct frame_shape frame_shape_of(const struct frame_params *fp)
{
	struct frame_shape f = { .ext = request_ext_len(fp->opcode), .payload = fp->payload_len & 511 };

	f.pad = (4 - (f.payload & 3)) & 3;
	f.ip_len = IPV4_SIZE + UDP_SIZE + BTH_SIZE + f.ext + f.payload + f.pad + ICRC_LEN;
	return f;
}

/* Raw CRC-32 state `crc` carried over s->out[start, start + len): a global function, so the verifier checks its
 * loop only once. */
__noinline __u32 out_crc_update(struct scratch *s, __u32 crc, __u32 start, __u32 len)
{
	if (!s)
		return 0;
	return crc32_slice8_update(crc, s->out, OUT_MASK, start, len);
}

/* The raw CRC-32 state carried over s->out[start, start + len), inline for up to TAIL_CRC_INLINE bytes (the
 * variable tail of a keyed frame, a multiple of 4 like every frame's): a subprogram call costs about as much as
 * hashing 32 bytes where returns go through a mitigation thunk (docs/translator.md, "Cost per report"). */
static __always_inline __u32 out_crc_tail(struct scratch *s, __u32 crc, __u32 start, __u32 len)
{
	if (len > TAIL_CRC_INLINE || len & 3)
		return out_crc_update(s, crc, start, len);
	return crc32_slice8_update_short(crc, s->out, OUT_MASK, start, len);
}

/* iCRC over s->out[start, start + len). */
static __always_inline __u32 out_crc(struct scratch *s, __u32 start, __u32 len)
{
	return ~out_crc_update(s, 0xffffffff, start, len);
}

static __always_inline int same_mac(const __u8 *a, const __u8 *b)
{
	return *(const __u32 *)a == *(const __u32 *)b && *(const __u16 *)(a + 4) == *(const __u16 *)(b + 4);
}

#ifdef SOFTDTA_LOCAL
#include "translator/local.h"
#else
/* Whether a cache entry holds the fixed part of this shape as the QP and the configuration now define it. */
static __always_inline int frame_cache_fits(const struct frame_cache *c, __u32 shape, const struct qp_value *q,
					    const struct translator_config_value *cfg)
{
	return c->shape == shape && c->remote_qpn == q->remote_qpn && c->collector_ip == q->collector_ip &&
	       c->src_ip == cfg->src_ip && c->udp_sport == cfg->udp_sport && c->dscp == cfg->dscp &&
	       c->ttl == cfg->ttl && same_mac(c->collector_mac, q->collector_mac) && same_mac(c->src_mac, cfg->src_mac);
}

/* Builds the fixed part of a frame at f (out[at]) and keeps it, with its iCRC state, in the cache entry. */
static __noinline void frame_cache_fill(struct scratch *s, __u32 at, struct frame_cache *c, __u32 shape,
					const struct qp_value *q)
{
	const struct translator_config_value *cfg = config_get();
	__u32 ip_len = shape & 0xffff;
	__u8 *f, *ip, *udp, *bth;

	if (!s || !c || !q || !cfg || at > OUT_LIMIT || ip_len > OUT_LIMIT)
		return;
	f = s->out + at;
	ip = f + ETHERNET_SIZE;
	udp = ip + IPV4_SIZE;
	bth = udp + UDP_SIZE;
	ipv4_header(ip, ip_len, cfg->src_ip, q->collector_ip);
	udp_set_sport(udp, cfg->udp_sport);
	udp_set_dport(udp, ROCE_PORT);
	udp_set_length(udp, ip_len - IPV4_SIZE);
	bth_set_opcode(bth, shape >> 24);
	/* MigReq set, as rdma_rxe sends */
	put8(bth + BTH_MIGREQ_OFF, BTH_MIGREQ_MASK | (shape >> 16 & 3) << BTH_PAD_COUNT_SHIFT);
	bth_set_pkey(bth, DEFAULT_PKEY);
	put8(bth + BTH_FECN_OFF, 0);
	bth_set_dest_qp(bth, q->remote_qpn);
	/* iCRC: eight 0xff bytes stand for the LRH, then the IP packet with its variant fields set to ones. */
	icrc_mask(ip - LRH_STAND_IN_LEN, ip, udp, bth);
	c->crc_state = crc32_slice8_update(0xffffffff, s->out, OUT_MASK, at + ETHERNET_SIZE - LRH_STAND_IN_LEN,
					   LRH_STAND_IN_LEN + ICRC_VARIABLE_FROM);
	icrc_unmask(udp, bth);
	ipv4_finish(ip, cfg->dscp, cfg->ttl);
	__builtin_memcpy(f + ETHERNET_DST_OFF, q->collector_mac, ETHERNET_DST_LEN);
	__builtin_memcpy(f + ETHERNET_SRC_OFF, cfg->src_mac, ETHERNET_SRC_LEN);
	ethernet_set_ethertype(f, ETH_P_IP);
	for (int i = 0; i < FRAME_FIXED_WORDS; i++)
		*(__u64 *)(c->headers + 8 * i) = *(__u64 *)(f + 8 * i);
	c->shape = shape;
	c->remote_qpn = q->remote_qpn;
	c->collector_ip = q->collector_ip;
	c->src_ip = cfg->src_ip;
	c->udp_sport = cfg->udp_sport;
	c->dscp = cfg->dscp;
	c->ttl = cfg->ttl;
	__builtin_memcpy(c->collector_mac, q->collector_mac, ETHERNET_DST_LEN);
	__builtin_memcpy(c->src_mac, cfg->src_mac, ETHERNET_SRC_LEN);
}

/* Frame 0's fixed part, out of cache entry c into s->out, and out holds all of frame 0 again. */
static __always_inline void fixed_to_out(struct scratch *s, const struct frame_cache *c)
{
	for (int i = 0; i < FRAME_FIXED_LEN / 8; i++)
		*(__u64 *)(s->out + 8 * i) = *(__u64 *)(c->headers + 8 * i);
	for (int i = FRAME_FIXED_LEN / 8 * 8; i < FRAME_FIXED_LEN; i++)
		s->out[i] = c->headers[i];
	s->out_fixed_cache = 0;
}

/* One RoCEv2 frame at s->out[at] from s->frame; the payload already sits after the headers. Allocates the
 * QP's next PSN. Returns the frame length, 0 if the frame would not fit. The fixed part comes from the QP's
 * frame cache; only the variable tail is written and hashed per frame. Frame 0's fixed part is left in the
 * cache (s->out_fixed_cache), for emit to copy into the packet. */
static __noinline __u32 build_roce(struct scratch *s, __u32 at, const struct qp_ref *ref,
				   const struct translator_config_value *cfg)
{
	const struct qp_value *q = ref->q;
	struct qp_state_value *qs = ref->qs;
	struct frame_params *fp = &s->frame;
	struct frame_shape sizes = frame_shape_of(fp);
	__u32 ext = sizes.ext, payload = sizes.payload, pad = sizes.pad, ip_len = sizes.ip_len;
	__u32 shape = (__u32)fp->opcode << 24 | pad << 16 | ip_len;
	__u32 cache_index = ref->index * 2 + (fp->opcode & 1);
	__u32 ack_req = 0, crc;
	struct frame_cache *c;
	__u8 *f, *bth, *eh;

	if (at > OUT_LIMIT || ETHERNET_SIZE + ip_len > OUT_LIMIT)
		return 0;
	c = bpf_map_lookup_elem(&frame_cache, &cache_index);
	if (!c)
		return 0;
	f = s->out + at;
	bth = f + ETHERNET_SIZE + IPV4_SIZE + UDP_SIZE;
	eh = bth + BTH_SIZE;
	if (frame_cache_fits(c, shape, q, cfg)) {
		/* frame 0's fixed part goes from the cache straight into the packet (emit) */
		if (at)
			for (int i = 0; i < FRAME_FIXED_WORDS; i++)
				*(__u64 *)(f + 8 * i) = *(__u64 *)(c->headers + 8 * i);
	} else {
		/* a later frame refills the entry frame 0's fixed part is in: that part moves to out first */
		if (at && s->out_fixed_cache == cache_index + 1)
			fixed_to_out(s, c);
		frame_cache_fill(s, at, c, shape, q);
		if (c->shape != shape)
			return 0;
	}
	if (!at)
		s->out_fixed_cache = cache_index + 1;

	qs->frames_sent += 1;
	if (q->transport == TRANSPORT_RC && cfg->ack_req_interval && qs->frames_sent % cfg->ack_req_interval == 0)
		ack_req = 1;
	put8(bth + BTH_ACK_REQ_OFF, ack_req << BTH_ACK_REQ_SHIFT);
	bth_set_psn(bth, qs->next_psn);
	qs->next_psn = (qs->next_psn + 1) & PSN_MASK;
	if (ext == ATOMIC_ETH_SIZE) {
		atomic_eth_set_va(eh, fp->va);
		atomic_eth_set_rkey(eh, q->rkey);
		atomic_eth_set_swap_add(eh, fp->swap_add);
		atomic_eth_set_compare(eh, 0);
	} else {
		reth_set_va(eh, fp->va);
		reth_set_rkey(eh, q->rkey);
		reth_set_dma_length(eh, payload);
		if (ext == RETH_SIZE + IMMDT_SIZE)
			immdt_set_immediate(eh + RETH_SIZE, fp->immediate);
	}
	for (__u32 i = 0; i < 3 && i < pad; i++)
		s->out[(at + ROCE_HEADERS + ext + payload + i) & OUT_MASK] = 0;

	crc = ~out_crc_tail(s, c->crc_state, at + FRAME_FIXED_LEN, ip_len - ICRC_VARIABLE_FROM - ICRC_LEN);
	for (int i = 0; i < ICRC_LEN; i++)	/* little-endian on the wire, as the InfiniBand CRC is sent */
		s->out[(at + ETHERNET_SIZE + ip_len - ICRC_LEN + i) & OUT_MASK] = crc >> (8 * i);
	return ETHERNET_SIZE + ip_len;
}
#endif /* SOFTDTA_LOCAL */

/* Appends one RDMA WRITE (with Immediate if asked) of the payload already at the frame's payload offset. */
static __always_inline __u32 write_frame(struct scratch *s, __u32 at, const struct qp_ref *ref,
					 const struct translator_config_value *cfg, __u64 offset, __u32 immediate)
{
	const struct qp_value *q = ref->q;
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
	return build_roce(s, at, ref, cfg);
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

#endif /* SOFTDTA_TRANSLATOR_FRAMES_H */
