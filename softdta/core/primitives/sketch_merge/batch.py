"""Sketch-Merge's vector path: reports that arrive in sequence merged at once, over the structure's arrays
(`SketchRuntime`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import numpy.typing as npt

from softdta.core.tables import Structure
from softdta.core.vector import Columns, Emitted, Layout, VectorPath, arrival_ranks, report_flags
from softdta.spec import DTA_BASE_EXT, MergeFunction, TranslatorCounter
from softdta.wire.columns import Rows, gather

if TYPE_CHECKING:
    from softdta.core.primitives.sketch_merge import SketchMerge
    from softdta.core.primitives.sketch_merge.state import SketchRuntime


@dataclass
class SketchPiece(Columns):
    """Vector Sketch-Merge rows bound for one structure: positions (ascending), reporters, columns, counters."""

    COLUMNS = ("positions", "reporters", "columns", "counters", "immediate")
    reporters: npt.NDArray[np.int64]
    columns: npt.NDArray[np.int64]
    counters: npt.NDArray[np.uint32]  # (rows, the structure's rows)
    immediate: npt.NDArray[np.bool_]


class SketchMergePath(VectorPath[SketchPiece]):
    def partition_keys(self, rows: Rows, layout: Layout) -> list[tuple[npt.NDArray[np.int64], Rows]]:
        """One sketch per fleet address: every report's partition key is empty (`SketchMerge.partition_key`)."""
        return [(np.arange(len(rows)), np.empty((len(rows), 0), dtype=np.uint8))]

    def decode_structure(self, rows: Rows, positions: npt.NDArray[np.int64], structure: Structure,
                         layout: Layout) -> SketchPiece | None:
        sub = self.primitive.subheader
        if not layout.extended or layout.size != DTA_BASE_EXT.size + sub.size + 4 * structure.rows:
            return None  # Sketch-Merge is extended only; other sizes are the oracle's drops
        take, immediate, sub_at = report_flags(rows, layout)
        take &= gather(rows, sub_at, sub, "rows") == structure.rows
        reporters = gather(rows, sub_at, sub, "reporter").astype(np.int64)
        columns = gather(rows, sub_at, sub, "column").astype(np.int64)
        take &= (reporters < structure.reporters) & (columns < structure.columns)
        rows = rows[take]
        counters_at = sub_at + sub.size
        counters = np.ascontiguousarray(rows[:, counters_at:counters_at + 4 * structure.rows]).view(">u4")
        return SketchPiece(structure, positions[take], reporters[take], columns[take], counters.astype(np.uint32),
                           immediate[take])

    def emit(self, parts: list[SketchPiece], now_ns: int) -> Emitted:
        """The frames of one structure's rows in a segment, merged at once. From the first report the oracle would
        refuse on (not its reporter's next column, or a column its reporter gave again before the column's group was
        written), the rows go through the oracle.

        A report's level is how many writes of its group must come before it: the laps its reporter went round the
        columns before it in the segment, and one more if the reporter gave that column already. A group's write at
        level l holds the reports of that level (level 0: with what the group held), and is sent by the last of
        them once all its columns have every reporter's report of that level; SUM and MAX commute, so the order
        between reporters does not matter."""
        structure = parts[0].structure
        rows = SketchPiece.joined(parts) if len(parts) > 1 else parts[0]
        runtime = cast("SketchMerge", self.primitive).runtime(structure)
        sequence = runtime.next_column[rows.reporters] + arrival_ranks(rows.reporters)
        laps, expected = np.divmod(sequence, structure.columns)
        levels = laps + runtime.contributors[rows.columns, rows.reporters]
        groups = _Groups.of(rows, levels, runtime)
        emitted = Emitted(np.empty(0, dtype=np.int64))
        refused = (rows.columns != expected) | groups.too_early(levels)
        if refused.any():
            kept = int(refused.argmax())
            emitted.resume = int(rows.positions[kept])
            if not kept:
                return emitted
            rows, levels = rows.select(slice(0, kept)), levels[:kept]
            groups = _Groups.of(rows, levels, runtime)
        merged = groups.merged(rows, levels, runtime)
        written = np.flatnonzero(groups.complete)
        if len(written):
            written = written[np.argsort(groups.writer[written])]  # in the order their last reports came
            writers = groups.writer[written]
            emitted.sent = rows.positions[writers]
            first_column = groups.touched[written // groups.depth] * structure.batch
            payloads = merged.reshape(len(groups.touched), groups.depth + 1, -1)[
                written // groups.depth, written % groups.depth]
            qp = self.primitive.translator.sender(structure)
            emitted.runs.append(self.frames.writes(
                qp, np.uint64(qp.base_va) + first_column.astype(np.uint64) * np.uint64(structure.slot_size),
                rows.immediate[writers], first_column.astype(np.uint32),
                payloads.astype("<u4").view(np.uint8).reshape(len(written), -1)))
        groups.store(merged, rows, levels, runtime)
        self.primitive.translator.counters[TranslatorCounter.SKETCH_MERGED] += len(rows.positions)
        self.count(len(rows.positions), len(emitted.sent))
        return emitted


@dataclass
class _Groups:
    """The groups of columns a segment's reports touch (`touched`, ascending), level by level: a cell per group
    and level (place of the group * depth + level), whether the cell is complete (every column of the group has
    every reporter's report of that level, with what the group held at level 0), and the last report in it."""

    structure: Structure
    touched: npt.NDArray[np.int64]
    depth: int
    cells: npt.NDArray[np.int64]  # each report's
    complete: npt.NDArray[np.bool_]
    writer: npt.NDArray[np.int64]  # -1: no report

    @classmethod
    def of(cls, rows: SketchPiece, levels: npt.NDArray[np.int64], runtime: SketchRuntime) -> _Groups:
        structure = rows.structure
        groups = rows.columns // structure.batch
        touched = np.flatnonzero(np.bincount(groups))
        depth = int(levels.max()) + 1
        cells = np.searchsorted(touched, groups) * depth + levels
        given = np.bincount(cells, minlength=len(touched) * depth)
        given[::depth] += runtime.contributors[_columns(touched, structure.batch)].reshape(len(touched), -1).sum(axis=1)
        writer = np.full(len(given), -1, dtype=np.int64)
        np.maximum.at(writer, cells, np.arange(len(cells)))
        return cls(structure, touched, depth, cells, given == structure.batch * structure.reporters, writer)

    def too_early(self, levels: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which reports come before the write of the level below theirs (their reporter gave the column already)."""
        below = np.where(levels > 0, self.cells - 1, self.cells)
        written = self.complete[below] & (self.writer[below] < np.arange(len(levels)))
        too_early: npt.NDArray[np.bool_] = (levels > 0) & ~written
        return too_early

    def merged(self, rows: SketchPiece, levels: npt.NDArray[np.int64],
               runtime: SketchRuntime) -> npt.NDArray[np.uint32]:
        """Each touched group's columns merged level by level, (group, level, column in the group, row), with a
        level of zeros past the last."""
        structure = self.structure
        batch, height = structure.batch, structure.rows
        merged = np.zeros((len(self.touched), self.depth + 1, batch, height), dtype=np.uint32)
        merged[:, 0] = runtime.aggregate[_columns(self.touched, batch)].reshape(len(self.touched), batch, height)
        places = self.cells // self.depth * (self.depth + 1) + levels
        at = (places * batch + rows.columns % batch)[:, None] * height + np.arange(height)
        merge = np.maximum if structure.merge is MergeFunction.MAX else np.add  # uint32: SUM wraps modulo 2^32
        merge.at(merged.reshape(-1), at.reshape(-1), rows.counters.reshape(-1))
        return merged

    def store(self, merged: npt.NDArray[np.uint32], rows: SketchPiece, levels: npt.NDArray[np.int64],
              runtime: SketchRuntime) -> None:
        """The state after the segment: each group's columns as the level after its last write left them, its
        contributors those of that level, and each reporter's next column."""
        structure = self.structure
        writes = self.complete.reshape(len(self.touched), self.depth).sum(axis=1)  # its complete levels come first
        columns = _columns(self.touched, structure.batch)
        runtime.aggregate[columns] = merged[np.arange(len(self.touched)), writes].reshape(-1, structure.rows)
        runtime.contributors[columns.reshape(len(self.touched), -1)[writes > 0]] = False
        waiting = levels == writes[self.cells // self.depth]
        runtime.contributors[rows.columns[waiting], rows.reporters[waiting]] = True
        runtime.next_column[:] = (runtime.next_column + np.bincount(rows.reporters, minlength=structure.reporters)) \
            % structure.columns


def _columns(groups: npt.NDArray[np.int64], batch: int) -> npt.NDArray[np.int64]:
    """The columns of `groups`, group by group."""
    return (groups[:, None] * batch + np.arange(batch)).reshape(-1)
