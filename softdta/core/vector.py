"""What a primitive's vector path is made of: the batch translator (core/batch.py) hands each primitive that
declares one (`Primitive.vector`) its reports of a batch as rows of frames, and the path decodes them into
pieces and emits their frames (sans-IO).

A path decodes the reports of one layout (format, opcode, payload length and, if its targets are named by the
report's destination, that address) into pieces: rows bound for one structure or Append range, with their fields
as arrays. At a fleet's address, the rows' partition keys (`VectorPath.partition_keys`, what
`Primitive.partition_key` takes, as rows) are hashed together and each row is bound for the first structure of its
slot's replicas, as the reference translator's `replica_structures` binds it; with copies across replicas, a
keyed path adds pieces of copies bound for the other replicas. Later, a segment (the rows between two barriers)
at a time, it emits the pieces bound for one QP into frames, in the order and with the state, counters and flush
queue entries the reference translator leaves.
The batch translator classifies, segments, sequences PSNs and builds the frames (`FrameMaker`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar, cast

import numpy as np
import numpy.typing as npt

from softdta.core.tables import AppendLists, Fleet, QueuePair, Structure, Tables
from softdta.spec import (
    DTA_BASE_EXT,
    ETHERNET,
    EXTENDED_FIRST_BYTE,
    IPV4,
    MAX_DATA_LEN,
    MAX_KEY_LEN,
    MAX_REPLICAS,
    UDP,
    Header,
    TranslatorCounter,
)
from softdta.wire.columns import Rows, byte_offset, gather
from softdta.wire.hashing import key_hashes_rows, partition_slots_rows

if TYPE_CHECKING:
    from softdta.core.primitives.base import KeyWrites, Primitive

IP_AT = ETHERNET.size
UDP_AT = IP_AT + IPV4.size
PAYLOAD_AT = UDP_AT + UDP.size  # the DTA report, or the BTH of a RoCEv2 frame
EXTENDED_SUB_AT = PAYLOAD_AT + DTA_BASE_EXT.size  # the sub-header of an extended report
NEVER = 1 << 62  # past every batch position

Target = Structure | AppendLists
Flush = tuple[int, int, Target | None]  # a flush queue entry a path asks for: batch position, index, target


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

    @property
    def copied(self) -> bool:
        """Whether the rows are copies of reports bound for another target (a fleet's copies across replicas)."""
        ...

    def cut(self, low: int, high: int) -> Self:
        """Rows low..high."""
        ...


@dataclass
class Emitted:
    """What a path emitted for one QP in a segment: the batch position of each frame (ascending: PSN order), the
    frames in runs, the flush queue entries its rows add (batch position, index, target as given to
    `flush_later`), the batch position from which its rows go through the oracle instead, and which copy of its
    report each frame is (None: the first), which orders the frames of a report sent through several QPs."""

    sent: npt.NDArray[np.int64]
    runs: list[Sequence[bytes]] = field(default_factory=list)
    flushes: list[Flush] = field(default_factory=list)
    resume: int = NEVER
    copies: npt.NDArray[np.int64] | None = None


@dataclass
class FleetMap:
    """A fleet's slot map as arrays, for the structures of one primitive: each slot's replica set (an index into
    `sets`: its replicas' structures of the primitive in replica order, the first being the target; -1 if none
    has one), each set's target (an index into `structures`), and each slot's replicas' addresses as 32-bit
    integers (0 past its last replica)."""

    tables: Tables
    set_of_slot: npt.NDArray[np.int64]
    sets: list[tuple[Structure, ...]]
    target_of_set: npt.NDArray[np.int64]
    structures: list[Structure]
    addresses: npt.NDArray[np.uint32]
    _places: dict[int, npt.NDArray[np.int64]] = field(default_factory=dict)

    def places(self, structure: Structure) -> npt.NDArray[np.int64]:
        """Each set's place of `structure` among its replicas (-1: not one of them)."""
        places = self._places.get(id(structure))
        if places is None:
            places = self._places[id(structure)] = np.array(
                [next((at for at, each in enumerate(found) if each is structure), -1) for found in self.sets],
                dtype=np.int64)
        return places

    @classmethod
    def of(cls, tables: Tables, fleet: Fleet, opcode: int) -> FleetMap:
        index: dict[tuple[int, ...], int] = {}
        sets: list[tuple[Structure, ...]] = []
        set_of_slot = np.full(len(fleet.slots), -1, dtype=np.int64)
        addresses = np.zeros((len(fleet.slots), MAX_REPLICAS), dtype=np.uint32)
        for slot, ips in enumerate(fleet.slots):
            addresses[slot, :len(ips)] = [int.from_bytes(ip, "big") for ip in ips]
            found = tuple(structure for ip in ips if (structure := tables.structure(ip, opcode)) is not None)
            if found:
                set_of_slot[slot] = index.setdefault(tuple(map(id, found)), len(sets))
                if set_of_slot[slot] == len(sets):
                    sets.append(found)
        structures = list({id(found[0]): found[0] for found in sets}.values())
        at = {id(structure): place for place, structure in enumerate(structures)}
        return cls(tables, set_of_slot, sets, np.array([at[id(found[0])] for found in sets], dtype=np.int64),
                   structures, addresses)


def fleet_map(cache: dict[int, FleetMap], tables: Tables, fleet: Fleet, opcode: int) -> FleetMap:
    """`FleetMap.of`, made once per tables (`cache`, by opcode, holds the tables' maps)."""
    made = cache.get(opcode)
    if made is None or made.tables is not tables:
        made = cache[opcode] = FleetMap.of(tables, fleet, opcode)
    return made


@dataclass
class FleetRows:
    """Rows at a fleet's address bound for one target: each row's replica set, an index into `map.sets`."""

    map: FleetMap
    sets: npt.NDArray[np.int64]


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
        self.fleet_maps: dict[int, FleetMap] = {}

    @property
    def tables(self) -> Tables:
        return self.primitive.translator.tables

    def targets(self, tables: Tables) -> Sequence[Target]:
        """The targets its reports write into."""
        return [structure for structure in tables.structures if structure.primitive == self.primitive.opcode]

    def decode(self, rows: Rows, positions: npt.NDArray[np.int64], layout: Layout,
               writable: Callable[[Target], bool]) -> list[PieceT]:
        """The rows of one layout that the vector path takes, as pieces bound for targets that are `writable`:
        the structure at their destination, or at a fleet's address, their slots' (`replica_structures`)."""
        address, fleet = layout.address.to_bytes(4, "big"), self.tables.fleet
        if fleet is not None and address == fleet.address:
            return self._decode_at_fleet(rows, positions, layout, writable, fleet)
        structure = self.tables.structure(address, self.primitive.opcode)
        if structure is None:
            return []  # a counted drop: the oracle's, at its place (a barrier)
        return self.decode_for(structure, rows, positions, layout, writable)

    def _decode_at_fleet(self, rows: Rows, positions: npt.NDArray[np.int64], layout: Layout,
                         writable: Callable[[Target], bool], fleet: Fleet) -> list[PieceT]:
        slots = fleet_map(self.fleet_maps, self.tables, fleet, self.primitive.opcode)
        sets = np.full(len(rows), -1, dtype=np.int64)  # rows without a set are the oracle's (drops)
        for which, keys in self.partition_keys(rows, layout):
            sets[which] = slots.set_of_slot[partition_slots_rows(keys, fleet.slot_bits)]
        targets = np.where(sets >= 0, slots.target_of_set[sets], -1)
        pieces: list[PieceT] = []
        for target in np.unique(targets[targets >= 0]).tolist():
            mine = np.flatnonzero(targets == target)
            pieces += self.decode_for(slots.structures[target], rows[mine], positions[mine], layout, writable,
                                      FleetRows(slots, sets[mine]) if fleet.across else None)
        return pieces

    def partition_keys(self, rows: Rows, layout: Layout) -> list[tuple[npt.NDArray[np.int64], Rows]]:
        """The rows' partition keys (`Primitive.partition_key`) as groups of rows (their indices) and the keys of
        each, as rows of bytes; a row in no group is the oracle's. By default: the report's key."""
        return report_keys(rows, layout, self.primitive)

    def decode_for(self, structure: Structure, rows: Rows, positions: npt.NDArray[np.int64], layout: Layout,
                   writable: Callable[[Target], bool], across: FleetRows | None = None) -> list[PieceT]:
        """The rows of one layout bound for `structure` that the vector path takes, as pieces. `across`: the rows
        are at a fleet's address whose copies go across its replicas (a path that makes copies adds them)."""
        if not writable(structure):
            return []  # a shared QP, or none on this RX queue: the oracle's, at its place (a barrier)
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

    def queued_all(self, flushes: list[Flush], tokens: list[int], now_ns: int) -> None:
        """The flush queue entries that one `emit` asked for, in batch order, are queued now as `tokens` (`queued`
        for each, by default)."""
        for (_, index, target), token in zip(flushes, tokens):
            self.queued(index, target, token, now_ns)

    def writes(self, writes: KeyWrites, positions: npt.NDArray[np.int64],
               immediate: npt.NDArray[np.bool_]) -> PieceT:
        """A plug-in's Key-Writes as vector rows, at the batch positions of its reports (see `takes_writes`)."""
        raise NotImplementedError(f"{type(self).__name__} takes no plug-in's writes")

    def unsent(self, piece: PieceT) -> int:
        """How many frames a piece of copies (`VectorPiece.copied`) would send: those its QP drops when it may
        not send."""
        raise NotImplementedError(f"{type(self).__name__} makes no copies")

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


def report_keys(rows: Rows, layout: Layout, primitive: Primitive) -> list[tuple[npt.NDArray[np.int64], Rows]]:
    """The keys of reports whose key follows the extended sub-header (`key_len` long) or is dta-v1's 32-bit `key`
    field, grouped by length (`VectorPath.partition_keys`); reports too short for theirs are in no group."""
    if layout.extended:
        sub, sub_at = primitive.subheader, EXTENDED_SUB_AT
        room = layout.size - DTA_BASE_EXT.size - sub.size
        if room < 0:
            return []
        lengths = gather(rows, sub_at, sub, "key_len").astype(np.int64)
        key_at = sub_at + sub.size
        groups = []
        for length in np.unique(lengths[lengths <= room]).tolist():
            which = np.flatnonzero(lengths == length)
            groups.append((which, rows[which, key_at:key_at + length]))
        return groups
    v1 = primitive.v1_subheader
    if v1 is None or "key" not in {f.name for f in v1.fields} or layout.size != layout.base.size + v1.size:
        return []
    key_at = PAYLOAD_AT + layout.base.size + byte_offset(v1, "key")
    return [(np.arange(len(rows)), rows[:, key_at:key_at + 4])]


def stable_order(keys: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The rows ordered by their keys (non-negative integers), rows of equal keys in row order: numpy's radix sort
    for keys of 16 bits, else a plain sort of the keys with the row numbers in their low bits (numpy's stable sort
    of wide integers is slower)."""
    count = len(keys)
    if count and keys.max() < 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    bits = count.bit_length()
    return np.sort(keys << bits | np.arange(count)) & ((1 << bits) - 1)


def arrival_ranks(groups: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each row's rank among the rows of its group (a non-negative integer), in row order: 0 for a group's first."""
    count = len(groups)
    by_group = stable_order(groups)
    sorted_groups = groups[by_group]
    first = np.empty(count, dtype=bool)
    first[:1], first[1:] = True, sorted_groups[1:] != sorted_groups[:-1]
    rows = np.arange(count)
    rank = np.empty(count, dtype=np.int64)
    rank[by_group] = rows - np.maximum.accumulate(np.where(first, rows, 0))
    return rank


def ranks(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """0, 1, .. counts[0] - 1, 0, 1, .. counts[1] - 1, ...: each element's rank in its run."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


@dataclass
class Columns:
    """A piece whose fields after its `structure` are per-row arrays, named by COLUMNS."""

    COLUMNS: ClassVar[tuple[str, ...]] = ()
    copied: ClassVar[bool] = False
    structure: Structure
    positions: npt.NDArray[np.int64]

    @property
    def target(self) -> Structure:
        return self.structure

    def cut(self, low: int, high: int) -> Self:
        return self.select(slice(low, high))

    def select(self, which: slice | npt.NDArray[np.int64] | npt.NDArray[np.bool_]) -> Self:
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
    and the data (rows of bytes) or counter (u64) that each writes. A row writes its copies 0..redundancy - 1, or
    with `first_copy` and `copy_step` (a fleet's copies across replicas) those n with n % step == first."""

    structure: Structure
    positions: npt.NDArray[np.int64]
    redundancy: npt.NDArray[np.int64]
    immediate: npt.NDArray[np.bool_]
    checksums: npt.NDArray[np.uint32]
    slot_hashes: npt.NDArray[np.uint32]  # (copies, rows): as many copies as the piece's largest redundancy
    values: npt.NDArray[Any]
    reports: bool = True  # False: writes a plug-in asked for, counted as its reports, or copies
    first_copy: npt.NDArray[np.int64] | None = None
    copy_step: npt.NDArray[np.int64] | None = None
    copied: bool = False  # copies of reports bound for another replica's structure

    @property
    def target(self) -> Structure:
        return self.structure

    def cut(self, low: int, high: int) -> KeyedPiece:
        return replace(self, positions=self.positions[low:high], redundancy=self.redundancy[low:high],
                       immediate=self.immediate[low:high], checksums=self.checksums[low:high],
                       slot_hashes=self.slot_hashes[:, low:high], values=self.values[low:high],
                       first_copy=None if self.first_copy is None else self.first_copy[low:high],
                       copy_step=None if self.copy_step is None else self.copy_step[low:high])

    def select(self, rows: npt.NDArray[np.int64]) -> KeyedPiece:
        return replace(self, positions=self.positions[rows], redundancy=self.redundancy[rows],
                       immediate=self.immediate[rows], checksums=self.checksums[rows],
                       slot_hashes=self.slot_hashes[:, rows], values=self.values[rows],
                       first_copy=None if self.first_copy is None else self.first_copy[rows],
                       copy_step=None if self.copy_step is None else self.copy_step[rows])

    def copy_counts(self) -> npt.NDArray[np.int64]:
        """How many frames each row writes."""
        if self.copy_step is None:
            return self.redundancy
        first = cast(npt.NDArray[np.int64], self.first_copy)
        counts: npt.NDArray[np.int64] = np.maximum(0, (self.redundancy - first + self.copy_step - 1) // self.copy_step)
        return counts


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
        decoded = self._decode(rows, positions, structure, layout)
        return None if decoded is None else decoded[0]

    def decode_for(self, structure: Structure, rows: Rows, positions: npt.NDArray[np.int64], layout: Layout,
                   writable: Callable[[Target], bool], across: FleetRows | None = None) -> list[KeyedPiece]:
        """With copies `across` a fleet's replicas (`Translator.copy_structures`): copy n of a report into replica
        n % R's structure, as a piece of copies per other replica. Replicas of another data length, or whose
        QPs the oracle writes, leave the rows to the oracle."""
        if across is None:
            return super().decode_for(structure, rows, positions, layout, writable)
        if not writable(structure):
            return []
        decoded = self._decode(rows, positions, structure, layout)
        if decoded is None or not len(decoded[0].positions):
            return []
        piece, keys = decoded
        sets = across.sets[np.searchsorted(positions, piece.positions)]
        replicas = [across.map.sets[index] for index in np.unique(sets).tolist()]
        if all(len(found) == 1 for found in replicas):
            return [piece]
        if any(not writable(other) or (self.carries_data and other.data_len != structure.data_len)
               for found in replicas for other in found[1:]):
            return []
        sizes = np.array([len(found) for found in across.map.sets], dtype=np.int64)[sets]
        pieces = [replace(piece, first_copy=np.zeros(len(sets), dtype=np.int64), copy_step=sizes)]
        others = {id(other): other for found in replicas for other in found[1:]}
        for other in others.values():
            first = across.map.places(other)[sets]  # each row's place of `other` among its replicas
            mine = np.flatnonzero((first > 0) & (first < piece.redundancy))
            if not len(mine):
                continue
            copies = piece.select(mine)
            slot_hashes = copies.slot_hashes if other.key_hash is structure.key_hash else \
                key_hashes_rows(keys[mine], copies.slot_hashes.shape[0], other.key_hash)[1]
            pieces.append(replace(copies, structure=other, slot_hashes=slot_hashes, reports=False,
                                  first_copy=first[mine], copy_step=sizes[mine], copied=True))
        return pieces

    def unsent(self, piece: KeyedPiece) -> int:
        return int(piece.copy_counts().sum())

    def _decode(self, rows: Rows, positions: npt.NDArray[np.int64], structure: Structure,
                layout: Layout) -> tuple[KeyedPiece, Rows] | None:
        """The piece bound for `structure`, and its rows' keys."""
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
            rows, positions, redundancy, immediate = (column.compress(take, axis=0)
                                                      for column in (rows, positions, redundancy, immediate))
        keys = rows[:, key_at:key_at + key_len]
        checksums, slot_hashes = key_hashes_rows(keys, int(redundancy.max(initial=1)), structure.key_hash)
        values = rows[:, data_at:data_at + data_len] if self.carries_data else gather(rows, sub_at, sub, "counter")
        return KeyedPiece(structure, positions, redundancy, immediate, checksums, slot_hashes, values), keys

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
        slots = slots & np.uint32(structure.slot_count - 1)  # a new array: the column may be the piece's own
        va = np.uint64(qp.base_va) + slots.astype(np.uint64) * np.uint64(structure.slot_size)
        run = self.frames_of(qp, structure, va, immediate, checksums, values)
        self.count(sum(len(piece.positions) for piece in parts if piece.reports), len(positions))
        return Emitted(positions, [run], copies=copies if len(parts) == 1 else copies[order])


def _requests(piece: KeyedPiece) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint32],
                                          npt.NDArray[np.bool_], npt.NDArray[np.uint32], npt.NDArray[Any]]:
    """One entry per frame of the piece's rows, copy by copy: batch position, copy, slot hash, immediate flag,
    key checksum, and the value."""
    if piece.copy_step is not None:
        counts = piece.copy_counts()
        rows = np.repeat(np.arange(len(piece.positions)), counts)
        copies = cast(npt.NDArray[np.int64], piece.first_copy)[rows] + piece.copy_step[rows] * ranks(counts)
    elif piece.redundancy.max() == 1:  # a frame per row: the columns as they are
        return (piece.positions, np.zeros(len(piece.positions), dtype=np.int64), piece.slot_hashes[0],
                piece.immediate, piece.checksums, piece.values)
    else:
        rows = np.repeat(np.arange(len(piece.positions)), piece.redundancy)
        copies = ranks(piece.redundancy)
    return (piece.positions[rows], copies, piece.slot_hashes[copies, rows], piece.immediate[rows],
            piece.checksums[rows], piece.values.take(rows, axis=0))
