"""Postcarding in the demos: INT postcards, one per hop of every flow's path, decoded back into paths against
the success the analysis expects at the structure's load."""

from __future__ import annotations

from typing import Any

import numpy as np

from softdta.core.analysis import expected_success, postcarding_success_chances
from softdta.core.tables import Structure
from softdta.core.workload import (
    BELOW_EXPECTED,
    BELOW_EXPECTED_WORDS,
    PrimitiveDemo,
    WorkloadParams,
    differences,
    expected_words,
)
from softdta.wire.dta import Report


class PostcardingDemo(PrimitiveDemo):
    """A flow's postcards leave its hops microseconds apart, well within the translator's idle flush time, so they
    travel together; all come from reporter 1 (see Key-Write's), so the collector's memory is predictable."""

    target: Structure

    def params(self) -> WorkloadParams:
        return WorkloadParams(int(4000 * self.setting.scale), self.setting.seed, hops=self.target.hops,
                              switch_ids=self.setting.switch_ids)

    def units(self) -> list[list[Report]]:
        flows: dict[bytes, list[Report]] = {}
        for report in self.reports:
            flows.setdefault(report.key, []).append(report)
        return list(flows.values())

    def owner(self, index: int, unit: list[Report]) -> int:
        return 0

    def paths(self) -> dict[bytes, list[int]]:
        """Each flow's path, hop by hop."""
        paths: dict[bytes, list[int]] = {}
        for report in self.reports:
            paths.setdefault(report.key, [0] * self.target.hops)[report.hop - 1] = int.from_bytes(report.data, "big")
        return paths

    def request(self, sent: int) -> dict[str, Any] | None:
        return {"keys": [key.hex() for key in self.paths()], "value_set": list(self.setting.switch_ids)}

    def check(self, answer: dict[str, Any], predicted: dict[str, Any], sent: int) -> dict[str, Any]:
        paths = self.paths()
        decoded = sum(row.get("path") == path for row, path in zip(answer["results"], paths.values()))
        later = np.arange(len(paths) - 1, -1, -1) / self.target.slot_count
        rate, spread = expected_success(postcarding_success_chances(later.tolist(), 1, self.target.hops,
                                                                    len(self.setting.switch_ids)))
        return {"paths": len(paths), "decoded_exactly": decoded, "expected": round(rate, 4),
                "spread": round(spread, 4), "differ_from_prediction": differences(answer["results"], predicted)}

    @classmethod
    def problems(cls, entry: dict[str, Any], complete: bool) -> list[str]:
        if entry["decoded_exactly"] / entry["paths"] < entry["expected"] - BELOW_EXPECTED:
            return [f"Postcarding decoded {entry['decoded_exactly'] / entry['paths']:.2%} of paths, more than "
                    f"{BELOW_EXPECTED_WORDS} below the expected {expected_words(entry)}"]
        return []

    @classmethod
    def row(cls, entry: dict[str, Any]) -> str:
        return (f"{entry['decoded_exactly']:,} / {entry['paths']:,} paths decoded exactly; "
                f"expected {expected_words(entry)}")

    def offline_lines(self, entry: dict[str, Any], answer: dict[str, Any]) -> list[str]:
        return [f"{entry['decoded_exactly']} / {entry['paths']} paths decoded exactly"]
