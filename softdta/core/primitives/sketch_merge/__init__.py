"""Sketch-Merge: reporters' sketch columns merged (sum or max) and written once every reporter gave its share."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, cast

import numpy as np

from softdta.core import workload as generators
from softdta.core.control_plane import map_spec
from softdta.core.primitives.base import Output, Primitive, SnapshotColumns, built_in, is_power_of_two
from softdta.core.primitives.sketch_merge.batch import SketchMergePath
from softdta.core.primitives.sketch_merge.demo import SketchMergeDemo
from softdta.core.primitives.sketch_merge.queries import MergedSketch, sketch_snapshot
from softdta.core.primitives.sketch_merge.region import SketchRegion
from softdta.core.primitives.sketch_merge.state import SketchRuntime as SketchRuntime  # its state, re-exported
from softdta.core.regions import Buffer, Region
from softdta.core.settings import TableError
from softdta.core.tables import Shape, Structure
from softdta.spec import (
    MAX_SKETCH_ROWS,
    MAX_WRITE_PAYLOAD,
    P4_SKETCH_COLUMN_BITS,
    P4_SKETCH_REPORTER_BITS,
    TNA_MAX_SKETCH_ROWS,
    TNA_SKETCH_COLUMN_ENTRIES,
    DtaOpcode,
    MergeFunction,
    NackKind,
    TranslatorCounter,
)
from softdta.wire.dta import Nack, Report
from softdta.wire.frames import UdpFrame
from softdta.wire.icrc_split import tna_needs_two_passes


class SketchMerge(Primitive):
    """State: QP index -> the aggregate columns, who contributed to them, and each reporter's next column."""

    opcode, name, subheader, v1_subheader, has_structure, rx_counter = built_in(DtaOpcode.SKETCH_MERGE)
    bpf_header: ClassVar[str | None] = "sketch.h"
    p4_header: ClassVar[str | None] = "sketch"
    vector = SketchMergePath
    demo = SketchMergeDemo
    query = MergedSketch
    hashed: ClassVar[bool] = False
    state_map: ClassVar[str | None] = "sketch_column"
    state_limit: ClassVar[tuple[str, str]] = ("sketches", "split the tables over translators")
    partitioned_by: ClassVar[str] = "sketch"  # a fleet address has one sketch: all its columns on one collector

    @classmethod
    def partition_key(cls, report: Any) -> bytes:
        return b""

    @classmethod
    def workload(cls, params: generators.WorkloadParams) -> list[Report]:
        return generators.sketch_epoch(params.reporters, params.columns, params.rows, params.seed)

    @classmethod
    def write_lengths(cls, structure: Structure) -> tuple[int, ...]:
        return (structure.batch * structure.slot_size,)

    @classmethod
    def slot_size(cls, structure: Shape) -> int:
        return 4 * structure.rows

    @classmethod
    def check_structure(cls, structure: Structure, where: str) -> None:
        if not 1 <= structure.rows <= MAX_SKETCH_ROWS or structure.columns <= 0:
            raise TableError(f"{where}: needs 1..{MAX_SKETCH_ROWS} rows and at least one column")
        if structure.columns % structure.batch:
            raise TableError(f"{where}: batch {structure.batch} must divide the column count {structure.columns}")
        if structure.batch * structure.slot_size > MAX_WRITE_PAYLOAD:
            raise TableError(f"{where}: a write of {structure.batch} columns x {structure.rows} rows x 4 B exceeds "
                             f"{MAX_WRITE_PAYLOAD} B; lower batch or rows")
        if structure.columns * structure.slot_size > structure.qp.length:
            raise TableError(f"{where}: {structure.columns} columns x {structure.rows} rows x 4 B need "
                             f"{structure.columns * structure.slot_size} B, the region has {structure.qp.length}")
        if structure.reporters <= 0 or structure.reporters >= 1 << 16:
            raise TableError(f"{where}: reporters must be 1..65535")

    @classmethod
    def region(cls, buffer: Buffer, structure: Structure) -> SketchRegion:
        return SketchRegion.for_structure(buffer, structure)

    @classmethod
    def snapshot(cls, region: Region, structure: Structure, rows: int) -> Iterator[SnapshotColumns]:
        return sketch_snapshot(cast(SketchRegion, region), rows)

    @classmethod
    def describe(cls, structure: Structure) -> dict[str, Any]:
        return {"columns": structure.columns, "rows": structure.rows, "reporters": structure.reporters,
                "merge": structure.merge.name.lower()}

    @classmethod
    def p4_problems(cls, structure: Structure, architecture: str, sharing: list[str]) -> list[str]:
        where, problems = f"structure {structure.name}", super().p4_problems(structure, architecture, sharing)
        if not is_power_of_two(structure.batch):
            problems.append(f"{where}: batch {structure.batch} must be a power of two")
        if structure.reporters > 1 << P4_SKETCH_REPORTER_BITS:
            problems.append(f"{where}: at most {1 << P4_SKETCH_REPORTER_BITS} reporters")
        if structure.columns > 1 << P4_SKETCH_COLUMN_BITS:
            problems.append(f"{where}: at most {1 << P4_SKETCH_COLUMN_BITS} columns")
        if architecture == "tna" and tna_needs_two_passes(structure.batch * structure.slot_size) and sharing:
            problems.append(f"{where}: its {structure.batch * structure.slot_size} B writes take their PSN before a "
                            f"second egress pass on tna, so its qp {structure.qp.name!r} must carry nothing else "
                            f"({', '.join(sharing)})")
        if architecture == "tna" and structure.rows > TNA_MAX_SKETCH_ROWS:
            problems.append(f"{where}: {structure.rows} rows are more than the tna build's "
                            f"TNA_MAX_SKETCH_ROWS ({TNA_MAX_SKETCH_ROWS})")
        return problems

    @classmethod
    def p4_state_problems(cls, state: Mapping[tuple[bytes, int], int], architecture: str) -> list[str]:
        problems = []
        sketches = map_spec(cast(str, cls.state_map)).max_entries >> P4_SKETCH_COLUMN_BITS
        if any(index >= sketches for index in state.values()):
            problems.append(f"at most {sketches} Sketch-Merge structures")
        columns_end = max(((index + 1) << P4_SKETCH_COLUMN_BITS for index in state.values()), default=0)
        if architecture == "tna" and columns_end > TNA_SKETCH_COLUMN_ENTRIES:
            problems.append(f"{len(state)} Sketch-Merge structures: the tna build holds "
                            f"{TNA_SKETCH_COLUMN_ENTRIES >> P4_SKETCH_COLUMN_BITS} (TNA_SKETCH_COLUMN_ENTRIES)")
        return problems

    def new_state(self) -> dict[int, SketchRuntime]:
        return {}

    def runtime(self, structure: Structure) -> SketchRuntime:
        """The structure's aggregate columns, their contributors and each reporter's next column (made on first use;
        made afresh if new tables reshaped the structure)."""
        runtime = self.state.get(structure.qp.index)
        if runtime is None or not runtime.fits(structure):
            runtime = self.state[structure.qp.index] = SketchRuntime(structure)
        return cast(SketchRuntime, runtime)

    def target(self, udp: UdpFrame, report: Report, now_ns: int) -> Structure | Output:
        t = self.translator
        structures = t.replica_structures(udp, self.opcode, report)  # at the fleet address, its slot's first
        if isinstance(structures, Output):
            return structures
        structure = structures[0]
        if report.reporter >= structure.reporters:
            return t.drop(TranslatorCounter.DROP_UNKNOWN_REPORTER)
        if len(report.counters) != structure.rows or report.column >= structure.columns:
            return t.drop(TranslatorCounter.DROP_BAD_LENGTH)
        runtime = self.runtime(structure)
        expected = int(runtime.next_column[report.reporter])
        # A reporter that wrapped into its next epoch waits (NACKed) until the column's last epoch is written.
        if report.column != expected or runtime.contributors[expected, report.reporter]:
            late = report.column > expected
            out = t.drop(TranslatorCounter.DROP_SKETCH_GAP if late else TranslatorCounter.DROP_SKETCH_STALE)
            nack = Nack(NackKind.SKETCH_COLUMN, expected, report.reporter, extended=True)
            out.to_reporter.append(t.nack_frame(udp, nack))
            return out
        return structure

    def apply(self, udp: UdpFrame, report: Report, target: Structure, now_ns: int) -> Output:
        t, structure = self.translator, target
        runtime = self.runtime(structure)
        runtime.next_column[report.reporter] = (report.column + 1) % structure.columns
        column, counters = runtime.aggregate[report.column], np.array(report.counters, dtype=np.uint32)
        if structure.merge is MergeFunction.MAX:
            np.maximum(column, counters, out=column)
        else:
            column += counters  # modulo 2^32
        runtime.contributors[report.column, report.reporter] = True
        t.counters[TranslatorCounter.SKETCH_MERGED] += 1
        first = report.column - report.column % structure.batch
        group = slice(first, first + structure.batch)
        if not runtime.contributors[group].all():
            return Output()
        payload = runtime.aggregate[group].astype("<u4").tobytes()
        runtime.aggregate[group] = 0
        runtime.contributors[group] = False
        return Output(frames=[t.write(t.sender(structure), first * structure.slot_size, payload, report, first)])
