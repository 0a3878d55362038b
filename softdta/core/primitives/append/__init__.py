"""Append: entries gathered into batches and written to the next place of a list's ring (RDMA WRITE)."""

from __future__ import annotations

from typing import Any, ClassVar

from softdta.core import workload as generators
from softdta.core.primitives.append.batch import AppendPath
from softdta.core.primitives.append.demo import AppendDemo
from softdta.core.primitives.append.state import AppendRuntime as AppendRuntime  # its state, re-exported
from softdta.core.primitives.base import Output, Primitive, Target, built_in
from softdta.core.tables import AppendLists, Tables
from softdta.spec import DtaOpcode, TranslatorCounter
from softdta.wire.dta import Report
from softdta.wire.frames import UdpFrame


class Append(Primitive):
    """State: list id -> its batch and ring head."""

    opcode, name, subheader, v1_subheader, has_structure, rx_counter = built_in(DtaOpcode.APPEND)
    bpf_header: ClassVar[str | None] = "append.h"
    p4_header: ClassVar[str | None] = "append"
    vector = AppendPath
    demo = AppendDemo

    @classmethod
    def workload(cls, params: generators.WorkloadParams) -> list[Report]:
        return generators.append(params.count, params.seed, params.lists, params.first_list)

    def new_state(self) -> dict[int, AppendRuntime]:
        return {}

    partitioned_by: ClassVar[str] = "list id"

    @classmethod
    def partition_key(cls, report: Any) -> bytes:
        return int(report.list_id).to_bytes(4, "big")

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
            runtime.token = t.flush_later(self, now_ns, report.list_id, None)
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

    def flush_target(self, index: int, target: Target | None) -> Target | None:
        return self.translator.tables.append_range(index)

    def retabled(self, old: Tables) -> None:
        """A list that a fleet's new epoch moved to another collector goes on in that collector's ring where it left
        it (at its first entry if it never wrote there); what waits in its batch goes there."""
        new = self.translator.tables
        for list_id, runtime in self.state.items():
            before, after = old.append_range(list_id), new.append_range(list_id)
            if before is None or after is None:
                continue
            left, joined = (before.qp.collector_ip, before.qp.rkey), (after.qp.collector_ip, after.qp.rkey)
            if left != joined:
                runtime.parked[left] = runtime.head
                runtime.head = runtime.parked.pop(joined, 0)

    def pending(self, token: int, index: int, target: Target) -> AppendRuntime | None:
        runtime: AppendRuntime | None = self.state.get(index)
        return runtime if runtime and runtime.pending and runtime.token == token else None

    def flush(self, target: Target, index: int, pending: AppendRuntime) -> list[bytes]:
        """A partial batch, padded with zero entries, written where the full batch would go."""
        assert isinstance(target, AppendLists)
        pending.pending += [bytes(target.data_len)] * (target.batch - len(pending.pending))
        self.translator.counters[TranslatorCounter.APPEND_FLUSHES] += 1
        return self.write_batch(target, index, pending, None)


def _append_entry(data: bytes) -> bytes:
    """Append entries of 4 or 8 bytes are integers and stored little-endian (host order); others verbatim."""
    return data[::-1] if len(data) in (4, 8) else data

