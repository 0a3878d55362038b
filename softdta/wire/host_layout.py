"""The C layout of a table's key or value in host byte order, as the BPF maps hold it: the members with explicit
padding where natural alignment needs it. codegen declares the structs from it; the map codecs pack by it."""

from __future__ import annotations

from dataclasses import dataclass

from softdta import spec
from softdta.spec import Field, Raw

HOST_INT_TYPES = {8: "__u8", 16: "__u16", 32: "__u32", 64: "__u64"}


@dataclass(frozen=True)
class Member:
    """One C struct member; `bitfields` holds the (field, shift) pairs it groups, counted from its LSB."""

    ctype: str
    name: str
    length: int = 0  # array length, 0 for a scalar
    doc: str = ""
    bitfields: tuple[tuple[Field, int], ...] = ()

    @property
    def declaration(self) -> str:
        return f"{self.ctype} {self.name}" + (f"[{self.length}]" if self.length else "")


def host_members(fields: tuple[Field | Raw, ...]) -> tuple[list[Member], int]:
    """C members of a table key or value in host order, with explicit padding where natural alignment needs it."""
    members: list[Member] = []
    offset, struct_align = 0, 1

    def pad_to(align: int) -> None:
        nonlocal offset
        if offset % align:
            gap = align - offset % align
            members.append(Member("__u8", f"_pad{sum(m.name.startswith('_pad') for m in members)}", gap))
            offset += gap

    for field in fields:
        if isinstance(field, Raw):
            member, size, align = Member("__u8", field.name, field.size, field.doc), field.size, 1
        elif isinstance(field, spec.SpinLock):
            member, size, align = Member("struct bpf_spin_lock", field.name, doc=field.doc), 4, 4
        else:
            size = align = field.bits // 8
            member = Member(HOST_INT_TYPES[field.bits], field.name, doc=field.doc)
        pad_to(align)
        members.append(member)
        offset += size
        struct_align = max(struct_align, align)
    pad_to(struct_align)
    return members, offset
