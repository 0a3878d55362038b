"""What a primitive's vector path is made of: the batch translator (core/batch.py) hands each primitive that
declares one (`Primitive.vector`) its reports of a batch as rows of frames, and the path decodes them into
pieces and emits their frames (sans-IO).

A path decodes the reports of one layout (format, opcode, payload length and, if its targets are named by the
report's destination, that address) into pieces: rows bound for one structure or Append range, with their fields
as arrays. Later, a segment (the rows between two barriers) at a time, it emits the pieces bound for one QP into
frames, in the order and with the state, counters and flush queue entries the reference translator leaves.
The batch translator classifies, segments, sequences PSNs and builds the frames (`FrameMaker`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar

import numpy as np
import numpy.typing as npt

from softdta.core.tables import AppendLists, QueuePair, Structure, Tables
from softdta.spec import (
    DTA_BASE_EXT,
    ETHERNET,
    EXTENDED_FIRST_BYTE,
    IPV4,
    MAX_DATA_LEN,
    MAX_KEY_LEN,
    UDP,
    Header,
    TranslatorCounter,
)
from softdta.wire.columns import Rows, byte_offset, gather
from softdta.wire.hashing import key_hashes_rows

if TYPE_CHECKING:
    from softdta.core.primitives.base import KeyWrites, Primitive

IP_AT = ETHERNET.size
UDP_AT = IP_AT + IPV4.size
PAYLOAD_AT = UDP_AT + UDP.size  # the DTA report, or the BTH of a RoCEv2 frame
EXTENDED_SUB_AT = PAYLOAD_AT + DTA_BASE_EXT.size  # the sub-header of an extended report
NEVER = 1 << 62  # past every batch position

Target = Structure | AppendLists


@dataclass(frozen=True)
class Layout:
    """What the reports of one layout share: format, payload length, destination address (0 for a path whose
    targets are not named by it) and the tables' dta-v1 base header."""

    extended: bool
    size: int
    address: int
    base: Header


class VectorPiece(Protocol):
    """Vector rows bound for one target: their batch positions (ascending) and, per row, their fields."""

    positions: npt.NDArray[np.int64]

    @property
    def target(self) -> Target: ...

    def cut(self, low: int, high: int) -> Self:
        """Rows low..high."""
        ...


@dataclass
class Emitted:
    """What a path emitted for one QP in a segment: the batch position of each frame (ascending: PSN order), the
    frames in runs, the flush queue entries its rows add (batch position, index, target as given to
    `flush_later`), and the batch position from which its rows go through the oracle instead."""

    sent: npt.NDArray[np.int64]
    runs: list[Sequence[bytes]] = field(default_factory=list)
    flushes: list[tuple[int, int, Target | None]] = field(default_factory=list)
    resume: int = NEVER


class FrameMaker(Protocol):
    """The frames a path asks the batch translator for: the QP's next PSNs, from its templates."""

    def writes(self, qp: QueuePair, va: npt.NDArray[np.uint64], immediate: npt.NDArray[np.bool_],
               tags: npt.NDArray[np.uint32], payloads: Rows) -> Sequence[bytes]:
        """RDMA WRITE frames of `payloads` to `va` (with immediate `tags` where `immediate`), in PSN order."""
        ...

    def fetch_adds(self, qp: QueuePair, va: npt.NDArray[np.uint64], values: npt.NDArray[np.uint64]) -> Sequence[bytes]:
        """RDMA Fetch&Add frames adding `values` at `va`, in PSN order."""
        ...


PieceT = TypeVar("PieceT", bound=VectorPiece)


class VectorPath(abc.ABC, Generic[PieceT]):
    """A primitive's vector translation, over the state of `primitive` (the reference translator's instance).
    It must leave frames, state, counters and flush queue exactly as `primitive.translate` would."""

    by_destination: ClassVar[bool] = True  # its reports' target is their destination's structure of its kind
    takes_writes: ClassVar[bool] = False  # it takes the Key-Writes plug-ins ask for (`writes`)

    def __init__(self, primitive: Primitive, frames: FrameMaker):
        self.primitive = primitive
        self.frames = frames

    @property
    def tables(self) -> Tables:
        return self.primitive.translator.tables

    def targets(self, tables: Tables) -> Sequence[Target]:
        """The targets its reports write into."""
        return [structure for structure in tables.structures if structure.primitive == self.primitive.opcode]

    def decode(self, rows: Rows, positions: npt.NDArray[np.int64], layout: Layout,
               writable: Callable[[Target], bool]) -> list[PieceT]:
        """The rows of one layout that the vector path takes, as pieces bound for targets that are `writable`."""
        structure = self.tables.structure(layout.address.to_bytes(4, "big"), self.primitive.opcode)
        if structure is None or not writable(structure):
            return []  # a counted drop, or a shared QP: the oracle's, at its place (a barrier)
        piece = self.decode_structure(rows, positions, structure, layout)
        return [piece] if piece is not None and len(piece.positions) else []

    def decode_structure(self, rows: Rows, positions: npt.NDArray[np.int64], structure: Structure,
                         layout: Layout) -> PieceT | None:
        """The rows of one layout bound for `structure` that the vector path takes; None if it cannot be one."""
        raise NotImplementedError(f"{type(self).__name__} decodes by its own targets")

    @abc.abstractmethod
    def emit(self, parts: list[PieceT], now_ns: int) -> Emitted:
        """The frames of the pieces bound for one QP in a segment (the rows before them are translated)."""

    def queued(self, index: int, target: Target | None, token: int, now_ns: int) -> None:
        """The flush queue entry that `emit` asked for under `index` is queued now, as `token`."""
        raise NotImplementedError(f"{type(self).__name__} adds no flush queue entries")

    def writes(self, writes: KeyWrites, positions: npt.NDArray[np.int64],
               immediate: npt.NDArray[np.bool_]) -> PieceT:
        """A plug-in's Key-Writes as vector rows, at the batch positions of its reports (see `takes_writes`)."""
        raise NotImplementedError(f"{type(self).__name__} takes no plug-in's writes")

    def count(self, reports: int, sent: int) -> None:
        counters = self.primitive.translator.counters
        counters[TranslatorCounter.TX_FRAMES] += sent
        counters[TranslatorCounter.RX_REPORTS] += reports
        if self.primitive.rx_counter is not None:
            counters[self.primitive.rx_counter] += reports


def report_flags(rows: Rows, layout: Layout) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], int]:
    """Of rows whose payload is as long as their layout says: which are not retransmissions (and, extended, carry
    the marker), their immediate flags, and where their sub-header starts."""
    if layout.extended:
        take = gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "marker") == EXTENDED_FIRST_BYTE
        take &= gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "retransmit") == 0
        return take, gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "immediate") != 0, EXTENDED_SUB_AT
    base = layout.base
    take = np.ones(len(rows), dtype=bool)
    if "retransmit" in {f.name for f in base.fields}:
        take &= gather(rows, PAYLOAD_AT, base, "retransmit") == 0
    return take, gather(rows, PAYLOAD_AT, base, "immediate") != 0, PAYLOAD_AT + base.size


def ranks(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """0, 1, .. counts[0] - 1, 0, 1, .. counts[1] - 1, ...: each element's rank in its run."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


@dataclass
class Columns:
    """A piece whose fields after its `structure` are per-row arrays, named by COLUMNS."""

    COLUMNS: ClassVar[tuple[str, ...]] = ()
    structure: Structure
    positions: npt.NDArray[np.int64]

    @property
    def target(self) -> Structure:
        return self.structure

    def cut(self, low: int, high: int) -> Self:
        return self.select(slice(low, high))

    def select(self, which: slice | npt.NDArray[np.int64]) -> Self:
        return replace(self, **{name: getattr(self, name)[which] for name in self.COLUMNS})

    @classmethod
    def joined(cls, parts: list[Self]) -> Self:
        """One piece of the parts' rows, in batch order."""
        columns: dict[str, Any] = {name: np.concatenate([getattr(part, name) for part in parts])
                                   for name in cls.COLUMNS}
        rows = replace(parts[0], **columns)
        return rows.select(np.argsort(rows.positions, kind="stable"))


# --------------------------------------------------------------------------------------------------
# keyed primitives: a key hashed into `redundancy` slots of a structure, one frame per copy


@dataclass
class KeyedPiece:
    """Vector rows of one layout bound for one keyed structure: positions in the batch (ascending), their fields,
    and the data (rows of bytes) or counter (u64) that each writes."""

    structure: Structure
    positions: npt.NDArray[np.int64]
    redundancy: npt.NDArray[np.int64]
    immediate: npt.NDArray[np.bool_]
    checksums: npt.NDArray[np.uint32]
    slot_hashes: npt.NDArray[np.uint32]  # (copies, rows): as many copies as the piece's largest redundancy
    values: npt.NDArray[Any]
    reports: bool = True  # False: writes a plug-in asked for, counted as its reports

    @property
    def target(self) -> Structure:
        return self.structure

    def cut(self, low: int, high: int) -> KeyedPiece:
        return KeyedPiece(self.structure, self.positions[low:high], self.redundancy[low:high],
                          self.immediate[low:high], self.checksums[low:high], self.slot_hashes[:, low:high],
                          self.values[low:high], self.reports)


class KeyedPath(VectorPath[KeyedPiece]):
    """The vector path of a keyed primitive: each report's key, hashed, names `redundancy` slots, and each slot
    gets one frame (`frames`) of the report's data (`carries_data`: its sub-header's `data`, as long as the
    structure's data_len) or counter (else: its sub-header's `counter`)."""

    carries_data: ClassVar[bool] = True

    @abc.abstractmethod
    def frames_of(self, qp: QueuePair, structure: Structure, va: npt.NDArray[np.uint64],
                  immediate: npt.NDArray[np.bool_], checksums: npt.NDArray[np.uint32],
                  values: npt.NDArray[Any]) -> Sequence[bytes]:
        """One frame per request, in PSN order."""

    def decode_structure(self, rows: Rows, positions: npt.NDArray[np.int64], structure: Structure,
                         layout: Layout) -> KeyedPiece | None:
        key_len = structure.key_len
        if not 1 <= key_len <= MAX_KEY_LEN or not 1 <= structure.data_len <= MAX_DATA_LEN:
            return None
        data_len = structure.data_len if self.carries_data else 0
        # the size first: a payload of another size is the oracle's drop, and gathers past it would leave the frame
        if layout.extended:
            sub = self.primitive.subheader
            if layout.size != DTA_BASE_EXT.size + sub.size + key_len + data_len:
                return None
            take, immediate, sub_at = report_flags(rows, layout)
            take &= gather(rows, sub_at, sub, "key_len") == key_len
            if self.carries_data:
                take &= gather(rows, sub_at, sub, "data_len") == data_len
            key_at = sub_at + sub.size
            data_at = key_at + key_len
        else:
            v1 = self.primitive.v1_subheader
            if v1 is None or key_len != 4 or (self.carries_data and data_len != 4) or \
                    layout.size != layout.base.size + v1.size:
                return None  # dta-v1 keys and data are 32 bits: the oracle drops these (bad length)
            sub = v1
            take, immediate, sub_at = report_flags(rows, layout)
            key_at = sub_at + byte_offset(sub, "key")
            data_at = sub_at + byte_offset(sub, "data") if self.carries_data else 0
        redundancy = gather(rows, sub_at, sub, "redundancy").astype(np.int64)
        take &= (redundancy >= 1) & (redundancy <= structure.redundancy)  # the oracle drops the others
        if not take.all():
            rows, positions, redundancy, immediate = rows[take], positions[take], redundancy[take], immediate[take]
        checksums, slot_hashes = key_hashes_rows(rows[:, key_at:key_at + key_len], int(redundancy.max(initial=1)),
                                                 structure.key_hash)
        values = rows[:, data_at:data_at + data_len] if self.carries_data else gather(rows, sub_at, sub, "counter")
        return KeyedPiece(structure, positions, redundancy, immediate, checksums, slot_hashes, values)

    def emit(self, parts: list[KeyedPiece], now_ns: int) -> Emitted:
        """The frames of one structure's rows in a segment, in batch order and copy order."""
        structure = parts[0].structure
        qp = self.primitive.translator.sender(structure)
        # one request per frame, in batch order and copy order: each piece's rows expanded into their copies
        requests = [_requests(piece) for piece in parts]
        positions, copies, slots, immediate, checksums, values = (
            np.concatenate(column) if len(parts) > 1 else column[0] for column in zip(*requests))
        if len(parts) > 1:  # each piece is in batch order already; interleave them
            order = np.lexsort((copies, positions))
            positions, slots, immediate, checksums, values = (
                column[order] for column in (positions, slots, immediate, checksums, values))
        slots &= np.uint32(structure.slot_count - 1)
        va = np.uint64(qp.base_va) + slots.astype(np.uint64) * np.uint64(structure.slot_size)
        run = self.frames_of(qp, structure, va, immediate, checksums, values)
        self.count(sum(len(piece.positions) for piece in parts if piece.reports), len(positions))
        return Emitted(positions, [run])


def _requests(piece: KeyedPiece) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint32],
                                          npt.NDArray[np.bool_], npt.NDArray[np.uint32], npt.NDArray[Any]]:
    """One entry per frame of the piece's rows, copy by copy: batch position, copy, slot hash, immediate flag,
    key checksum, and the value."""
    if piece.redundancy.max() == 1:
        rows = np.arange(len(piece.positions))
        copies = np.zeros(len(rows), dtype=np.int64)
    else:
        rows = np.repeat(np.arange(len(piece.positions)), piece.redundancy)
        copies = ranks(piece.redundancy)
    return (piece.positions[rows], copies, piece.slot_hashes[copies, rows], piece.immediate[rows],
            piece.checksums[rows], piece.values[rows])
