"""The one registry of primitives. Every layer finds a primitive here, by opcode or by name, or iterates them all,
and asks the primitive's class what it needs: its sub-headers, translation, region layout, queries, planning and
workload (`softdta.core.primitives.base.Primitive`). No layer tests a primitive's opcode or name itself.

The built-in primitives register when `softdta.core` is imported; a plug-in registers with `register(cls)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from softdta.errors import SoftdtaError

if TYPE_CHECKING:
    from softdta.core.primitives.base import Primitive

_by_opcode: dict[int, type[Primitive]] = {}
_by_name: dict[str, type[Primitive]] = {}


class UnknownPrimitive(SoftdtaError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def register(cls: type[Primitive]) -> type[Primitive]:
    """Add a primitive class; its opcode and name must be its own. Returns the class, so it decorates one."""
    for taken in (_by_opcode.get(cls.opcode), _by_name.get(cls.name)):
        if taken is not None and taken is not cls:
            raise ValueError(f"primitive {cls.__name__} ({cls.name!r}, opcode {cls.opcode}) clashes with "
                             f"{taken.__name__} ({taken.name!r}, opcode {taken.opcode}); give it its own of both")
    _by_opcode[cls.opcode] = cls
    _by_name[cls.name] = cls
    return cls


def unregister(cls: type[Primitive]) -> None:
    if _by_opcode.get(cls.opcode) is cls:
        del _by_opcode[cls.opcode], _by_name[cls.name]


def registered() -> tuple[type[Primitive], ...]:
    """Every registered primitive, in the order they registered (the built-ins by opcode first)."""
    return tuple(_by_opcode.values())


def by_opcode(opcode: int) -> type[Primitive]:
    try:
        return _by_opcode[opcode]
    except KeyError:
        raise UnknownPrimitive(f"no primitive has opcode {opcode}; registered: "
                               f"{', '.join(f'{p.name} ({p.opcode})' for p in registered())}") from None


def by_name(name: str) -> type[Primitive]:
    try:
        return _by_name[name]
    except KeyError:
        raise UnknownPrimitive(f"no primitive is called {name!r}; use one of {', '.join(_by_name)}") from None


def structure_kinds() -> dict[str, type[Primitive]]:
    """The primitives whose reports land in a structure (`[[structures]]` of the tables), by name."""
    return {p.name: p for p in registered() if p.has_structure}
