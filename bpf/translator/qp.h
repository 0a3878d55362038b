/* translator.bpf.c: Queue pairs. */
#ifndef SOFTDTA_TRANSLATOR_QP_H
#define SOFTDTA_TRANSLATOR_QP_H

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

	if (len > DEFERRED_FRAME_MAX)
		return CNT_DROP_BAD_LENGTH;
	rec = bpf_ringbuf_reserve(&deferred, sizeof(*rec), 0);
	if (!rec)
		return CNT_DROP_DEFER_FULL;
	rec->qp_index = qp_index;
	rec->len = len;
	rec->ingress_ifindex = ctx->ingress_ifindex;
	rec->rx_queue = ctx->rx_queue_index;
	if (len < 1 || bpf_xdp_load_bytes(ctx, 0, rec->frame, NONZERO(len, DEFERRED_FRAME_MAX))) {
		bpf_ringbuf_discard(rec, 0);
		return CNT_DROP_BAD_LENGTH;
	}
	bpf_ringbuf_submit(rec, 0);
	count(CNT_ESSENTIAL_DEFERRED);
	return DEFERRED;
}

struct qp_ref {
	struct qp_value *q;
	struct qp_state_value *qs;
	__u32 index;
};

/* 0 if the QP may send now; otherwise DEFERRED (an essential report) or the drop reason. */
static __always_inline __u32 qp_blocked(struct xdp_md *ctx, struct scratch *s, const struct qp_ref *ref)
{
	if (qp_ready(ref->qs, s))
		return 0;
	if (s->report.essential)
		return defer_report(ctx, ref->index);
	return ref->qs->state == QP_STATE_FAILED ? CNT_DROP_QP_FAILED : CNT_DROP_GRACE;
}

static __always_inline int qp_lookup(__u32 qp_index, struct qp_ref *ref)
{
	ref->index = qp_index;
	ref->q = bpf_map_lookup_elem(&qp, &qp_index);
	ref->qs = bpf_map_lookup_elem(&qp_state, &qp_index);
	return ref->q && ref->qs && ref->q->remote_qpn;
}

/* The QP a structure or Append list writes through for s->rx_queue (each RX queue orders its own PSNs): 0, or
 * DROP_NO_QUEUE_QP when it has none for the queue, or `missing` when the tables hold none. Queue 0's needs no
 * lookup. */
static __always_inline __u32 sender_lookup(struct scratch *s, __u32 first_qp, __u32 queues, struct qp_ref *ref,
					   __u32 missing)
{
	__u32 qp_index = first_qp, slot;
	struct queue_qp_value *found;

	if (s->rx_queue) {
		if (s->rx_queue >= queues || s->rx_queue >= MAX_RX_QUEUES)
			return CNT_DROP_NO_QUEUE_QP;
		slot = first_qp * MAX_RX_QUEUES + s->rx_queue;
		found = bpf_map_lookup_elem(&queue_qp, &slot);
		if (!found)
			return missing;
		qp_index = found->qp_index;
	}
	return qp_lookup(qp_index, ref) ? 0 : missing;
}

#endif /* SOFTDTA_TRANSLATOR_QP_H */
