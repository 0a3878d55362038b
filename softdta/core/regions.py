"""Collector memory layouts of each primitive, as numpy views over any buffer (bytearray, numpy, mmap).

The layouts are what the translator writes (see docs/protocol.md):
  * Key-Write: slots of `slot_size` bytes: key checksum (u32, little-endian) then the data as reported;
  * Key-Increment: u64 counters in the collector's byte order (little-endian, as Fetch&Add leaves them);
  * Postcarding: slots of `slot_size` bytes, one big-endian u32 per hop (value XOR per-hop checksum);
  * Append: per list, a ring of `entries` entries; 4- and 8-byte entries little-endian;
  * Sketch-Merge: column-major ("rotated"): column c is `rows` little-endian u32 at c * rows * 4.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from softdta.core.tables import AppendLists, Structure
from softdta.spec import KEY_CHECKSUM_LEN

# Collector memory as `np.frombuffer` takes it.
Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap | np.ndarray


def byte_view(buffer: Buffer) -> npt.NDArray[np.uint8]:
    return np.frombuffer(buffer, dtype=np.uint8)


@dataclass
class KeyWriteRegion:
    buffer: Buffer
    slot_size: int
    data_len: int = 4

    def __post_init__(self) -> None:
        raw = byte_view(self.buffer)
        self.slot_count = raw.size // self.slot_size
        slots = raw[:self.slot_count * self.slot_size].reshape(self.slot_count, self.slot_size)
        self.checksums = slots[:, :KEY_CHECKSUM_LEN].view("<u4").reshape(self.slot_count)
        self.data = slots[:, KEY_CHECKSUM_LEN:KEY_CHECKSUM_LEN + self.data_len]

    @classmethod
    def for_structure(cls, buffer: Buffer, structure: Structure) -> "KeyWriteRegion":
        return cls(buffer, structure.slot_size, structure.data_len)


@dataclass
class KeyIncrementRegion:
    """Key-Increment counters."""

    buffer: Buffer

    def __post_init__(self) -> None:
        raw = byte_view(self.buffer)
        self.counters = raw[:raw.size // 8 * 8].view("<u8")
        self.slot_count = self.counters.size


@dataclass
class PostcardRegion:
    buffer: Buffer
    slot_size: int
    hops: int

    def __post_init__(self) -> None:
        raw = byte_view(self.buffer)
        self.slot_count = raw.size // self.slot_size
        slots = raw[:self.slot_count * self.slot_size].reshape(self.slot_count, self.slot_size)
        self.values = slots[:, :4 * self.hops].view(">u4")

    @classmethod
    def for_structure(cls, buffer: Buffer, structure: Structure) -> "PostcardRegion":
        return cls(buffer, structure.slot_size, structure.hops)


@dataclass
class AppendRegion:
    """All rings of one `AppendLists` range; `ring(list_id)` is one list's (entries,) or (entries, size) view."""

    buffer: Buffer
    lists: AppendLists

    def __post_init__(self) -> None:
        raw = byte_view(self.buffer)
        size = self.lists.lists * self.lists.entries * self.lists.data_len
        entries = raw[:size].reshape(self.lists.lists, self.lists.entries, self.lists.data_len)
        dtype = {4: "<u4", 8: "<u8"}.get(self.lists.data_len)
        self.rings = entries.view(dtype).reshape(self.lists.lists, self.lists.entries) if dtype else entries

    def ring(self, list_id: int) -> np.ndarray:
        ring: np.ndarray = self.rings[list_id - self.lists.first_list]
        return ring


@dataclass
class SketchRegion:
    buffer: Buffer
    columns: int
    rows: int

    def __post_init__(self) -> None:
        raw = byte_view(self.buffer)
        self.by_column = raw[:self.columns * self.rows * 4].view("<u4").reshape(self.columns, self.rows)

    @classmethod
    def for_structure(cls, buffer: Buffer, structure: Structure) -> "SketchRegion":
        return cls(buffer, structure.columns, structure.rows)

    def matrix(self) -> np.ndarray:
        """The merged sketch as (rows, columns), undoing the rotated layout."""
        return self.by_column.T.copy()
