"""Key-Write's collector region: slots of `slot_size` bytes, the key's checksum (u32, little-endian) then the data
as reported."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from softdta.core.regions import Buffer, byte_view
from softdta.core.tables import Structure
from softdta.spec import KEY_CHECKSUM_LEN


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
    def for_structure(cls, buffer: Buffer, structure: Structure) -> KeyWriteRegion:
        return cls(buffer, structure.slot_size, structure.data_len)

    def occupied(self) -> npt.NDArray[np.bool_]:
        written: npt.NDArray[np.bool_] = (self.checksums != 0) | self.data.any(axis=1)
        return written
