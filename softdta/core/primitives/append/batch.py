"""Append's vector path: each report's entry finds its place in its list's batches by its rank among the segment's
reports to that list, and every batch filled is written at once. A list is written through the range that holds
it, or with a fleet, the range of the first replica of the list's slot that holds it (`Tables.append_range`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from softdta.core.primitives.append.state import AppendRuntime
from softdta.core.tables import AppendLists, Tables
from softdta.core.vector import Emitted, FleetMap, Layout, Target, VectorPath, fleet_map, ranks, report_flags
from softdta.spec import APPEND_EXT, DTA_BASE_EXT, MAX_REPLICAS, TranslatorCounter
from softdta.wire.columns import Rows, byte_offset, gather
from softdta.wire.hashing import partition_slots_rows


@dataclass
class AppendPiece:
    """Vector Append rows of one layout bound for one range of lists: positions (ascending), list ids, and
    each report's entry as stored (`append._append_entry`)."""

    lists: AppendLists
    positions: npt.NDArray[np.int64]
    list_ids: npt.NDArray[np.int64]
    immediate: npt.NDArray[np.bool_]
    entries: Rows

    copied = False

    @property
    def target(self) -> AppendLists:
        return self.lists

    def cut(self, low: int, high: int) -> AppendPiece:
        return AppendPiece(self.lists, self.positions[low:high], self.list_ids[low:high],
                           self.immediate[low:high], self.entries[low:high])


class AppendPath(VectorPath[AppendPiece]):
    by_destination: ClassVar[bool] = False  # a report's list, not its destination, names its target

    def targets(self, tables: Tables) -> Sequence[Target]:
        return tables.append_lists

    def decode(self, rows: Rows, positions: npt.NDArray[np.int64], layout: Layout,
               writable: Callable[[Target], bool]) -> list[AppendPiece]:
        """The rows of one layout that the vector path takes, a piece per range of lists."""
        if layout.extended:
            sub = self.primitive.subheader
            width = layout.size - DTA_BASE_EXT.size - APPEND_EXT.size
            if width < 1:
                return []  # too short: the oracle's drop
            take, immediate, sub_at = report_flags(rows, layout)
            take &= gather(rows, sub_at, sub, "data_len") == width
            data_at = sub_at + sub.size
        else:
            width = 4  # dta-v1 data is 32 bits
            v1 = self.primitive.v1_subheader
            if v1 is None or layout.size != layout.base.size + v1.size:
                return []
            sub = v1
            take, immediate, sub_at = report_flags(rows, layout)
            data_at = sub_at + byte_offset(sub, "data")
        list_ids = gather(rows, sub_at, sub, "list_id").astype(np.int64)
        owners = self._owners(list_ids)
        pieces = []
        for owner, lists in enumerate(self.tables.append_lists):
            if not writable(lists):
                continue
            mine = take & (owners == owner)
            if lists.data_len != width or not mine.any():
                continue  # another length than the list's is the oracle's drop
            data = rows[mine, data_at:data_at + width]
            # as stored: integers of 4 or 8 bytes little-endian (append._append_entry)
            entries = np.ascontiguousarray(data[:, ::-1] if width in (4, 8) else data)
            pieces.append(AppendPiece(lists, positions[mine], list_ids[mine], immediate[mine], entries))
        return pieces

    def _owners(self, list_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The range each list is written through (`Tables.append_range`), as an index into the tables' ranges;
        -1 for none."""
        tables = self.tables
        owners = np.full(len(list_ids), -1, dtype=np.int64)
        holds = [(list_ids >= lists.first_list) & (list_ids < lists.first_list + lists.lists)
                 for lists in tables.append_lists]
        if tables.fleet is None:  # ranges do not overlap
            for owner, held in enumerate(holds):
                owners[held] = owner
            return owners
        slots: FleetMap = fleet_map(self.fleet_maps, tables, tables.fleet, self.primitive.opcode)
        keys = np.ascontiguousarray(list_ids.astype(">u4")).view(np.uint8).reshape(-1, 4)
        addresses = slots.addresses[partition_slots_rows(keys, tables.fleet.slot_bits)]
        collectors = [int.from_bytes(lists.qp.collector_ip, "big") for lists in tables.append_lists]
        for replica in range(MAX_REPLICAS):  # the first replica that holds the list
            for owner, (held, collector) in enumerate(zip(holds, collectors)):
                owners[(owners < 0) & held & (addresses[:, replica] == collector)] = owner
        return owners

    def emit(self, parts: list[AppendPiece], now_ns: int) -> Emitted:
        """The frames of one range's rows in a segment: a report that fills its list's batch writes the batch.
        The reports that begin a batch add flush queue entries."""
        lists = parts[0].lists
        positions, list_ids, immediate, entries = (
            np.concatenate(column) if len(parts) > 1 else column[0]
            for column in zip(*((p.positions, p.list_ids, p.immediate, p.entries) for p in parts)))
        # list by list, each in batch order
        by_list = np.lexsort((positions, list_ids)) if len(parts) > 1 else np.argsort(list_ids, kind="stable")
        positions, list_ids, immediate, entries = (
            column[by_list] for column in (positions, list_ids, immediate, entries))
        ids, counts = np.unique(list_ids, return_counts=True)
        state: dict[int, AppendRuntime] = self.primitive.state
        runtimes = [state.setdefault(list_id, AppendRuntime()) for list_id in ids.tolist()]
        waited = np.fromiter((len(runtime.pending) for runtime in runtimes), dtype=np.int64, count=len(runtimes))
        group = np.repeat(np.arange(len(ids)), counts)
        place = waited[group] + ranks(counts)  # each report's entry's place in its list's run of entries
        batch, width = lists.batch, lists.data_len
        fills = (place + 1) % batch == 0

        # each list's run: the entries that waited, then this segment's; whole batches of it are written
        run_length = waited + counts
        run_at = np.cumsum(run_length) - run_length
        run = np.empty((int(run_length.sum()), width), dtype=np.uint8)
        run[run_at[group] + place] = entries
        if waited.any():
            old = np.frombuffer(b"".join(b"".join(runtime.pending) for runtime in runtimes), dtype=np.uint8)
            run[np.repeat(run_at, waited) + ranks(waited)] = old.reshape(-1, width)
        written = run_length // batch * batch
        leaves = ranks(run_length) < np.repeat(written, run_length)

        order = np.argsort(positions[fills], kind="stable")  # the filling reports, from list order to batch order
        sent_at: npt.NDArray[np.int64] = positions[fills][order]
        filled_group = group[fills][order]
        lap = place[fills][order] // batch  # which batch of its list's run
        heads = np.fromiter((runtime.head for runtime in runtimes), dtype=np.int64, count=len(runtimes))
        head = (heads[filled_group] + lap * batch) % lists.entries
        offsets = ((ids[filled_group] - lists.first_list) * lists.entries + head) * width
        qp = self.primitive.translator.sender(lists)
        payloads = run[leaves].reshape(-1, batch * width)[order]
        frames = self.frames.writes(qp, np.uint64(qp.base_va) + offsets.astype(np.uint64), immediate[fills][order],
                                    ids[filled_group].astype(np.uint32), payloads)

        rest = run[~leaves].tobytes()
        cursor = 0
        for runtime, left, laps in zip(runtimes, (run_length - written).tolist(), (written // batch).tolist()):
            runtime.pending = [rest[at:at + width] for at in range(cursor, cursor + left * width, width)]
            runtime.head = (runtime.head + laps * batch) % lists.entries
            cursor += left * width
        begins = place % batch == 0
        self.primitive.translator.counters[TranslatorCounter.APPEND_BATCHED] += len(positions) - len(sent_at)
        self.count(len(positions), len(sent_at))
        return Emitted(sent_at, [frames], [(position, list_id, None) for position, list_id in
                                           zip(positions[begins].tolist(), list_ids[begins].tolist())])

    def queued(self, index: int, target: Target | None, token: int, now_ns: int) -> None:
        """The list's batch begun in the segment (the one that waits now, the last begun there) is named by it."""
        runtime: AppendRuntime = self.primitive.state[index]
        runtime.first_pending_ns, runtime.token = now_ns, token
