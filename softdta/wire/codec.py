"""Packers and parsers derived from the header specs in `softdta.spec`.

A `Codec` packs a dict (or keyword arguments) into bytes and unpacks bytes into a dict. Integer fields are
big-endian bit fields, MSB first; `Raw` and `Var` parts are bytes.
"""

from __future__ import annotations

from typing import Any

from softdta.errors import SoftdtaError
from softdta.spec import Header, Raw


class WireError(SoftdtaError, ValueError):
    """Malformed input. `reason` is a short machine-readable tag (a `spec.TranslatorCounter` name without DROP_)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Codec:
    def __init__(self, header: Header):
        self.header = header
        self.size = header.size
        self._int_fields: list[tuple[str, int, int]] = []  # (name, shift, mask) within the fixed part
        self._raw_fields: list[tuple[str, int, int]] = []  # (name, byte offset, size)
        offset_bits = header.size * 8
        for spec_field in header.fields:
            offset_bits -= spec_field.bits
            if isinstance(spec_field, Raw):
                start = header.size - (offset_bits // 8) - spec_field.size
                self._raw_fields.append((spec_field.name, start, spec_field.size))
            else:
                self._int_fields.append((spec_field.name, offset_bits, (1 << spec_field.bits) - 1))
        self.names = tuple(f.name for f in header.fields) + tuple(v.name for v in header.tail)
        self._known = frozenset(self.names)

    def pack(self, values: dict[str, Any] | None = None, **fields: Any) -> bytes:
        if values:
            fields = {**values, **fields}
        unknown = fields.keys() - self._known
        if unknown:
            raise KeyError(f"{self.header.name} has no field(s) {sorted(unknown)}")
        word = 0
        for name, shift, mask in self._int_fields:
            value = int(fields.get(name, 0))
            if value < 0 or value > mask:
                raise ValueError(f"{self.header.name}.{name}={value} does not fit in {mask.bit_length()} bits")
            word |= value << shift
        out = bytearray(word.to_bytes(self.size, "big"))
        for name, start, size in self._raw_fields:
            raw = bytes(fields.get(name, bytes(size)))
            if len(raw) != size:
                raise ValueError(f"{self.header.name}.{name} must be {size} bytes, got {len(raw)}")
            out[start:start + size] = raw
        for var in self.header.tail:
            raw = bytes(fields.get(var.name, b""))
            declared = int(fields.get(var.length_from, 0)) * var.unit
            if len(raw) != declared:
                raise ValueError(f"{self.header.name}.{var.name} is {len(raw)} bytes but "
                                 f"{var.length_from} declares {declared}")
            out += raw
        return bytes(out)

    def unpack(self, buf: bytes | memoryview, offset: int = 0) -> tuple[dict[str, Any], int]:
        """Parse the header at `offset`; return its fields and the offset just past it."""
        end = offset + self.size
        if len(buf) < end:
            raise WireError("TRUNCATED", f"{self.header.name} needs {self.size} bytes at offset {offset}, "
                                         f"packet has {max(0, len(buf) - offset)}")
        chunk = bytes(buf[offset:end])
        word = int.from_bytes(chunk, "big")
        fields: dict[str, Any] = {name: (word >> shift) & mask for name, shift, mask in self._int_fields}
        for name, start, size in self._raw_fields:
            fields[name] = chunk[start:start + size]
        for var in self.header.tail:
            length = fields[var.length_from] * var.unit
            if len(buf) < end + length:
                raise WireError("TRUNCATED", f"{self.header.name}.{var.name} declares {length} bytes, "
                                             f"only {len(buf) - end} remain")
            fields[var.name] = bytes(buf[end:end + length])
            end += length
        return fields, end

    def length_of(self, fields: dict[str, Any]) -> int:
        return self.size + sum(int(fields[v.length_from]) * v.unit for v in self.header.tail)


_CODECS: dict[int, Codec] = {}


def codec(header: Header) -> Codec:
    """The codec of `header`, built once. Memoized by identity: headers are long-lived constants, and hashing a
    frozen dataclass of field tuples on every lookup costs more than packing a small header."""
    found = _CODECS.get(id(header))
    if found is None or found.header is not header:
        found = _CODECS[id(header)] = Codec(header)
    return found

