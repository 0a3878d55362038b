"""Sketch-Merge in the demos: one epoch of per-switch Count-Min sketches, merged by the translator and compared
with the sum of the reporters' sketches."""

from __future__ import annotations

from typing import Any

import numpy as np

from softdta.core.tables import Structure
from softdta.core.workload import PrimitiveDemo, WorkloadParams
from softdta.wire.dta import Report


class SketchMergeDemo(PrimitiveDemo):
    """Reporter r sends sketch r's columns in order."""

    target: Structure

    def params(self) -> WorkloadParams:
        sketch = self.target
        return WorkloadParams(0, self.setting.seed, reporters=sketch.reporters, columns=sketch.columns,
                              rows=sketch.rows)

    def owner(self, index: int, unit: list[Report]) -> int:
        return unit[0].reporter

    def request(self, sent: int) -> dict[str, Any] | None:
        return {}

    def check(self, answer: dict[str, Any], predicted: dict[str, Any], sent: int) -> dict[str, Any]:
        expected = np.zeros((self.target.columns, self.target.rows), dtype=np.uint64)
        for report in self.reports:
            expected[report.column] += np.array(report.counters, dtype=np.uint64)
        merged = np.array(answer["matrix"], dtype=np.uint64)
        return {"matches_sum_of_reporters": merged.shape == expected.shape and bool((merged == expected).all()),
                "matches_prediction": answer["matrix"] == predicted["matrix"]}

    @classmethod
    def problems(cls, entry: dict[str, Any], complete: bool) -> list[str]:
        problems = []
        if complete and not entry["matches_sum_of_reporters"]:
            problems.append("Sketch-Merge: the merged sketch differs from the sum of the reporters' sketches")
        if not entry.get("matches_prediction", True):
            problems.append("sketch-merge: the merged sketch differs from the memory the reference predicts")
        return problems

    @classmethod
    def prediction_count(cls, entry: dict[str, Any]) -> int | None:
        return None

    @classmethod
    def prediction_note(cls, entry: dict[str, Any]) -> str | None:
        return f"the merged sketch {'equals it' if entry.get('matches_prediction', True) else 'DIFFERS'}"

    @classmethod
    def row(cls, entry: dict[str, Any]) -> str:
        return ("merged sketch matches the sum of the reporters'" if entry["matches_sum_of_reporters"] else
                "merged sketch DIFFERS")

    def offline_lines(self, entry: dict[str, Any], answer: dict[str, Any]) -> list[str]:
        sketch = self.target
        return [f"merged sketch {'matches' if entry['matches_sum_of_reporters'] else 'DIFFERS from'} the sum of "
                f"{sketch.reporters} reporters' sketches ({sketch.rows}x{sketch.columns})"]
