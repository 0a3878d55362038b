"""RoCEv2 frames built by softdta against independent implementations: scapy, tshark and a byte-level iCRC.

Every expectation here comes from docs (rocev2.md, dta-v1.md section 3) or from scapy / tshark, never from
softdta itself:

* the extended-header layouts are re-declared below as scapy layers (scapy only ships BTH and AETH);
* the iCRC is recomputed by scapy's ``BTH.post_build`` (``icrc=None``), which masks IPv4 TOS/TTL/checksum or
  IPv6 traffic class/flow label/hop limit, the UDP checksum and BTH byte 4, and by ``reference_icrc`` below,
  written from the rocev2.md description;
* tshark 4.0 displays the iCRC (``infiniband.invariant.crc``) but does not validate it, so the value it shows is
  compared with ``reference_icrc``.
"""

from __future__ import annotations

import ipaddress
import json
import random
import struct
import zlib
from dataclasses import dataclass, replace

import numpy as np
import pytest
from scapy.contrib.roce import AETH, BTH
from scapy.fields import BitField, ByteField, IntField, LongField
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw

from softdta.spec import ROCE_OPCODE_HEADERS, RoceOpcode
from softdta.wire.codec import WireError
from softdta.wire.frames import UdpEndpoints, build_udp_frame, mac_str
from softdta.wire.roce import build_roce_frame, icrc, icrc_of_rows, parse_roce, transport_payload
from tests.common import needs_tshark, num, run_tshark

# --------------------------------------------------------------------------------------------------
# Independent definitions (rocev2.md "Extended headers"), as scapy layers.


class RETH(Packet):
    name = "RETH"
    fields_desc = [LongField("va", 0), IntField("rkey", 0), IntField("dma_length", 0)]


class ImmDt(Packet):
    name = "ImmDt"
    fields_desc = [IntField("immediate", 0)]


class AtomicETH(Packet):
    name = "AtomicETH"
    fields_desc = [LongField("va", 0), IntField("rkey", 0), LongField("swap_add", 0), LongField("compare", 0)]


class AtomicAckETH(Packet):
    name = "AtomicAckETH"
    fields_desc = [LongField("original", 0)]


class DETH(Packet):
    name = "DETH"
    fields_desc = [IntField("qkey", 0), ByteField("reserved", 0), BitField("src_qp", 0, 24)]


# softdta header name -> (scapy layer, {field: bits}); AETH is scapy's own layer.
LAYERS = {
    "reth": (RETH, {"va": 64, "rkey": 32, "dma_length": 32}),
    "immdt": (ImmDt, {"immediate": 32}),
    "atomic_eth": (AtomicETH, {"va": 64, "rkey": 32, "swap_add": 64, "compare": 64}),
    "atomic_ack_eth": (AtomicAckETH, {"original": 64}),
    "deth": (DETH, {"qkey": 32, "reserved": 8, "src_qp": 24}),
    "aeth": (AETH, {"syndrome": 8, "msn": 24}),
}
HEADER_SIZES = {"reth": 16, "immdt": 4, "atomic_eth": 28, "atomic_ack_eth": 8, "deth": 8, "aeth": 4}

# Extended headers after the BTH, in wire order, per opcode value (rocev2.md, IBTA vol. 1 ch. 9).
EXPECTED_CHAIN = {
    0x04: (),
    0x0A: ("reth",),
    0x0B: ("reth", "immdt"),
    0x11: ("aeth",),
    0x12: ("aeth", "atomic_ack_eth"),
    0x13: ("atomic_eth",),
    0x14: ("atomic_eth",),
    0x2A: ("reth",),
    0x2B: ("reth", "immdt"),
    0x64: ("deth",),
}

ETH_LEN = 14
BTH_LEN = 12


def reference_icrc(frame: bytes) -> bytes:
    """iCRC written from rocev2.md: CRC-32 (zlib) over 8 x 0xFF and the masked IP packet, LSB first."""
    ethertype = frame[12:14]
    ip = bytearray(frame[ETH_LEN:])
    if ethertype == b"\x08\x00":
        header_len = (ip[0] & 0x0F) * 4
        ip = ip[:int.from_bytes(ip[2:4], "big")]
        ip[1] = 0xFF  # TOS (DSCP + ECN)
        ip[8] = 0xFF  # TTL
        ip[10:12] = b"\xff\xff"  # header checksum
    else:
        assert ethertype == b"\x86\xdd"
        header_len = 40
        ip = ip[:40 + int.from_bytes(ip[4:6], "big")]
        ip[0] |= 0x0F  # traffic class, high nibble
        ip[1:4] = b"\xff\xff\xff"  # traffic class low nibble + flow label
        ip[7] = 0xFF  # hop limit
    udp = header_len
    ip[udp + 6:udp + 8] = b"\xff\xff"  # UDP checksum
    ip[udp + 8 + 4] = 0xFF  # BTH byte 4: FECN, BECN, reserved6
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + bytes(ip[:-4])))


def ones_complement_sum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


# --------------------------------------------------------------------------------------------------
# Random cases


@dataclass(frozen=True)
class Case:
    opcode: int
    ends: UdpEndpoints
    dest_qp: int
    psn: int
    headers: dict
    payload: bytes
    ack_req: bool
    migreq: bool
    solicited: bool
    pkey: int

    @property
    def ipv6(self) -> bool:
        return len(self.ends.src_ip) == 16

    @property
    def pad(self) -> int:
        return (-len(self.payload)) % 4

    def transport(self) -> bytes:
        return transport_payload(RoceOpcode(self.opcode), self.dest_qp, self.psn, self.headers, self.payload,
                                 ack_req=self.ack_req, migreq=self.migreq, pkey=self.pkey, solicited=self.solicited)

    def frame(self) -> bytes:
        return build_roce_frame(self.ends, self.transport())


def random_ends(rng: random.Random, ipv6: bool) -> UdpEndpoints:
    if ipv6:
        src, dst = (ipaddress.IPv6Address(rng.getrandbits(128)).packed for _ in range(2))
    else:
        src, dst = (ipaddress.IPv4Address(rng.getrandbits(32)).packed for _ in range(2))
    return UdpEndpoints(src_mac=rng.randbytes(6), dst_mac=rng.randbytes(6), src_ip=src, dst_ip=dst,
                        sport=rng.randrange(1, 65536), dport=4791, dscp=rng.randrange(64), ecn=rng.randrange(4),
                        ttl=rng.randrange(1, 256), identification=rng.randrange(65536),
                        flow_label=rng.randrange(1 << 20) if ipv6 else 0)


def random_case(rng: random.Random, opcode: int, ipv6: bool, payload_len: int) -> Case:
    headers = {name: {f: rng.getrandbits(bits) for f, bits in LAYERS[name][1].items()}
               for name in EXPECTED_CHAIN[opcode]}
    return Case(opcode=opcode, ends=random_ends(rng, ipv6),
                dest_qp=rng.choice([0, 1, 0xFFFFFF, rng.getrandbits(24)]),
                psn=rng.choice([0, 0xFFFFFF, rng.getrandbits(24)]),
                headers=headers, payload=rng.randbytes(payload_len), ack_req=rng.random() < 0.5,
                migreq=rng.random() < 0.5, solicited=rng.random() < 0.5,
                pkey=rng.choice([0xFFFF, rng.getrandbits(16)]))


def all_cases(ipv6: bool, seed: int) -> list[Case]:
    """Every opcode with every payload length 0..64 (all pad counts), random everything else."""
    rng = random.Random(seed)
    return [random_case(rng, int(op), ipv6, length) for op in ROCE_OPCODE_HEADERS for length in range(65)]


CASES_V4 = all_cases(False, 4791)
CASES_V6 = all_cases(True, 6791)


def ip_layer(ends: UdpEndpoints):
    tos = (ends.dscp << 2) | ends.ecn
    if len(ends.src_ip) == 4:
        return (IP(src=str(ipaddress.ip_address(ends.src_ip)), dst=str(ipaddress.ip_address(ends.dst_ip)),
                   tos=tos, ttl=ends.ttl, id=ends.identification, flags="DF"),
                UDP(sport=ends.sport, dport=4791, chksum=0))
    return (IPv6(src=str(ipaddress.ip_address(ends.src_ip)), dst=str(ipaddress.ip_address(ends.dst_ip)),
                 tc=tos, fl=ends.flow_label, hlim=ends.ttl),
            UDP(sport=ends.sport, dport=4791))  # checksum computed by scapy over the final bytes


def scapy_frame(case: Case) -> bytes:
    """The same frame built in scapy layer by layer; BTH(icrc=None) makes scapy compute the iCRC."""
    ip, udp = ip_layer(case.ends)
    pkt = Ether(src=mac_str(case.ends.src_mac), dst=mac_str(case.ends.dst_mac)) / ip / udp / BTH(
        opcode=case.opcode, solicited=int(case.solicited), migreq=int(case.migreq), padcount=case.pad, version=0,
        pkey=case.pkey, fecn=0, becn=0, resv6=0, dqpn=case.dest_qp, ackreq=int(case.ack_req), resv7=0,
        psn=case.psn, icrc=None)
    for name in EXPECTED_CHAIN[case.opcode]:
        pkt = pkt / LAYERS[name][0](**case.headers[name])
    if case.payload:
        pkt = pkt / Raw(case.payload + bytes(case.pad))
    return bytes(pkt)


def udp_checksum_offset(frame: bytes) -> int:
    return ETH_LEN + (40 if frame[12:14] == b"\x86\xdd" else (frame[ETH_LEN] & 0x0F) * 4) + 6


def without_udp_checksum(frame: bytes) -> bytes:
    offset = udp_checksum_offset(frame)
    return frame[:offset] + b"\0\0" + frame[offset + 2:]


# --------------------------------------------------------------------------------------------------
# Layout


def test_opcode_table_matches_the_ibta_header_chains():
    assert {int(op) for op in ROCE_OPCODE_HEADERS} == set(EXPECTED_CHAIN)
    for opcode, headers in ROCE_OPCODE_HEADERS.items():
        assert tuple(h.name for h in headers) == EXPECTED_CHAIN[int(opcode)], opcode.name
        for h in headers:
            assert h.size == HEADER_SIZES[h.name]
            assert len(LAYERS[h.name][0]()) == HEADER_SIZES[h.name]


def test_transport_payload_lengths():
    rng = random.Random(1)
    for opcode in EXPECTED_CHAIN:
        for length in range(9):
            case = random_case(rng, opcode, False, length)
            transport = case.transport()
            expected = BTH_LEN + sum(HEADER_SIZES[h] for h in EXPECTED_CHAIN[opcode]) + length + case.pad
            assert len(transport) == expected
            assert len(transport) % 4 == 0
            assert (transport[1] >> 4) & 0b11 == (4 - length % 4) % 4  # PadCnt
            assert transport[len(transport) - case.pad:] == bytes(case.pad)


# --------------------------------------------------------------------------------------------------
# Against scapy


@pytest.mark.parametrize("cases", [CASES_V4], ids=["ipv4"])
def test_frames_equal_scapy_bytes_ipv4(cases):
    for case in cases:
        ours = case.frame()
        assert ours == scapy_frame(case), case


@pytest.mark.parametrize("cases", [CASES_V6], ids=["ipv6"])
def test_frames_equal_scapy_bytes_ipv6_apart_from_udp_checksum(cases):
    """scapy computes the iCRC over IPv6 too (tc, fl and hlim masked). The UDP checksum is checked apart."""
    for case in cases:
        ours = case.frame()
        theirs = scapy_frame(case)
        assert ours[-4:] == theirs[-4:], case
        assert without_udp_checksum(ours) == without_udp_checksum(theirs), case


def test_ipv6_udp_checksum_is_valid():
    for case in CASES_V6[::13]:
        frame = case.frame()
        ip = frame[ETH_LEN:]
        udp = ip[40:]
        pseudo = ip[8:40] + len(udp).to_bytes(4, "big") + b"\0\0\0\x11"
        assert frame[udp_checksum_offset(frame):udp_checksum_offset(frame) + 2] != b"\0\0"
        assert ones_complement_sum(pseudo + udp) == 0xFFFF, case
        assert frame == scapy_frame(case)


@pytest.mark.parametrize("cases", [CASES_V4, CASES_V6], ids=["ipv4", "ipv6"])
def test_scapy_dissects_our_frames(cases):
    for case in cases:
        frame = case.frame()
        pkt = Ether(frame)
        assert pkt[UDP].dport == 4791 and pkt[UDP].sport == case.ends.sport
        assert pkt[UDP].len == len(frame) - ETH_LEN - (40 if case.ipv6 else 20)
        bth = pkt[BTH]
        assert (bth.opcode, bth.solicited, bth.migreq, bth.padcount, bth.version, bth.pkey) == \
               (case.opcode, case.solicited, case.migreq, case.pad, 0, case.pkey)
        assert (bth.fecn, bth.becn, bth.resv6, bth.dqpn, bth.ackreq, bth.resv7, bth.psn) == \
               (0, 0, 0, case.dest_qp, case.ack_req, 0, case.psn)
        # scapy reads the iCRC trailer as a big-endian integer of the wire bytes; the wire is LSB first.
        assert bth.icrc == int.from_bytes(frame[-4:], "big")
        assert frame[-4:] == reference_icrc(frame)
        rest = bytes(bth.payload)
        for name in EXPECTED_CHAIN[case.opcode]:
            header = LAYERS[name][0](rest)
            assert {f: header.getfieldval(f) for f in LAYERS[name][1]} == case.headers[name], (case, name)
            rest = rest[HEADER_SIZES[name]:]
        assert rest == case.payload + bytes(case.pad)
        # scapy recomputes the same iCRC from our dissected frame.
        pkt[BTH].icrc = None
        assert bytes(pkt) == frame


def test_reference_icrc_agrees_with_scapy_on_unusual_values():
    """Check the test's own reference against scapy with non-zero FECN/BECN/resv6 and odd TOS/TTL."""
    rng = random.Random(7)
    for _ in range(50):
        for v6 in (False, True):
            case = random_case(rng, 0x0A, v6, rng.randrange(65))
            pkt = Ether(scapy_frame(case))
            pkt[BTH].fecn, pkt[BTH].becn, pkt[BTH].resv6 = 1, rng.randrange(2), rng.randrange(64)
            pkt[BTH].icrc = None
            frame = bytes(pkt)
            assert frame[-4:] == reference_icrc(frame)


# --------------------------------------------------------------------------------------------------
# parse_roce


@pytest.mark.parametrize("cases", [CASES_V4, CASES_V6], ids=["ipv4", "ipv6"])
def test_parse_roce_round_trips_every_field(cases):
    for case in cases:
        frame = case.frame()
        parsed = parse_roce(frame)
        assert parsed.bth == {
            "opcode": case.opcode, "solicited": int(case.solicited), "migreq": int(case.migreq),
            "pad_count": case.pad, "tver": 0, "pkey": case.pkey, "fecn": 0, "becn": 0, "reserved6": 0,
            "dest_qp": case.dest_qp, "ack_req": int(case.ack_req), "reserved7": 0, "psn": case.psn}
        assert parsed.opcode == case.opcode
        assert parsed.headers == case.headers
        assert parsed.payload == case.payload
        assert parsed.icrc == frame[-4:] == reference_icrc(frame)
        assert parsed.icrc_ok is True
        assert parsed.src_ip == case.ends.src_ip and parsed.dst_ip == case.ends.dst_ip
        udp = parsed.udp_frame
        assert udp.eth["src"] == case.ends.src_mac and udp.eth["dst"] == case.ends.dst_mac
        assert (udp.udp["sport"], udp.udp["dport"]) == (case.ends.sport, 4791)
        if case.ipv6:
            assert udp.is_ipv6
            assert udp.ip["traffic_class"] == (case.ends.dscp << 2) | case.ends.ecn
            assert udp.ip["flow_label"] == case.ends.flow_label
            assert udp.ip["hop_limit"] == case.ends.ttl
        else:
            assert not udp.is_ipv6
            assert (udp.ip["dscp"], udp.ip["ecn"], udp.ip["ttl"]) == (case.ends.dscp, case.ends.ecn, case.ends.ttl)
            assert udp.ip["identification"] == case.ends.identification
            assert udp.ip["flags"] == 0b010  # DF
            assert udp.udp["checksum"] == 0


def test_psn_is_24_bits():
    rng = random.Random(3)
    case = replace(random_case(rng, 0x0A, False, 8), psn=0x1234567)
    assert parse_roce(case.frame()).bth["psn"] == 0x234567


def masked_positions(frame: bytes) -> set[tuple[int, int]]:
    """(byte offset, XOR mask) pairs that only touch iCRC-masked bits (plus the IPv4 header checksum)."""
    ip = ETH_LEN
    if frame[12:14] == b"\x08\x00":
        udp = ip + 20
        spots = {(ip + 1, 0xFF), (ip + 8, 0xFF), (ip + 10, 0xFF), (ip + 11, 0xFF)}
    else:
        udp = ip + 40
        spots = {(ip, 0x0F), (ip + 1, 0xFF), (ip + 2, 0xFF), (ip + 3, 0xFF), (ip + 7, 0xFF)}
    return spots | {(udp + 6, 0xFF), (udp + 7, 0xFF), (udp + 8 + 4, 0xFF)}


def flip(frame: bytes, offset: int, mask: int) -> bytes:
    out = bytearray(frame)
    out[offset] ^= mask
    return bytes(out)


@pytest.mark.parametrize("ipv6", [False, True], ids=["ipv4", "ipv6"])
def test_icrc_ok_false_after_any_covered_byte_flip(ipv6):
    rng = random.Random(99 + ipv6)
    parsed_but_rejected = 0
    for opcode in EXPECTED_CHAIN:
        for length in (0, 5, 19):
            frame = random_case(rng, opcode, ipv6, length).frame()
            masked = {offset for offset, _ in masked_positions(frame)}
            for offset in range(ETH_LEN, len(frame)):
                masks = [rng.randrange(1, 256)]
                if offset in masked:
                    if not (ipv6 and offset == ETH_LEN):
                        continue
                    masks = [0x10 << rng.randrange(4)]  # the IPv6 version nibble is covered, not masked
                for mask in masks:
                    if offset == ETH_LEN + (40 if ipv6 else 20) + 8 and frame[offset] ^ mask == 0x81:
                        mask ^= 0x02  # CNP has its own test: test_parse_roce_handles_cnp
                    try:
                        parsed = parse_roce(flip(frame, offset, mask))
                    except WireError:
                        continue
                    assert parsed.icrc_ok is False, (opcode, length, offset, mask)
                    parsed_but_rejected += 1
    # Most flips still parse (payload, addresses, QPN, PSN, ...): icrc_ok is what catches them.
    assert parsed_but_rejected > 1500


@pytest.mark.parametrize("ipv6", [False, True], ids=["ipv4", "ipv6"])
def test_icrc_ok_true_when_only_masked_fields_change(ipv6):
    rng = random.Random(5 + ipv6)
    for opcode in EXPECTED_CHAIN:
        case = random_case(rng, opcode, ipv6, rng.randrange(65))
        frame = case.frame()
        reference = parse_roce(frame)
        for offset, mask in masked_positions(frame):
            for _ in range(3):
                value = rng.randrange(1, 256) & mask or mask
                changed = parse_roce(flip(frame, offset, value))
                assert changed.icrc_ok is True, (opcode, offset, value)
                assert changed.headers == reference.headers and changed.payload == reference.payload
                bth = {k: v for k, v in changed.bth.items() if k not in ("fecn", "becn", "reserved6")}
                assert bth == {k: v for k, v in reference.bth.items() if k not in ("fecn", "becn", "reserved6")}
        # All masked fields at once.
        mangled = frame
        for offset, mask in masked_positions(frame):
            mangled = flip(mangled, offset, mask)
        parsed = parse_roce(mangled)
        assert parsed.icrc_ok is True
        assert (parsed.bth["fecn"], parsed.bth["becn"], parsed.bth["reserved6"]) == (1, 1, 0x3F)


def test_router_rewrites_keep_the_icrc():
    """A switch that marks CE, sets FECN, rewrites DSCP and decrements TTL (fixing the checksum) keeps iCRC."""
    rng = random.Random(11)
    for opcode in EXPECTED_CHAIN:
        case = random_case(rng, opcode, False, 8)
        original = case.frame()
        remarked = replace(case, ends=replace(case.ends, dscp=(case.ends.dscp + 1) % 64, ecn=3,
                                              ttl=max(1, case.ends.ttl - 1)))
        frame = bytearray(remarked.frame())
        assert frame[-4:] == original[-4:]  # TOS/TTL do not enter the iCRC
        frame[ETH_LEN + 28 + 4] |= 0xC0  # FECN + BECN
        parsed = parse_roce(bytes(frame))
        assert parsed.icrc_ok and parsed.bth["fecn"] == 1 and parsed.bth["becn"] == 1
        assert parsed.udp_frame.ip["ecn"] == 3
        # The IPv4 identification is not masked: a different one gives a different iCRC.
        other = replace(case, ends=replace(case.ends, identification=case.ends.identification ^ 1)).frame()
        assert other[-4:] != original[-4:]
        assert not parse_roce(original[:-4] + other[-4:]).icrc_ok


def test_icrc_is_not_over_ethernet_header():
    rng = random.Random(12)
    frame = random_case(rng, 0x0A, False, 8).frame()
    for offset in range(12):  # MAC addresses
        assert parse_roce(flip(frame, offset, rng.randrange(1, 256))).icrc_ok is True
    with pytest.raises(WireError) as err:
        parse_roce(flip(frame, 12, 0x01))  # ethertype
    assert err.value.reason == "NOT_UDP"


def test_parse_roce_rejects_malformed():
    rng = random.Random(13)
    case = random_case(rng, 0x0A, False, 8)
    frame = case.frame()
    # Wrong UDP port.
    bad_port = bytearray(frame)
    bad_port[ETH_LEN + 22:ETH_LEN + 24] = (4792).to_bytes(2, "big")
    with pytest.raises(WireError) as err:
        parse_roce(bytes(bad_port))
    assert err.value.reason == "NOT_ROCE"
    # Unsupported opcode (RC READ request 0x0C).
    with pytest.raises(WireError) as err:
        parse_roce(flip(frame, ETH_LEN + 28, 0x0A ^ 0x0C))
    assert err.value.reason == "UNKNOWN_OPCODE"
    # Truncated frames (IP and UDP lengths adjusted so only the RoCE layer is short).
    send_only = replace(case, opcode=0x04, headers={}, payload=b"").transport()
    assert parse_roce(build_roce_frame(case.ends, send_only)).icrc_ok  # BTH + iCRC alone is a whole frame
    for cut in range(BTH_LEN):
        with pytest.raises(WireError) as err:
            parse_roce(build_udp_frame(case.ends, send_only[:cut] + bytes(4)))
        assert err.value.reason == "TRUNCATED", cut
    # A RETH cut short.
    with pytest.raises(WireError) as err:
        parse_roce(build_roce_frame(case.ends, case.transport()[:BTH_LEN + 8]))
    assert err.value.reason == "TRUNCATED"
    # Pad count larger than the payload.
    ack = random_case(rng, 0x11, False, 0)
    transport = bytearray(ack.transport())
    transport[1] |= 0x30
    with pytest.raises(WireError) as err:
        parse_roce(build_roce_frame(ack.ends, bytes(transport)))
    assert err.value.reason == "BAD_LENGTH"


def test_parse_roce_handles_cnp():
    """A DCQCN CNP (opcode 0x81, built by scapy) must give WireError or a parsed frame, never a crash."""
    from scapy.contrib.roce import cnp

    frame = bytes(Ether() / IP(src="10.0.0.51", dst="10.0.0.101", flags="DF") / UDP(sport=1, dport=4791, chksum=0)
                  / cnp(0x123))
    assert frame[-4:] == reference_icrc(frame)
    try:
        parsed = parse_roce(frame)
    except WireError as err:
        assert err.reason == "UNKNOWN_OPCODE"
    else:
        assert parsed.opcode == 0x81 and parsed.bth["dest_qp"] == 0x123 and parsed.icrc_ok


# --------------------------------------------------------------------------------------------------
# tshark

def tshark_cases() -> list[Case]:
    rng = random.Random(2024)
    ends = UdpEndpoints(src_mac=bytes.fromhex("02005e000001"), dst_mac=bytes.fromhex("02005e000002"),
                        src_ip=ipaddress.ip_address("10.0.0.101").packed,
                        dst_ip=ipaddress.ip_address("10.0.0.51").packed, sport=10000, dport=4791, dscp=26, ttl=64)

    def case(opcode, headers, payload=b"", **kw):
        return Case(opcode=opcode, ends=ends, dest_qp=kw.get("dest_qp", rng.getrandbits(24)),
                    psn=kw.get("psn", rng.getrandbits(24)), headers=headers, payload=payload,
                    ack_req=kw.get("ack_req", False), migreq=True, solicited=False, pkey=0xFFFF)

    return [
        case(0x0A, {"reth": {"va": 0x00007F1234560AD8, "rkey": 0x1234, "dma_length": 8}},
             bytes.fromhex("79b8f8990000002a"), psn=5, dest_qp=0x123),
        case(0x2A, {"reth": {"va": 0xFFFFFFFFFFFFFFF8, "rkey": 0xDEADBEEF, "dma_length": 20}}, rng.randbytes(20),
             psn=0xFFFFFF, ack_req=True),
        case(0x0B, {"reth": {"va": 0x1000, "rkey": 0x55, "dma_length": 3}, "immdt": {"immediate": 0xCAFEF00D}},
             b"abc"),
        case(0x14, {"atomic_eth": {"va": 0x8000_0000_0000_0010, "rkey": 0x7, "swap_add": 0xFFFF_FFFF_FFFF_FFFE,
                                   "compare": 0}}),
        case(0x13, {"atomic_eth": {"va": 0x40, "rkey": 0x99, "swap_add": 3, "compare": 0x1122334455667788}}),
        case(0x11, {"aeth": {"syndrome": 0x1F, "msn": 0xABCDEF}}),  # ACK, 31 credits
        case(0x11, {"aeth": {"syndrome": 0x60, "msn": 17}}),  # NAK PSN sequence error
        case(0x11, {"aeth": {"syndrome": 0x62, "msn": 18}}),  # NAK remote access error
        case(0x12, {"aeth": {"syndrome": 0x1F, "msn": 2}, "atomic_ack_eth": {"original": 0x0123456789ABCDEF}}),
        case(0x64, {"deth": {"qkey": 0x11111111, "reserved": 0, "src_qp": 0x000ABC}}, rng.randbytes(18),
             dest_qp=0x000042),
        case(0x04, {}, rng.randbytes(7)),
    ]


def hexbytes(text: str) -> bytes:
    return bytes.fromhex(text.replace(":", ""))


@pytest.mark.interop
@needs_tshark
def test_tshark_dissects_our_frames(tmp_path):
    cases = tshark_cases()
    frames = [c.frame() for c in cases]
    layers = run_tshark(frames, tmp_path)
    assert len(layers) == len(cases)
    for case, frame, layer in zip(cases, frames, layers):
        assert "_ws.malformed" not in layer and "_ws.expert" not in json.dumps(layer), case
        ib = layer["infiniband"]
        bth = ib["infiniband.bth_tree"]
        assert num(bth["infiniband.bth.opcode"]) == case.opcode
        assert num(bth["infiniband.bth.destqp"]) == case.dest_qp
        assert num(bth["infiniband.bth.psn"]) == case.psn
        assert num(bth["infiniband.bth.padcnt"]) == case.pad
        assert num(bth["infiniband.bth.m"]) == 1 and num(bth["infiniband.bth.se"]) == 0
        assert num(bth["infiniband.bth.a"]) == int(case.ack_req)
        assert num(bth["infiniband.bth.p_key"]) == 0xFFFF
        assert num(bth["infiniband.bth.tver"]) == 0
        if "reth" in case.headers:
            reth = ib["infiniband.reth_tree"]
            assert num(reth["infiniband.reth.va"]) == case.headers["reth"]["va"]
            assert num(reth["infiniband.reth.r_key"]) == case.headers["reth"]["rkey"]
            assert num(reth["infiniband.reth.dmalen"]) == case.headers["reth"]["dma_length"]
        if "immdt" in case.headers:
            assert hexbytes(ib["infiniband.immdt"]) == case.headers["immdt"]["immediate"].to_bytes(4, "big")
        if "atomic_eth" in case.headers:
            atomic, expected = ib["infiniband.atomiceth_tree"], case.headers["atomic_eth"]
            assert num(atomic["infiniband.reth.va"]) == expected["va"]  # tshark reuses the RETH field names
            assert num(atomic["infiniband.reth.r_key"]) == expected["rkey"]
            assert num(atomic["infiniband.atomiceth.swapdt"]) == expected["swap_add"]
            assert num(atomic["infiniband.atomiceth.cmpdt"]) == expected["compare"]
        if "aeth" in case.headers:
            aeth, expected = ib["infiniband.aeth_tree"], case.headers["aeth"]
            assert num(aeth["infiniband.aeth.syndrome"]) == expected["syndrome"]
            assert num(aeth["infiniband.aeth.msn"]) == expected["msn"]
            syndrome = aeth["infiniband.aeth.syndrome_tree"]
            assert num(syndrome["infiniband.aeth.syndrome.opcode"]) == expected["syndrome"] >> 5
            if expected["syndrome"] >> 5 == 0:
                assert num(syndrome["infiniband.aeth.syndrome.credit_count"]) == expected["syndrome"] & 0x1F
            else:
                assert num(syndrome["infiniband.aeth.syndrome.error_code"]) == expected["syndrome"] & 0x1F
        if "atomic_ack_eth" in case.headers:
            assert num(ib["infiniband.atomicacketh_tree"]["infiniband.atomicacketh.origremdt"]) == \
                   case.headers["atomic_ack_eth"]["original"]
        if "deth" in case.headers:
            deth = ib["infiniband.deth_tree"]
            assert num(deth["infiniband.deth.q_key"]) == case.headers["deth"]["qkey"]
            assert num(deth["infiniband.deth.srcqp"]) == case.headers["deth"]["src_qp"]
        # tshark 4.0 shows the iCRC (as a big-endian read of the wire bytes) without validating it.
        assert num(ib["infiniband.invariant.crc"]) == int.from_bytes(reference_icrc(frame), "big")
        if case.payload:
            assert hexbytes(layer["data"]["data.data"]) == case.payload + bytes(case.pad)
        else:
            assert "data" not in layer
        assert num(layer["ip"]["ip.dsfield_tree"]["ip.dsfield.dscp"]) == 26
        assert layer["ip"]["ip.flags_tree"]["ip.flags.df"] == "1"
        assert num(layer["udp"]["udp.length"]) == len(frame) - ETH_LEN - 20


@pytest.mark.interop
@needs_tshark
def test_tshark_ipv4_header_checksum_good_and_udp_checksum_absent(tmp_path):
    frames = [c.frame() for c in tshark_cases()]
    layers = run_tshark(frames, tmp_path, "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE")
    for layer in layers:
        assert layer["ip"]["ip.checksum.status"] == "1"  # good
        assert num(layer["udp"]["udp.checksum"]) == 0
        assert layer["udp"]["udp.checksum_tree"]["udp.checksum.status"] == "3"  # not present


@pytest.mark.interop
@needs_tshark
def test_tshark_ipv6_udp_checksum(tmp_path):
    frames = [c.frame() for c in CASES_V6[::50]]
    layers = run_tshark(frames, tmp_path, "-o", "udp.check_checksum:TRUE")
    assert len(layers) == len(frames)
    for layer in layers:
        udp = layer["udp"]
        status = udp.get("udp.checksum.status", udp.get("udp.checksum_tree", {}).get("udp.checksum.status"))
        assert status == "1"  # good


def test_icrc_of_rows_equals_icrc_of_each_packet_flips_and_masked_fields_alike():
    """The vectorized iCRC (`icrc_of_rows`, the batch translator's check of ACKs) of IPv4 packets of one length
    is `icrc` of each, whatever their bytes: real frames, and the same with covered bytes flipped or masked
    fields changed."""
    rng = random.Random(12)
    for opcode in EXPECTED_CHAIN:
        frame = random_case(rng, opcode, False, rng.randrange(40)).frame()
        variants = [frame, *(flip(frame, offset, mask) for offset, mask in masked_positions(frame))]
        variants += [flip(frame, offset, rng.randrange(1, 256)) for offset in rng.sample(range(ETH_LEN + 1,
                                                                                               len(frame) - 4), 20)]
        packets = [variant[ETH_LEN:-4] for variant in variants]
        rows = np.frombuffer(b"".join(packets), dtype=np.uint8).reshape(len(packets), -1)
        assert icrc_of_rows(rows).tolist() == [int.from_bytes(icrc(packet), "little") for packet in packets]
    with pytest.raises(ValueError):
        icrc_of_rows(np.zeros((1, 39), dtype=np.uint8))
