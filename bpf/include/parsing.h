/* The one parser of the BPF programs: Ethernet, IPv4 and UDP, with the checks every program makes before it
 * trusts a datagram (the xdp-tools parsing-helpers idea, with softdta_spec.h's generated accessors). */
#ifndef SOFTDTA_PARSING_H
#define SOFTDTA_PARSING_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include "softdta_spec.h"

/* An IPv4 UDP datagram in a frame, as parse_udp4 found it. */
struct udp4 {
	__u8 *eth;
	__u8 *ip;
	__u8 *udp;
	__u32 ihl;		/* IPv4 header bytes, 20 to 60 */
	__u32 ip_total;		/* IPv4 total length: within the frame */
	__u32 udp_len;		/* UDP length: within ip_total */
	__u32 dport;
};

/* 0 for an unfragmented IPv4 UDP datagram whose IP and UDP lengths agree with each other and with the frame;
 * -1 for anything else, which the caller passes up the stack untouched. */
static __always_inline int parse_udp4(void *data, void *data_end, struct udp4 *d)
{
	__u8 *eth = data, *ip = eth + ETHERNET_SIZE, *udp;

	if ((void *)(ip + IPV4_SIZE) > data_end || ethernet_get_ethertype(eth) != ETH_P_IP)
		return -1;
	if (ipv4_get_version(ip) != IPV4_VERSION_NUMBER || ipv4_get_ihl(ip) < IPV4_SIZE / 4 ||
	    ipv4_get_protocol(ip) != IPPROTO_UDP)
		return -1;
	if ((ipv4_get_flags(ip) & IPV4_FLAG_MORE_FRAGMENTS) || ipv4_get_fragment_offset(ip))
		return -1;
	d->ihl = ipv4_get_ihl(ip) * 4;
	d->ip_total = ipv4_get_total_length(ip);
	if (ETHERNET_SIZE + d->ip_total > (__u64)(data_end - data) || d->ip_total < d->ihl + UDP_SIZE)
		return -1;
	udp = ip + d->ihl;
	if ((void *)(udp + UDP_SIZE) > data_end)
		return -1;
	d->udp_len = udp_get_length(udp);
	if (d->udp_len < UDP_SIZE || d->ihl + d->udp_len > d->ip_total)
		return -1;
	d->dport = udp_get_dport(udp);
	d->eth = eth;
	d->ip = ip;
	d->udp = udp;
	return 0;
}

#endif /* SOFTDTA_PARSING_H */
