/* translator.bpf.c, built as bpf/local.bpf.c: the request a frame would carry, executed into the collector's
 * memory instead of built. */
#ifndef SOFTDTA_TRANSLATOR_LOCAL_H
#define SOFTDTA_TRANSLATOR_LOCAL_H

/* out[from, from + len) to the arena at byte `offset`. Global: verified once. */
__noinline int local_arena_write(__u64 offset, __u32 from, __u32 len)
{
	struct scratch *s = scratch_get();

	return s ? arena_copy(s->out, OUT_MASK, OUT_LIMIT, offset, from, len) : -1;
}

/* build_roce's stand-in: instead of the frame at s->out[at], what the responder would do on receiving it, with
 * the responder's checks (R_Key, bounds, access) and counters; no headers, no iCRC, no ACK. The QP's PSN and
 * frame count move on as if the frame had left, so flushes keep their idle rule. Returns the length the frame
 * would have had (the callers lay copies out by it), 0 if it would not fit. */
static __noinline __u32 build_roce(struct scratch *s, __u32 at, const struct qp_ref *ref,
				   const struct translator_config_value *cfg)
{
	const struct qp_value *q = ref->q;
	struct qp_state_value *qs = ref->qs;
	struct frame_params *fp = &s->frame;
	struct frame_shape sizes = frame_shape_of(fp);
	__u32 ext = sizes.ext, payload = sizes.payload, ip_len = sizes.ip_len;
	struct responder_config_value *rcfg;
	struct responder_qp_value *rqp = NULL;
	__u32 zero = 0;

	if (at > OUT_LIMIT || ETHERNET_SIZE + ip_len > OUT_LIMIT)
		return 0;
	qs->frames_sent += 1;
	qs->next_psn = (qs->next_psn + 1) & PSN_MASK;
	s->out_executed = 1;
	rcfg = bpf_map_lookup_elem(&responder_config, &zero);
	if (rcfg)
		rqp = responder_qp_find(rcfg, q->remote_qpn);
	if (!rqp) {
		responder_count(RCNT_UNKNOWN_QPN);
	} else if (fp->opcode == ROCE_OP_RC_FETCH_ADD) {
		__u32 refused = fetch_add_refused(rqp, fp->va, q->rkey);
		__u64 original;

		if (!refused && execute_fetch_add(rqp, fp->va, fp->swap_add, &original))
			refused = RCNT_REMOTE_ACCESS_ERRORS;
		responder_count(refused ?: RCNT_EXECUTED);
	} else {
		struct exec_write w = {
			.va = fp->va, .rkey = q->rkey, .dma_len = payload, .immediate = fp->immediate,
			.payload_at = at + ROCE_HEADERS + ext, .payload_len = payload, .qpn = q->remote_qpn,
			.opcode = fp->opcode,
		};

		__u64 offset = write_offset(rqp, &w);
		int copied = 0;

		if (write_allowed(rqp, &w)) {
			copied = arena_copy_short(s->out, OUT_MASK, offset, w.payload_at, payload);
			if (!copied)
				copied = local_arena_write(offset, w.payload_at, payload) ? -1 : 1;
		}
		if (copied > 0) {
			execute_write_done(rqp, &w);
			responder_count(RCNT_EXECUTED);
		} else {
			responder_count(rqp->transport == TRANSPORT_UC ? RCNT_UC_ACCESS_ERROR : RCNT_REMOTE_ACCESS_ERRORS);
		}
	}
	return ETHERNET_SIZE + ip_len;
}

#endif /* SOFTDTA_TRANSLATOR_LOCAL_H */
