/* Executing an RDMA request into the collector's memory: the one copy of each primitive that the XDP responder
 * (bpf/responder.bpf.c, for a RoCEv2 frame it received) and the local translator (bpf/local.bpf.c, for a report
 * it translated, with no frame in between) both run, so the two leave the same bytes in the same maps.
 *
 * The maps here are the responder's: the local translator loads them reused from the responder's object.
 * Whoever includes this defines responder_count() first (both programs count in responder_counters).
 */
#ifndef SOFTDTA_EXECUTE_H
#define SOFTDTA_EXECUTE_H

#include "softdta_spec.h"
#include "maps.h"

#define ARENA_MASK (ARENA_PAGE - 1)

TABLE(responder_config, BPF_MAP_TYPE_ARRAY, __u32, struct responder_config_value, 1);
TABLE(responder_qp, BPF_MAP_TYPE_ARRAY, struct responder_qp_key, struct responder_qp_value,
      RESPONDER_QP_MAX_ENTRIES);	/* sized at load, a power of two */
TABLE(responder_counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, __u64, RESPONDER_COUNTER_SLOTS);

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct arena_value);
	__uint(max_entries, ARENA_MAX_ENTRIES);	/* sized at load */
} arena SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, struct ring_writes_key);
	__type(value, struct ring_writes_value);
	__uint(max_entries, RING_WRITES_MAX_ENTRIES);
} ring_writes SEC(".maps");

RING(completions, 1 << 18);	/* struct completion records */

static __always_inline void responder_count(__u32 slot)
{
	__u64 *value = bpf_map_lookup_elem(&responder_counters, &slot);

	if (value)
		*value += 1;
}

/* Queue pair `qpn`'s slot in responder_qp and responder_qp_state. Arrays, not hash maps keyed by QPN: an array
 * lookup is inline, where a hash lookup (jhash and a compare) costs about 20 ns here. The control plane gives
 * no two live queue pairs one slot; each entry names its QPN. */
static __always_inline __u32 responder_qp_slot(const struct responder_config_value *cfg, __u32 qpn)
{
	return qpn & cfg->qp_slot_mask;
}

/* Queue pair `qpn`, or NULL if no queue pair of that number is up (QPN 0 never is). */
static __always_inline struct responder_qp_value *responder_qp_find(const struct responder_config_value *cfg,
								   __u32 qpn)
{
	struct responder_qp_key key = { .slot = responder_qp_slot(cfg, qpn) };
	struct responder_qp_value *qp = bpf_map_lookup_elem(&responder_qp, &key);

	return qp && qpn && qp->qpn == qpn ? qp : NULL;
}

/* What a WRITE asks of the collector's memory: RETH, Immediate, and where its payload sits in the caller's
 * buffer. */
struct exec_write {
	__u64 va;
	__u32 rkey;
	__u32 dma_len;
	__u32 immediate;
	__u32 payload_at;
	__u32 payload_len;
	__u32 qpn;
	__u8 opcode;
};

static __always_inline int region_contains(const struct responder_qp_value *qp, __u64 va, __u64 len)
{
	return va >= qp->base_va && va - qp->base_va <= qp->length && len <= qp->length - (va - qp->base_va);
}

/* Copies buf[from, from + len) (indexes masked by `mask`, a power of two less one; buf readable 8 bytes past any
 * masked index) to the arena at byte `offset`, eight bytes at a time: a part per page it touches (two at most,
 * since `limit` is shorter than a page), each a run of words and, for a part of 8 bytes or more, one last word
 * that ends where the part ends (it rewrites up to 7 bytes with what they already hold); shorter parts byte by
 * byte. */
static __always_inline int arena_copy(const __u8 *buf, __u32 mask, __u32 limit, __u64 offset, __u32 from,
				      __u32 len)
{
	__u32 done = 0;

	if (len > limit)
		return -1;
	for (int part = 0; part < 2 && done < len; part++) {
		__u64 at = offset + done;
		__u32 index = at / ARENA_PAGE, o = at & ARENA_MASK, n = len - done, i = 0, to;
		struct arena_value *page = bpf_map_lookup_elem(&arena, &index);

		if (!page)
			return -1;
		if (n > ARENA_PAGE - o)
			n = ARENA_PAGE - o;
		if (n >= 8) {
			for (int k = 0; k < limit / 8 && i + 8 <= n; k++, i += 8) {
				to = (o + i) & ARENA_MASK;
				if (to > ARENA_PAGE - 8)
					return -1;	/* never: o + n <= ARENA_PAGE */
				*(__u64 *)(page->bytes + to) = *(__u64 *)(buf + ((from + done + i) & mask));
			}
			if (i < n) {
				to = (o + n - 8) & ARENA_MASK;
				if (to > ARENA_PAGE - 8)
					return -1;
				*(__u64 *)(page->bytes + to) = *(__u64 *)(buf + ((from + done + n - 8) & mask));
			}
		} else {
			for (; i < 8 && i < n; i++)
				page->bytes[(o + i) & ARENA_MASK] = buf[(from + done + i) & mask];
		}
		done += n;
	}
	return 0;
}

#define ARENA_SHORT_WORDS 8	/* arena_copy_short: payloads of up to this many words */

/* arena_copy for a payload of up to ARENA_SHORT_WORDS words inside one page, a word at a time and inline: 1 if
 * it copied, 0 if the payload is not one of those (arena_copy then), -1 if the arena has no such page. */
static __always_inline int arena_copy_short(const __u8 *buf, __u32 mask, __u64 offset, __u32 from, __u32 len)
{
	__u32 in_page = offset & ARENA_MASK, index = offset / ARENA_PAGE, i = 0;
	struct arena_value *page;

	if (len > 8 * ARENA_SHORT_WORDS || in_page + len > ARENA_PAGE)
		return 0;
	page = bpf_map_lookup_elem(&arena, &index);
	if (!page)
		return -1;
	for (; i < 8 * ARENA_SHORT_WORDS && i + 8 <= len; i += 8) {
		__u64 at = in_page + i;

		barrier_var(at);	/* checked and used as one 64-bit register: the verifier bounds the store by it */
		if (at > ARENA_PAGE - 8)
			return -1;
		*(__u64 *)(page->bytes + at) = *(__u64 *)(buf + ((from + i) & mask));
	}
	for (int k = 0; k < 8 && i < len; k++, i++)
		page->bytes[(in_page + i) & ARENA_MASK] = buf[(from + i) & mask];
	return 1;
}

/* A WRITE's checks before its payload is copied: DMA length, R_Key, access rights and bounds. */
static __always_inline int write_allowed(const struct responder_qp_value *qp, const struct exec_write *w)
{
	return w->dma_len == w->payload_len && w->rkey == qp->rkey && (qp->access & ACCESS_REMOTE_WRITE) &&
	       region_contains(qp, w->va, w->payload_len);
}

/* Where a WRITE that write_allowed() let through lands in the arena, in bytes. */
static __always_inline __u64 write_offset(const struct responder_qp_value *qp, const struct exec_write *w)
{
	return qp->arena_offset + (w->va - qp->base_va);
}

/* After a WRITE's payload landed: its Append ring counted (the ring's reader learns from this that a lap
 * overwrote entries) and, with Immediate, its completion queued for userspace. */
static __always_inline void execute_write_done(const struct responder_qp_value *qp, const struct exec_write *w)
{
	if (qp->ring_bytes) {
		struct ring_writes_key ring = {qp->ring_index + (__u32)((w->va - qp->base_va) / qp->ring_bytes)};
		struct ring_writes_value *done = bpf_map_lookup_elem(&ring_writes, &ring);

		if (done)
			__sync_fetch_and_add(&done->writes, 1);
	}
	if (w->opcode == ROCE_OP_RC_WRITE_ONLY_IMM || w->opcode == ROCE_OP_UC_WRITE_ONLY_IMM) {
		struct completion *done = bpf_ringbuf_reserve(&completions, sizeof(*done), 0);

		if (done) {
			done->qpn = w->qpn;
			done->immediate = w->immediate;
			done->byte_len = w->payload_len;
			done->pad = 0;
			bpf_ringbuf_submit(done, 0);
		} else {
			responder_count(RCNT_COMPLETIONS_LOST);
		}
		responder_count(RCNT_COMPLETIONS);
	}
}

/* Fetch&Add's checks: 0 if it may execute, else the responder counter of the access error. */
static __always_inline __u32 fetch_add_refused(const struct responder_qp_value *qp, __u64 va, __u32 rkey)
{
	if (va % 8)
		return RCNT_MISALIGNED_ATOMIC;
	if (!(qp->access & ACCESS_REMOTE_ATOMIC) || rkey != qp->rkey || !region_contains(qp, va, 8))
		return RCNT_REMOTE_ACCESS_ERRORS;
	return 0;
}

/* Fetch&Add at `va` of a QP that fetch_add_refused() let through, atomically; the original value in *original.
 * Returns 0, or -1 if the arena has no such page. */
static __always_inline int execute_fetch_add(const struct responder_qp_value *qp, __u64 va, __u64 add,
					     __u64 *original)
{
	__u64 offset = qp->arena_offset + (va - qp->base_va);
	__u32 index = offset / ARENA_PAGE;
	struct arena_value *page = bpf_map_lookup_elem(&arena, &index);

	if (!page || offset % 8)
		return -1;
	*original = __sync_fetch_and_add((__u64 *)&page->bytes[offset & ARENA_MASK & ~7ULL], add);
	return 0;
}

#endif /* SOFTDTA_EXECUTE_H */
