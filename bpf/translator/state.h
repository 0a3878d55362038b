/* translator.bpf.c: The translator's constants, working memory and maps, and the helpers every part uses. */
#ifndef SOFTDTA_TRANSLATOR_STATE_H
#define SOFTDTA_TRANSLATOR_STATE_H

#define RAW_MAX 160		/* longer than any report payload, so every length check sees all it needs */
#define RAW_MASK 127		/* valid reports end before byte 128 (extended Key-Write: 7 + 32 + 64) */
_Static_assert(RAW_MAX >= RAW_MASK + 1 + 8, "a word load at any masked raw index stays inside raw");
_Static_assert(MAX_KEY_LEN % 8 == 0 && MAX_DATA_LEN % 8 == 0, "key and data arrays are copied in words");
#define OUT_SIZE 2048		/* frames being built; a power of two for index masks */
#define OUT_MASK (OUT_SIZE - 1)
#define OUT_LIMIT 1024		/* the frames of one report, back to back, end before this */
#define ROCE_HEADERS (ETHERNET_SIZE + IPV4_SIZE + UDP_SIZE + BTH_SIZE)
#define DEFERRED 1		/* qp_blocked(): the report went to userspace */
#define PASS_UP 2		/* not a reply: a CM MAD or a collector's SEND, for the control plane */
/* In the IP packet, where the bytes that change from frame to frame of one QP and shape start: BTH AckReq. */
#define ICRC_VARIABLE_FROM (IPV4_SIZE + UDP_SIZE + BTH_ACK_REQ_OFF)
#define FRAME_FIXED_LEN (ETHERNET_SIZE + ICRC_VARIABLE_FROM)
#define TAIL_CRC_INLINE (8 * CRC_SHORT_WORDS + 4)	/* longer tails (Append batches) hash in a subprogram */
#define FRAME_FIXED_WORDS ((FRAME_FIXED_LEN + 7) / 8)	/* copied a word at a time; the tail is written after */
/* n, for 1 <= n <= limit (a power of two), in a form the verifier bounds to 1..limit for helper sizes */
#define NONZERO(n, limit) ((((n) - 1) & ((limit) - 1)) + 1)
_Static_assert((FANOUT_FRAME_MAX & (FANOUT_FRAME_MAX - 1)) == 0, "FANOUT_FRAME_MAX must be a power of two");
_Static_assert(MAX_REDUNDANCY * FANOUT_FRAME_MAX <= OUT_LIMIT, "the frames of a redundant report fit in out");

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

/* The structure this CPU translated for last, copied out of the `structure` map: most reports are for the
 * structure the one before was for, and a copy costs less than a hash lookup. Good while the tables generation
 * it was copied in lasts. */
struct structure_memo {
	__u64 generation;	/* 0: empty (the control plane never writes generation 0) */
	struct structure_key key;
	struct structure_value value;
};

/* The same for the Append list this CPU appended to last: a reporter sends its events to its own list. */
struct append_list_memo {
	__u64 generation;
	struct append_list_key key;
	struct append_list_value value;
};

/* Per-CPU working memory: XDP programs never run nested on one CPU. */
struct scratch {
	__u64 now_ns;		/* read from the clock on first use: most reports never need it */
	__u32 data_path;	/* frames come from reports, not from a flush */
	__u32 rx_queue;		/* of the report, or of the report that started the batch a flush writes out */
	__u32 src_ip;		/* of the report, network order */
	__u32 dst_ip;
	__u32 collector_ip;	/* whose structures the report goes to: dst_ip, or at the fleet address its slot's */
	__u32 across;		/* copies go across the fleet's replicas: copy n to copy_ip[n] */
	__u32 copy_ip[MAX_REDUNDANCY];	/* replica n % R of those R in the slot that have the structure */
	__u8 peer_mac[6];
	__u8 raw[RAW_MAX];
	struct report report;
	struct frame_params frame;
	__u32 out_count;	/* frames in out, back to back from its start */
	__u32 out_redundant;	/* the QP's frames always leave by `copies`, or through the tc stage without it */
	__u32 fanout_sequence;
	__u32 copy_sequence;	/* softdta_copy: the report whose clones it is making, and the copy it makes next */
	__u32 copy_next;
	__u32 out_frame_len;
	__u32 out_ifindex;
	__u32 out_executed;	/* local translation (bpf/local.bpf.c): the report's requests executed, nothing to send */
	__u32 out_fixed_cache;	/* 1 + the frame_cache entry that holds frame 0's fixed part; 0: out holds it */
	struct postcard_copy postcard;	/* a cache entry taken out under its lock, to be written */
	struct structure_memo structure_memo;
	struct append_list_memo append_list_memo;
	__u8 out[OUT_SIZE + 8];	/* + 8: word loads at any masked index stay inside */
};

/* The fixed part of a RoCEv2 frame of one QP and shape, with what it was built from: Ethernet, IPv4 (checksum
 * included) and UDP headers and the BTH up to its AckReq byte, and the iCRC state over those bytes, masked. Every
 * later frame of the shape copies the headers and hashes only its variable tail (softdta/wire/icrc_split.py). */
struct frame_cache {
	__u32 shape;		/* RoCE opcode << 24 | pad count << 16 | IP length; 0: empty */
	__u32 crc_state;	/* raw CRC-32 state after the LRH stand-in and ICRC_VARIABLE_FROM bytes of IP */
	__u32 remote_qpn;
	__u32 collector_ip;
	__u32 src_ip;
	__u16 udp_sport;
	__u8 dscp;
	__u8 ttl;
	__u8 collector_mac[8];
	__u8 src_mac[8];
	__u8 headers[FRAME_FIXED_WORDS * 8];
};

struct flush_entry {
	__u64 first_ns;
	__u32 kind;
	__u32 index;		/* append_state or postcard_cache slot */
	__u32 owner;		/* list id (Append) or collector IP (Postcarding) */
	__u32 rx_queue;		/* of the report that started it: the flush writes through that queue's QP */
};

TABLE(translator_config, BPF_MAP_TYPE_ARRAY, __u32, struct translator_config_value, 1);
TABLE(tables_generation, BPF_MAP_TYPE_ARRAY, __u32, struct tables_generation_value, 1);
TABLE(qp, BPF_MAP_TYPE_ARRAY, __u32, struct qp_value, QP_MAX_ENTRIES);
TABLE(qp_state, BPF_MAP_TYPE_ARRAY, __u32, struct qp_state_value, QP_STATE_MAX_ENTRIES);
TABLE(qp_by_local_qpn, BPF_MAP_TYPE_HASH, struct qp_by_local_qpn_key, struct qp_by_local_qpn_value,
      QP_BY_LOCAL_QPN_MAX_ENTRIES);
TABLE(collector, BPF_MAP_TYPE_HASH, struct collector_key, struct collector_value, COLLECTOR_MAX_ENTRIES);
TABLE(structure, BPF_MAP_TYPE_HASH, struct structure_key, struct structure_value, STRUCTURE_MAX_ENTRIES);
TABLE(append_list, BPF_MAP_TYPE_HASH, struct append_list_key, struct append_list_value, APPEND_LIST_MAX_ENTRIES);
TABLE(queue_qp, BPF_MAP_TYPE_ARRAY, __u32, struct queue_qp_value, QUEUE_QP_MAX_ENTRIES);
TABLE(append_state, BPF_MAP_TYPE_ARRAY, __u32, struct append_state_value, APPEND_STATE_MAX_ENTRIES);
TABLE(postcard_cache, BPF_MAP_TYPE_ARRAY, __u32, struct postcard_cache_value, POSTCARD_CACHE_MAX_ENTRIES);
TABLE(sketch_column, BPF_MAP_TYPE_HASH, struct sketch_column_key, struct sketch_column_value,
      SKETCH_COLUMN_MAX_ENTRIES);
TABLE(sketch_reporter, BPF_MAP_TYPE_HASH, struct sketch_reporter_key, struct sketch_reporter_value,
      SKETCH_REPORTER_MAX_ENTRIES);
/* Per CPU, so no two CPUs ever fill one entry; two per QP: with and without immediate. */
TABLE(frame_cache, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct frame_cache, 2 * QP_MAX_ENTRIES);
TABLE(fanout, BPF_MAP_TYPE_ARRAY, __u32, struct fanout_value, FANOUT_MAX_ENTRIES);	/* x CPUs at load */
/* A report's frames leave from XDP as one broadcast to a devmap of `count` entries for the egress interface,
 * which the control plane creates and puts here; each entry runs softdta_copy, which makes clone i frame i. */
struct copy_devmap {
	__uint(type, BPF_MAP_TYPE_DEVMAP);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(struct bpf_devmap_val));
	__uint(max_entries, MAX_REDUNDANCY);
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, struct copies_key);
	__uint(max_entries, COPIES_MAX_ENTRIES);
	__array(values, struct copy_devmap);
} copies SEC(".maps");

TABLE(reporter_seq, BPF_MAP_TYPE_LRU_HASH, struct reporter_seq_key, struct reporter_seq_value,
      REPORTER_SEQ_MAX_ENTRIES);
TABLE(counters, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, __u64, COUNTER_SLOTS);
TABLE(scratch, BPF_MAP_TYPE_PERCPU_ARRAY, __u32, struct scratch, 1);

QUEUE(flush_queue, struct flush_entry, 65536);
RING(deferred, 1 << 20);

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

/* The tables generation now; 0 (no copy is good) before the control plane's first. */
static __always_inline __u64 generation_now(void)
{
	struct tables_generation_value *current;
	__u32 zero = 0;

	current = bpf_map_lookup_elem(&tables_generation, &zero);
	return current ? current->generation : 0;
}

/* The structure of (collector, primitive): this CPU's copy when it is of the current tables generation, else
 * looked up and copied. Read-only, like the map's entries are for the data path. */
static __always_inline const struct structure_value *structure_find(struct scratch *s, __u32 collector_ip,
								    __u32 primitive)
{
	struct structure_memo *memo = &s->structure_memo;
	struct structure_key key = { .collector_ip = collector_ip, .primitive = primitive };
	struct structure_value *found;
	__u64 generation = generation_now();

	if (generation && memo->generation == generation && memo->key.collector_ip == collector_ip &&
	    memo->key.primitive == primitive)
		return &memo->value;
	found = bpf_map_lookup_elem(&structure, &key);
	if (!found)
		return 0;
	memo->value = *found;
	memo->key = key;
	memo->generation = generation;
	return &memo->value;
}

/* The Append list `list_id`, the same way. */
static __always_inline const struct append_list_value *append_list_find(struct scratch *s, __u32 list_id)
{
	struct append_list_memo *memo = &s->append_list_memo;
	struct append_list_key key = { .list_id = list_id };
	struct append_list_value *found;
	__u64 generation = generation_now();

	if (generation && memo->generation == generation && memo->key.list_id == list_id)
		return &memo->value;
	found = bpf_map_lookup_elem(&append_list, &key);
	if (!found)
		return 0;
	memo->value = *found;
	memo->key = key;
	memo->generation = generation;
	return &memo->value;
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

#endif /* SOFTDTA_TRANSLATOR_STATE_H */
