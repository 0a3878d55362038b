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
"""

from __future__ import annotations

import zlib

from .hashing import crc_table
from .roce import icrc
from .spec import BTH, IMMDT, IPV4, MAX_WRITE_PAYLOAD, RETH, UDP

# Offset, in the IP packet, of the first byte that changes from frame to frame of one QP and length: BTH
# byte 8 (AckReq and reserved), followed by the PSN. IPv4 identification is 0 and the IPv4 checksum, TOS and
# TTL are masked in the iCRC, so every header byte before it is fixed per QP and frame length.
VARIABLE_FROM = IPV4.size + UDP.size + 8
# The longest tail: the rest of the BTH, RETH, ImmDt and the largest write (a Fetch&Add tail is shorter).
TAIL_BYTES = BTH.size - 8 + RETH.size + IMMDT.size + MAX_WRITE_PAYLOAD
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
