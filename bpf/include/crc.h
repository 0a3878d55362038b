/* CRC-32 over bytes in a map value, slice-by-8 for the iCRC and byte-wise for short keys.
 * `buf` indexes are masked with the buffer's power-of-two size so the verifier can bound every access. */
#ifndef SOFTDTA_CRC_BPF_H
#define SOFTDTA_CRC_BPF_H

#include "softdta_crc.h"

#define CRC_SHORT_WORDS 12

/* The raw CRC-32 state after eight more bytes, loaded as one little-endian word. */
static __always_inline __u32 crc32_slice8_word(__u32 crc, __u64 word)
{
	__u32 lo = crc ^ (__u32)word, hi = word >> 32;

	return crc32_slice8[7][lo & 0xff] ^ crc32_slice8[6][(lo >> 8) & 0xff] ^ crc32_slice8[5][(lo >> 16) & 0xff] ^
	       crc32_slice8[4][lo >> 24] ^ crc32_slice8[3][hi & 0xff] ^ crc32_slice8[2][(hi >> 8) & 0xff] ^
	       crc32_slice8[1][(hi >> 16) & 0xff] ^ crc32_slice8[0][hi >> 24];
}

/* The raw CRC-32 state after four more bytes, loaded as one little-endian word (slice-by-4). */
static __always_inline __u32 crc32_slice4_word(__u32 crc, __u32 word)
{
	__u32 lo = crc ^ word;

	return crc32_slice8[3][lo & 0xff] ^ crc32_slice8[2][(lo >> 8) & 0xff] ^ crc32_slice8[1][(lo >> 16) & 0xff] ^
	       crc32_slice8[0][lo >> 24];
}

/* Raw (pre-xorout) CRC-32 state after `len` bytes of buf[start..], slice-by-8 with 8-byte loads (x86 and
 * arm64 load unaligned words at full speed). buf must hold mask + 8 bytes. */
static __always_inline __u32 crc32_slice8_update(__u32 crc, const __u8 *buf, __u32 mask, __u32 start, __u32 len)
{
	__u32 i = 0;

	for (int step = 0; step < 256 && i + 8 <= len; step++, i += 8)
		crc = crc32_slice8_word(crc, *(const __u64 *)(buf + ((start + i) & mask)));
	for (int step = 0; step < 8 && i < len; step++, i++)
		crc = crc32_slice8[0][(crc ^ buf[(start + i) & mask]) & 0xff] ^ (crc >> 8);
	return crc;
}

/* The same, for a len that is a multiple of 4 and at most 8 * CRC_SHORT_WORDS + 4. Its loop's exits all reach
 * code that no longer needs the index, so the verifier walks it once per call site, which lets it be inline. */
static __always_inline __u32 crc32_slice8_update_short(__u32 crc, const __u8 *buf, __u32 mask, __u32 start,
						       __u32 len)
{
	__u32 words = len / 8;

	for (__u32 i = 0; i < CRC_SHORT_WORDS && i < words; i++)
		crc = crc32_slice8_word(crc, *(const __u64 *)(buf + ((start + 8 * i) & mask)));
	if (len & 4)
		crc = crc32_slice4_word(crc, *(const __u32 *)(buf + ((start + 8 * words) & mask)));
	return crc;
}

static __always_inline __u32 crc32_byte(const __u32 *table, __u32 crc, __u8 byte)
{
	return table[(crc ^ byte) & 0xff] ^ (crc >> 8);
}

#endif /* SOFTDTA_CRC_BPF_H */
