"""Append in the demos: congestion and loss events spread over lists, taken from the collector while they come
(a ring nobody drains wraps: Append has no backpressure) and compared list by list, in order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from softdta.core.tables import AppendLists, Tables
from softdta.core.workload import PrimitiveDemo, WorkloadParams
from softdta.wire.dta import Report

if TYPE_CHECKING:
    from softdta.core.offline import OfflineCollector
    from softdta.core.primitives.base import Primitive


class AppendDemo(PrimitiveDemo):
    """A list belongs to one reporter, which sends its entries in order."""

    drained = True
    prediction_unit = "lists"
    target: AppendLists

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.appended: dict[int, list[Any]] = {}  # what the demo took, by list id
        self.overwritten = 0  # entries that laps overwrote before they were taken

    @classmethod
    def target_in(cls, primitive: type[Primitive], tables: Tables, collector_ip: bytes) -> AppendLists | None:
        return next((lists for lists in tables.append_lists if lists.qp.collector_ip == collector_ip), None)

    def params(self) -> WorkloadParams:
        lists = self.target
        per_list = min(int(200 * self.setting.scale), lists.entries // 2)  # within a ring: no lap
        return WorkloadParams(lists.lists * per_list, self.setting.seed, lists=lists.lists,
                              first_list=lists.first_list)

    def owner(self, index: int, unit: list[Report]) -> int:
        return unit[0].list_id

    def path(self) -> str:
        from softdta.core.primitives.append.queries import range_name  # it names its range after Append

        return f"/{self.primitive.name}/{range_name(self.target)}"

    def request(self, sent: int) -> dict[str, Any] | None:
        return {}

    def take(self, answer: dict[str, Any]) -> None:
        for list_id, entry in answer["lists"].items():
            self.appended.setdefault(int(list_id), []).extend(entry["entries"])
            self.overwritten += entry["dropped"]

    def answer_from(self, collector: OfflineCollector, fields: dict[str, Any]) -> dict[str, Any]:
        poller = next(poller for poller in collector.append_pollers if poller.region.lists == self.target)
        entries, lost = poller.poll_counting_laps()
        return {"lists": {str(list_id): {"entries": values.tolist(), "dropped": lost.get(list_id, 0)}
                          for list_id, values in entries.items()}}

    def check(self, answer: dict[str, Any], predicted: dict[str, Any], sent: int) -> dict[str, Any]:
        self.take(answer)
        per_list: dict[int, list[int]] = {}
        for report in self.reports:
            per_list.setdefault(report.list_id, []).append(int.from_bytes(report.data, "big"))
        expected = {int(list_id): entry["entries"] for list_id, entry in predicted["lists"].items()}
        appended = self.appended
        return {"entries_sent": sum(len(values) for values in per_list.values()),
                "entries_recovered": sum(len(entries) for entries in appended.values()), "lists": len(per_list),
                "lists_in_exact_order": sum(appended.get(list_id, []) == values
                                            for list_id, values in per_list.items()),
                "entries_overwritten": self.overwritten,
                "lists_differ_from_prediction": sum(appended.get(list_id, []) != entries
                                                    for list_id, entries in expected.items())
                + len(set(appended) - set(expected))}

    @classmethod
    def problems(cls, entry: dict[str, Any], complete: bool) -> list[str]:
        if complete and (entry["entries_recovered"] != entry["entries_sent"]
                         or entry["lists_in_exact_order"] != entry["lists"]):
            overwritten = entry.get("entries_overwritten")
            return [f"Append: {entry['entries_recovered']:,} of {entry['entries_sent']:,} entries recovered, "
                    f"{entry['lists_in_exact_order']} of {entry['lists']} lists in order"
                    f"{f'; laps overwrote {overwritten:,}' if overwritten else ''}"]
        return []

    @classmethod
    def prediction_count(cls, entry: dict[str, Any]) -> int | None:
        count: int = entry["lists_differ_from_prediction"]
        return count

    @classmethod
    def row(cls, entry: dict[str, Any]) -> str:
        return (f"{entry['entries_recovered']:,} / {entry['entries_sent']:,} entries recovered, "
                f"{entry['lists_in_exact_order']} / {entry['lists']} lists in exact order")

    def offline_lines(self, entry: dict[str, Any], answer: dict[str, Any]) -> list[str]:
        recovered, sent = entry["entries_recovered"], entry["entries_sent"]
        return [f"{recovered} / {sent} entries recovered ({100 * recovered / sent:.1f} %), "
                f"{entry['lists_in_exact_order']} / {entry['lists']} lists in exact order"]
