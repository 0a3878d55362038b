"""Sketch-Merge's query: the merged sketch (`MergedSketch`, what the query service answers at
`GET /sketch-merge/<structure>`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from softdta.core.primitives.sketch_merge.region import SketchRegion
from softdta.core.query import StructureQuery
from softdta.core.tables import Structure


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
