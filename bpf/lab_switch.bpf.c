// SPDX-License-Identifier: GPL-2.0
/* For the lab, not the product: the live lab's switch ports (softdta.lab.topology). The data plane's datagrams
 * (reports, RoCEv2 and its replies) to a station in `switch_port` leave by redirect, in XDP, as a hardware switch
 * forwards them at line rate; the kernel's bridge behind the ports forwards the rest (ARP, the control plane's
 * TCP, frames to other stations). The bridge costs about ten times more a frame: a translator sending from XDP
 * outran it, and the 256-slot veth ring in front of it dropped. A station gets data-plane frames only while it
 * runs XDP, as it does whenever it takes them; the rest reaches it either way.
 * Running XDP on a port is also what lets frames XDP_TX'd or redirected from its peer enter it. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "softdta_spec.h"
#include "maps.h"
#include "parsing.h"

TABLE(switch_port, BPF_MAP_TYPE_HASH, struct switch_port_key, struct switch_port_value, SWITCH_PORT_MAX_ENTRIES);

SEC("xdp")
int softdta_switch(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
	struct switch_port_key key = {};
	struct switch_port_value *port;
	struct udp4 datagram;

	if (parse_udp4(data, data_end, &datagram) || (datagram.dport != DTA_PORT && datagram.dport != ROCE_PORT))
		return XDP_PASS;
	__builtin_memcpy(key.mac, data, sizeof(key.mac));	/* the destination MAC */
	port = bpf_map_lookup_elem(&switch_port, &key);
	if (!port || port->ifindex == ctx->ingress_ifindex)
		return XDP_PASS;
	return bpf_redirect(port->ifindex, 0);
}

char LICENSE[] SEC("license") = "GPL";
