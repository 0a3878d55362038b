"""Report generators for the offline tools, the demos and tests: realistic shapes, deterministic seeds; and what a
primitive declares of its part in the demos (`PrimitiveDemo`). Each primitive's `workload(params)` is one of the
generators here, given what it takes of one `WorkloadParams`."""

from __future__ import annotations

import abc
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from softdta.core.tables import Structure, Tables
from softdta.spec import DTA_PORT, DtaOpcode
from softdta.wire import dta
from softdta.wire.dta import Profile, Report
from softdta.wire.frames import UdpEndpoints, build_udp_frame, ip_str

if TYPE_CHECKING:
    from softdta.core.offline import OfflineCollector
    from softdta.core.primitives.base import Primitive, Target


@dataclass(frozen=True)
class ReporterAddress:
    """Where reports come from and go to: the reporter, the translator's MAC (next hop), the collector IP."""

    mac: bytes
    ip: bytes
    translator_mac: bytes
    collector_ip: bytes
    sport: int = 40041

    def frame(self, report: Report, profile: Profile = Profile.DTA_V1) -> bytes:
        ends = UdpEndpoints(src_mac=self.mac, dst_mac=self.translator_mac, src_ip=self.ip,
                            dst_ip=self.collector_ip, sport=self.sport, dport=DTA_PORT)
        return build_udp_frame(ends, dta.encode(report, profile))


@dataclass(frozen=True)
class WorkloadParams:
    """What the generators take: each primitive's `workload` uses the fields that apply to it. `count` is the
    reports to make (Postcarding: the flows, one postcard per hop; Sketch-Merge: unused, one epoch)."""

    count: int
    seed: int = 0
    redundancy: int = 2  # Key-Write, Key-Increment
    key_len: int = 4  # Key-Write
    data_len: int = 4  # Key-Write
    flows: int = 64  # Key-Increment: the flows the increments spread over
    lists: int = 4  # Append: the lists, from first_list on
    first_list: int = 0
    hops: int = 5  # Postcarding
    switch_ids: Sequence[int] | None = None  # Postcarding: the values hops report (default 1..1024)
    reporters: int = 2  # Sketch-Merge: the sketches, and their columns and rows
    columns: int = 64
    rows: int = 4


def key_write(count: int, seed: int = 0, redundancy: int = 2, key_len: int = 4, data_len: int = 4) -> list[Report]:
    """INT-style path reports: distinct flow keys, each with its data (e.g. a path of switch IDs)."""
    rng = random.Random(seed)
    extended = key_len != 4 or data_len != 4
    keys = _distinct_keys(rng, count, key_len)
    return [Report(DtaOpcode.KEY_WRITE, key=key, data=rng.randbytes(data_len), redundancy=redundancy,
                   extended=extended) for key in keys]


def key_increment(count: int, seed: int = 0, redundancy: int = 2, flows: int = 64) -> list[Report]:
    """Marple-style counters: many increments over a small set of flows."""
    rng = random.Random(seed)
    keys = _distinct_keys(rng, flows, 4)
    return [dta.key_increment(rng.choice(keys), rng.randint(1, 1500), redundancy) for _ in range(count)]


def append(count: int, seed: int = 0, lists: int = 4, first_list: int = 0) -> list[Report]:
    """Loss or congestion events spread over lists; values are never 0 (0 marks an empty entry)."""
    rng = random.Random(seed)
    return [dta.append(first_list + rng.randrange(lists), rng.randint(1, 0xFFFFFFFF)) for _ in range(count)]


def postcards(flows: int, seed: int = 0, hops: int = 5, switch_ids: Sequence[int] | None = None) -> list[Report]:
    """INT postcards: every flow crosses `hops` switches, one postcard per hop, flows interleaved."""
    rng = random.Random(seed)
    values = list(switch_ids or range(1, 1025))
    reports: list[Report] = []
    for key in _distinct_keys(rng, flows, 4):
        path = rng.sample(values, hops)
        reports.extend(dta.postcard(key, hop + 1, path[hop]) for hop in range(hops))
    rng.shuffle(reports)
    return reports


def sketch_epoch(reporters: int, columns: int, rows: int, seed: int = 0) -> list[Report]:
    """One epoch of per-switch Count-Min sketches, each switch sending its columns in order, interleaved."""
    rng = random.Random(seed)
    streams = [[dta.sketch_column(r, c, [rng.randint(0, 1000) for _ in range(rows)]) for c in range(columns)]
               for r in range(reporters)]
    reports = []
    while any(streams):
        stream = rng.choice([s for s in streams if s])
        reports.append(stream.pop(0))
    return reports


def interleave(streams: list[list[Report]], seed: int = 0) -> list[Report]:
    """The streams merged in a random order that keeps each stream's own (sketch columns stay sequential)."""
    rng = random.Random(seed)
    pending = [list(reversed(stream)) for stream in streams]
    order = [index for index, stream in enumerate(pending) for _ in stream]
    rng.shuffle(order)
    return [pending[index].pop() for index in order]


def _distinct_keys(rng: random.Random, count: int, key_len: int) -> list[bytes]:
    """In the order drawn: a set's order depends on the process's hash seed, and a seed must give one workload."""
    keys: dict[bytes, None] = {}
    while len(keys) < count:
        keys[rng.randbytes(key_len)] = None
    return list(keys)


# --------------------------------------------------------------------------------------------------
# The demos (`softdta demo`, live and offline): each primitive declares its part, and the demos iterate them

# How far a query's success rate may fall below its expected value (the summary shows its standard deviation);
# the exact check is the one against the reference translator's prediction.
BELOW_EXPECTED = 0.01
BELOW_EXPECTED_WORDS = f"{100 * BELOW_EXPECTED:g} percentage point"


@dataclass(frozen=True)
class DemoSetting:
    """What a demo asks of every primitive: its seed, how big a workload (1.0: the live demo's), how many
    reporters send, and the values a path's hops report (switch IDs)."""

    seed: int = 0
    scale: float = 1.0
    reporters: int = 2
    switch_ids: Sequence[int] = range(1, 4097)


class PrimitiveDemo(abc.ABC):
    """A primitive's part in the demos (sans-IO), its `Primitive.demo`: its workload on the demo's tables, how its
    reports travel, the query that checks them, and what the summary says of the answer.

    The demo asks the collector (over HTTP live, an `OfflineCollector` offline) at `path()` with `request()`;
    `check` compares the answer with the truth, the reports it sent, and with the answer the reference translator
    predicts (`answer_from` an offline collector fed the same reports), into its entry of the summary's queries
    (`summary_key`). `problems`, `row` and `offline_lines` say what that entry means.
    """

    drained: ClassVar[bool] = False  # its answers are taken (with the collector's token), also while sending
    prediction_unit: ClassVar[str] = "answers"  # what `prediction_count` counts

    def __init__(self, primitive: type[Primitive], target: Target, setting: DemoSetting):
        self.primitive, self.target, self.setting = primitive, target, setting
        self.reports = primitive.workload(self.params())

    @classmethod
    def target_in(cls, primitive: type[Primitive], tables: Tables, collector_ip: bytes) -> Target | None:
        """Where its reports go in `tables`: by default its structure on the collector."""
        return tables.structure(collector_ip, primitive.opcode)

    @abc.abstractmethod
    def params(self) -> WorkloadParams:
        """Its workload's parameters, for its target and the demo's setting."""

    def units(self) -> list[list[Report]]:
        """Its reports in what must travel together, in order: by default each report alone."""
        return [[report] for report in self.reports]

    def owner(self, index: int, unit: list[Report]) -> int:
        """Which reporter sends the `index`th unit (modulo the reporters): by default round-robin."""
        return index

    def path(self) -> str:
        """Its query's path at the query service: /<primitive>/<structure>."""
        return f"/{self.primitive.name}/{self.primitive.name}@{ip_str(self.target.qp.collector_ip)}"

    @abc.abstractmethod
    def request(self, sent: int) -> dict[str, Any] | None:
        """The fields of its query over its first `sent` reports ({}: a query without fields); None: no query."""

    def take(self, answer: dict[str, Any]) -> None:
        """A drained primitive keeps what an answer took (the demo takes while it sends)."""

    def answer_from(self, collector: OfflineCollector, fields: dict[str, Any]) -> dict[str, Any]:
        """The answer, as the query service sends it, from an offline collector's memory."""
        assert self.primitive.query is not None and isinstance(self.target, Structure)  # its query, its structure
        region = collector.structure_region(self.primitive.opcode, self.target.qp.collector_ip)
        name = self.path().rsplit("/", 1)[1]
        return self.primitive.query.parse(fields, self.target, name).answer(region).json()

    @abc.abstractmethod
    def check(self, answer: dict[str, Any], predicted: dict[str, Any], sent: int) -> dict[str, Any]:
        """Its entry in the summary: the collector's `answer` against the truth of the first `sent` reports, and
        against the `predicted` answer."""

    @classmethod
    @abc.abstractmethod
    def problems(cls, entry: dict[str, Any], complete: bool) -> list[str]:
        """What in its entry is below the truth, or more than BELOW_EXPECTED below the expected success
        (`complete`: every report was sent)."""

    @classmethod
    def prediction_count(cls, entry: dict[str, Any]) -> int | None:
        """How many of its answers (`prediction_unit`) differ from the prediction; None if it says it otherwise."""
        count: int = entry["differ_from_prediction"]
        return count

    @classmethod
    def prediction_note(cls, entry: dict[str, Any]) -> str | None:
        """Its comparison with the prediction in words, if it is no count."""
        return None

    @classmethod
    @abc.abstractmethod
    def row(cls, entry: dict[str, Any]) -> str:
        """Its row of the demo's table of queries against the truth."""

    @abc.abstractmethod
    def offline_lines(self, entry: dict[str, Any], answer: dict[str, Any]) -> list[str]:
        """Its lines of the offline demo's queries against the truth."""


def summary_key(primitive: type[Primitive]) -> str:
    """A primitive's entry in the demo summary's queries (key_write)."""
    return primitive.name.replace("-", "_")


def expected_words(entry: dict[str, Any]) -> str:
    """A query's expected success rate and one standard deviation of the measured rate around it."""
    return f"{entry['expected']:.2%} ± {entry['spread']:.2%}"


def differences(live: list[Any], predicted: dict[str, Any]) -> int:
    """Rows of a live answer that differ from the predicted one, as the service would have sent it."""
    rows: list[Any] = json.loads(json.dumps(predicted["results"]))
    differing = sum(bool(a != b) for a, b in zip(live, rows))
    return differing + abs(len(live) - len(rows))
