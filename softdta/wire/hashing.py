"""Hashes of the DTA primitives, scalar (zlib) and vectorized (numpy), exactly as dta-v1 computes them.

Key-Write and Key-Increment hash the key bytes *reversed* (for a 32-bit key: its little-endian form, which is
what dta-v1's P4 byte-swap produces), followed by one byte holding the copy index n. Extended keys of any
length follow the same rule: all key bytes reversed. Postcarding hashes the key in wire order.

Two slot-hash schemes exist (`spec.KeyHash`): dta-v1's CRC32(k || n), whose copies are correlated, and
INDEPENDENT, which gives copy n its own CRC polynomial.

The fleet's partition hash (`partition_hash`) picks a key's slot in the fleet's slot map, and so its collectors.
"""

from __future__ import annotations

import zlib
from functools import cache

import numpy as np
import numpy.typing as npt

from softdta.spec import (
    CRC32_POLYNOMIAL,
    KEY_HASH_POLYNOMIALS,
    PARTITION_POLYNOMIAL,
    POSTCARD_HOP_POLYNOMIALS,
    KeyHash,
)

_MASK32 = 0xFFFFFFFF


def crc32(data: bytes) -> int:
    """CRC-32 with zlib/Ethernet parameters (Tofino HashAlgorithm_t.CRC32, boost::crc_32_type)."""
    return zlib.crc32(data)


def _reflect32(value: int) -> int:
    return int(f"{value:032b}"[::-1], 2)


@cache
def crc_table(polynomial: int = CRC32_POLYNOMIAL) -> tuple[int, ...]:
    """Byte table of the reflected CRC-32 with `polynomial` in normal notation."""
    reflected = _reflect32(polynomial)
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (reflected if crc & 1 else 0)
        table.append(crc)
    return tuple(table)


def crc32_poly(polynomial: int, data: bytes) -> int:
    """Reflected CRC-32 with a custom polynomial, init and xorout 0xFFFFFFFF (Tofino CRCPolynomial)."""
    table = crc_table(polynomial)
    crc = _MASK32
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ _MASK32


def key_checksum(key: bytes) -> int:
    """The 32-bit checksum stored beside Key-Write data: CRC32 of the reversed key."""
    return zlib.crc32(key[::-1])


def key_slot_hash(key: bytes, copy: int, scheme: KeyHash = KeyHash.DTA_V1) -> int:
    """Unbounded 32-bit slot hash of copy `copy` (0-based) over reversed key ‖ copy."""
    if scheme is KeyHash.DTA_V1:
        return zlib.crc32(bytes([copy]), zlib.crc32(key[::-1]))
    return crc32_poly(KEY_HASH_POLYNOMIALS[copy], key[::-1] + bytes([copy]))


def key_slot(key: bytes, copy: int, slot_count: int, scheme: KeyHash = KeyHash.DTA_V1) -> int:
    """Slot of copy `copy` in a store of `slot_count` (a power of two) slots."""
    return key_slot_hash(key, copy, scheme) & (slot_count - 1)


def postcard_hop_hash(key: bytes, hop: int) -> int:
    """H_hop(key) for 1-based `hop`: the value XORed onto that hop's postcard data."""
    return crc32_poly(POSTCARD_HOP_POLYNOMIALS[hop - 1], key)


def postcard_slot_hash(key: bytes) -> int:
    """Postcarding cache index and collector slot hash: CRC32 of the key in wire order."""
    return zlib.crc32(key)


def partition_hash(partition_key: bytes) -> int:
    """The fleet's partition hash of a report's partition key (spec.PARTITION_POLYNOMIAL)."""
    return crc32_poly(PARTITION_POLYNOMIAL, partition_key)


def partition_slot(partition_key: bytes, slot_bits: int) -> int:
    """The slot of the fleet's slot map that owns `partition_key`."""
    return partition_hash(partition_key) & ((1 << slot_bits) - 1)


# --------------------------------------------------------------------------------------------------
# Vectorized forms, for queries over millions of keys.

@cache
def _np_table(polynomial: int = CRC32_POLYNOMIAL) -> np.ndarray:
    return np.array(crc_table(polynomial), dtype=np.uint32)


def crc32_update_rows(state: np.ndarray, rows: np.ndarray, polynomial: int = CRC32_POLYNOMIAL) -> np.ndarray:
    """Advance raw CRC states (before xorout) over each row of a (count, width) uint8 array."""
    table = _np_table(polynomial)
    state = state.astype(np.uint32, copy=True)
    for column in range(rows.shape[1]):
        index = (state ^ rows[:, column]) & 0xFF
        state = table.take(index) ^ (state >> np.uint32(8))  # take: half the time of indexing
    return state


def crc32_rows(rows: np.ndarray, polynomial: int = CRC32_POLYNOMIAL) -> np.ndarray:
    """CRC-32 of every row of a (count, width) uint8 array."""
    start = np.full(rows.shape[0], _MASK32, dtype=np.uint32)
    return crc32_update_rows(start, rows, polynomial) ^ np.uint32(_MASK32)


def partition_slots_rows(rows: np.ndarray, slot_bits: int) -> np.ndarray:
    """`partition_slot` of every row of a (count, width) uint8 array of partition keys."""
    return crc32_rows(rows, PARTITION_POLYNOMIAL) & np.uint32((1 << slot_bits) - 1)


def keys_to_rows(keys: npt.ArrayLike, key_len: int = 4) -> np.ndarray:
    """Integer keys (big-endian on the wire) to a (count, key_len) uint8 array of wire bytes."""
    values = np.asarray(keys, dtype=np.uint64)
    shifts = np.arange(key_len - 1, -1, -1, dtype=np.uint64) * np.uint64(8)
    return ((values[:, None] >> shifts) & np.uint64(0xFF)).astype(np.uint8)


def key_hashes_rows(key_rows: np.ndarray, copies: int,
                    scheme: KeyHash = KeyHash.DTA_V1) -> tuple[np.ndarray, np.ndarray]:
    """Checksums (count,) and unbounded slot hashes (copies, count) for wire-order key rows."""
    shares, zeros_crc = _reversed_key_shares(key_rows.shape[1])
    # the CRC is affine: the CRC of the reversed key is that of as many zero bytes XOR each byte's share
    checksums = xor_of_shares(shares, key_rows, list(range(key_rows.shape[1])), int(zeros_crc))
    state = checksums ^ np.uint32(_MASK32)  # the CRC register after the key
    slot_hashes = np.empty((copies, key_rows.shape[0]), dtype=np.uint32)
    table = _np_table()
    for copy in range(copies):
        if scheme is KeyHash.DTA_V1 or KEY_HASH_POLYNOMIALS[copy] == CRC32_POLYNOMIAL:
            # dta-v1 copies share the key's CRC state; one more byte (the copy index) finishes each. So does
            # copy 0 of the independent scheme, whose polynomial is the checksum's.
            index = (state ^ np.uint32(copy)) & 0xFF
            slot_hashes[copy] = (table.take(index) ^ (state >> np.uint32(8))) ^ np.uint32(_MASK32)
        else:
            copy_column = np.full((key_rows.shape[0], 1), copy, dtype=np.uint8)
            slot_hashes[copy] = crc32_rows(np.hstack([key_rows[:, ::-1], copy_column]), KEY_HASH_POLYNOMIALS[copy])
    return checksums, slot_hashes


@cache
def _reversed_key_shares(length: int) -> tuple[np.ndarray, np.uint32]:
    """For wire-order keys of `length` bytes: (length, 256) tables, row j mapping byte j to its share of the
    reversed key's linear CRC, and the CRC-32 of `length` zero bytes."""
    shares = np.ascontiguousarray(linear_crc_position_tables(length)[::-1])
    shares.flags.writeable = False  # cached and shared
    return shares, np.uint32(zlib.crc32(bytes(length)))


def postcard_hashes_rows(key_rows: np.ndarray, hops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per wire-order key row, with its 1-based hop: `postcard_slot_hash`, `key_checksum` and
    `postcard_hop_hash`, each (count,) uint32."""
    slot_hashes = crc32_rows(key_rows)
    checksums = crc32_rows(np.ascontiguousarray(key_rows[:, ::-1]))
    hop_hashes = np.empty(key_rows.shape[0], dtype=np.uint32)
    for hop in np.unique(hops).tolist():
        mine = hops == hop
        hop_hashes[mine] = crc32_rows(key_rows[mine], POSTCARD_HOP_POLYNOMIALS[hop - 1])
    return slot_hashes, checksums, hop_hashes


@cache
def linear_crc_position_tables(length: int, polynomial: int = CRC32_POLYNOMIAL) -> np.ndarray:
    """(length, 256) tables: row j maps a byte at position j of a `length`-byte message to its share of the
    message's linear CRC (init 0, no final XOR). The CRC is linear, so the message's CRC is the XOR of its bytes'
    shares: one lookup per byte, independent of the others, and none for bytes known to be zero."""
    table = _np_table(polynomial)
    tables = np.empty((length, 256), dtype=np.uint32)
    share = table[np.arange(256)]  # a byte followed by nothing
    for position in range(length - 1, -1, -1):
        tables[position] = share
        share = table[share & 0xFF] ^ (share >> np.uint32(8))  # one more zero byte after it
    tables.flags.writeable = False  # cached and shared
    return tables


# From this many rows, the shares are looked up a column at a time: each lookup then stays in one column's 1 KiB
# table. Below it, one lookup of every column's bytes at once costs fewer numpy calls. (For 4096 rows of 14
# columns: 130 us against 500 us; for 64 rows of 160 columns: 270 us against 37 us.)
BY_COLUMN_FROM = 1024


def xor_of_shares(tables: np.ndarray, rows: npt.NDArray[np.uint8], columns: list[int], start: int
                  ) -> npt.NDArray[np.uint32]:
    """Per row, `start` XOR the share `tables[j]` gives the byte in column `columns[j]`, for every j: a linear
    CRC's value over those bytes, from `linear_crc_position_tables`' rows."""
    if len(rows) < BY_COLUMN_FROM:
        index = rows[:, columns].T + (np.arange(len(columns), dtype=np.int32) * 256)[:, None]
        state: npt.NDArray[np.uint32] = np.bitwise_xor.reduce(tables.reshape(-1).take(index), axis=0) ^ \
            np.uint32(start)
        return state
    state = np.full(len(rows), start, dtype=np.uint32)
    for table, column in zip(tables, columns):
        state ^= table.take(rows[:, column])
    return state
