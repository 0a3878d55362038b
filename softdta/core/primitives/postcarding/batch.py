"""Postcarding's vector path: reports taken in rounds, one report per cache entry each, so that a round's rows
are on different entries and are vectorized over the cache's arrays (`PostcardCache`)."""

from __future__ import annotations

import functools
import itertools
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import numpy.typing as npt

from softdta.core.primitives.postcarding.state import Words, key_words
from softdta.core.tables import Structure
from softdta.core.vector import Columns, Emitted, Flush, Layout, VectorPath, arrival_ranks, report_flags, stable_order
from softdta.spec import DTA_BASE_EXT, MAX_POSTCARD_HOPS, POSTCARD_HOP_POLYNOMIALS, TranslatorCounter
from softdta.wire.columns import Rows, byte_offset, gather
from softdta.wire.hashing import crc32_poly, linear_crc_position_tables

if TYPE_CHECKING:
    from softdta.core.primitives.postcarding import Postcarding

_POPCOUNT = np.array([bin(mask).count("1") for mask in range(1 << MAX_POSTCARD_HOPS)], dtype=np.int64)


@dataclass
class PostcardPiece(Columns):
    """Vector Postcarding rows of one layout bound for one structure: positions (ascending), keys (as words,
    `key_words`), hops, path lengths (the table's where a report gives none), encoded values and the key's
    hashes."""

    COLUMNS = ("positions", "keys", "hops", "path_lengths", "encoded", "slot_hashes", "checksums", "immediate")
    keys: Words
    hops: npt.NDArray[np.int64]
    path_lengths: npt.NDArray[np.int64]
    encoded: npt.NDArray[np.uint32]
    slot_hashes: npt.NDArray[np.uint32]
    checksums: npt.NDArray[np.uint32]
    immediate: npt.NDArray[np.bool_]


class PostcardingPath(VectorPath[PostcardPiece]):
    def decode_structure(self, rows: Rows, positions: npt.NDArray[np.int64], structure: Structure,
                         layout: Layout) -> PostcardPiece | None:
        key_len = structure.key_len
        if layout.extended:
            sub = self.primitive.subheader
            if layout.size != DTA_BASE_EXT.size + sub.size + key_len:
                return None
            take, immediate, sub_at = report_flags(rows, layout)
            take &= gather(rows, sub_at, sub, "key_len") == key_len
            given = gather(rows, sub_at, sub, "path_length").astype(np.int64)
            path_lengths = np.where(given == 0, structure.hops, given)
            key_at, data_at = sub_at + sub.size, sub_at + byte_offset(sub, "data")
        else:
            v1 = self.primitive.v1_subheader
            if v1 is None or key_len != 4 or layout.size != layout.base.size + v1.size:
                return None  # dta-v1 keys are 32 bits: the oracle drops these (bad length)
            sub = v1
            take, immediate, sub_at = report_flags(rows, layout)
            path_lengths = np.full(len(rows), structure.hops, dtype=np.int64)
            key_at, data_at = sub_at + byte_offset(sub, "key"), sub_at + byte_offset(sub, "data")
        hops = gather(rows, sub_at, sub, "hop").astype(np.int64)
        take &= (hops >= 1) & (hops <= path_lengths) & (path_lengths <= structure.hops)  # else a bad-hop drop
        if not take.all():
            rows, positions, hops, path_lengths, immediate = (
                rows[take], positions[take], hops[take], path_lengths[take], immediate[take])
        keys = rows[:, key_at:key_at + key_len]
        data = np.ascontiguousarray(rows[:, data_at:data_at + 4]).view(">u4").reshape(-1).astype(np.uint32)
        slot_hashes, checksums, hop_hashes = _postcard_hashes(keys, hops)
        return PostcardPiece(structure, positions, key_words(keys), hops, path_lengths, data ^ hop_hashes,
                             slot_hashes, checksums, immediate)

    def emit(self, parts: list[PostcardPiece], now_ns: int) -> Emitted:
        """The frames of one structure's rows in a segment.

        Rows are taken in rounds: round r holds each cache entry's r-th report, so a round's rows are all on
        different entries and are vectorized over the cache's arrays. Paths of many flows take a few rounds;
        reports that all crowd one entry take a round each, which costs about what the oracle costs per report
        (docs/primitives.md). A report writes at most one frame: the path it completes, the path it evicts (a new
        one then begins, and is not complete, having one hop of at least two), or its own one-hop path beside
        another flow's. The reports that begin a path add flush queue entries."""
        structure = parts[0].structure
        rows = PostcardPiece.joined(parts) if len(parts) > 1 else parts[0]
        cache = cast("Postcarding", self.primitive).cache(structure)
        index = (rows.slot_hashes & np.uint32(structure.cache_entries - 1)).astype(np.int64)
        by_round, round_ends = _rounds(index)
        ordered, entries = rows.select(by_round), index[by_round]  # a round takes its rows as slices of these
        written: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.uint32], npt.NDArray[np.uint32],
                            npt.NDArray[np.uint32], npt.NDArray[np.bool_]]] = []
        # ^ per round, the frames: the batch position that writes, the path's values, its key's slot hash and
        # checksum, immediate
        begun: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]] = []  # per round: positions, entries
        evictions = cached = 0
        low = 0
        for high in round_ends.tolist():
            part, entry = ordered.cut(low, high), entries[low:high]
            low = high
            live = cache.live[entry]
            other = live & _other_keys(cache.keys, entry, part.keys)
            evicting = 0
            if other.any():
                alone = other & (part.path_lengths == 1)  # its own one-hop path, written beside the waiting one
                if alone.any():
                    mine = part.select(alone)
                    values = np.zeros((len(mine.positions), structure.hops), dtype=np.uint32)
                    values[np.arange(len(values)), mine.hops - 1] = mine.encoded
                    written.append((mine.positions, values, mine.slot_hashes, mine.checksums, mine.immediate))
                    rest = ~alone
                    part, entry, live, other = part.select(rest), entry[rest], live[rest], other[rest]
                gone = entry[other]
                if len(gone):
                    written.append((part.positions[other], cache.values.take(gone, axis=0), cache.slot_hashes[gone],
                                    cache.checksums[gone], np.zeros(len(gone), dtype=bool)))
                    evicting = len(gone)
            begins = ~live | other
            if begins.any():
                new = part.select(begins)
                cache.begin(entry[begins], new.keys, new.slot_hashes, new.checksums, new.path_lengths, now_ns)
                begun.append((new.positions, entry[begins]))
            cache.values[entry, part.hops - 1] = part.encoded
            masks = cache.masks[entry] | np.int64(1) << (part.hops - 1)
            cache.masks[entry] = masks
            done = _POPCOUNT[masks] >= cache.path_lengths[entry]
            completed = int(done.sum())
            if completed:
                whole = entry[done]
                written.append((part.positions[done], cache.values.take(whole, axis=0), cache.slot_hashes[whole],
                                cache.checksums[whole], part.immediate[done]))
                cache.live[whole] = False
            evictions += evicting
            cached += len(entry) - completed - evicting  # an evicting report begins a path that is not complete

        emitted = Emitted(np.empty(0, dtype=np.int64))
        if begun:
            positions, began = (np.concatenate(column) for column in zip(*begun))
            order = np.argsort(positions)
            emitted.flushes = list(zip(positions[order].tolist(), began[order].tolist(), itertools.repeat(structure)))
        if written:
            positions, values, slot_hashes, checksums, immediate = (
                np.concatenate(column) for column in zip(*written))
            order = np.argsort(positions)
            emitted.sent = positions[order]
            qp = self.primitive.translator.sender(structure)
            slot_in_region = (slot_hashes[order] & np.uint32(structure.slot_count - 1)).astype(np.uint64)
            emitted.runs.append(self.frames.writes(
                qp, np.uint64(qp.base_va) + slot_in_region * np.uint64(structure.slot_size), immediate[order],
                checksums[order], values[order].astype(">u4").view(np.uint8).reshape(len(order), -1)))
        counters = self.primitive.translator.counters
        counters[TranslatorCounter.POSTCARD_EVICTIONS] += evictions
        counters[TranslatorCounter.POSTCARD_CACHED] += cached
        self.count(len(rows.positions), len(emitted.sent))
        return emitted

    def queued_all(self, flushes: list[Flush], tokens: list[int], now_ns: int) -> None:
        """A path begun in the segment that still waits (it waits where a path began last: a path begins only where
        none waits) is named by the last entry queued for its cache entry, the one with the highest token (a path
        begun by the vector path has token 0 until then)."""
        target = flushes[0][2]
        assert isinstance(target, Structure)
        cache = cast("Postcarding", self.primitive).cache(target)
        index, token = np.array([index for _, index, _ in flushes], dtype=np.int64), np.array(tokens, dtype=np.int64)
        live = cache.live[index]
        np.maximum.at(cache.tokens, index[live], token[live])

def _other_keys(keys: Words, entry: npt.NDArray[np.int64], given: Words) -> npt.NDArray[np.bool_]:
    """Whether the key in each cache entry `entry` differs from the one given for it, a word at a time."""
    other: npt.NDArray[np.bool_] = keys[entry, 0] != given[:, 0]
    for word in range(1, keys.shape[1]):
        other |= keys[entry, word] != given[:, word]
    return other


def _rounds(index: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The rows in rounds, round r holding each cache entry's r-th row, and where each round ends."""
    rank = arrival_ranks(index)
    return stable_order(rank), np.cumsum(np.bincount(rank))


@functools.cache
def _hash_shares(key_len: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    """What `wire.hashing.postcard_hashes_rows` computes, as each key byte's share of the key's CRCs, which are
    affine: a key's CRC is the CRC of as many zero bytes XOR the shares of its bytes. Byte j's shares at j * 256 +
    its value: of the slot hash (low 32 bits) and the checksum, the reversed key's CRC (high 32 bits); of hop h's
    hash at ((h - 1) * key_len + j) * 256 + its value. Then each one's CRC of zero bytes: the slot hash's, the
    checksum's, and each hop's from index 2 + h - 1."""
    hop_polynomials = POSTCARD_HOP_POLYNOMIALS[:MAX_POSTCARD_HOPS]
    forward = linear_crc_position_tables(key_len).astype(np.uint64)
    keyed = (forward | forward[::-1] << np.uint64(32)).reshape(-1)
    hops = np.concatenate([linear_crc_position_tables(key_len, polynomial) for polynomial in hop_polynomials])
    zero = bytes(key_len)
    zeros = [zlib.crc32(zero), zlib.crc32(zero), *(crc32_poly(polynomial, zero) for polynomial in hop_polynomials)]
    return keyed, hops.reshape(-1), np.array(zeros, dtype=np.uint32)


def _postcard_hashes(keys: Rows, hops: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.uint32], ...]:
    """Per key row, with its 1-based hop: `postcard_slot_hash`, `key_checksum` and `postcard_hop_hash`, a lookup
    per key byte each."""
    key_len = keys.shape[1]
    keyed_shares, hop_shares, zeros = _hash_shares(key_len)
    columns = np.ascontiguousarray(keys.T, dtype=np.intp)  # (key bytes, rows)
    keyed = np.zeros(len(hops), dtype=np.uint64)
    hop_hashes = zeros.take(hops + 1)
    hop_at = (hops - 1) * (key_len * 256)
    for byte, column in enumerate(columns):  # take: half the time of indexing
        keyed ^= keyed_shares.take(column + byte * 256)
        hop_hashes ^= hop_shares.take(hop_at + column + byte * 256)
    slot_hashes = keyed.astype(np.uint32) ^ zeros[0]
    checksums = (keyed >> np.uint64(32)).astype(np.uint32) ^ zeros[1]
    return slot_hashes, checksums, hop_hashes
