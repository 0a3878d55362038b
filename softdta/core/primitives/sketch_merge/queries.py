"""Sketch-Merge's query: the merged sketch (`MergedSketch`, what the query service answers at
`GET /sketch-merge/<structure>`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from softdta.core.primitives.sketch_merge.region import SketchRegion
from softdta.core.query import StructureQuery
from softdta.core.tables import Structure


def sketch_snapshot(region: SketchRegion, rows: int) -> Iterator[dict[str, npt.NDArray[Any]]]:
    """Every cell of the merged sketch, column by column, about `rows` cells at a time: column (u32), row (u32)
    and value (u32)."""
    columns, sketch_rows = region.by_column.shape
    step = max(1, rows // max(sketch_rows, 1))
    for first in range(0, max(columns, 1), step):
        cells = region.by_column[first:first + step]
        yield {"column": np.repeat(np.arange(first, first + cells.shape[0], dtype=np.uint32), sketch_rows),
               "row": np.tile(np.arange(sketch_rows, dtype=np.uint32), cells.shape[0]),
               "value": cells.reshape(-1).astype(np.uint32)}


@dataclass
class SketchAnswer:
    structure: str
    columns: int
    rows: int
    merge: str
    matrix: list[list[int]]  # matrix[column][row]

    def json(self) -> dict[str, Any]:
        return {"structure": self.structure, "columns": self.columns, "rows": self.rows, "merge": self.merge,
                "matrix": self.matrix}


@dataclass(frozen=True)
class MergedSketch(StructureQuery[SketchRegion]):
    """The merged sketch, column by column; it takes no fields."""

    name: str
    structure: Structure

    @classmethod
    def parse(cls, fields: dict[str, Any], structure: Structure, name: str) -> MergedSketch:
        return cls(name, structure)

    def answer(self, region: SketchRegion) -> SketchAnswer:
        structure = self.structure
        return SketchAnswer(self.name, structure.columns, structure.rows, structure.merge.name.lower(),
                            region.by_column.tolist())
