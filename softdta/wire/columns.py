"""Header fields as columns: gather and scatter one field of a header across every row of a (rows, bytes) uint8
array, at the spec's offsets (sans-IO). The vectorized counterpart of `wire.codec`, for batch translators."""

from __future__ import annotations

from functools import cache

import numpy as np
import numpy.typing as npt

from softdta.spec import Header

Rows = npt.NDArray[np.uint8]
Column = npt.NDArray[np.uint64]


def gather(rows: Rows, at: int, header: Header, name: str) -> Column:
    """Field `name` of the `header` that starts at byte `at` of every row, as unsigned integers."""
    start, bits = _span(header, name)
    first, end = at + start // 8, at + (start + bits + 7) // 8
    width = end - first
    if width in (1, 2, 4, 8):  # the covering bytes as one big-endian word each
        value = np.ascontiguousarray(rows[:, first:end]).view(f">u{width}").reshape(-1).astype(np.uint64)
    else:
        value = np.zeros(rows.shape[0], dtype=np.uint64)
        for byte in range(first, end):
            value = (value << np.uint64(8)) | rows[:, byte]
    unused = width * 8 - start % 8 - bits  # bits after the field in its last byte
    if unused:
        value >>= np.uint64(unused)
    if bits < width * 8:
        value &= np.uint64((1 << bits) - 1)
    return value


def scatter(rows: Rows, at: int, header: Header, name: str, values: npt.ArrayLike) -> None:
    """Write field `name` into every row: a byte-aligned field whole, a field inside one byte by its bits."""
    start, bits = _span(header, name)
    column = np.asarray(values, dtype=np.uint64)
    if start % 8 == 0 and bits % 8 == 0:
        for index in range(bits // 8):
            rows[:, at + start // 8 + index] = (column >> np.uint64(bits - 8 * (index + 1))) & np.uint64(0xFF)
        return
    if start // 8 != (start + bits - 1) // 8:
        raise ValueError(f"{header.name}.{name} spans bytes without being byte-aligned")
    shift = 8 - (start % 8) - bits
    mask = ((1 << bits) - 1) << shift
    byte = at + start // 8
    rows[:, byte] = (rows[:, byte] & np.uint8(~mask & 0xFF)) | ((column << np.uint64(shift)) & np.uint64(mask))


def byte_offset(header: Header, name: str) -> int:
    """Offset in bytes of a byte-aligned field from the header's start."""
    start, _ = header.span(name)
    if start % 8:
        raise ValueError(f"{header.name}.{name} is not byte-aligned")
    return start // 8


@cache
def _span(header: Header, name: str) -> tuple[int, int]:
    return header.span(name)
