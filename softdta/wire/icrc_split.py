"""The iCRC as a per-QP constant XOR a CRC over the variable tail of a frame, for data planes that cannot hash
a whole RoCEv2 frame (Tofino: a hash unit takes a few dozen bytes of header fields). Sans-IO.

CRC-32 is affine over GF(2): for messages of one length, crc(a ^ b) = crc(a) ^ crc(b) ^ crc(zeros). Write a
frame's iCRC input as C ^ V, where C holds everything fixed for one QP and one frame length (masked IPv4 and
UDP headers, BTH opcode, P_Key and DestQP, the leading 0xFF bytes) with zeros in place of the variable
bytes, and V holds the variable bytes with zeros elsewhere. Then iCRC = crc(C) ^ L(V), where L is the CRC
with initial value 0 and no final XOR. Leading zero bytes do not change L, so L(V) is L over V's tail only:
from BTH byte 8 (AckReq, PSN) on, through the extended headers and payload. The control plane precomputes
crc(C) (`constant`); the data plane hashes the tail with a CRC of init 0 and no final XOR (`linear_crc`) and
XORs the two.

A data plane that can hash one wide field with the standard CRC-32 (v1model) hashes the tail right-aligned in
a field of `TAIL_BYTES`: leading zeros leave L unchanged, and over a fixed length crc(x) = L(x) ^ crc(zeros),
so L(tail) = crc(zero-padded tail) ^ `TAIL_ZEROS_CRC`.

A data plane whose hash units each take a few dozen bytes (TNA) chains them: L is a CRC state, so
L(prefix || piece) = L((le(L(prefix)) ^ piece[:4]) || piece[4:]) (`continue_crc`): each unit hashes one
piece with the CRC so far folded into its first word. `chained_tail_crc` is the TNA program's layout: the
headers of the tail and the first (payload mod `TAIL_CHUNK_BYTES`) bytes of the payload in one unit, then one
unit per `TAIL_CHUNK_BYTES` chunk.
"""

from __future__ import annotations

import zlib

from softdta.spec import BTH, IMMDT, IPV4, MAX_WRITE_PAYLOAD, RETH, UDP
from softdta.wire.hashing import crc_table
from softdta.wire.roce import icrc

# Offset, in the IP packet, of the first byte that changes from frame to frame of one QP and length: BTH
# byte 8 (AckReq and reserved), followed by the PSN. IPv4 identification is 0 and the IPv4 checksum, TOS and
# TTL are masked in the iCRC, so every header byte before it is fixed per QP and frame length.
VARIABLE_FROM = IPV4.size + UDP.size + 8
# The longest tail: the rest of the BTH, RETH, ImmDt and the largest write (a Fetch&Add tail is shorter).
TAIL_BYTES = BTH.size - 8 + RETH.size + IMMDT.size + MAX_WRITE_PAYLOAD
# A chained hash unit's piece of the payload on TNA (p4/softdta_tna.p4 TAIL_CHUNK_WORDS).
TAIL_CHUNK_BYTES = 32
# Chunks one TNA egress pass chains; a longer payload finishes its CRC in a second pass (recirculated).
TAIL_CHUNKS_PER_PASS = 4
_TABLE = crc_table()
TAIL_ZEROS_CRC = zlib.crc32(bytes(TAIL_BYTES))


def linear_crc(data: bytes) -> int:
    """Reflected CRC-32 (the iCRC polynomial) with initial value 0 and no final XOR."""
    state = 0
    for byte in data:
        state = _TABLE[(state ^ byte) & 0xFF] ^ (state >> 8)
    return state


def constant(ip_packet: bytes, variable_from: int = VARIABLE_FROM) -> int:
    """The per-QP part: the iCRC (as a little-endian integer, the wire order) of the packet with its variable
    tail zeroed. Any packet of the QP with the same length gives the same value."""
    if len(ip_packet) < max(variable_from, IPV4.size + UDP.size + BTH.size):
        raise ValueError("the packet ends before the BTH does")
    fixed = ip_packet[:variable_from] + bytes(len(ip_packet) - variable_from)
    return int.from_bytes(icrc(fixed), "little")


def combine(constant_part: int, ip_packet: bytes, variable_from: int = VARIABLE_FROM) -> bytes:
    """The iCRC as the data plane forms it: the constant XOR the linear CRC of the tail, in wire order."""
    return (constant_part ^ linear_crc(ip_packet[variable_from:])).to_bytes(4, "little")


def combine_padded(constant_part: int, ip_packet: bytes, variable_from: int = VARIABLE_FROM) -> bytes:
    """The iCRC as v1model forms it: the standard CRC-32 of the tail right-aligned in `TAIL_BYTES` bytes."""
    tail = ip_packet[variable_from:]
    if len(tail) > TAIL_BYTES:
        raise ValueError(f"a tail of {len(tail)} bytes is longer than {TAIL_BYTES}")
    padded = zlib.crc32(bytes(TAIL_BYTES - len(tail)) + tail)
    return (constant_part ^ padded ^ TAIL_ZEROS_CRC).to_bytes(4, "little")


def continue_crc(state: int, piece: bytes) -> int:
    """`linear_crc(prefix + piece)` from `state = linear_crc(prefix)`, hashing only `piece` (4 bytes or more)
    with the state XORed into its first word."""
    if len(piece) < 4:
        raise ValueError("a piece continues the CRC in its first 4 bytes: it needs at least 4")
    folded = bytes(a ^ b for a, b in zip(state.to_bytes(4, "little"), piece[:4]))
    return linear_crc(folded + piece[4:])


def chained_tail_crc(tail: bytes, headers_len: int) -> int:
    """L(tail) as the TNA program chains its hash units: the tail's `headers_len` header bytes with the lead of
    the payload (its length modulo `TAIL_CHUNK_BYTES`) in one unit, then each whole chunk continuing the CRC."""
    first = headers_len + (len(tail) - headers_len) % TAIL_CHUNK_BYTES
    state = linear_crc(tail[:first])
    for start in range(first, len(tail), TAIL_CHUNK_BYTES):
        state = continue_crc(state, tail[start:start + TAIL_CHUNK_BYTES])
    return state


def tna_needs_two_passes(payload_len: int) -> bool:
    """Whether the TNA program finishes a write's tail CRC in a second egress pass: when its payload has more
    whole chunks than one pass chains (p4/softdta_tna.p4, `chained_tail_crc`)."""
    return payload_len // TAIL_CHUNK_BYTES > TAIL_CHUNKS_PER_PASS
