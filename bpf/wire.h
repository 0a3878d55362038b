/* Helpers shared by the BPF programs: map declarations, big-endian fields, IPv4 headers, RoCE header lengths
 * and iCRC masking. */
#ifndef SOFTDTA_WIRE_H
#define SOFTDTA_WIRE_H

#include <linux/in.h>
#include "softdta_spec.h"

/* One map; its key and value layouts are the generated ones of softdta_spec.h (the control plane's contract). */
#define TABLE(_name, _type, _key, _value, _max)                                                          \
	struct {                                                                                         \
		__uint(type, _type);                                                                     \
		__type(key, _key);                                                                       \
		__type(value, _value);                                                                   \
		__uint(max_entries, _max);                                                               \
	} _name SEC(".maps")

static __always_inline void put16(__u8 *p, __u16 v)
{
	p[0] = v >> 8;
	p[1] = v;
}

static __always_inline void put32(__u8 *p, __u32 v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

static __always_inline void put64(__u8 *p, __u64 v)
{
	put32(p, v >> 32);
	put32(p + 4, v);
}

static __always_inline __u32 get32(const __u8 *p)
{
	return (__u32)p[0] << 24 | (__u32)p[1] << 16 | (__u32)p[2] << 8 | p[3];
}

static __always_inline void ipv4_header(__u8 *ip, __u16 total_len, __u32 src, __u32 dst)
{
	ip[0] = 0x45;
	put16(ip + 2, total_len);
	put32(ip + 4, 0x00004000);	/* identification 0, DF */
	ip[9] = IPPROTO_UDP;
	__builtin_memcpy(ip + 12, &src, 4);
	__builtin_memcpy(ip + 16, &dst, 4);
}

static __always_inline void ipv4_finish(__u8 *ip, __u8 dscp, __u8 ttl)
{
	__u32 sum = 0;

	ip[1] = dscp << 2;
	ip[8] = ttl;
	ip[10] = 0;
	ip[11] = 0;
	for (int i = 0; i < IPV4_SIZE; i += 2)
		sum += (__u32)ip[i] << 8 | ip[i + 1];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	put16(ip + 10, ~sum);
}

/* Bytes of the extended transport headers after the BTH for the opcodes softdta knows, -1 for others. */
static __always_inline int roce_ext_len(__u8 opcode)
{
	switch (opcode) {
	case ROCE_OP_RC_SEND_ONLY: return ROCE_EXT_LEN_RC_SEND_ONLY;
	case ROCE_OP_RC_WRITE_ONLY: return ROCE_EXT_LEN_RC_WRITE_ONLY;
	case ROCE_OP_RC_WRITE_ONLY_IMM: return ROCE_EXT_LEN_RC_WRITE_ONLY_IMM;
	case ROCE_OP_RC_ACK: return ROCE_EXT_LEN_RC_ACK;
	case ROCE_OP_RC_ATOMIC_ACK: return ROCE_EXT_LEN_RC_ATOMIC_ACK;
	case ROCE_OP_RC_COMPARE_SWAP: return ROCE_EXT_LEN_RC_COMPARE_SWAP;
	case ROCE_OP_RC_FETCH_ADD: return ROCE_EXT_LEN_RC_FETCH_ADD;
	case ROCE_OP_UC_WRITE_ONLY: return ROCE_EXT_LEN_UC_WRITE_ONLY;
	case ROCE_OP_UC_WRITE_ONLY_IMM: return ROCE_EXT_LEN_UC_WRITE_ONLY_IMM;
	case ROCE_OP_UD_SEND_ONLY: return ROCE_EXT_LEN_UD_SEND_ONLY;
	default: return -1;
	}
}

/* Prepares a received IP packet, copied to ip = lrh + 8, for the iCRC: eight 0xff bytes stand for the LRH, and
 * the variant fields (IPv4 TOS, TTL, checksum; UDP checksum; BTH byte 4) are set to ones. */
static __always_inline void icrc_mask(__u8 *lrh, __u8 *ip, __u32 ip_header_len)
{
	__builtin_memset(lrh, 0xff, 8);
	ip[1] = 0xff;
	ip[8] = 0xff;
	ip[10] = 0xff;
	ip[11] = 0xff;
	ip[(ip_header_len + 6) & 63] = 0xff;
	ip[(ip_header_len + 7) & 63] = 0xff;
	ip[(ip_header_len + UDP_SIZE + 4) & 127] = 0xff;
}

#endif /* SOFTDTA_WIRE_H */
