"""Collector memory as numpy views over any buffer (bytearray, numpy, mmap): what every primitive's region view
shares. Each primitive lays out its own structure (`Primitive.region`, in its package's `region.py`; the bytes
are in docs/protocol.md)."""

from __future__ import annotations

import mmap
from typing import Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

# Collector memory as `np.frombuffer` takes it.
Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap | np.ndarray


def byte_view(buffer: Buffer) -> npt.NDArray[np.uint8]:
    return np.frombuffer(buffer, dtype=np.uint8)


class Region(Protocol):
    """A view of one structure's collector memory, as its primitive's `region` makes it."""

    def occupied(self) -> npt.NDArray[np.bool_]:
        """One bool per slot (a Sketch-Merge slot is a column): whether anything was written there. The query
        service's fill and load factor (`/structures`, `/stats`, `/metrics`) count them."""
        ...
