"""Ethernet / IPv4 / IPv6 / UDP framing shared by DTA reports, DTA NACKs and RoCEv2 frames."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Any

from softdta.spec import ETH_P_IP, ETH_P_IPV6, ETHERNET, IPPROTO_UDP, IPV4, IPV6, UDP
from softdta.wire.codec import WireError, codec

_ETH = codec(ETHERNET)
_IPV4 = codec(IPV4)
_IPV6 = codec(IPV6)
_UDP = codec(UDP)


def mac_bytes(mac: str | bytes) -> bytes:
    if isinstance(mac, bytes):
        if len(mac) != 6:
            raise ValueError(f"a MAC address is 6 bytes, got {len(mac)}")
        return mac
    parts = mac.replace("-", ":").split(":")
    if len(parts) != 6:
        raise ValueError(f"bad MAC address {mac!r}: expected six hex bytes like 02:00:00:00:00:01")
    return bytes(int(p, 16) for p in parts)


def mac_str(mac: bytes) -> str:
    return ":".join(f"{b:02x}" for b in mac)


def ip_bytes(address: str | bytes | ipaddress.IPv4Address | ipaddress.IPv6Address) -> bytes:
    if isinstance(address, bytes):
        if len(address) not in (4, 16):
            raise ValueError(f"an IP address is 4 or 16 bytes, got {len(address)}")
        return address
    return ipaddress.ip_address(address).packed


def ip_str(address: bytes) -> str:
    return str(ipaddress.ip_address(address))


def ipv4_checksum(header: bytes) -> int:
    total: int = sum(struct.unpack(f"!{len(header) // 2}H", header[:len(header) // 2 * 2]))
    if len(header) % 2:
        total += header[-1]  # as a one-byte big-endian word, like the slice of an odd tail
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@dataclass(frozen=True)
class UdpEndpoints:
    """Addresses and header values for one UDP flow (IPv4 or IPv6, by the length of the IPs)."""

    src_mac: bytes
    dst_mac: bytes
    src_ip: bytes
    dst_ip: bytes
    sport: int
    dport: int
    dscp: int = 0
    ecn: int = 0
    ttl: int = 64
    identification: int = 0
    flow_label: int = 0

    def __post_init__(self) -> None:
        if len(self.src_ip) != len(self.dst_ip):
            raise ValueError("source and destination IP must be the same family")


def build_udp_frame(ends: UdpEndpoints, payload: bytes) -> bytes:
    """A complete Ethernet frame; UDP checksum 0 over IPv4, computed over IPv6 (where 0 is not allowed)."""
    udp_length = _UDP.size + len(payload)
    ip_header: bytes | bytearray  # a bytearray for IPv4, whose checksum is patched in
    if len(ends.src_ip) == 4:
        ip_header = bytearray(_IPV4.pack(
            version=4, ihl=5, dscp=ends.dscp, ecn=ends.ecn, total_length=_IPV4.size + udp_length,
            identification=ends.identification, flags=0b010, ttl=ends.ttl, protocol=IPPROTO_UDP,
            src=ends.src_ip, dst=ends.dst_ip))
        ip_header[10:12] = ipv4_checksum(bytes(ip_header)).to_bytes(2, "big")
        udp = _UDP.pack(sport=ends.sport, dport=ends.dport, length=udp_length)
        ethertype = ETH_P_IP
    else:
        ip_header = _IPV6.pack(
            version=6, traffic_class=(ends.dscp << 2) | ends.ecn, flow_label=ends.flow_label,
            payload_length=udp_length, next_header=IPPROTO_UDP, hop_limit=ends.ttl,
            src=ends.src_ip, dst=ends.dst_ip)
        checksum = _udp6_checksum(ends, udp_length, payload)
        udp = _UDP.pack(sport=ends.sport, dport=ends.dport, length=udp_length, checksum=checksum)
        ethertype = ETH_P_IPV6
    return _ETH.pack(dst=ends.dst_mac, src=ends.src_mac, ethertype=ethertype) + bytes(ip_header) + udp + payload


def _udp6_checksum(ends: UdpEndpoints, udp_length: int, payload: bytes) -> int:
    pseudo = (ends.src_ip + ends.dst_ip + udp_length.to_bytes(4, "big") + bytes(3) + bytes([IPPROTO_UDP])
              + _UDP.pack(sport=ends.sport, dport=ends.dport, length=udp_length) + payload)
    if len(pseudo) % 2:
        pseudo += b"\0"
    checksum = ipv4_checksum(pseudo)
    return checksum or 0xFFFF


@dataclass(frozen=True)
class UdpFrame:
    """A parsed Ethernet/IP/UDP frame. `ip_offset` and `payload_offset` index into `frame`."""

    frame: bytes
    eth: dict[str, Any]
    ip: dict[str, Any]
    udp: dict[str, Any]
    ip_offset: int
    payload_offset: int
    payload_end: int

    @property
    def payload(self) -> bytes:
        return self.frame[self.payload_offset:self.payload_end]

    @property
    def is_ipv6(self) -> bool:
        version: int = self.ip["version"]
        return version == 6

    @property
    def src_ip(self) -> bytes:
        src: bytes = self.ip["src"]
        return src

    @property
    def dst_ip(self) -> bytes:
        dst: bytes = self.ip["dst"]
        return dst


def parse_udp_frame(frame: bytes) -> UdpFrame:
    """Parse Ethernet/IPv4|IPv6/UDP; raises WireError for anything else or inconsistent lengths."""
    eth, offset = _ETH.unpack(frame)
    ip_offset = offset
    if eth["ethertype"] == ETH_P_IP:
        ip, _ = _IPV4.unpack(frame, offset)
        if ip["version"] != 4 or ip["ihl"] < 5:
            raise WireError("BAD_LENGTH", f"bad IPv4 version/IHL {ip['version']}/{ip['ihl']}")
        if ip["protocol"] != IPPROTO_UDP:
            raise WireError("NOT_UDP", f"IP protocol {ip['protocol']} is not UDP")
        if ip["fragment_offset"] or ip["flags"] & 0b001:
            raise WireError("BAD_LENGTH", "fragmented IPv4 packets are not reports")
        ip_end = offset + ip["total_length"]
        offset += ip["ihl"] * 4
    elif eth["ethertype"] == ETH_P_IPV6:
        ip, offset = _IPV6.unpack(frame, offset)
        if ip["next_header"] != IPPROTO_UDP:
            raise WireError("NOT_UDP", f"IPv6 next header {ip['next_header']} is not UDP")
        ip_end = offset + ip["payload_length"]
    else:
        raise WireError("NOT_UDP", f"ethertype 0x{eth['ethertype']:04x} is neither IPv4 nor IPv6")
    if ip_end > len(frame) or ip_end < offset + _UDP.size:
        raise WireError("TRUNCATED", f"IP length says {ip_end - ip_offset} bytes, frame holds {len(frame) - ip_offset}")
    udp, payload_offset = _UDP.unpack(frame, offset)
    payload_end = offset + udp["length"]
    if udp["length"] < _UDP.size or payload_end > ip_end:
        raise WireError("BAD_LENGTH", f"UDP length {udp['length']} does not fit the IP packet")
    return UdpFrame(bytes(frame), eth, ip, udp, ip_offset, payload_offset, payload_end)
