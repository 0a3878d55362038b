"""Postcarding's collector region: slots of `slot_size` bytes, one big-endian u32 per hop (the hop's value XOR its
per-hop checksum)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from softdta.core.regions import Buffer, byte_view
from softdta.core.tables import Structure


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
    def for_structure(cls, buffer: Buffer, structure: Structure) -> PostcardRegion:
        return cls(buffer, structure.slot_size, structure.hops)

    def occupied(self) -> npt.NDArray[np.bool_]:
        # any() over an axis is an array (numpy's stubs also allow a scalar)
        return cast(npt.NDArray[np.bool_], self.values.any(axis=1))
