"""Key-Increment's collector region: u64 counters in the collector's byte order (little-endian, as Fetch&Add
leaves them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from softdta.core.regions import Buffer, byte_view


@dataclass
class KeyIncrementRegion:
    buffer: Buffer

    def __post_init__(self) -> None:
        raw = byte_view(self.buffer)
        self.counters = raw[:raw.size // 8 * 8].view("<u8")
        self.slot_count = self.counters.size

    def occupied(self) -> npt.NDArray[np.bool_]:
        written: npt.NDArray[np.bool_] = self.counters != 0
        return written
