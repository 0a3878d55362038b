/* translator.bpf.c: Collector replies: ACK, NAK, Atomic ACK. */
#ifndef SOFTDTA_TRANSLATOR_REPLIES_H
#define SOFTDTA_TRANSLATOR_REPLIES_H

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
	__u8 *ip = s->out + LRH_STAND_IN_LEN, *udp, *body;

	/* The frame was checked by the caller: ip_off + ip_len lies inside the packet. */
	ip_len = s->frame.payload_len;
	if (ip_len > OUT_LIMIT || ip_header_len > IPV4_MAX_HEADER_LEN || ip_len < ip_header_len + UDP_SIZE)
		return CNT_DROP_BAD_LENGTH;
	body_len = ip_len - ip_header_len - UDP_SIZE;
	if (body_len < BTH_SIZE + ICRC_LEN)
		return CNT_DROP_TRUNCATED;
	if (bpf_xdp_load_bytes(ctx, ip_off, ip, NONZERO(ip_len, OUT_LIMIT)))
		return CNT_DROP_TRUNCATED;
	udp = ip + (ip_header_len & IPV4_MAX_HEADER_LEN);
	body = udp + UDP_SIZE;
	ext = roce_ext_len(bth_get_opcode(body));
	if (ext < 0)
		return CNT_DROP_UNKNOWN_OPCODE;
	if (body_len - ICRC_LEN < BTH_SIZE + ext)
		return CNT_DROP_TRUNCATED;
	pad = bth_get_pad_count(body);
	if (body_len - ICRC_LEN - pad < BTH_SIZE + ext)
		return CNT_DROP_BAD_LENGTH;
	if (bth_get_opcode(body) != ROCE_OP_RC_ACK && bth_get_opcode(body) != ROCE_OP_RC_ATOMIC_ACK)
		return PASS_UP;
	dest_qp = bth_get_dest_qp(body);
	psn = bth_get_psn(body);
	syndrome = aeth_get_syndrome(body + BTH_SIZE);

	icrc_mask(s->out, ip, udp, body);
	crc = out_crc(s, 0, LRH_STAND_IN_LEN + ip_len - ICRC_LEN);
	for (int i = 0; i < ICRC_LEN; i++)
		if (s->out[(LRH_STAND_IN_LEN + ip_len - ICRC_LEN + i) & OUT_MASK] != ((crc >> (8 * i)) & 0xff))
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
	switch (syndrome >> AETH_KIND_SHIFT) {
	case AETH_ACK:
		count(CNT_RX_ACKS);
		ref.qs->unacked_psn = (psn + 1) & PSN_MASK; /* an ACK covers every PSN up to its own */
		break;
	case AETH_RNR_NAK:
		count(CNT_RX_RNR_NAKS);
		break;
	default:
		/* The collector executed nothing from the NAK's PSN on: those writes are lost. */
		count_n(CNT_NAK_LOST_WRITES, (ref.qs->next_psn - psn) & PSN_MASK);
		if (syndrome >> AETH_KIND_SHIFT == AETH_NAK && (syndrome & AETH_VALUE_MASK) == NAK_PSN_SEQUENCE_ERROR) {
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

#endif /* SOFTDTA_TRANSLATOR_REPLIES_H */
