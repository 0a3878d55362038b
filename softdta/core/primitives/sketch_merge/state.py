"""Sketch-Merge's state: one structure's columns being merged, as arrays, which the reference translator reads and
writes a report at a time and the vector path a batch at a time."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from softdta.core.tables import Structure


class SketchRuntime:
    """The aggregate columns (columns, rows), who gave each column since its group of columns was last written
    (columns, reporters), and each reporter's next column."""

    def __init__(self, structure: Structure):
        self.shape = (structure.columns, structure.rows, structure.reporters)
        self.aggregate: npt.NDArray[np.uint32] = np.zeros((structure.columns, structure.rows), dtype=np.uint32)
        self.contributors = np.zeros((structure.columns, structure.reporters), dtype=bool)
        self.next_column = np.zeros(structure.reporters, dtype=np.int64)

    def fits(self, structure: Structure) -> bool:
        return self.shape == (structure.columns, structure.rows, structure.reporters)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SketchRuntime):
            return NotImplemented
        return self.shape == other.shape and all(np.array_equal(mine, theirs) for mine, theirs in (
            (self.aggregate, other.aggregate), (self.contributors, other.contributors),
            (self.next_column, other.next_column)))
