"""Key-Write in the demos: INT path tracing, distinct flow keys each with its path's data, looked up over N=2
copies against the success the analysis expects at the structure's load."""

from __future__ import annotations

from typing import Any

import numpy as np

from softdta.core.analysis import expected_success, key_write_success_chances
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

REDUNDANCY = 2


class KeyWriteDemo(PrimitiveDemo):
    """Its reports come from reporter 1 alone (the sink of every traced flow): reports to one slot then reach the
    translator in the order sent, so the collector's memory is predictable exactly."""

    target: Structure

    def params(self) -> WorkloadParams:
        return WorkloadParams(int(6000 * self.setting.scale), self.setting.seed, REDUNDANCY, self.target.key_len,
                              self.target.data_len)

    def owner(self, index: int, unit: list[Report]) -> int:
        return 0

    def request(self, sent: int) -> dict[str, Any] | None:
        keys = self.reports[:sent]
        return {"keys": [report.key.hex() for report in keys], "redundancy": REDUNDANCY} if keys else None

    def expected(self, keys: int) -> tuple[float, float]:
        """The expected success rate of `keys` keys written in turn, and its spread."""
        later = np.arange(keys - 1, -1, -1) / self.target.slot_count
        return expected_success(key_write_success_chances(later.tolist(), REDUNDANCY))

    def check(self, answer: dict[str, Any], predicted: dict[str, Any], sent: int) -> dict[str, Any]:
        keys = self.reports[:sent]
        right = sum(row["value"] == report.data.hex() for row, report in zip(answer["results"], keys))
        rate, spread = self.expected(len(keys))
        return {"correct": right, "keys": len(keys), "success": round(right / len(keys), 4),
                "expected": round(rate, 4), "spread": round(spread, 4),
                "load": round(len(keys) / self.target.slot_count, 4),
                "differ_from_prediction": differences(answer["results"], predicted)}

    @classmethod
    def problems(cls, entry: dict[str, Any], complete: bool) -> list[str]:
        if entry["success"] < entry["expected"] - BELOW_EXPECTED:
            return [f"Key-Write answered {entry['success']:.2%} correctly, more than {BELOW_EXPECTED_WORDS} below "
                    f"the expected {expected_words(entry)}"]
        return []

    @classmethod
    def row(cls, entry: dict[str, Any]) -> str:
        return (f"{entry['success']:.2%} of {entry['keys']:,} keys correct at load {entry['load']} "
                f"(N={REDUNDANCY}); expected {expected_words(entry)}")

    def offline_lines(self, entry: dict[str, Any], answer: dict[str, Any]) -> list[str]:
        rows = answer["results"]
        correct = [row["value"] == report.data.hex() for row, report in zip(rows, self.reports)]
        wrong = sum(row["value"] is not None and not right for row, right in zip(rows, correct))
        rate, spread = self.expected(len(self.reports))
        return [f"{100 * sum(correct) / len(correct):6.2f} % of keys answered correctly (N={REDUNDANCY}, load "
                f"{len(self.reports) / self.target.slot_count:.2f}, hash {self.target.key_hash.name.lower()}); "
                f"expected {100 * rate:.2f} % ± {100 * spread:.2f} % (one standard deviation)",
                f"wrong answers: {wrong}"]
