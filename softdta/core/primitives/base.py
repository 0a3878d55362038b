"""What a primitive is: one class that declares everything every layer asks of it (sans-IO).

A primitive declares its opcode, name and sub-headers (from `spec.PRIMITIVES` for the built-ins), its state and
reference translation (`translate`, `apply`), its vector translation for the batch translator, its collector
region (`slot_size`, `check_structure`, `region`), its query answers, its control-plane planning and its
workload and truth for demos, and names the BPF header and the P4 header instance that implement it in the data
planes.
Every layer finds it in `softdta.core.registry` and asks; none switches on an opcode or a name.

Built-in primitives take their sub-headers from `softdta.wire.dta` (they have dta-v1 and extended forms); a plug-in
uses the extended format only: base header `spec.DTA_BASE_EXT` with its own opcode, then its `subheader`.
A plug-in runs live as soon as it is given to `softdta translator up --engine python --primitive MODULE:CLASS`
(docs/primitives.md shows how one is written).
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from softdta.core.query import StructureQuery
from softdta.core.regions import Buffer, Region
from softdta.core.settings import TableError
from softdta.core.tables import AppendLists, QueuePair, Shape, Structure, Tables
from softdta.core.workload import PrimitiveDemo, WorkloadParams
from softdta.spec import (
    DTA_BASE_EXT,
    EXTENDED_FIRST_BYTE,
    KEY_CHECKSUM_LEN,
    PRIMITIVES,
    DtaOpcode,
    Header,
    RoceOpcode,
    TranslatorCounter,
    Transport,
)
from softdta.wire.codec import WireError, codec
from softdta.wire.dta import Nack, Report
from softdta.wire.frames import UdpFrame

if TYPE_CHECKING:
    from softdta.core.vector import VectorPath


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

    def primitive(self, opcode: int) -> Primitive:
        """The translator's instance of the primitive with `opcode` (its state is `state`)."""
        ...

    def drop(self, reason: TranslatorCounter) -> Output: ...

    def sender(self, target: Structure | AppendLists) -> QueuePair:
        """The QP of `target` that the RX queue being translated writes through."""
        ...

    def blocked(self, qp: QueuePair, report: Report | PluginReport, now_ns: int) -> Output | None: ...

    def gate(self, qp: QueuePair, essential: npt.NDArray[np.bool_],
             now_ns: int) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]: ...

    def replica_structures(self, udp: UdpFrame, kind: int,
                           report: Report | PluginReport) -> list[Structure] | Output: ...

    def copy_structures(self, udp: UdpFrame, kind: int, report: Report | PluginReport, target: Structure,
                        copies: int, now_ns: int) -> list[Structure | None]: ...

    def structure(self, udp: UdpFrame, kind: int, report: Report | PluginReport,
                  key: bytes | None = None) -> Structure | Output: ...

    def write(self, qp: QueuePair, offset: int, payload: bytes, report: Report | PluginReport | None,
              tag: int) -> bytes: ...

    def emit(self, qp: QueuePair, opcode: RoceOpcode, headers: dict[str, dict[str, Any]], payload: bytes) -> bytes: ...

    def nack_frame(self, udp: UdpFrame, nack: Nack) -> bytes: ...

    def flush_later(self, by: Primitive, now_ns: int, index: int, target: Target | None) -> int:
        """Queue what `by` holds under `index` for an idle flush (`Primitive.flush`); returns the entry's token."""
        ...


Target = Structure | AppendLists  # where a report goes: what its QP writes into
SnapshotColumns = dict[str, npt.NDArray[Any]]  # one part of a snapshot: column name -> values, all of one length


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

    On the collector, a primitive whose reports land in a structure declares, and the query service and the
    command line take from that alone (`GET /structures`, `/stats`, `/metrics`, and its route):
    - `region(buffer, structure)`: the view of the structure's memory, with `occupied()` per slot; with `hashed`
      the service also estimates the load factor;
    - `describe(structure)`: what `/structures` lists of it beside sizes and fill (by default key_len, key_hash);
    - `query`: a `core.query.StructureQuery` subclass, served at `/<name>/<structure name>` (a POST of a JSON
      object of its `required_fields`, or a GET if it declares no fields). Its `parse` turns the fields into the
      typed query, its `answer(region)` returns an answer whose `json()` the service sends; `None`: no route.
    - `snapshot(region, structure, rows)`: its content as columns, part by part, which `softdta collector snapshot`
      writes as Parquet under the table `snapshot_table()` (docs/export.md); None: snapshots skip it.
    A plug-in whose slots hold checksum ‖ data, as Key-Write's, reuses Key-Write's view, lookup and snapshot:
    `region` returns `key_write.region.KeyWriteRegion.for_structure(buffer, structure)`,
    `query = key_write.queries.KeyLookup` and `snapshot` returns `key_write.queries.key_write_snapshot(region, rows)`.
    """

    opcode: ClassVar[int]
    name: ClassVar[str]  # its one spelling: tables, collector configuration, HTTP paths, the command line
    subheader: ClassVar[Header]  # in the extended profile
    v1_subheader: ClassVar[Header | None] = None  # in the dta-v1 profile; None: extended profile only
    has_structure: ClassVar[bool] = True  # its reports land in a structure ([[structures]]), not in Append lists
    hashed: ClassVar[bool] = True  # keys hash into a power-of-two count of slots; else slots are columns, in order
    atomics: ClassVar[bool] = False  # writes with Fetch&Add: an RC queue pair and remote-atomic access
    default_transport: ClassVar[Transport] = Transport.UC
    rx_counter: ClassVar[TranslatorCounter | None] = None  # counts its well-formed reports
    redundant: ClassVar[bool] = False  # its reports ask for copies (redundancy): the P4 path multicasts them
    # its per-structure state in the data planes: a range of `state_size` entries of this map, and what to say
    # when they run out (what, fix)
    state_map: ClassVar[str | None] = None
    state_limit: ClassVar[tuple[str, str]] = ("state entries", "split the tables over translators")
    bpf_header: ClassVar[str | None] = None  # bpf/translator/<header>: the XDP engine's implementation
    p4_header: ClassVar[str | None] = None  # its sub-header's instance in the P4 programs, whose validity selects it
    vector: ClassVar[type[VectorPath[Any]] | None] = None  # its vector path in the batch translator (core/vector.py)
    # what the query service answers over one of its structures, at /<name>/<structure name> (core.query)
    query: ClassVar[type[StructureQuery[Any]] | None] = None
    demo: ClassVar[type[PrimitiveDemo] | None] = None  # its part in the demos (core.workload); None: not in them
    partitioned_by: ClassVar[str] = "key"  # what picks its reports' slot in a fleet: `partition_key` (docs/fleet.md)

    @classmethod
    def partition_key(cls, report: Any) -> bytes:
        """The bytes of a report that the fleet's partition hash takes (a Report, or a plug-in's PluginReport): by
        default its key, in wire order."""
        key = report.fields.get("key", b"") if isinstance(report, PluginReport) else report.key
        return bytes(key)

    # ----------------------------------------------------------------------------------------------
    # its structure and collector region (class-level: the tables and collectors ask without a translator)

    @classmethod
    def slot_size(cls, structure: Shape) -> int:
        """Bytes per slot of its structure (per key, or per sketch column)."""
        return power_of_two_at_least(KEY_CHECKSUM_LEN + structure.data_len)

    @classmethod
    def check_structure(cls, structure: Structure, where: str) -> None:
        """Raise TableError naming the problem and the fix if `structure` cannot hold this primitive's writes.
        By default a hashed structure: a power-of-two slot count between 2 and 2^31."""
        check_hashed_slots(structure, where)

    @classmethod
    def write_lengths(cls, structure: Structure) -> tuple[int, ...]:
        """The payload lengths of the RDMA WRITEs it sends into `structure` (the iCRC constants cover each)."""
        return (KEY_CHECKSUM_LEN + structure.data_len,)

    @classmethod
    def state_size(cls, fields: Mapping[str, int]) -> int:
        """How many entries of `state_map` a structure takes, from its `structure` map entry's fields."""
        return 1

    @classmethod
    def p4_problems(cls, structure: Structure, architecture: str, sharing: list[str]) -> list[str]:
        """What the P4 program of `architecture` ("v1model", "tna") cannot do of `structure`; `sharing` names what
        else writes through its queue pair. A primitive the P4 programs do not parse cannot run there at all."""
        if cls.p4_header is None:
            return [f"structure {structure.name}: the P4 programs have no {cls.name} primitive"]
        if structure.key_len != 4:
            return [f"structure {structure.name}: dta-v1 reports carry 4-byte keys and data"]
        return []

    @classmethod
    def p4_state_problems(cls, state: Mapping[tuple[bytes, int], int], architecture: str) -> list[str]:
        """What the P4 program cannot hold of its structures' state: (collector ip, entries) -> first entry."""
        return []

    @classmethod
    def region(cls, buffer: Buffer, structure: Structure) -> Region:
        """A view of its structure's collector memory (`buffer`) that its `query` reads, and that tells the query
        service which slots are occupied (`Region.occupied`: the fill and load factor of `/structures`, `/stats`
        and `/metrics`). A primitive whose reports land in a structure declares it."""
        raise NotImplementedError(f"primitive {cls.name} declares no collector region")

    @classmethod
    def describe(cls, structure: Structure) -> dict[str, Any]:
        """What the query service lists of `structure` beside its sizes and fill (`/structures`, `/stats`); by
        default its keys."""
        return {"key_len": structure.key_len, "key_hash": structure.key_hash.name.lower()}

    @classmethod
    def snapshot(cls, region: Region, structure: Structure, rows: int) -> Iterator[SnapshotColumns] | None:
        """Its structure's content (`region`, as `region` makes it) as columns, in parts of at most about `rows`
        slots each, so that memory stays bounded (each part is a Parquet row group); at least one part, which may
        be empty. Each column is a 1-D array, or a 2-D uint8 array of fixed-size binary values. None: it declares
        no snapshot, and snapshots skip its structure."""
        return None

    @classmethod
    def snapshot_table(cls) -> str:
        """The table its snapshots make (their file name, and the view `softdta query sql` reads them as)."""
        return cls.name.replace("-", "_")

    @classmethod
    def workload(cls, params: WorkloadParams) -> list[Report]:
        """Reports of a realistic workload of this primitive, the same for the same `params` (core.workload)."""
        raise NotImplementedError(f"primitive {cls.name} declares no workload")

    def __init__(self, translator: TranslatorContext):
        self.translator = translator
        self.state = self.new_state()

    def new_state(self) -> Any:
        return None

    def retabled(self, old: Tables) -> None:
        """The translator's tables were `old` and are now `self.translator.tables` (a live change): adjust the state
        that depended on them."""

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
        return self.translator.structure(udp, self.opcode, report)

    @abc.abstractmethod
    def apply(self, udp: UdpFrame, report: Any, target: Any, now_ns: int) -> Output:
        """The frames for a report whose target's QP may send."""

    # ----------------------------------------------------------------------------------------------
    # idle flushes: a primitive that holds reports back (`flush_later`) writes them out when they have waited

    def flush_target(self, index: int, target: Target | None) -> Target | None:
        """Where what waits under `index` (as given to `flush_later`) is written; None if nowhere now."""
        return target

    def pending(self, token: int, index: int, target: Target) -> Any:
        """What still waits under `index` for the flush-queue entry `token`, or None."""
        return None

    def flush(self, target: Target, index: int, pending: Any) -> list[bytes]:
        """The frames that write out `pending` now, with what it has."""
        return []


def built_in(opcode: DtaOpcode) -> tuple[DtaOpcode, str, Header, Header | None, bool, TranslatorCounter]:
    """What a built-in primitive takes from its entry in `spec.PRIMITIVES`: opcode, name, sub-headers, whether it
    has a structure, and the counter of its well-formed reports."""
    info = PRIMITIVES[opcode]
    return (opcode, info.slug, info.ext_subheader, info.v1_subheader, info.structure,
            TranslatorCounter[f"RX_{opcode.name}"])


def power_of_two_at_least(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def check_hashed_slots(structure: Structure, where: str) -> None:
    """A hashed structure's slot count is a power of two between 2 and 2^31 (the hash takes the low bits)."""
    count = structure.slot_count
    if not is_power_of_two(count) or count < 2 or count > 1 << 31:
        raise TableError(f"{where}: region length {structure.qp.length} gives {count} slots of "
                         f"{structure.slot_size} B; the hash needs a power of two between 2 and 2^31 "
                         f"(e.g. length {power_of_two_at_least(max(2, count)) * structure.slot_size})")


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
