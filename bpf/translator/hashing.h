/* translator.bpf.c: Hashes (softdta.wire.hashing). */
#ifndef SOFTDTA_TRANSLATOR_HASHING_H
#define SOFTDTA_TRANSLATOR_HASHING_H

/* Raw CRC-32 state over the key bytes reversed, as Key-Write and Key-Increment hash them. */
static __always_inline __u32 reversed_key_state(const struct report *r, const __u32 *table)
{
	__u32 crc = 0xffffffff;

	for (__u32 i = 0; i < MAX_KEY_LEN && i < r->key_len; i++)
		crc = crc32_byte(table, crc, r->key[(r->key_len - 1 - i) & (MAX_KEY_LEN - 1)]);
	return crc;
}

static __always_inline __u32 key_checksum(const struct report *r)
{
	return reversed_key_state(r, crc32_slice8[0]) ^ 0xffffffff;
}

/* The slot hash of copy `copy`. dta-v1 hashes with the checksum's own table, so it continues the checksum (the
 * key's raw state is checksum ^ 0xffffffff) with one byte instead of hashing the key again. */
static __noinline __u32 key_slot_hash(const struct report *r, __u32 copy, __u32 scheme, __u32 checksum)
{
	copy &= MAX_REDUNDANCY - 1;
	if (scheme == KEY_HASH_INDEPENDENT)
		return crc32_byte(crc32_key_hash[copy], reversed_key_state(r, crc32_key_hash[copy]), copy) ^ 0xffffffff;
	return crc32_byte(crc32_slice8[0], checksum ^ 0xffffffff, copy) ^ 0xffffffff;
}

/* CRC over the key in wire order with a byte table (Postcarding slot and hop hashes). */
static __always_inline __u32 key_crc(const __u8 *key, __u32 key_len, const __u32 *table)
{
	__u32 crc = 0xffffffff;

	for (__u32 i = 0; i < MAX_KEY_LEN && i < key_len; i++)
		crc = crc32_byte(table, crc, key[i]);
	return crc ^ 0xffffffff;
}

#endif /* SOFTDTA_TRANSLATOR_HASHING_H */
