"""Sketch-Merge's collector region, column-major ("rotated"): column c is `rows` little-endian u32 at
c * rows * 4."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from softdta.core.regions import Buffer, byte_view
from softdta.core.tables import Structure


@dataclass
class SketchRegion:
    buffer: Buffer
    columns: int
    rows: int

    def __post_init__(self) -> None:
        raw = byte_view(self.buffer)
        self.by_column = raw[:self.columns * self.rows * 4].view("<u4").reshape(self.columns, self.rows)

    @classmethod
    def for_structure(cls, buffer: Buffer, structure: Structure) -> SketchRegion:
        return cls(buffer, structure.columns, structure.rows)

    def matrix(self) -> np.ndarray:
        """The merged sketch as (rows, columns), undoing the rotated layout."""
        return self.by_column.T.copy()

    def occupied(self) -> npt.NDArray[np.bool_]:
        """One bool per column."""
        # any() over an axis is an array (numpy's stubs also allow a scalar)
        return cast(npt.NDArray[np.bool_], self.by_column.any(axis=1))
