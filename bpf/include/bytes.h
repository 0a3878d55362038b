/* Big-endian loads and stores of 1 to 8 bytes at any alignment: the generated field accessors of
 * softdta_spec.h are built on them. Whole words are one load or store and one byte swap: BPF's JIT targets
 * (x86, arm64) access unaligned words at full speed, and the verifier allows it wherever the kernel declares
 * efficient unaligned access. */
#ifndef SOFTDTA_BYTES_H
#define SOFTDTA_BYTES_H

#include <linux/types.h>

static __always_inline __u32 get8(const __u8 *p)
{
	return *p;
}

static __always_inline __u32 get16(const __u8 *p)
{
	return __builtin_bswap16(*(const __u16 *)p);
}

static __always_inline __u32 get24(const __u8 *p)
{
	return (__u32)get8(p) << 16 | get16(p + 1);
}

static __always_inline __u32 get32(const __u8 *p)
{
	return __builtin_bswap32(*(const __u32 *)p);
}

static __always_inline __u64 get64(const __u8 *p)
{
	return __builtin_bswap64(*(const __u64 *)p);
}

static __always_inline void put8(__u8 *p, __u32 v)
{
	*p = v;
}

static __always_inline void put16(__u8 *p, __u32 v)
{
	*(__u16 *)p = __builtin_bswap16(v);
}

static __always_inline void put24(__u8 *p, __u32 v)
{
	put8(p, v >> 16);
	put16(p + 1, v);
}

static __always_inline void put32(__u8 *p, __u32 v)
{
	*(__u32 *)p = __builtin_bswap32(v);
}

static __always_inline void put64(__u8 *p, __u64 v)
{
	*(__u64 *)p = __builtin_bswap64(v);
}

#endif /* SOFTDTA_BYTES_H */
