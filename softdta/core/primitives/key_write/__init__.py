"""Key-Write: a key's data, with the key's checksum, into `redundancy` hashed slots of a structure (RDMA WRITE)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, cast

from softdta.core import workload as generators
from softdta.core.primitives.base import (
    Output,
    PluginReport,
    Primitive,
    SnapshotColumns,
    Target,
    TranslatorContext,
    built_in,
)
from softdta.core.primitives.key_write.batch import KeyWritePath
from softdta.core.primitives.key_write.demo import KeyWriteDemo
from softdta.core.primitives.key_write.queries import KeyLookup, key_write_snapshot
from softdta.core.primitives.key_write.region import KeyWriteRegion
from softdta.core.regions import Buffer, Region
from softdta.core.tables import Structure
from softdta.spec import DtaOpcode, TranslatorCounter
from softdta.wire.dta import Report
from softdta.wire.frames import UdpFrame
from softdta.wire.hashing import key_checksum, key_slot


class KeyWrite(Primitive):
    opcode, name, subheader, v1_subheader, has_structure, rx_counter = built_in(DtaOpcode.KEY_WRITE)
    bpf_header: ClassVar[str | None] = "keyed.h"
    p4_header: ClassVar[str | None] = "key_write"
    vector = KeyWritePath
    demo = KeyWriteDemo
    query = KeyLookup
    redundant: ClassVar[bool] = True

    @classmethod
    def workload(cls, params: generators.WorkloadParams) -> list[Report]:
        return generators.key_write(params.count, params.seed, params.redundancy, params.key_len,
                                    params.data_len)

    @classmethod
    def region(cls, buffer: Buffer, structure: Structure) -> KeyWriteRegion:
        return KeyWriteRegion.for_structure(buffer, structure)

    @classmethod
    def describe(cls, structure: Structure) -> dict[str, Any]:
        return {**super().describe(structure), "data_len": structure.data_len}

    @classmethod
    def snapshot(cls, region: Region, structure: Structure, rows: int) -> Iterator[SnapshotColumns]:
        return key_write_snapshot(cast(KeyWriteRegion, region), rows)

    @classmethod
    def p4_problems(cls, structure: Structure, architecture: str, sharing: list[str]) -> list[str]:
        if structure.key_len != 4 or structure.data_len != 4:
            return [f"structure {structure.name}: dta-v1 reports carry 4-byte keys and data"]
        return []

    def target(self, udp: UdpFrame, report: Report, now_ns: int) -> Target | Output:
        t = self.translator
        structure = t.structure(udp, self.opcode, report)
        if isinstance(structure, Output):
            return structure
        if len(report.data) != structure.data_len:
            return t.drop(TranslatorCounter.DROP_BAD_LENGTH)
        if report.redundancy > structure.redundancy:
            return t.drop(TranslatorCounter.DROP_BAD_REDUNDANCY)
        return structure

    def apply(self, udp: UdpFrame, report: Report, target: Structure, now_ns: int) -> Output:
        copies = self.translator.copy_structures(udp, self.opcode, report, target, report.redundancy, now_ns)
        return Output(frames=write_key(self.translator, copies, report.key, report.data, report))


def write_key(t: TranslatorContext, copies: list[Structure | None], key: bytes, data: bytes,
              report: Report | PluginReport | None) -> list[bytes]:
    """Key-Write's frames: checksum ‖ data into the key's slot of each copy n in the structure `copies[n]` (None:
    that copy is not sent)."""
    payload = key_checksum(key).to_bytes(4, "little") + data
    frames = []
    for copy, structure in enumerate(copies):
        if structure is not None:
            offset = key_slot(key, copy, structure.slot_count, structure.key_hash) * structure.slot_size
            frames.append(t.write(t.sender(structure), offset, payload, report, key_checksum(key)))
    return frames
