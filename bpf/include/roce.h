/* Building RoCEv2 frames: the IPv4 header, the RoCE header lengths and the iCRC's masking of variant fields. */
#ifndef SOFTDTA_ROCE_H
#define SOFTDTA_ROCE_H

#include <linux/in.h>
#include "softdta_spec.h"

/* Everything of an outgoing IPv4 header but the variant fields, which ipv4_finish fills once the iCRC is known. */
static __always_inline void ipv4_header(__u8 *ip, __u32 total_len, __u32 src, __u32 dst)
{
	put8(ip + IPV4_VERSION_OFF, IPV4_VERSION_NUMBER << IPV4_VERSION_SHIFT | (IPV4_SIZE / 4) << IPV4_IHL_SHIFT);
	ipv4_set_total_length(ip, total_len);
	ipv4_set_identification(ip, 0);
	put16(ip + IPV4_FLAGS_OFF, IPV4_FLAG_DONT_FRAGMENT << IPV4_FLAGS_SHIFT);
	ipv4_set_protocol(ip, IPPROTO_UDP);
	__builtin_memcpy(ip + IPV4_SRC_OFF, &src, IPV4_SRC_LEN);
	__builtin_memcpy(ip + IPV4_DST_OFF, &dst, IPV4_DST_LEN);
}

/* The variant fields of an IPv4 header, then its checksum. */
static __always_inline void ipv4_finish(__u8 *ip, __u32 dscp, __u32 ttl)
{
	__u32 sum = 0;

	put8(ip + IPV4_DSCP_OFF, dscp << IPV4_DSCP_SHIFT);
	ipv4_set_ttl(ip, ttl);
	ipv4_set_checksum(ip, 0);
	for (int i = 0; i < IPV4_SIZE; i += 2)
		sum += get16(ip + i);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	ipv4_set_checksum(ip, ~sum);
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

/* The iCRC covers a packet with its variant fields set to ones (the spec's icrc_variant fields of IPv4, UDP and
 * BTH), after eight 0xff bytes that stand for the InfiniBand LRH at lrh. */
static __always_inline void icrc_mask(__u8 *lrh, __u8 *ip, __u8 *udp, __u8 *bth)
{
	__builtin_memset(lrh, 0xff, LRH_STAND_IN_LEN);
	ipv4_icrc_variant_ones(ip);
	udp_icrc_variant_ones(udp);
	bth_icrc_variant_ones(bth);
}

/* What a sender puts in the variant fields of UDP and BTH once the iCRC is computed: zeros (ipv4_finish fills
 * the IPv4 ones). */
static __always_inline void icrc_unmask(__u8 *udp, __u8 *bth)
{
	udp_icrc_variant_zeros(udp);
	bth_icrc_variant_zeros(bth);
}

#endif /* SOFTDTA_ROCE_H */
