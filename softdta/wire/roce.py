"""RoCEv2: transport headers, iCRC, and whole-frame build and dissect (sans-IO)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from softdta.wire.codec import WireError, codec
from softdta.wire.frames import UdpEndpoints, UdpFrame, build_udp_frame, parse_udp_frame
from softdta.spec import (BTH, DEFAULT_PKEY, ICRC_LEN, ROCE_OPCODE_HEADERS, ROCE_PORT, AethKind, Header,
                   NakCode, RoceOpcode)

_BTH = codec(BTH)
_ICRC_PREFIX = b"\xff" * 8
_ETHERNET_LEN = 14


def icrc(ip_packet: bytes) -> bytes:
    """iCRC of an IP packet (IP header through the last payload byte, without the iCRC), wire order.

    The variant fields are masked to ones as IBTA Annex A17 prescribes: IPv4 TOS, TTL and header checksum (or
    IPv6 traffic class, flow label and hop limit), the UDP checksum, and BTH byte 4 (FECN, BECN, reserved).
    """
    masked = bytearray(ip_packet)
    if masked[0] >> 4 == 4:
        header_len = (masked[0] & 0x0F) * 4
        masked[1] = 0xFF
        masked[8] = 0xFF
        masked[10:12] = b"\xff\xff"
    else:
        header_len = 40
        masked[0:4] = bytes([masked[0] | 0x0F, 0xFF, 0xFF, 0xFF])
        masked[7] = 0xFF
    masked[header_len + 6:header_len + 8] = b"\xff\xff"
    masked[header_len + 8 + 4] = 0xFF
    return zlib.crc32(masked, zlib.crc32(_ICRC_PREFIX)).to_bytes(4, "little")


def aeth_syndrome(kind: AethKind, value: int) -> int:
    """Compose an AETH syndrome: credit count for ACK, timer for RNR NAK, NAK code for NAK."""
    return (int(kind) << 5) | (value & 0x1F)


def aeth_kind(syndrome: int) -> tuple[int, int]:
    """Split an AETH syndrome into (kind, low five bits)."""
    return syndrome >> 5, syndrome & 0x1F


ACK_SYNDROME = aeth_syndrome(AethKind.ACK, 0x1F)
NAK_SEQUENCE_SYNDROME = aeth_syndrome(AethKind.NAK, NakCode.PSN_SEQUENCE_ERROR)
NAK_REMOTE_ACCESS_SYNDROME = aeth_syndrome(AethKind.NAK, NakCode.REMOTE_ACCESS_ERROR)
NAK_INVALID_REQUEST_SYNDROME = aeth_syndrome(AethKind.NAK, NakCode.INVALID_REQUEST)


def transport_payload(opcode: RoceOpcode, dest_qp: int, psn: int, headers: dict[str, dict],
                      payload: bytes = b"", ack_req: bool = False, migreq: bool = True,
                      pkey: int = DEFAULT_PKEY, solicited: bool = False) -> bytes:
    """BTH, the opcode's extended headers (from `headers`, keyed by header name) and the payload."""
    pad = (-len(payload)) % 4
    out = _BTH.pack(opcode=int(opcode), solicited=int(solicited), migreq=int(migreq), pad_count=pad, pkey=pkey,
                    dest_qp=dest_qp, ack_req=int(ack_req), psn=psn & 0xFFFFFF)
    for header in ROCE_OPCODE_HEADERS[RoceOpcode(opcode)]:
        out += codec(header).pack(headers.get(header.name, {}))
    return out + payload + bytes(pad)


def build_roce_frame(ends: UdpEndpoints, transport: bytes) -> bytes:
    """A complete RoCEv2 frame: UDP to port 4791 carrying `transport` and a correct iCRC."""
    frame = build_udp_frame(ends, transport + bytes(ICRC_LEN))
    crc = icrc(frame[_ETHERNET_LEN:-ICRC_LEN])
    if len(ends.src_ip) == 16:
        # IPv6 needs a real UDP checksum, which covers the iCRC; the iCRC itself masks the UDP checksum.
        return build_udp_frame(ends, transport + crc)
    return frame[:-ICRC_LEN] + crc


@dataclass
class RoceFrame:
    """A dissected RoCEv2 frame. `headers` maps extended header names to their fields."""

    udp_frame: UdpFrame
    bth: dict
    headers: dict[str, dict] = field(default_factory=dict)
    payload: bytes = b""
    icrc: bytes = b""
    icrc_ok: bool = False

    @property
    def opcode(self) -> int:
        return self.bth["opcode"]

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


