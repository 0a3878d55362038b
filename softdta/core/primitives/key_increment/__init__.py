"""Key-Increment: a key's counter added into `redundancy` hashed u64 slots of a structure (RDMA Fetch&Add, RC)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, cast

from softdta.core import workload as generators
from softdta.core.primitives.base import Output, Primitive, SnapshotColumns, Target, built_in
from softdta.core.primitives.key_increment.batch import KeyIncrementPath
from softdta.core.primitives.key_increment.demo import KeyIncrementDemo
from softdta.core.primitives.key_increment.queries import CountLookup, key_increment_snapshot
from softdta.core.primitives.key_increment.region import KeyIncrementRegion
from softdta.core.regions import Buffer, Region
from softdta.core.settings import TableError
from softdta.core.tables import Shape, Structure
from softdta.spec import DtaOpcode, RoceOpcode, TranslatorCounter, Transport
from softdta.wire.dta import Report
from softdta.wire.frames import UdpFrame
from softdta.wire.hashing import key_slot


class KeyIncrement(Primitive):
    opcode, name, subheader, v1_subheader, has_structure, rx_counter = built_in(DtaOpcode.KEY_INCREMENT)
    atomics: ClassVar[bool] = True
    redundant: ClassVar[bool] = True
    default_transport: ClassVar[Transport] = Transport.RC
    bpf_header: ClassVar[str | None] = "keyed.h"
    p4_header: ClassVar[str | None] = "key_increment"
    vector = KeyIncrementPath
    demo = KeyIncrementDemo
    query = CountLookup

    @classmethod
    def workload(cls, params: generators.WorkloadParams) -> list[Report]:
        return generators.key_increment(params.count, params.seed, params.redundancy, params.flows)

    @classmethod
    def slot_size(cls, structure: Shape) -> int:
        return 8

    @classmethod
    def write_lengths(cls, structure: Structure) -> tuple[int, ...]:
        return ()  # Fetch&Add only

    @classmethod
    def check_structure(cls, structure: Structure, where: str) -> None:
        if structure.qp.transport is not Transport.RC:
            raise TableError(f"{where}: Key-Increment uses Fetch&Add, which needs an RC queue pair "
                             "(set transport = \"rc\")")
        if structure.qp.base_va % 8:
            raise TableError(f"{where}: atomics need an 8-byte aligned region; base 0x{structure.qp.base_va:x}")
        super().check_structure(structure, where)

    @classmethod
    def region(cls, buffer: Buffer, structure: Structure) -> KeyIncrementRegion:
        return KeyIncrementRegion(buffer)

    @classmethod
    def snapshot(cls, region: Region, structure: Structure, rows: int) -> Iterator[SnapshotColumns]:
        return key_increment_snapshot(cast(KeyIncrementRegion, region), rows)

    def target(self, udp: UdpFrame, report: Report, now_ns: int) -> Target | Output:
        structure = self.translator.structure(udp, self.opcode, report)
        if not isinstance(structure, Output) and report.redundancy > structure.redundancy:
            return self.translator.drop(TranslatorCounter.DROP_BAD_REDUNDANCY)
        return structure

    def apply(self, udp: UdpFrame, report: Report, target: Structure, now_ns: int) -> Output:
        t = self.translator
        out = Output()
        for copy, structure in enumerate(t.copy_structures(udp, self.opcode, report, target, report.redundancy,
                                                           now_ns)):
            if structure is None:
                continue
            qp = t.sender(structure)
            offset = key_slot(report.key, copy, structure.slot_count, structure.key_hash) * structure.slot_size
            atomic = {"va": qp.base_va + offset, "rkey": qp.rkey, "swap_add": report.counter, "compare": 0}
            out.frames.append(t.emit(qp, RoceOpcode.RC_FETCH_ADD, {"atomic_eth": atomic}, b""))
        return out
