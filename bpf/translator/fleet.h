/* translator.bpf.c: The fleet (docs/fleet.md). A report to the fleet address goes to the collectors of its
 * partition key's slot that hold a structure of its primitive, in replica order, as
 * softdta.core.translator.Translator.replica_structures picks them. Append routes by list id without this: the
 * control plane writes each list's owner into append_list. */
#ifndef SOFTDTA_TRANSLATOR_FLEET_H
#define SOFTDTA_TRANSLATOR_FLEET_H

TABLE(fleet_config, BPF_MAP_TYPE_ARRAY, __u32, struct fleet_config_value, FLEET_CONFIG_MAX_ENTRIES);
TABLE(fleet_slot, BPF_MAP_TYPE_ARRAY, __u32, struct fleet_slot_value, FLEET_SLOT_MAX_ENTRIES);

_Static_assert(sizeof(((struct fleet_slot_value *)0)->collector_ip) == 4 * MAX_REPLICAS, "four IPv4 replicas");
_Static_assert(MAX_REPLICAS == MAX_REDUNDANCY, "scratch.copy_ip holds the replicas, then one IP per copy");
_Static_assert((1 << MAX_SLOT_BITS) <= FLEET_SLOT_MAX_ENTRIES, "every slot of the largest map has its entry");

/* The partition CRC's raw state after four more bytes, loaded as one little-endian word (slice-by-4). */
static __always_inline __u32 partition_word(__u32 crc, __u32 word)
{
	crc ^= word;
	return crc32_partition[3][crc & 0xff] ^ crc32_partition[2][(crc >> 8) & 0xff] ^
	       crc32_partition[1][(crc >> 16) & 0xff] ^ crc32_partition[0][crc >> 24];
}

/* wire.hashing.partition_hash of the report's partition key (Primitive.partition_key): Key-Write, Key-Increment
 * and Postcarding hash their key in wire order; a Sketch-Merge's key is empty, whose CRC is 0. A word at a time,
 * then byte by byte: a 4-byte key, the most common, is one step of four independent loads. */
static __always_inline __u32 partition_hash(const struct report *r)
{
	__u32 crc = 0xffffffff, len = r->key_len, i = 0;

	if (r->opcode == DTA_OP_SKETCH_MERGE)
		return 0;
	if (len == 4)
		return partition_word(crc, *(const __u32 *)r->key) ^ 0xffffffff;
	for (; i < MAX_KEY_LEN && i + 4 <= len; i += 4)
		crc = partition_word(crc, *(const __u32 *)(r->key + i));
	for (int step = 0; step < 3 && i < MAX_KEY_LEN && i < len; step++, i++)
		crc = crc32_byte(crc32_partition[0], crc, r->key[i]);
	return crc ^ 0xffffffff;
}

/* Whether collector `ip` holds a structure of `primitive`: this CPU's structure copy answers without a lookup
 * when it is the one (most reports of a flow go to one collector). */
static __always_inline int structure_held(struct scratch *s, __u32 ip, __u32 primitive, __u64 generation)
{
	struct structure_key key = { .collector_ip = ip, .primitive = primitive };
	struct structure_memo *memo = &s->structure_memo;

	if (generation && memo->generation == generation && memo->key.collector_ip == ip &&
	    memo->key.primitive == primitive)
		return 1;
	return bpf_map_lookup_elem(&structure, &key) != 0;
}

/* The report at the fleet address to its slot's first replica that holds its structure (s->collector_ip), and
 * with copies across replicas, copy n to the n % R-th of the R that do (s->copy_ip). Inline: a call would cost
 * the report path its register spills and a frame. */
static __always_inline __u32 fleet_route(struct scratch *s, __u32 slot_bits, __u32 across)
{
	struct fleet_slot_value *replicas;
	__u64 generation = generation_now();
	__u32 slot, found = 0, primitive = s->report.opcode, ip;

	slot = partition_hash(&s->report) & ((1u << (slot_bits & 31)) - 1);
	replicas = bpf_map_lookup_elem(&fleet_slot, &slot);
	if (!replicas)
		return CNT_DROP_FLEET_UNMAPPED;
	for (__u32 i = 0; i < MAX_REPLICAS && i < replicas->replicas; i++) {
		ip = ((const __u32 *)replicas->collector_ip)[i];	/* at offset 4: aligned */
		if (structure_held(s, ip, primitive, generation))
			s->copy_ip[found++ & (MAX_REDUNDANCY - 1)] = ip;	/* first the replicas that hold it */
	}
	if (!found)
		return CNT_DROP_FLEET_UNMAPPED;
	s->collector_ip = s->copy_ip[0];
	s->across = across && (primitive == DTA_OP_KEY_WRITE || primitive == DTA_OP_KEY_INCREMENT);
	for (__u32 copy = found; s->across && copy < MAX_REDUNDANCY; copy++)	/* copy n goes where copy n - R went */
		s->copy_ip[copy] = s->copy_ip[(copy - found) & (MAX_REDUNDANCY - 1)];
	count(CNT_FLEET_RESOLVED);
	return 0;
}

/* Where the report goes: its destination's structures, or, at the fleet address, its slot's (fleet_route). */
static __always_inline __u32 fleet_resolve(struct scratch *s)
{
	__u32 zero = 0;
	struct fleet_config_value *fleet = bpf_map_lookup_elem(&fleet_config, &zero);

	s->collector_ip = s->dst_ip;
	s->across = 0;
	if (!fleet || !fleet->address || fleet->address != s->dst_ip || s->report.opcode == DTA_OP_APPEND)
		return 0;
	return fleet_route(s, fleet->slot_bits, fleet->across);
}

#endif /* SOFTDTA_TRANSLATOR_FLEET_H */
