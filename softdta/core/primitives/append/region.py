"""Append's collector region: per list, a ring of `entries` entries; 4- and 8-byte entries little-endian."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from softdta.core.regions import Buffer, byte_view
from softdta.core.tables import AppendLists


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

    def occupied(self) -> npt.NDArray[np.bool_]:
        """One bool per entry of every ring."""
        # any() over an axis is an array (numpy's stubs also allow a scalar)
        entries = self.rings.reshape(self.rings.shape[0] * self.rings.shape[1], -1)
        return cast(npt.NDArray[np.bool_], entries.any(axis=1))
