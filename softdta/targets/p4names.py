"""The names and IDs of the P4 translator's objects: the control-plane tables with their actions, and the data-plane
state registers. codegen writes the P4 sources and the P4Info from them; P4Runtime finds its objects by them.

Every object carries an explicit @name (global, with a leading dot) and @id, so the P4Info a compiler derives
from p4/*.p4 has the names and IDs of the P4Info generated here, whatever the architecture.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from softdta import spec
from softdta.core.control_plane import CONFIG_TABLES
from softdta.spec import Field, Raw

P4_ID_ACTION, P4_ID_TABLE, P4_ID_REGISTER = 0x01, 0x02, 0x16  # p4.config.v1.P4Ids prefixes
P4_MISS_ACTION = "softdta_miss"
# Translator tables without a P4 counterpart, and why.
P4_WITHOUT = {"fanout": "XDP parks frames 2..N for the tc stage; P4 replicates a report with multicast instead",
              "copies": "XDP broadcasts a report's frames to a devmap; P4 replicates a report with multicast",
              "tables_generation": "XDP keeps a copy of the structure a CPU translated for last; P4 looks it up",
              "queue_qp": "XDP translates on every RX queue, each through its own QPs; a P4 pipeline orders the "
                          "PSNs of queue 0's QPs itself"}
# spec.P4_TABLES that P4Runtime writes as packet replication entries, not as P4 tables.
P4_REPLICATION = ("multicast_group",)
# Value fields only the P4 form of a shared table has. A switch looks one structure up per report, so the slot map
# says which replicas hold a structure of each primitive: the first of them is the one to look up.
FLEET_HOLDER_BITS = spec.MAX_REPLICAS  # bits per primitive in has_structure, one per replica
P4_EXTRA_VALUES = {"fleet_slot": (Field("has_structure", 32, f"bit {FLEET_HOLDER_BITS} x opcode + n: replica n "
                                                             "holds a structure of that primitive"),)}


@dataclass(frozen=True)
class P4Register:
    name: str
    table: str  # the spec table whose state it holds
    field: str
    bits: int
    size: int  # elements: the table's capacity, times the 32-bit words of a byte-array field
    id: int
    words: int = 1  # elements per table entry


def p4_id(prefix: int, index: int) -> int:
    return prefix << 24 | index


def p4_control_tables() -> list[spec.Map]:
    """The P4 tables the control plane writes: the shared configuration tables, then the P4-only ones."""
    shared = [replace(t, value=t.value + P4_EXTRA_VALUES.get(name, ())) for name in CONFIG_TABLES
              for t in spec.TRANSLATOR_MAPS if t.name == name and name not in P4_WITHOUT]
    return shared + [t for t in spec.P4_TABLES if t.name not in P4_REPLICATION]


def p4_action_params(table: spec.Map) -> list[Field | Raw]:
    """Parameters of a table's set action: its value fields, without padding."""
    return [f for f in table.value if f.name != "pad"]


def p4_table_id(index: int) -> int:
    return p4_id(P4_ID_TABLE, index + 1)


def p4_action_id(index: int) -> int:
    return p4_id(P4_ID_ACTION, index + 1)


P4_MISS_ACTION_ID = p4_id(P4_ID_ACTION, 0xFFFF)


def p4_registers() -> list[P4Register]:
    """One register per field of each data-plane state table (spin locks and padding have no P4 meaning)."""
    registers: list[P4Register] = []
    for table in spec.TRANSLATOR_MAPS:
        if table.name in CONFIG_TABLES or table.name in P4_WITHOUT:
            continue
        for f in table.value:
            if isinstance(f, spec.SpinLock) or f.name == "pad":
                continue
            bits, words = (32, f.size // 4) if isinstance(f, Raw) else (f.bits, 1)
            registers.append(P4Register(f"{table.name}_{f.name}", table.name, f.name, bits, table.max_entries * words,
                                        p4_id(P4_ID_REGISTER, len(registers) + 1), words))
    return registers
