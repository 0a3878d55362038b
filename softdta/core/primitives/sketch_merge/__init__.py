"""Sketch-Merge: reporters' sketch columns merged (sum or max) and written once every reporter gave its share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from softdta.core import workload as generators
from softdta.core.primitives.base import Output, Primitive, built_in
from softdta.core.primitives.sketch_merge.batch import SketchMergePath
from softdta.core.primitives.sketch_merge.demo import SketchMergeDemo
from softdta.core.primitives.sketch_merge.queries import MergedSketch
from softdta.core.primitives.sketch_merge.region import SketchRegion
from softdta.core.regions import Buffer
from softdta.core.settings import TableError
from softdta.core.tables import Shape, Structure
from softdta.spec import MAX_SKETCH_ROWS, MAX_WRITE_PAYLOAD, DtaOpcode, MergeFunction, NackKind, TranslatorCounter
from softdta.wire.dta import Nack, Report
from softdta.wire.frames import UdpFrame


@dataclass
class SketchRuntime:
    aggregate: list[list[int]]
    contributors: list[set[int]]
    next_column: dict[int, int] = field(default_factory=dict)


class SketchMerge(Primitive):
    """State: QP index -> the aggregate columns, who contributed to them, and each reporter's next column."""

    opcode, name, subheader, v1_subheader, has_structure, rx_counter = built_in(DtaOpcode.SKETCH_MERGE)
    bpf_header: ClassVar[str | None] = "sketch.h"
    p4_fragments: ClassVar[tuple[str, ...]] = ("sketch_merge",)
    vector = SketchMergePath
    hashed: ClassVar[bool] = False

    demo = SketchMergeDemo

    @classmethod
    def workload(cls, params: generators.WorkloadParams) -> list[Report]:
        return generators.sketch_epoch(params.reporters, params.columns, params.rows, params.seed)

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

    query = MergedSketch

    @classmethod
    def region(cls, buffer: Buffer, structure: Structure) -> SketchRegion:
        return SketchRegion.for_structure(buffer, structure)

    @classmethod
    def describe(cls, structure: Structure) -> dict[str, Any]:
        return {"columns": structure.columns, "rows": structure.rows, "reporters": structure.reporters,
                "merge": structure.merge.name.lower()}

    def new_state(self) -> dict[int, SketchRuntime]:
        return {}

    def runtime(self, structure: Structure) -> SketchRuntime:
        """The structure's aggregate columns, their contributors and each reporter's next column (made on first use)."""
        runtime: SketchRuntime = self.state.setdefault(structure.qp.index, SketchRuntime(
            [[0] * structure.rows for _ in range(structure.columns)], [set() for _ in range(structure.columns)]))
        return runtime

    def target(self, udp: UdpFrame, report: Report, now_ns: int) -> Structure | Output:
        t = self.translator
        structure = t.tables.structure(udp.dst_ip, self.opcode)
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

