/* Big-endian loads and stores of 1 to 8 bytes at any alignment: the generated field accessors of
 * softdta_spec.h are built on them. */
#ifndef SOFTDTA_BYTES_H
#define SOFTDTA_BYTES_H

#include <linux/types.h>

static __always_inline __u32 get8(const __u8 *p)
{
	return *p;
}

static __always_inline __u32 get16(const __u8 *p)
{
	return (__u32)get8(p) << 8 | get8(p + 1);
}

static __always_inline __u32 get24(const __u8 *p)
{
	return (__u32)get8(p) << 16 | get16(p + 1);
}

static __always_inline __u32 get32(const __u8 *p)
{
	return (__u32)get16(p) << 16 | get16(p + 2);
}

static __always_inline __u64 get64(const __u8 *p)
{
	return (__u64)get32(p) << 32 | get32(p + 4);
}

static __always_inline void put8(__u8 *p, __u32 v)
{
	*p = v;
}

static __always_inline void put16(__u8 *p, __u32 v)
{
	put8(p, v >> 8);
	put8(p + 1, v);
}

static __always_inline void put24(__u8 *p, __u32 v)
{
	put8(p, v >> 16);
	put16(p + 1, v);
}

static __always_inline void put32(__u8 *p, __u32 v)
{
	put16(p, v >> 16);
	put16(p + 2, v);
}

static __always_inline void put64(__u8 *p, __u64 v)
{
	put32(p, v >> 32);
	put32(p + 4, v);
}

#endif /* SOFTDTA_BYTES_H */
