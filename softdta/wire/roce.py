"""RoCEv2: transport headers, iCRC, and whole-frame build and dissect (sans-IO)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from softdta.spec import (
    AETH_KIND_SHIFT,
    AETH_VALUE_MASK,
    BTH,
    DEFAULT_PKEY,
    ETHERNET,
    ICRC_LEN,
    IPV4,
    IPV4_VERSION_NUMBER,
    IPV6,
    LRH_STAND_IN_LEN,
    PSN_MASK,
    ROCE_OPCODE_HEADERS,
    ROCE_PORT,
    UDP,
    AethKind,
    Field,
    Header,
    NakCode,
    RoceOpcode,
)
from softdta.wire.codec import WireError, codec
from softdta.wire.frames import UdpEndpoints, UdpFrame, build_udp_frame, parse_udp_frame
from softdta.wire.hashing import linear_crc_position_tables, xor_of_shares

_BTH = codec(BTH)
_LRH_STAND_IN_CRC = zlib.crc32(b"\xff" * LRH_STAND_IN_LEN)
# version and ihl share the first byte of IPv4 (4 bits each)
_IPV4_VERSION_SHIFT = 8 - IPV4.fields[0].bits
_IPV4_IHL_MASK = (1 << IPV4.fields[1].bits) - 1



def icrc_variant_mask(header: Header) -> bytes:
    """A header-sized mask with the bits of the header's `icrc_variant` fields set."""
    total, offset, mask = header.size * 8, 0, 0
    for f in header.fields:
        if isinstance(f, Field) and f.icrc_variant:
            mask |= ((1 << f.bits) - 1) << (total - offset - f.bits)
        offset += f.bits
    return mask.to_bytes(header.size, "big")


# (size, mask of the variant bits) of each header the iCRC masks; Header.size is summed on every access
_IPV4_VARIANT, _IPV6_VARIANT, _UDP_VARIANT, _BTH_VARIANT = (
    (header.size, int.from_bytes(icrc_variant_mask(header), "big")) for header in (IPV4, IPV6, UDP, BTH))


def _set_ones(buffer: bytearray, at: int, variant: tuple[int, int]) -> None:
    """The header's variant fields at buffer[at:] to ones: one OR with a precomputed mask per header."""
    size, mask = variant
    buffer[at:at + size] = (int.from_bytes(buffer[at:at + size], "big") | mask).to_bytes(size, "big")


def icrc(ip_packet: bytes) -> bytes:
    """iCRC of an IP packet (IP header through the last payload byte, without the iCRC), wire order.

    The variant fields (the spec's `icrc_variant`: IPv4 TOS, TTL and header checksum, or IPv6 traffic class,
    flow label and hop limit; the UDP checksum; BTH FECN, BECN and reserved bits) count as ones, after eight
    0xff bytes that stand for the LRH (IBTA Annex A17).
    """
    masked = bytearray(ip_packet)
    if ip_packet[0] >> _IPV4_VERSION_SHIFT == IPV4_VERSION_NUMBER:
        header_len = (ip_packet[0] & _IPV4_IHL_MASK) * 4
        _set_ones(masked, 0, _IPV4_VARIANT)
    else:
        header_len = _IPV6_VARIANT[0]
        _set_ones(masked, 0, _IPV6_VARIANT)
    _set_ones(masked, header_len, _UDP_VARIANT)
    _set_ones(masked, header_len + _UDP_VARIANT[0], _BTH_VARIANT)
    return zlib.crc32(masked, _LRH_STAND_IN_CRC).to_bytes(ICRC_LEN, "little")


# the variant fields of an IPv4 packet without options, through its BTH, as ones
_IPV4_PACKET_VARIANT = np.frombuffer(b"".join(icrc_variant_mask(header) for header in (IPV4, UDP, BTH)),
                                     dtype=np.uint8)


def icrc_of_rows(packets: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint32]:
    """`icrc` of each row of `packets`, IPv4 packets without options of one length (each through the last payload
    byte, without the iCRC), as the little-endian numbers the wire carries: the CRC is linear, so each is the
    CRC of that many zeros XOR one table lookup per byte (`linear_crc_position_tables`)."""
    length = packets.shape[1]
    if length < _IPV4_PACKET_VARIANT.size:
        raise ValueError(f"a RoCEv2 IPv4 packet has at least {_IPV4_PACKET_VARIANT.size} bytes, not {length}")
    masked = packets.copy()
    masked[:, :_IPV4_PACKET_VARIANT.size] |= _IPV4_PACKET_VARIANT
    return xor_of_shares(linear_crc_position_tables(length), masked, list(range(length)),
                         zlib.crc32(bytes(length), _LRH_STAND_IN_CRC))


def aeth_syndrome(kind: AethKind, value: int) -> int:
    """Compose an AETH syndrome: credit count for ACK, timer for RNR NAK, NAK code for NAK."""
    return (int(kind) << AETH_KIND_SHIFT) | (value & AETH_VALUE_MASK)


def aeth_kind(syndrome: int) -> tuple[int, int]:
    """Split an AETH syndrome into (kind, low five bits)."""
    return syndrome >> AETH_KIND_SHIFT, syndrome & AETH_VALUE_MASK


NAK_SEQUENCE_SYNDROME = aeth_syndrome(AethKind.NAK, NakCode.PSN_SEQUENCE_ERROR)
NAK_REMOTE_ACCESS_SYNDROME = aeth_syndrome(AethKind.NAK, NakCode.REMOTE_ACCESS_ERROR)
NAK_INVALID_REQUEST_SYNDROME = aeth_syndrome(AethKind.NAK, NakCode.INVALID_REQUEST)


def transport_payload(opcode: RoceOpcode, dest_qp: int, psn: int, headers: dict[str, dict[str, Any]],
                      payload: bytes = b"", ack_req: bool = False, migreq: bool = True,
                      pkey: int = DEFAULT_PKEY, solicited: bool = False) -> bytes:
    """BTH, the opcode's extended headers (from `headers`, keyed by header name) and the payload."""
    pad = (-len(payload)) % 4
    out = _BTH.pack(opcode=int(opcode), solicited=int(solicited), migreq=int(migreq), pad_count=pad, pkey=pkey,
                    dest_qp=dest_qp, ack_req=int(ack_req), psn=psn & PSN_MASK)
    for header in ROCE_OPCODE_HEADERS[RoceOpcode(opcode)]:
        out += codec(header).pack(headers.get(header.name, {}))
    return out + payload + bytes(pad)


def build_roce_frame(ends: UdpEndpoints, transport: bytes) -> bytes:
    """A complete RoCEv2 frame: UDP to port 4791 carrying `transport` and a correct iCRC."""
    frame = build_udp_frame(ends, transport + bytes(ICRC_LEN))
    crc = icrc(frame[ETHERNET.size:-ICRC_LEN])
    if len(ends.src_ip) == 16:
        # IPv6 needs a real UDP checksum, which covers the iCRC; the iCRC itself masks the UDP checksum.
        return build_udp_frame(ends, transport + crc)
    return frame[:-ICRC_LEN] + crc


@dataclass
class RoceFrame:
    """A dissected RoCEv2 frame. `headers` maps extended header names to their fields."""

    udp_frame: UdpFrame
    bth: dict[str, Any]
    headers: dict[str, dict[str, Any]] = field(default_factory=dict)
    payload: bytes = b""
    icrc: bytes = b""
    icrc_ok: bool = False

    @property
    def opcode(self) -> int:
        opcode: int = self.bth["opcode"]
        return opcode

    @property
    def src_ip(self) -> bytes:
        return self.udp_frame.src_ip

    @property
    def dst_ip(self) -> bytes:
        return self.udp_frame.dst_ip


def parse_roce(frame: bytes, udp_frame: UdpFrame | None = None) -> RoceFrame:
    """Dissect a RoCEv2 frame; raises WireError for unknown opcodes or bad lengths, flags a bad iCRC."""
    udp_frame = udp_frame or parse_udp_frame(frame)
    if udp_frame.udp["dport"] != ROCE_PORT:
        raise WireError("NOT_ROCE", f"UDP port {udp_frame.udp['dport']} is not RoCEv2 ({ROCE_PORT})")
    body = udp_frame.payload
    if len(body) < BTH.size + ICRC_LEN:
        raise WireError("TRUNCATED", f"RoCEv2 payload of {len(body)} bytes is shorter than BTH + iCRC")
    bth, offset = _BTH.unpack(body)
    try:
        extended: tuple[Header, ...] = ROCE_OPCODE_HEADERS[RoceOpcode(bth["opcode"])]
    except (ValueError, KeyError):
        raise WireError("UNKNOWN_OPCODE", f"RoCE opcode 0x{bth['opcode']:02x} is not supported") from None
    headers = {}
    for header in extended:
        headers[header.name], offset = codec(header).unpack(body[:-ICRC_LEN], offset)
    payload_end = len(body) - ICRC_LEN - bth["pad_count"]
    if payload_end < offset:
        raise WireError("BAD_LENGTH", "pad count exceeds the payload")
    wire_icrc = body[-ICRC_LEN:]
    ip_packet = udp_frame.frame[udp_frame.ip_offset:udp_frame.payload_end - ICRC_LEN]
    return RoceFrame(udp_frame, bth, headers, body[offset:payload_end], wire_icrc, icrc(ip_packet) == wire_icrc)


def describe_aeth(syndrome: int) -> str:
    kind, value = aeth_kind(syndrome)
    if kind == AethKind.ACK:
        return f"ACK credits={value}"
    if kind == AethKind.RNR_NAK:
        return f"RNR NAK timer={value}"
    if kind == AethKind.NAK:
        try:
            return f"NAK {NakCode(value).name}"
        except ValueError:
            return f"NAK code {value}"
    return f"reserved syndrome 0x{syndrome:02x}"


