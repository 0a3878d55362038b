"""Byte layouts of the maps shared with BPF programs (map keys and values) and of the records they exchange,
derived from `spec.MAPS` and `spec.RECORDS`.

The C structs in bpf/include/softdta_spec.h come from the same `codegen.host_members`, so the two cannot drift.
"""

from __future__ import annotations

import struct
from functools import cache
from typing import Any

from softdta.spec import MAPS, RECORDS, Field, Map, Raw
from softdta.wire.host_layout import host_members

_INT_FORMATS = {"__u8": "B", "__u16": "H", "__u32": "I", "__u64": "Q"}


class Layout:
    """Pack and unpack one map key or value (host byte order, explicit padding)."""

    def __init__(self, fields: tuple[Field | Raw, ...]):
        members, size = host_members(fields)
        formats, self.names = ["="], []
        self.offsets: dict[str, int] = {}  # where each member starts: for maps userspace reads as memory
        for member in members:
            self.offsets[member.name] = struct.calcsize("".join(formats))
            if member.name.startswith("_pad"):
                formats.append(f"{member.length}x")
            elif member.length:
                formats.append(f"{member.length}s")
                self.names.append(member.name)
            elif member.ctype == "struct bpf_spin_lock":
                formats.append("4x")  # the kernel owns it: never written from userspace
            else:
                formats.append(_INT_FORMATS[member.ctype])
                self.names.append(member.name)
        self.struct = struct.Struct("".join(formats))
        if self.struct.size != size:
            raise AssertionError(f"layout of {[f.name for f in fields]} is {self.struct.size} B, C says {size}")
        self.size = size
        self._defaults = dict(zip(self.names, self.struct.unpack(bytes(size))))

    def pack(self, **values: int | bytes) -> bytes:
        unknown = set(values) - set(self.names)
        if unknown:
            raise KeyError(f"unknown fields {sorted(unknown)}; known: {self.names}")
        return self.struct.pack(*(values.get(name, default) for name, default in self._defaults.items()))

    def unpack(self, data: bytes) -> dict[str, Any]:
        """Each member by name: an int, or bytes for an array member (which members depends on the spec)."""
        return dict(zip(self.names, self.struct.unpack(data)))


class MapLayout:
    def __init__(self, spec: Map):
        self.spec = spec
        self.key = Layout(spec.key)
        self.value = Layout(spec.value)


@cache
def map_layout(name: str) -> MapLayout:
    for entry in MAPS:
        if entry.name == name:
            return MapLayout(entry)
    raise KeyError(f"no map named {name!r} in spec.MAPS")


@cache
def record(name: str) -> Layout:
    for entry in RECORDS:
        if entry.name == name:
            return Layout(entry.fields)
    raise KeyError(f"no record named {name!r} in spec.RECORDS")
