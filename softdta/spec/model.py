"""The vocabulary of the spec: header fields, headers, tables and records."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    """An unsigned big-endian integer field of `bits` bits (bit fields are packed MSB first). An `icrc_variant`
    field may change in flight, so the RoCEv2 iCRC covers it as all ones (IBTA Annex A17)."""

    name: str
    bits: int
    doc: str = ""
    icrc_variant: bool = False


@dataclass(frozen=True)
class SpinLock(Field):
    """A `struct bpf_spin_lock` in a table value: the data path and the flusher run on different CPUs."""

    bits: int = 32


@dataclass(frozen=True)
class Raw:
    """A fixed number of opaque bytes, copied as they are (keys and data)."""

    name: str
    size: int
    doc: str = ""

    @property
    def bits(self) -> int:
        return self.size * 8


@dataclass(frozen=True)
class Var:
    """Trailing bytes whose length is `unit` times the value of the integer field `length_from`."""

    name: str
    length_from: str
    unit: int = 1
    doc: str = ""


@dataclass(frozen=True)
class Header:
    """A wire header: a fixed part of `Field`/`Raw` entries, optionally followed by `Var` parts."""

    name: str
    fields: tuple[Field | Raw, ...]
    doc: str
    tail: tuple[Var, ...] = ()

    def __post_init__(self) -> None:
        bits = sum(f.bits for f in self.fields)
        if bits % 8:
            raise ValueError(f"header {self.name} is {bits} bits, not a whole number of bytes")
        names = {f.name for f in self.fields}
        for var in self.tail:
            if var.length_from not in names:
                raise ValueError(f"{self.name}.{var.name} takes its length from unknown field {var.length_from}")

    @property
    def size(self) -> int:
        """Size of the fixed part in bytes."""
        return sum(f.bits for f in self.fields) // 8

    def span(self, name: str) -> tuple[int, int]:
        """(bit offset from the header's start, bits) of the fixed-part field `name`."""
        offset = 0
        for f in self.fields:
            if f.name == name:
                return offset, f.bits
            offset += f.bits
        raise KeyError(f"header {self.name} has no field {name!r}")


@dataclass(frozen=True)
class Map:
    name: str
    key: tuple[Field | Raw, ...]
    value: tuple[Field | Raw, ...]
    max_entries: int
    doc: str


@dataclass(frozen=True)
class Record:
    name: str
    fields: tuple[Field | Raw, ...]
    doc: str
