// SPDX-License-Identifier: GPL-2.0
/* softdta translator fast path: DTA reports in, RoCEv2 frames out, byte for byte like softdta.core.translator.
 *
 * softdta_xdp    translates reports and consumes collector ACK/NAKs (XDP);
 * softdta_copy   makes clone i of a Key-Write or Key-Increment report's packet, which XDP broadcast to a `copies`
 *                devmap, its frame i, parked in the `fanout` map (devmap program);
 * softdta_fanout sends those frames where there is no `copies` entry (generic XDP): the packet XDP passed up
 *                with metadata, then the ones it parked in the `fanout` map (tc ingress);
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
#include "maps.h"
#include "parsing.h"
#include "roce.h"

#include "translator/state.h"
#include "translator/report.h"
#include "translator/hashing.h"
#include "translator/fleet.h"
#include "translator/qp.h"
#include "translator/frames.h"
#include "translator/nack.h"
#include "translator/keyed.h"
#include "translator/append.h"
#include "translator/postcard.h"
#include "translator/sketch.h"
#include "translator/replies.h"
#include "translator/output.h"

static __always_inline int translate(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct translator_config_value *cfg;
	__u32 zero = 0, payload_off, payload_len, reason = 0;
	struct scratch *s;
	struct udp4 d;

	if (parse_udp4(data, data_end, &d))
		return XDP_PASS;
	payload_off = ETHERNET_SIZE + d.ihl + UDP_SIZE;
	payload_len = d.udp_len - UDP_SIZE;

	cfg = bpf_map_lookup_elem(&translator_config, &zero);
	s = begin(1, ctx->rx_queue_index);
	if (!cfg || !s)
		return XDP_PASS;
	__builtin_memcpy(&s->src_ip, d.ip + IPV4_SRC_OFF, IPV4_SRC_LEN);
	__builtin_memcpy(&s->dst_ip, d.ip + IPV4_DST_OFF, IPV4_DST_LEN);
	__builtin_memcpy(s->peer_mac, d.eth + ETHERNET_SRC_OFF, ETHERNET_SRC_LEN);

	if (d.dport == DTA_PORT) {
		__u64 take = payload_len < RAW_MAX ? payload_len : RAW_MAX;

		count(CNT_RX_REPORTS);
		if (copy_payload(ctx, s, payload_off, take))
			reason = CNT_DROP_TRUNCATED;
		if (!reason)
			reason = decode_report(s, payload_len, cfg->profile);
		if (!reason)
			count(CNT_RX_KEY_WRITE + s->report.opcode - 1);
		if (!reason && s->report.retransmit)
			reason = check_sequence();
		if (!reason)
			reason = fleet_resolve(s);
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
	} else if (d.dport == ROCE_PORT) {
		struct collector_key ck = { .ip = s->src_ip };

		if (!bpf_map_lookup_elem(&collector, &ck))
			return XDP_PASS;
		s->frame.payload_len = d.ip_total;
		reason = on_reply(ctx, ETHERNET_SIZE, d.ihl);
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

/* The RX queue whose QP writes a flush entry out: the one whose report started it, or queue 0 if the tables
 * no longer give it a QP. Any idle QP of the owner keeps PSN order (flushable), this one keeps the reference's. */
static __always_inline __u32 flush_queue_of(const struct flush_entry *entry, __u32 queues)
{
	return entry->rx_queue < queues ? entry->rx_queue : 0;
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
	s = begin(0, 0);
	if (!cfg || !s || bpf_map_peek_elem(&flush_queue, &entry))
		return XDP_DROP;
	now = clock_ns(s);
	if (entry.kind == FLUSH_TARGET_APPEND_LIST) {
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
		s->rx_queue = flush_queue_of(&entry, al->queues);
		if (sender_lookup(s, al->qp_index, al->queues, &ref, CNT_DROP_UNKNOWN_LIST) ||
		    !flushable(ref.qs, s, cfg->flush_idle_ns)) {
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
		reason = append_write(s, al, entry.owner, head, &ref);
	} else {
		struct postcard_cache_value *pc = bpf_map_lookup_elem(&postcard_cache, &entry.index);
		struct structure_key key = { .collector_ip = entry.owner, .primitive = DTA_OP_POSTCARDING };
		struct structure_value *st = bpf_map_lookup_elem(&structure, &key);
		__u32 taken;

		if (!pc || !st || !pc->valid || pc->first_ns != entry.first_ns) {
			bpf_map_pop_elem(&flush_queue, &entry);
			return XDP_DROP;
		}
		if (now - entry.first_ns < cfg->flush_idle_ns)
			return XDP_DROP;
		bpf_map_pop_elem(&flush_queue, &entry);
		s->rx_queue = flush_queue_of(&entry, st->queues);
		if (sender_lookup(s, st->qp_index, st->queues, &ref, CNT_DROP_UNKNOWN_COLLECTOR) ||
		    !flushable(ref.qs, s, cfg->flush_idle_ns)) {
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
		reason = postcard_write(s, &s->postcard, st, 0, &ref);
	}
	if (reason) {
		count(reason);
		return XDP_DROP;
	}
	ref.qs->flush_mark = ref.qs->frames_sent;	/* its own frames do not make the QP busy */
	return emit(ctx, s);
}

/* ------------------------------------------------------------------------------------------------ */
/* devmap: one copy of a redundant report's broadcast */

/* Runs on clone i of the packet `emit` broadcast, which is frame 1 of the report: makes it frame i, parked in
 * `fanout`. The clones of one broadcast reach it one after the other on the CPU that sent them (the devmap's bulk
 * queue is per CPU and flushed in order), so the CPU's count since the report's sequence changed is i. */
SEC("xdp/devmap")
int softdta_copy(struct xdp_md *ctx)
{
	__u8 *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct fanout_meta *meta = (void *)(long)ctx->data_meta;
	__u32 copy, slot, len = data_end - data, from, i;
	struct fanout_value *entry;
	struct scratch *s;

	if ((void *)(meta + 1) > (void *)data || meta->magic != FANOUT_META_MAGIC)
		return XDP_PASS;	/* not a broadcast of `emit`: a frame redirected to this interface */
	if (meta->count < 2)
		return XDP_PASS;	/* parked nothing, so its sequence (0) is no report's: it must not count as a copy */
	s = scratch_get();
	if (!s)
		return XDP_DROP;
	copy = s->copy_sequence == meta->sequence && s->copy_next < meta->count ? s->copy_next : 0;
	s->copy_sequence = meta->sequence;
	s->copy_next = copy + 1;
	if (!copy)
		return XDP_PASS;
	slot = meta->cpu * FANOUT_MAX_ENTRIES + meta->sequence % FANOUT_MAX_ENTRIES;
	entry = bpf_map_lookup_elem(&fanout, &slot);
	if (!entry || entry->sequence != meta->sequence || entry->count != meta->count || entry->frame_len != len ||
	    len > FANOUT_FRAME_MAX || copy >= MAX_REDUNDANCY || (copy - 1) * len >= 2 * FANOUT_FRAME_MAX) {
		count(CNT_DROP_FANOUT_LOST);
		return XDP_DROP;
	}
	from = (copy - 1) * len;
	barrier_var(from);	/* keeps the mask, which the verifier needs to bound the offset and the compiler would drop */
	from &= 2 * FANOUT_FRAME_MAX - 1;
	for (i = 0; i < FANOUT_FRAME_MAX && i + 8 <= len; i += 8) {
		if (data + i + 8 > data_end)
			return XDP_DROP;
		*(__u64 *)(data + i) = *(__u64 *)(entry->frames + from + i);
	}
	for (int k = 0; k < 8 && i < len && i < FANOUT_FRAME_MAX; k++, i++) {
		if (data + i + 1 > data_end)
			return XDP_DROP;
		data[i] = entry->frames[from + i];
	}
	return XDP_PASS;
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
	ifindex = meta->ifindex ? meta->ifindex : skb->ifindex;
	if (meta->count == 1)
		return bpf_redirect(ifindex, 0);
	slot = meta->cpu * FANOUT_MAX_ENTRIES + meta->sequence % FANOUT_MAX_ENTRIES;
	entry = bpf_map_lookup_elem(&fanout, &slot);
	if (!entry || meta->count < 2 || entry->sequence != meta->sequence || entry->count != meta->count ||
	    entry->count > MAX_REDUNDANCY ||
	    entry->frame_len != skb->len || entry->frame_len > FANOUT_FRAME_MAX) {
		count(CNT_DROP_FANOUT_LOST);
		return TC_ACT_SHOT;
	}
	len = entry->frame_len;
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

char LICENSE[] SEC("license") = "GPL";
