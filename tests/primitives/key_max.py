"""Key-Max: keep the largest value reported per key, with plain RDMA WRITEs (no Fetch&Add).

A test-tree primitive that shows what adding one takes (docs/primitives.md, "Adding a primitive"): this module
and nothing else. The translator remembers the largest value it wrote for each slot and writes a key's slot,
checksum ‖ value, only when a report raises it (or the key takes over the slot). The collector's slots hold what
Key-Write's do, so the collector reads them with Key-Write's view and lookup.
"""

from __future__ import annotations

from typing import Any, ClassVar

from softdta.core import registry
from softdta.core.primitives import Output, PluginReport, Primitive, Target
from softdta.core.primitives.key_write.queries import KeyLookup
from softdta.core.primitives.key_write.region import KeyWriteRegion
from softdta.core.regions import Buffer
from softdta.core.tables import Structure
from softdta.spec import MAX_KEY_LEN, Field, Header, TranslatorCounter, Var
from softdta.wire.frames import UdpFrame
from softdta.wire.hashing import key_checksum, key_slot

KEY_MAX_EXT = Header("key_max_ext", (Field("key_len", 8), Field("value", 32)),
                     "Key-Max: a key and a value; the collector keeps each key's largest", (Var("key", "key_len"),))


class KeyMax(Primitive):
    """State: QP index -> slot -> (key checksum, the value written there)."""

    opcode, name, subheader = 0x30, "key-max", KEY_MAX_EXT
    query: ClassVar[type[KeyLookup]] = KeyLookup

    @classmethod
    def report(cls, key: bytes, value: int) -> bytes:
        return cls.encode({"key_len": len(key), "key": key, "value": value})

    @classmethod
    def region(cls, buffer: Buffer, structure: Structure) -> KeyWriteRegion:
        return KeyWriteRegion.for_structure(buffer, structure)

    def new_state(self) -> dict[int, dict[int, tuple[int, int]]]:
        return {}

    def target(self, udp: UdpFrame, report: PluginReport, now_ns: int) -> Target | Output:
        key = report.fields["key"]
        if not 1 <= len(key) <= MAX_KEY_LEN:
            return self.translator.drop(TranslatorCounter.DROP_BAD_LENGTH)
        return self.translator.structure(udp, self.opcode, report, key=key)

    def apply(self, udp: UdpFrame, report: PluginReport, target: Any, now_ns: int) -> Output:
        t, structure, key, value = self.translator, target, report.fields["key"], report.fields["value"]
        slot = key_slot(key, 0, structure.slot_count, structure.key_hash)
        written = self.state.setdefault(structure.qp.index, {})
        checksum, held = key_checksum(key), written.get(slot)
        if held is not None and held[0] == checksum and held[1] >= value:
            return Output()  # not above the key's maximum: nothing to write
        written[slot] = (checksum, value)
        payload = checksum.to_bytes(4, "little") + value.to_bytes(structure.data_len, "big")
        return Output(frames=[t.write(t.sender(structure), slot * structure.slot_size, payload, report, checksum)])


def register() -> type[Primitive]:
    return registry.register(KeyMax)
