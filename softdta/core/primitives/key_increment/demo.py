"""Key-Increment in the demos: Marple-style per-flow counters, many increments over few flows, read back as
Count-Min estimates over N=2 counters, none of which may be below the truth."""

from __future__ import annotations

from typing import Any

from softdta.core.workload import PrimitiveDemo, WorkloadParams, differences

REDUNDANCY = 2


class KeyIncrementDemo(PrimitiveDemo):
    def params(self) -> WorkloadParams:
        return WorkloadParams(int(20000 * self.setting.scale), self.setting.seed, REDUNDANCY, flows=1000)

    def truth(self, sent: int) -> dict[bytes, int]:
        """Each flow's sum of the increments in the first `sent` reports."""
        sums: dict[bytes, int] = {}
        for report in self.reports[:sent]:
            sums[report.key] = sums.get(report.key, 0) + report.counter
        return sums

    def request(self, sent: int) -> dict[str, Any] | None:
        flows = self.truth(sent)
        return {"keys": [key.hex() for key in flows], "redundancy": REDUNDANCY} if flows else None

    def check(self, answer: dict[str, Any], predicted: dict[str, Any], sent: int) -> dict[str, Any]:
        truth = self.truth(sent)
        counts = [row["count"] for row in answer["results"]]
        return {"flows": len(truth), "exact": sum(count == sum_ for count, sum_ in zip(counts, truth.values())),
                "under_counted": sum(count < sum_ for count, sum_ in zip(counts, truth.values())),
                "differ_from_prediction": differences(answer["results"], predicted)}

    @classmethod
    def problems(cls, entry: dict[str, Any], complete: bool) -> list[str]:
        if entry["under_counted"]:
            return [f"{entry['under_counted']} Key-Increment counters are below the truth"]
        return []

    @classmethod
    def row(cls, entry: dict[str, Any]) -> str:
        return f"{entry['exact']:,} / {entry['flows']:,} flow counters exact, {entry['under_counted']} under the truth"

    def offline_lines(self, entry: dict[str, Any], answer: dict[str, Any]) -> list[str]:
        return [f"{entry['exact']} / {entry['flows']} flow counters exact (Count-Min, N={REDUNDANCY})"]
