"""Sketch-Merge's vector path: reports that arrive in sequence merged at once, a lap of the columns at a time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import numpy.typing as npt

from softdta.core.tables import Structure
from softdta.core.vector import Columns, Emitted, Layout, VectorPath, ranks, report_flags
from softdta.spec import DTA_BASE_EXT, MergeFunction, TranslatorCounter
from softdta.wire.columns import Rows, gather

if TYPE_CHECKING:
    from softdta.core.primitives.sketch_merge import SketchMerge, SketchRuntime


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
        """The frames of one structure's rows in a segment, a lap of the columns at a time (a lap ends where a
        reporter starts its columns again). From a lap that is not in sequence on, the rows go through the oracle."""
        structure = parts[0].structure
        rows = SketchPiece.joined(parts) if len(parts) > 1 else parts[0]
        runtime = cast("SketchMerge", self.primitive).runtime(structure)
        by_reporter, reporters, counts, first = _reporter_runs(rows, runtime)
        restarts = ((np.repeat(first, counts) + ranks(counts)) % structure.columns == 0) & (ranks(counts) > 0)
        laps = np.searchsorted(rows.positions, np.unique(rows.positions[by_reporter][restarts]))
        emitted = Emitted(np.empty(0, dtype=np.int64))
        sent: list[npt.NDArray[np.int64]] = []
        for low, high in zip([0, *laps.tolist()], [*laps.tolist(), len(rows.positions)]):
            lap = rows.select(slice(low, high))
            lap_sent = self._merge_lap(lap, runtime, emitted)
            if lap_sent is None:
                emitted.resume = int(lap.positions[0])
                break
            sent.append(lap_sent)
        emitted.sent = np.concatenate([emitted.sent, *sent])
        return emitted

    def _merge_lap(self, rows: SketchPiece, runtime: SketchRuntime, emitted: Emitted) -> npt.NDArray[np.int64] | None:
        """Merges and writes one lap of rows, or returns None (and does nothing) unless every report is its
        reporter's next column and none repeats a column its reporter already gave.

        Then every report is accepted, whatever the order between reporters: SUM and MAX commute, and a group of
        columns written (all reporters in all its columns) gets no more reports in the lap, since each of them
        would repeat a column. The report that completes a group is its last one in the lap. Returns the batch
        position of each frame sent (ascending)."""
        structure = rows.structure
        by_reporter, reporters, counts, first = _reporter_runs(rows, runtime)
        if (counts > structure.columns).any() or (
                rows.columns[by_reporter] != (np.repeat(first, counts) + ranks(counts)) % structure.columns).any():
            return None
        # the columns of every group the lap touches, as arrays
        batch = structure.batch
        groups = np.unique(rows.columns // batch)
        columns = (groups[:, None] * batch + np.arange(batch)).reshape(-1)
        given = np.zeros((len(columns), structure.reporters), dtype=bool)
        for row, column in enumerate(columns.tolist()):
            given[row, list(runtime.contributors[column])] = True
        at = np.searchsorted(columns, rows.columns)  # each report's row among `columns`
        if given[at, rows.reporters].any():
            return None
        given[at, rows.reporters] = True
        aggregate = np.array([runtime.aggregate[column] for column in columns.tolist()], dtype=np.int64)
        if structure.merge is MergeFunction.MAX:
            np.maximum.at(aggregate, at, rows.counters.astype(np.int64))
        else:
            np.add.at(aggregate, at, rows.counters.astype(np.int64))
            aggregate &= 0xFFFFFFFF
        complete = given.reshape(len(groups), -1).all(axis=1)
        group_of = at // batch  # each report's group among `groups`
        last = np.full(len(groups), -1, dtype=np.int64)
        np.maximum.at(last, group_of, np.arange(len(rows.positions)))
        sent: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
        if complete.any():
            done = np.flatnonzero(complete)  # ascending groups; the frames go in the order of their last reports
            order = np.argsort(rows.positions[last[done]])
            done, writer = done[order], last[done][order]
            sent = rows.positions[writer]
            qp = self.primitive.translator.sender(structure)
            first_column = groups[done] * batch
            payloads = aggregate.reshape(len(groups), -1)[done].astype("<u4").view(np.uint8).reshape(len(done), -1)
            emitted.runs.append(self.frames.writes(
                qp, np.uint64(qp.base_va) + first_column.astype(np.uint64) * np.uint64(structure.slot_size),
                rows.immediate[writer], first_column.astype(np.uint32), payloads))
            wiped = (done[:, None] * batch + np.arange(batch)).reshape(-1)
            aggregate[wiped] = 0
            given[wiped] = False
        for row, column in enumerate(columns.tolist()):
            runtime.aggregate[column] = aggregate[row].tolist()
            runtime.contributors[column] = set(np.flatnonzero(given[row]).tolist())
        ends = np.cumsum(counts) - 1  # each reporter's last report, in reporter order
        for reporter, column in zip(reporters.tolist(), rows.columns[by_reporter][ends].tolist()):
            runtime.next_column[reporter] = (column + 1) % structure.columns
        self.primitive.translator.counters[TranslatorCounter.SKETCH_MERGED] += len(rows.positions)
        self.count(len(rows.positions), len(sent))
        return sent


def _reporter_runs(rows: SketchPiece, runtime: SketchRuntime) -> tuple[npt.NDArray[np.int64], ...]:
    """The rows reporter by reporter (each in batch order), the reporters, their counts of rows, and the column
    each reporter is to send next."""
    reporters, counts = np.unique(rows.reporters, return_counts=True)
    first = np.fromiter((runtime.next_column.get(reporter, 0) for reporter in reporters.tolist()), dtype=np.int64,
                        count=len(reporters))
    return np.lexsort((rows.positions, rows.reporters)), reporters, counts, first
