"""DTA primitives as plug-ins of the reference translator (sans-IO).

A primitive is a class that declares its opcode, its sub-header (a `spec.Header`), its state and its
translation function. The reference translator dispatches every report through one: the five built-in ones
below, and any plug-in passed to `Translator(tables, plugins=[...])`. Because the reference translator is what
the python engine runs on the wire, a plug-in runs live as soon as it is given to `softdta translator up
--engine python --primitive MODULE:CLASS` (docs/primitives.md shows how one is written).

Built-in primitives take their sub-headers from `softdta.wire.dta` (they have dta-v1 and extended forms); a plug-in
uses the extended format only: base header `spec.DTA_BASE_EXT` with its own opcode, then its `subheader`.
"""

from __future__ import annotations

import abc
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from softdta.core.tables import AppendLists, QueuePair, Structure, Tables
from softdta.spec import (
    DTA_BASE_EXT,
    EXTENDED_FIRST_BYTE,
    FLUSH_EXT,
    FLUSH_OPCODE,
    PRIMITIVES,
    DtaOpcode,
    FlushTarget,
    Header,
    MergeFunction,
    NackKind,
    RoceOpcode,
    TranslatorCounter,
)
from softdta.wire.codec import WireError, codec
from softdta.wire.dta import Nack, Report
from softdta.wire.frames import UdpFrame
from softdta.wire.hashing import key_checksum, key_slot, postcard_hop_hash, postcard_slot_hash


@dataclass
class Output:
    frames: list[bytes] = field(default_factory=list)
    to_reporter: list[bytes] = field(default_factory=list)
    drop: TranslatorCounter | None = None
    deferred: bool = False
    passed: bool = False


@dataclass(frozen=True)
class PluginReport:
    """A plug-in's report: the extended base header's flags and its sub-header's fields, as unpacked."""

    opcode: int
    fields: dict[str, Any]
    seqnum: int = 0
    immediate: bool = False
    essential: bool = False
    retransmit: bool = False
    extended: bool = True


class TranslatorContext(Protocol):
    """What a primitive may use of the translator that runs it (the reference `Translator`)."""

    tables: Tables
    counters: Counter[TranslatorCounter]
    queue: int  # the RX queue being translated: its QPs are the ones written

    @property
    def append_state(self) -> dict[int, AppendRuntime]: ...

    @property
    def postcard_cache(self) -> dict[int, dict[int, PostcardEntry]]: ...

    def drop(self, reason: TranslatorCounter) -> Output: ...

    def sender(self, target: Structure | AppendLists) -> QueuePair:
        """The QP of `target` that the RX queue being translated writes through."""
        ...

    def blocked(self, qp: QueuePair, report: Report | PluginReport, now_ns: int) -> Output | None: ...

    def gate(self, qp: QueuePair, essential: npt.NDArray[np.bool_],
             now_ns: int) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]: ...

    def structure(self, udp: UdpFrame, kind: DtaOpcode, report: Report | PluginReport,
                  key: bytes | None = None) -> Structure | Output: ...

    def write(self, qp: QueuePair, offset: int, payload: bytes, report: Report | PluginReport | None,
              tag: int) -> bytes: ...

    def emit(self, qp: QueuePair, opcode: RoceOpcode, headers: dict[str, dict[str, Any]], payload: bytes) -> bytes: ...

    def nack_frame(self, udp: UdpFrame, nack: Nack) -> bytes: ...

    def flush_later(self, now_ns: int, index: int, structure: Structure | None) -> int: ...

    def flush_batch(self, lists: AppendLists, list_id: int, runtime: AppendRuntime) -> list[bytes]: ...

    def flush_path(self, structure: Structure, index: int, entry: PostcardEntry) -> list[bytes]: ...


Target = Structure | AppendLists  # where a report goes: what its QP writes into


@dataclass
class PluginRows:
    """A plug-in's reports in one batch, for `translate_batch`, in the order they arrived: whole frames as rows
    of bytes (zero-padded to the longest; `lengths` are the frames'), each one report of the plug-in's opcode
    in the extended format, not a retransmission, and of the size its sub-header's length fields give.
    The sub-header starts at byte `at`; `collector_ips` are the destination addresses, as 32-bit integers."""

    frames: npt.NDArray[np.uint8]
    lengths: npt.NDArray[np.int64]
    at: int
    collector_ips: npt.NDArray[np.uint64]
    immediate: npt.NDArray[np.bool_]
    essential: npt.NDArray[np.bool_]


@dataclass
class KeyWrites:
    """Key-Write frames that `translate_batch` asks for, as `write_key` makes them: for each of `rows` (indices
    into PluginRows, ascending), checksum(key) ‖ data into `redundancy` slots of `structure`, a Key-Write
    structure, with the report's immediate flag."""

    structure: Structure
    rows: npt.NDArray[np.int64]
    keys: npt.NDArray[np.uint8]  # (writes, the structure's key_len)
    data: npt.NDArray[np.uint8]  # (writes, the structure's data_len)
    redundancy: int = 1


@dataclass
class BatchResult:
    """What `translate_batch` made of a PluginRows: the frames it asks for, and the rows it deferred (essential
    reports whose QP cannot send, as `blocked` defers them)."""

    writes: list[KeyWrites] = field(default_factory=list)
    deferred: npt.NDArray[np.int64] = field(default_factory=lambda: np.empty(0, dtype=np.int64))


class BatchPrimitive(Protocol):
    """A primitive that also translates its reports a batch at a time (see `Primitive`)."""

    def translate_batch(self, rows: PluginRows, now_ns: int) -> BatchResult: ...


class Primitive(abc.ABC):
    """One DTA primitive. Subclasses set `opcode`, `name` and `subheader` (the built-ins take them from
    spec.PRIMITIVES), and implement `apply`. `translate` runs every report the same way: `target` finds where
    it goes (by default the structure of kind `opcode` at the report's collector address) or the drop that
    replaces it, the translator gates the target's QP (`blocked`), and `apply` makes the frames.

    `new_state()` returns the primitive's state, kept in `self.state` for the translator's lifetime.
    `self.translator` offers what every primitive shares: table lookups (`structure`), QP gating (`blocked`),
    RDMA WRITE and atomic frames with per-QP PSNs (`write`, `emit`), drops, counters and NACKs.

    A plug-in may also define `translate_batch(rows: PluginRows, now_ns) -> BatchResult` (`BatchPrimitive`):
    the batch translator (core/batch.py) then hands it all of its reports of a batch segment at once, and merges
    the Key-Write frames it asks for into the PSN order of their QPs. It must leave the state, counters and
    frames exactly as `translate` would, report by report (tests/unit/test_batch.py checks Latency-Sum's).
    Without it, the plug-in's reports go through `translate`, one at a time, in order.
    """

    opcode: int
    name: str
    subheader: Header

    def __init__(self, translator: TranslatorContext):
        self.translator = translator
        self.state = self.new_state()

    def new_state(self) -> Any:
        return None

    def decode(self, base: dict[str, Any], payload: bytes, offset: int) -> PluginReport:
        """The report after the extended base header `base`; raises WireError for malformed input."""
        fields, end = codec(self.subheader).unpack(payload, offset)
        if end != len(payload):
            raise WireError("BAD_LENGTH", f"{self.name} report is {end} bytes but the UDP payload is {len(payload)}")
        return PluginReport(self.opcode, fields, seqnum=base["seqnum"], immediate=bool(base["immediate"]),
                            essential=bool(base["essential"]), retransmit=bool(base["retransmit"]))

    @classmethod
    def encode(cls, fields: dict[str, Any], *, seqnum: int = 0, immediate: bool = False, essential: bool = False,
               retransmit: bool = False) -> bytes:
        """The UDP payload of a report of this primitive (what a reporter sends)."""
        base = codec(DTA_BASE_EXT).pack(marker=EXTENDED_FIRST_BYTE, opcode=cls.opcode, immediate=int(immediate),
                                        essential=int(essential), retransmit=int(retransmit), seqnum=seqnum)
        return base + codec(cls.subheader).pack(fields)

    def translate(self, udp: UdpFrame, report: Any, now_ns: int) -> Output:  # a Report, or a plug-in's PluginReport
        """The frames for one report (or the drop, deferral or NACK that replaces them)."""
        target = self.target(udp, report, now_ns)
        if isinstance(target, Output):
            return target
        if target.qp_on(self.translator.queue) is None:
            return self.translator.drop(TranslatorCounter.DROP_NO_QUEUE_QP)
        blocked = self.translator.blocked(self.translator.sender(target), report, now_ns)
        if blocked:
            return blocked
        return self.apply(udp, report, target, now_ns)

    def target(self, udp: UdpFrame, report: Any, now_ns: int) -> Target | Output:
        """Where the report goes, or the Output (a counted drop, a NACK) that replaces it."""
        return self.translator.structure(udp, DtaOpcode(self.opcode), report)

    @abc.abstractmethod
    def apply(self, udp: UdpFrame, report: Any, target: Any, now_ns: int) -> Output:
        """The frames for a report whose target's QP may send."""


def _built_in(opcode: DtaOpcode) -> tuple[DtaOpcode, str, Header]:
    info = PRIMITIVES[opcode]
    return opcode, info.slug, info.ext_subheader


# ------------------------------------------------------------------------------------------------------------
# the built-in primitives (the paper's four, and Sketch-Merge)

class KeyWrite(Primitive):
    opcode, name, subheader = _built_in(DtaOpcode.KEY_WRITE)

    def apply(self, udp: UdpFrame, report: Report, target: Structure, now_ns: int) -> Output:
        return Output(frames=write_key(self.translator, target, report.key, report.data, report.redundancy, report))


def write_key(t: TranslatorContext, structure: Structure, key: bytes, data: bytes, redundancy: int,
              report: Report | PluginReport | None) -> list[bytes]:
    """Key-Write's frames: checksum ‖ data into each of the key's `redundancy` slots."""
    payload = key_checksum(key).to_bytes(4, "little") + data
    frames = []
    for copy in range(redundancy):
        offset = key_slot(key, copy, structure.slot_count, structure.key_hash) * structure.slot_size
        frames.append(t.write(t.sender(structure), offset, payload, report, key_checksum(key)))
    return frames


class KeyIncrement(Primitive):
    opcode, name, subheader = _built_in(DtaOpcode.KEY_INCREMENT)

    def apply(self, udp: UdpFrame, report: Report, target: Structure, now_ns: int) -> Output:
        t, structure = self.translator, target
        qp = t.sender(structure)
        out = Output()
        for copy in range(report.redundancy):
            offset = key_slot(report.key, copy, structure.slot_count, structure.key_hash) * structure.slot_size
            atomic = {"va": qp.base_va + offset, "rkey": qp.rkey, "swap_add": report.counter, "compare": 0}
            out.frames.append(t.emit(qp, RoceOpcode.RC_FETCH_ADD, {"atomic_eth": atomic}, b""))
        return out


@dataclass
class AppendRuntime:
    head: int = 0
    pending: list[bytes] = field(default_factory=list)
    first_pending_ns: int = 0
    token: int = 0  # names this batch in the flush queue


class Append(Primitive):
    """State: list id -> its batch and ring head."""

    opcode, name, subheader = _built_in(DtaOpcode.APPEND)

    def new_state(self) -> dict[int, AppendRuntime]:
        return {}

    def target(self, udp: UdpFrame, report: Report, now_ns: int) -> AppendLists | Output:
        lists = self.translator.tables.append_range(report.list_id)
        if lists is None:
            return self.translator.drop(TranslatorCounter.DROP_UNKNOWN_LIST)
        if len(report.data) != lists.data_len:
            return self.translator.drop(TranslatorCounter.DROP_BAD_LENGTH)
        return lists

    def apply(self, udp: UdpFrame, report: Report, target: AppendLists, now_ns: int) -> Output:
        t, lists = self.translator, target
        runtime = self.state.setdefault(report.list_id, AppendRuntime())
        if not runtime.pending:
            runtime.first_pending_ns = now_ns
            runtime.token = t.flush_later(now_ns, report.list_id, None)
        runtime.pending.append(_append_entry(report.data))
        if len(runtime.pending) < lists.batch:
            t.counters[TranslatorCounter.APPEND_BATCHED] += 1
            return Output()
        return Output(frames=self.write_batch(lists, report.list_id, runtime, report))

    def write_batch(self, lists: AppendLists, list_id: int, runtime: AppendRuntime,
                    report: Report | None) -> list[bytes]:
        offset = lists.ring_offset(list_id) + runtime.head * lists.data_len
        payload = b"".join(runtime.pending)
        runtime.pending = []
        runtime.head = (runtime.head + lists.batch) % lists.entries
        return [self.translator.write(self.translator.sender(lists), offset, payload, report, list_id)]


def _append_entry(data: bytes) -> bytes:
    """Append entries of 4 or 8 bytes are integers and stored little-endian (host order); others verbatim."""
    return data[::-1] if len(data) in (4, 8) else data


@dataclass
class PostcardEntry:
    key: bytes
    path_length: int
    values: list[int]
    hop_mask: int = 0
    first_ns: int = 0
    token: int = 0


class Postcarding(Primitive):
    """State: QP index -> cache index -> the path being gathered."""

    opcode, name, subheader = _built_in(DtaOpcode.POSTCARDING)

    def new_state(self) -> dict[int, dict[int, PostcardEntry]]:
        return {}

    def target(self, udp: UdpFrame, report: Report, now_ns: int) -> Structure | Output:
        structure = self.translator.structure(udp, DtaOpcode.POSTCARDING, report)
        if isinstance(structure, Output):
            return structure
        path_length = report.path_length or structure.hops
        if report.hop > path_length or path_length > structure.hops:
            return self.translator.drop(TranslatorCounter.DROP_BAD_HOP)
        return structure

    def apply(self, udp: UdpFrame, report: Report, target: Structure, now_ns: int) -> Output:
        t, structure = self.translator, target
        path_length = report.path_length or structure.hops
        cache = self.state.setdefault(structure.qp.index, {})
        index = postcard_slot_hash(report.key) & (structure.cache_entries - 1)
        encoded = int.from_bytes(report.data, "big") ^ postcard_hop_hash(report.key, report.hop)
        out = Output()
        entry = cache.get(index)
        if entry is not None and entry.key != report.key:
            if path_length == 1:
                # A one-hop path is complete on arrival: write it without evicting another flow's path.
                single = PostcardEntry(report.key, 1, [0] * structure.hops, hop_mask=1)
                single.values[report.hop - 1] = encoded
                return Output(frames=self.write_path(structure, single, report))
            t.counters[TranslatorCounter.POSTCARD_EVICTIONS] += 1
            out.frames += self.write_path(structure, entry, None)
            entry = None
        if entry is None:
            entry = cache[index] = PostcardEntry(report.key, path_length, [0] * structure.hops, first_ns=now_ns,
                                                 token=t.flush_later(now_ns, index, structure))
        entry.values[report.hop - 1] = encoded
        entry.hop_mask |= 1 << (report.hop - 1)
        if entry.hop_mask.bit_count() >= entry.path_length:
            del cache[index]
            out.frames += self.write_path(structure, entry, report)
        elif not out.frames:
            t.counters[TranslatorCounter.POSTCARD_CACHED] += 1
        return out

    def write_path(self, structure: Structure, entry: PostcardEntry, report: Report | None) -> list[bytes]:
        offset = (postcard_slot_hash(entry.key) & (structure.slot_count - 1)) * structure.slot_size
        payload = b"".join(v.to_bytes(4, "big") for v in entry.values)
        return [self.translator.write(self.translator.sender(structure), offset, payload, report,
                                      key_checksum(entry.key))]


@dataclass
class SketchRuntime:
    aggregate: list[list[int]]
    contributors: list[set[int]]
    next_column: dict[int, int] = field(default_factory=dict)


class SketchMerge(Primitive):
    """State: QP index -> the aggregate columns, who contributed to them, and each reporter's next column."""

    opcode, name, subheader = _built_in(DtaOpcode.SKETCH_MERGE)

    def new_state(self) -> dict[int, SketchRuntime]:
        return {}

    def runtime(self, structure: Structure) -> SketchRuntime:
        """The structure's aggregate columns, their contributors and each reporter's next column (made on first use)."""
        runtime: SketchRuntime = self.state.setdefault(structure.qp.index, SketchRuntime(
            [[0] * structure.rows for _ in range(structure.columns)], [set() for _ in range(structure.columns)]))
        return runtime

    def target(self, udp: UdpFrame, report: Report, now_ns: int) -> Structure | Output:
        t = self.translator
        structure = t.tables.structure(udp.dst_ip, DtaOpcode.SKETCH_MERGE)
        if structure is None:
            return t.drop(TranslatorCounter.DROP_UNKNOWN_COLLECTOR)
        if report.reporter >= structure.reporters:
            return t.drop(TranslatorCounter.DROP_UNKNOWN_REPORTER)
        if len(report.counters) != structure.rows or report.column >= structure.columns:
            return t.drop(TranslatorCounter.DROP_BAD_LENGTH)
        runtime = self.runtime(structure)
        expected = runtime.next_column.get(report.reporter, 0)
        # A reporter that wrapped into its next epoch waits (NACKed) until the column's last epoch is written.
        if report.column != expected or report.reporter in runtime.contributors[expected]:
            late = report.column > expected
            out = t.drop(TranslatorCounter.DROP_SKETCH_GAP if late else TranslatorCounter.DROP_SKETCH_STALE)
            nack = Nack(NackKind.SKETCH_COLUMN, expected, report.reporter, extended=True)
            out.to_reporter.append(t.nack_frame(udp, nack))
            return out
        return structure

    def apply(self, udp: UdpFrame, report: Report, target: Structure, now_ns: int) -> Output:
        t, structure = self.translator, target
        runtime = self.runtime(structure)
        expected = report.column
        runtime.next_column[report.reporter] = (expected + 1) % structure.columns
        column = runtime.aggregate[report.column]
        for row, value in enumerate(report.counters):
            column[row] = max(column[row], value) if structure.merge is MergeFunction.MAX \
                else (column[row] + value) & 0xFFFFFFFF
        runtime.contributors[report.column].add(report.reporter)
        t.counters[TranslatorCounter.SKETCH_MERGED] += 1
        first = report.column - report.column % structure.batch
        group = range(first, first + structure.batch)
        if any(len(runtime.contributors[c]) < structure.reporters for c in group):
            return Output()
        payload = b"".join(v.to_bytes(4, "little") for c in group for v in runtime.aggregate[c])
        for c in group:
            runtime.aggregate[c] = [0] * structure.rows
            runtime.contributors[c] = set()
        return Output(frames=[t.write(t.sender(structure), first * structure.slot_size, payload, report, first)])


BUILT_IN: tuple[type[Primitive], ...] = (KeyWrite, KeyIncrement, Append, Postcarding, SketchMerge)


class FlushRequest(Primitive):
    """The P4 translators' idle flush, which a switch cannot run from a timer: a flush request names an Append
    list or a Postcarding cache entry, and what waits there is written out if it has waited `idle_ns` (the
    `flush_idle_ns` of translator_config). Not a built-in: software translators flush by their clock, and
    this is how the reference models the switch (`Translator(tables, plugins=[FlushRequest.after(ns)])`).
    Anything not yet due stays, uncounted; an unknown target is a counted drop."""

    opcode, name, subheader = FLUSH_OPCODE, "flush-request", FLUSH_EXT
    idle_ns = 0

    @classmethod
    def after(cls, idle_ns: int) -> type[FlushRequest]:
        return type(cls.__name__, (cls,), {"idle_ns": idle_ns})

    @classmethod
    def request(cls, target: FlushTarget, index: int) -> bytes:
        """The UDP payload of a flush request, sent to the DTA port of the structure's collector address."""
        return cls.encode({"target": target, "index": index})

    def target(self, udp: UdpFrame, report: PluginReport, now_ns: int) -> Target | Output:
        t = self.translator
        kind, index = report.fields["target"], report.fields["index"]
        if kind == FlushTarget.APPEND_LIST:
            lists = t.tables.append_range(index)
            return t.drop(TranslatorCounter.DROP_UNKNOWN_LIST) if lists is None else lists
        if kind != FlushTarget.POSTCARD_ENTRY:
            return t.drop(TranslatorCounter.DROP_BAD_FLUSH)
        structure = t.tables.structure(udp.dst_ip, DtaOpcode.POSTCARDING)
        return t.drop(TranslatorCounter.DROP_UNKNOWN_COLLECTOR) if structure is None else structure

    def apply(self, udp: UdpFrame, report: PluginReport, target: Target, now_ns: int) -> Output:
        t, index = self.translator, report.fields["index"]
        if isinstance(target, AppendLists):
            batch = t.append_state.get(index)
            if batch is None or not batch.pending or now_ns - batch.first_pending_ns < self.idle_ns:
                return Output()
            return Output(frames=t.flush_batch(target, index, batch))
        if index >= target.cache_entries:
            return t.drop(TranslatorCounter.DROP_BAD_FLUSH)
        entry = t.postcard_cache.get(target.qp.index, {}).get(index)
        if entry is None or now_ns - entry.first_ns < self.idle_ns:
            return Output()
        return Output(frames=t.flush_path(target, index, entry))


def load(spec: str) -> type[Primitive]:
    """A plug-in primitive class from `MODULE:CLASS` (for example softdta.plugins.latency_sum:LatencySum)."""
    import importlib

    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"primitive {spec!r}: give MODULE:CLASS, for example "
                         "softdta.plugins.latency_sum:LatencySum")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"primitive {spec!r} cannot be loaded ({error}); is the module on PYTHONPATH?") from None
    if not (isinstance(cls, type) and issubclass(cls, Primitive)):
        raise ValueError(f"primitive {spec!r} is not a subclass of softdta.core.primitives.Primitive")
    return cls
