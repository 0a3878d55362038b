"""A reporter's side of the fleet, DTA's way (sans-IO; docs/fleet.md): each report is addressed to the
collector of its partition key's slot in the slot map.

Normally a report goes to the first replica of its slot, as it is. With copies across the replicas, a report of a
primitive that asks for copies (Key-Write, Key-Increment: `Primitive.redundant`) goes to each replica that holds
one of its copies: copy n belongs to replica n mod R (R the slot's replicas), as at a translator that resolves the
fleet address. A report cannot ask a translator for copy n alone, and a collector keeps copy n at the key's slot
hash n; so replica r gets the report with the redundancy that reaches the highest copy it holds (copies 0 up to
that one). Every replica then holds copy n at slot hash n exactly where a translator-side fleet puts it, so one
query path reads both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from softdta.core import registry
from softdta.core.fleet import SlotMap
from softdta.wire.dta import Report
from softdta.wire.frames import ip_bytes
from softdta.wire.hashing import partition_slots_rows


@dataclass(frozen=True)
class Addressed:
    """One report to send, and the collector (IPv4 address, 4 bytes) it goes to."""

    collector: bytes
    report: Report


def address(slot_map: SlotMap, report: Report, *, copies_across: bool = False) -> tuple[Addressed, ...]:
    """Where `report` goes under `slot_map`: its slot's first replica; with `copies_across`, a report that asks
    for copies goes to every replica that holds one of them (see the module's docstring)."""
    primitive = registry.by_opcode(report.opcode)
    owners = [ip_bytes(slot_map.members[name]) for name in slot_map.owners(primitive.partition_key(report))]
    if not (copies_across and primitive.redundant):
        return (Addressed(owners[0], report),)
    copies = report.redundancy
    return tuple(Addressed(collector, replace(report, redundancy=highest_copy(replica, len(owners), copies) + 1))
                 for replica, collector in enumerate(owners[:copies]))


def highest_copy(replica: int, replicas: int, copies: int) -> int:
    """The highest of copies 0..copies-1 that replica `replica` (of `replicas`) holds: the last n = replica mod
    replicas; `replica` < `copies`."""
    return replica + (copies - 1 - replica) // replicas * replicas


def primary_ips(slot_map: SlotMap) -> npt.NDArray[np.uint32]:
    """Each slot's first replica's IP, as a big-endian number, indexed by slot."""
    ip_of = {name: int.from_bytes(ip_bytes(ip), "big") for name, ip in slot_map.members.items()}
    return np.array([ip_of[owners[0]] for owners in slot_map.slots], dtype=np.uint32)


def primary_ips_rows(slot_map: SlotMap, partition_keys: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint32]:
    """`address`'s collector (without copies across) of every row of a (count, width) uint8 array of partition
    keys, as big-endian numbers: one table lookup per key."""
    slots = partition_slots_rows(partition_keys, slot_map.slot_bits)
    ips: npt.NDArray[np.uint32] = primary_ips(slot_map)[slots]
    return ips
