/* translator.bpf.c: Reporter NACKs. */
#ifndef SOFTDTA_TRANSLATOR_NACK_H
#define SOFTDTA_TRANSLATOR_NACK_H

static __noinline void build_nack(struct scratch *s, const struct translator_config_value *cfg, __u32 kind,
				  __u32 value, __u32 reporter)
{
	__u8 *f = s->out;
	__u8 *ip = f + ETHERNET_SIZE, *udp = ip + IPV4_SIZE, *body = udp + UDP_SIZE;
	__u32 body_len = s->report.extended ? NACK_EXT_SIZE : NACK_V1_SIZE;

	__builtin_memcpy(f + ETHERNET_DST_OFF, s->peer_mac, ETHERNET_DST_LEN);
	__builtin_memcpy(f + ETHERNET_SRC_OFF, cfg->src_mac, ETHERNET_SRC_LEN);
	ethernet_set_ethertype(f, ETH_P_IP);
	ipv4_header(ip, IPV4_SIZE + UDP_SIZE + body_len, s->dst_ip, s->src_ip);
	ipv4_finish(ip, cfg->dscp, cfg->ttl);
	udp_set_sport(udp, DTA_PORT);
	udp_set_dport(udp, DTA_NACK_PORT);
	udp_set_length(udp, UDP_SIZE + body_len);
	udp_set_checksum(udp, 0);
	if (s->report.extended) {
		nack_ext_set_marker(body, EXTENDED_FIRST_BYTE);
		nack_ext_set_kind(body, kind);
		nack_ext_set_reporter(body, reporter);
		nack_ext_set_value(body, value);
	} else {
		nack_v1_set_seqnum(body, value);
		put8(body + NACK_V1_NACK_OFF, 1 << NACK_V1_NACK_SHIFT);	/* the NACK flag, reserved bits zero */
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

#endif /* SOFTDTA_TRANSLATOR_NACK_H */
