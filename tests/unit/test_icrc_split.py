"""The split iCRC (per-QP constant XOR a CRC over the variable tail) equals the real iCRC of softdta.wire.roce."""

import random
import zlib

import pytest

from softdta.spec import BTH, ICRC_LEN, IMMDT, MAX_WRITE_PAYLOAD, RETH, ROCE_PORT, RoceOpcode
from softdta.wire.frames import UdpEndpoints, build_udp_frame
from softdta.wire.icrc_split import (
    TAIL_CHUNK_BYTES,
    VARIABLE_FROM,
    chained_tail_crc,
    combine,
    combine_padded,
    constant,
    continue_crc,
    linear_crc,
)
from softdta.wire.roce import icrc, transport_payload

ETHERNET = 14


def ip_packet(rng: random.Random, ends: UdpEndpoints, opcode: RoceOpcode, dest_qp: int, rkey: int,
              payload_len: int, immediate: int | None = None) -> bytes:
    """A RoCEv2 packet of one QP: PSN, AckReq, address and payload vary, the QP's fields do not."""
    psn, ack_req = rng.randrange(1 << 24), rng.random() < 0.5
    if opcode is RoceOpcode.RC_FETCH_ADD:
        headers = {"atomic_eth": {"va": rng.getrandbits(61) << 3, "rkey": rkey, "swap_add": rng.getrandbits(64)}}
        payload = b""
    else:
        headers = {"reth": {"va": rng.getrandbits(64), "rkey": rkey, "dma_length": payload_len}}
        payload = rng.randbytes(payload_len)
    if immediate is not None:
        headers["immdt"] = {"immediate": immediate}
    transport = transport_payload(opcode, dest_qp, psn, headers, payload, ack_req=ack_req)
    frame = build_udp_frame(ends, transport + bytes(ICRC_LEN))
    return frame[ETHERNET:-ICRC_LEN]


def endpoints(rng: random.Random) -> UdpEndpoints:
    return UdpEndpoints(src_mac=rng.randbytes(6), dst_mac=rng.randbytes(6), src_ip=rng.randbytes(4),
                        dst_ip=rng.randbytes(4), sport=rng.randrange(1, 1 << 16), dport=ROCE_PORT,
                        dscp=rng.randrange(64), ttl=rng.randrange(1, 256))


def test_crc_is_affine_over_gf2():
    rng = random.Random(1)
    for length in (1, 7, 64, 333):
        a, b = rng.randbytes(length), rng.randbytes(length)
        xor = bytes(x ^ y for x, y in zip(a, b))
        assert zlib.crc32(xor) == zlib.crc32(a) ^ zlib.crc32(b) ^ zlib.crc32(bytes(length))
        assert linear_crc(xor) == linear_crc(a) ^ linear_crc(b)
        assert linear_crc(bytes(5) + a) == linear_crc(a)  # leading zeros do not count


@pytest.mark.parametrize("opcode,payload_len", [(RoceOpcode.UC_WRITE_ONLY, 8), (RoceOpcode.RC_WRITE_ONLY, 8),
                                                (RoceOpcode.UC_WRITE_ONLY, 64), (RoceOpcode.RC_FETCH_ADD, 0)])
def test_constant_and_tail_give_the_real_icrc(opcode, payload_len):
    rng = random.Random(f"{opcode}{payload_len}")
    for _ in range(20):
        ends, dest_qp, rkey = endpoints(rng), rng.randrange(2, 1 << 24), rng.getrandbits(32)
        first = ip_packet(rng, ends, opcode, dest_qp, rkey, payload_len)
        per_qp = constant(first)
        for _ in range(25):
            packet = ip_packet(rng, ends, opcode, dest_qp, rkey, payload_len)
            assert constant(packet) == per_qp
            assert combine(per_qp, packet) == icrc(packet)
            assert combine_padded(per_qp, packet) == icrc(packet)


def test_a_variable_byte_before_the_tail_breaks_the_split():
    rng = random.Random(7)
    ends = endpoints(rng)
    packet = ip_packet(rng, ends, RoceOpcode.UC_WRITE_ONLY, 0x123, 0x456, 8)
    per_qp = constant(packet)
    changed = bytearray(packet)
    changed[VARIABLE_FROM - 1] ^= 0x01  # BTH byte 7: the low byte of DestQP, part of the constant
    assert combine(per_qp, bytes(changed)) != icrc(bytes(changed))
    assert combine(constant(bytes(changed)), bytes(changed)) == icrc(bytes(changed))


def test_the_tail_crc_continues_over_pieces():
    """L(prefix || piece) = L((le(L(prefix)) ^ piece[:4]) || piece[4:]): each TNA hash unit continues the last."""
    rng = random.Random(3)
    for _ in range(200):
        prefix, piece = rng.randbytes(rng.randrange(0, 80)), rng.randbytes(rng.randrange(4, 60))
        assert continue_crc(linear_crc(prefix), piece) == linear_crc(prefix + piece)
    with pytest.raises(ValueError):
        continue_crc(0, b"abc")


def test_a_piece_hashed_without_the_state_breaks_the_chain():
    rng = random.Random(4)
    prefix, piece = rng.randbytes(24), rng.randbytes(TAIL_CHUNK_BYTES)
    assert linear_crc(prefix) ^ linear_crc(piece) != linear_crc(prefix + piece)


@pytest.mark.parametrize("opcode", [RoceOpcode.RC_WRITE_ONLY, RoceOpcode.UC_WRITE_ONLY_IMM,
                                    RoceOpcode.RC_WRITE_ONLY_IMM, RoceOpcode.UC_WRITE_ONLY])
def test_chained_hash_units_give_the_real_icrc_for_every_payload_length(opcode):
    """Append batches (1..16 words), Postcarding paths (1..8) and Sketch-Merge groups (up to 64 words), as the
    TNA program chains them: headers and lead words in one unit, then a unit per 32-byte chunk."""
    rng = random.Random(f"chained{opcode}")
    with_immediate = opcode in (RoceOpcode.RC_WRITE_ONLY_IMM, RoceOpcode.UC_WRITE_ONLY_IMM)
    headers_len = BTH.size - 8 + RETH.size + (IMMDT.size if with_immediate else 0)
    for words in range(1, MAX_WRITE_PAYLOAD // 4 + 1):
        ends, dest_qp, rkey = endpoints(rng), rng.randrange(2, 1 << 24), rng.getrandbits(32)
        immediate = rng.getrandbits(32) if with_immediate else None
        per_qp = constant(ip_packet(rng, ends, opcode, dest_qp, rkey, 4 * words, immediate))
        for _ in range(3):
            packet = ip_packet(rng, ends, opcode, dest_qp, rkey, 4 * words,
                               rng.getrandbits(32) if with_immediate else None)
            tail = packet[VARIABLE_FROM:]
            assert len(tail) == headers_len + 4 * words
            crc = per_qp ^ chained_tail_crc(tail, headers_len)
            assert crc.to_bytes(4, "little") == icrc(packet)
