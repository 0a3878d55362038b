"""Postcarding's vector path: reports taken in rounds, one report per cache slot each, so that a round's rows
are on different slots and are vectorized."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from softdta.core.primitives.postcarding.state import PostcardEntry
from softdta.core.tables import Structure
from softdta.core.vector import Columns, Emitted, Layout, Target, VectorPath, ranks, report_flags
from softdta.spec import DTA_BASE_EXT, MAX_POSTCARD_HOPS, TranslatorCounter
from softdta.wire.columns import Rows, byte_offset, gather
from softdta.wire.hashing import postcard_hashes_rows

_POPCOUNT = np.array([bin(mask).count("1") for mask in range(1 << MAX_POSTCARD_HOPS)], dtype=np.int64)


@dataclass
class PostcardPiece(Columns):
    """Vector Postcarding rows of one layout bound for one structure: positions (ascending), keys, hops, path
    lengths (the table's where a report gives none), encoded values and the key's hashes."""

    COLUMNS = ("positions", "keys", "hops", "path_lengths", "encoded", "slot_hashes", "checksums", "immediate")
    keys: Rows
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
        rows, hops = rows[take], hops[take]
        keys = np.ascontiguousarray(rows[:, key_at:key_at + key_len])
        data = np.ascontiguousarray(rows[:, data_at:data_at + 4]).view(">u4").reshape(-1).astype(np.uint32)
        slot_hashes, checksums, hop_hashes = postcard_hashes_rows(keys, hops)
        return PostcardPiece(structure, positions[take], keys, hops, path_lengths[take], data ^ hop_hashes,
                             slot_hashes, checksums, immediate[take])

    @property
    def _cache(self) -> dict[int, dict[int, PostcardEntry]]:
        cache: dict[int, dict[int, PostcardEntry]] = self.primitive.state
        return cache

    def emit(self, parts: list[PostcardPiece], now_ns: int) -> Emitted:
        """The frames of one structure's rows in a segment.

        Rows are taken in rounds: round r holds each slot's r-th report, so a round's rows are all on different
        slots and are vectorized. Paths of many flows take a few rounds; reports that all crowd one slot take a
        round each, which costs about what the oracle costs per report (docs/primitives.md). A report writes
        at most one frame: the path it completes, the path it evicts (a new one then begins, and is not complete,
        having one hop of at least two), or its own one-hop path beside another flow's. The reports that begin a
        path add flush queue entries."""
        structure = parts[0].structure
        rows = PostcardPiece.joined(parts) if len(parts) > 1 else parts[0]
        index = (rows.slot_hashes & np.uint32(structure.cache_entries - 1)).astype(np.int64)
        slots, slot_of, counts = np.unique(index, return_inverse=True, return_counts=True)
        rank = np.empty(len(index), dtype=np.int64)
        rank[np.argsort(slot_of, kind="stable")] = ranks(counts)
        paths = _Paths.load(self._cache.setdefault(structure.qp.index, {}), slots, structure)

        written: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.uint32], npt.NDArray[np.uint32],
                            npt.NDArray[np.uint32], npt.NDArray[np.bool_]]] = []
        # ^ per round, the frames: batch position, the path's values, its key's slot hash and checksum, immediate
        flushes: list[tuple[int, int, Target | None]] = []
        evictions = cached = 0
        for round_ in range(int(counts.max())):
            at = np.flatnonzero(rank == round_)
            slot = slot_of[at]
            keys, hops, path_lengths = rows.keys[at], rows.hops[at], rows.path_lengths[at]
            other = paths.live[slot] & (paths.keys[slot] != keys).any(axis=1)
            alone = other & (path_lengths == 1)  # its own one-hop path, written beside the waiting one
            if alone.any():
                values = np.zeros((int(alone.sum()), structure.hops), dtype=np.uint32)
                values[np.arange(len(values)), hops[alone] - 1] = rows.encoded[at][alone]
                written.append((rows.positions[at][alone], values, rows.slot_hashes[at][alone],
                                rows.checksums[at][alone], rows.immediate[at][alone]))
            evict = other & ~alone
            if evict.any():
                gone = slot[evict]
                written.append((rows.positions[at][evict], paths.values[gone].copy(), paths.slot_hashes[gone],
                                paths.checksums[gone], np.zeros(len(gone), dtype=bool)))
                evictions += len(gone)
            begin = (~paths.live[slot] | evict) & ~alone
            if begin.any():
                paths.begin(slot[begin], keys[begin], path_lengths[begin], rows.slot_hashes[at][begin],
                            rows.checksums[at][begin], now_ns)
                flushes += ((position, int(slots[s]), structure) for position, s in
                            zip(rows.positions[at][begin].tolist(), slot[begin].tolist()))
            add = ~alone
            slot, hops = slot[add], hops[add]
            paths.values[slot, hops - 1] = rows.encoded[at][add]
            paths.masks[slot] |= np.int64(1) << (hops - 1)
            done = _POPCOUNT[paths.masks[slot]] >= paths.path_lengths[slot]
            if done.any():
                whole = slot[done]
                written.append((rows.positions[at][add][done], paths.values[whole].copy(), paths.slot_hashes[whole],
                                paths.checksums[whole], rows.immediate[at][add][done]))
                paths.live[whole] = False
            cached += int((~done & ~evict[add]).sum())
        paths.store(self._cache[structure.qp.index], slots)

        emitted = Emitted(np.empty(0, dtype=np.int64), flushes=flushes)
        if written:
            positions, values, slot_hashes, checksums, immediate = (np.concatenate(column) for column in zip(*written))
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

    def queued(self, index: int, target: Target | None, token: int, now_ns: int) -> None:
        """The path begun in the segment in cache entry `index` (the one that waits now) is named by it."""
        assert isinstance(target, Structure)
        entry = self._cache[target.qp.index].get(index)
        if entry is not None:  # begun in this segment, since a path begins only where none waits
            entry.token = token


@dataclass
class _Paths:
    """The Postcarding cache slots a segment touches, as arrays (one row per slot), loaded from and stored back
    to the oracle's cache."""

    live: npt.NDArray[np.bool_]
    keys: Rows
    path_lengths: npt.NDArray[np.int64]
    values: npt.NDArray[np.uint32]  # (slots, the structure's hops)
    masks: npt.NDArray[np.int64]
    first_ns: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int64]
    slot_hashes: npt.NDArray[np.uint32]
    checksums: npt.NDArray[np.uint32]

    @classmethod
    def load(cls, cache: dict[int, PostcardEntry], slots: npt.NDArray[np.int64], structure: Structure) -> _Paths:
        count = len(slots)
        paths = cls(np.zeros(count, dtype=bool), np.zeros((count, structure.key_len), dtype=np.uint8),
                    np.zeros(count, dtype=np.int64), np.zeros((count, structure.hops), dtype=np.uint32),
                    np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64),
                    np.zeros(count, dtype=np.uint32), np.zeros(count, dtype=np.uint32))
        waiting = [(row, entry) for row, entry in enumerate(map(cache.get, slots.tolist())) if entry is not None]
        if waiting:
            at = np.array([row for row, _ in waiting])
            entries = [entry for _, entry in waiting]
            paths.live[at] = True
            paths.keys[at] = np.frombuffer(b"".join(entry.key for entry in entries),
                                           dtype=np.uint8).reshape(len(at), -1)
            paths.path_lengths[at] = [entry.path_length for entry in entries]
            paths.values[at] = [entry.values for entry in entries]
            paths.masks[at] = [entry.hop_mask for entry in entries]
            paths.first_ns[at] = [entry.first_ns for entry in entries]
            paths.tokens[at] = [entry.token for entry in entries]
            hashes = postcard_hashes_rows(paths.keys[at], np.ones(len(at), dtype=np.int64))
            paths.slot_hashes[at], paths.checksums[at] = hashes[0], hashes[1]
        return paths

    def begin(self, slots: npt.NDArray[np.int64], keys: Rows, path_lengths: npt.NDArray[np.int64],
              slot_hashes: npt.NDArray[np.uint32], checksums: npt.NDArray[np.uint32], now_ns: int) -> None:
        """New paths in `slots` (the flush queue's token comes later, in batch order)."""
        self.live[slots] = True
        self.keys[slots] = keys
        self.path_lengths[slots] = path_lengths
        self.values[slots] = 0
        self.masks[slots] = 0
        self.first_ns[slots] = now_ns
        self.tokens[slots] = 0
        self.slot_hashes[slots] = slot_hashes
        self.checksums[slots] = checksums

    def store(self, cache: dict[int, PostcardEntry], slots: npt.NDArray[np.int64]) -> None:
        keys = self.keys.tobytes()
        width = self.keys.shape[1]
        for row, (slot, live, path_length, values, mask, first_ns, token) in enumerate(zip(
                slots.tolist(), self.live.tolist(), self.path_lengths.tolist(), self.values.tolist(),
                self.masks.tolist(), self.first_ns.tolist(), self.tokens.tolist())):
            if live:
                cache[slot] = PostcardEntry(keys[row * width:(row + 1) * width], path_length, values, mask,
                                            first_ns, token)
            else:
                cache.pop(slot, None)
