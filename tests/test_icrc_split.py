"""The split iCRC (per-QP constant XOR a CRC over the variable tail) equals the real iCRC of softdta.roce."""

import random
import zlib

import pytest

from softdta.frames import UdpEndpoints, build_udp_frame
from softdta.icrc_split import VARIABLE_FROM, combine, combine_padded, constant, linear_crc
from softdta.roce import icrc, transport_payload
from softdta.spec import ICRC_LEN, ROCE_PORT, RoceOpcode

ETHERNET = 14


def ip_packet(rng: random.Random, ends: UdpEndpoints, opcode: RoceOpcode, dest_qp: int, rkey: int,
              payload_len: int) -> bytes:
    """A RoCEv2 packet of one QP: PSN, AckReq, address and payload vary, the QP's fields do not."""
    psn, ack_req = rng.randrange(1 << 24), rng.random() < 0.5
    if opcode is RoceOpcode.RC_FETCH_ADD:
        headers = {"atomic_eth": {"va": rng.getrandbits(61) << 3, "rkey": rkey, "swap_add": rng.getrandbits(64)}}
        payload = b""
    else:
        headers = {"reth": {"va": rng.getrandbits(64), "rkey": rkey, "dma_length": payload_len}}
        payload = rng.randbytes(payload_len)
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


def test_the_tail_crc_continues_one_word_per_pass():
    """What longer TNA tails would need (docs/p4.md): carrying L across passes costs one 32-bit hash per word,
    L(prefix || w) = L(le(L(prefix)) ^ w) for a 4-byte w."""
    rng = random.Random(3)
    for _ in range(50):
        prefix, word = rng.randbytes(rng.randrange(4, 40)), rng.randbytes(4)
        state = linear_crc(prefix).to_bytes(4, "little")
        assert linear_crc(prefix + word) == linear_crc(bytes(a ^ b for a, b in zip(state, word)))
