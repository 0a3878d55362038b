"""The export to NATS JetStream (docs/export.md): Append entries acknowledged per second from one collector into
a local nats-server, and the XDP responder's cost per report with an exporter running beside it and without.

The collector's memory is written as the XDP responder writes it: whole batches straight into the rings, each
WRITE counted in its ring's writes counter. The exporter is the collector's own (`collector.export.Exporter`),
taking from the same `AppendFeed`s a running collector gives it, journaling and publishing to a real nats-server.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import TypedDict

import numpy as np

from softdta.collector.export import Exporter
from softdta.core.export import ExportSettings
from softdta.core.primitives.append.queries import AppendFeed
from softdta.core.primitives.append.region import AppendRegion
from softdta.core.tables import AppendLists, Tables
from softdta.errors import SoftdtaError
from softdta.lab.benchmarks.workloads import ROOT, Stats, stats
from softdta.lab.nats_server import NatsServer

GOAL_ENTRIES_PER_S = 1_000_000
GOAL_RESPONDER_RATIO = 1.05
LISTS, ENTRIES, BATCH = 64, 4096, 4  # a ring holds 64 k entries in all: 65 ms at 1 M/s
TICK_S = 0.001
SATURATED_BACKLOG = 256 << 10
WARM_S = 0.5  # the exporter beside the responder runs this long before a round is measured
TEST_RUNS_PER_ROUND = 3  # a round's figure is the median of this many calls of `repeat` test runs


class ExportRate(TypedDict):
    """One offered rate: what JetStream acknowledged while the writer wrote at it."""

    entry_bytes: int
    offered_per_s: int
    acknowledged_per_s: int
    lost_to_overflow: int
    dropped_from_backlog: int
    backlog_at_end: int
    messages_per_s: int
    exact: bool  # after the writer stopped, every entry written was acknowledged, or counted as lost


class ExportThroughput(TypedDict):
    """`softdta bench`'s export_throughput, per entry size."""

    lists: int
    ring_entries: int
    batch: int
    seconds_per_step: float
    steps: list[ExportRate]
    max_acknowledged_per_s: int
    max_lossless_per_s: int
    idle_cores: float  # the exporter's CPU time per second with nothing to take (it polls every ring every 5 ms)
    goal_per_s: int
    met: bool


def bench_tables(entry_bytes: int) -> Tables:
    """The example tables with one Append range of LISTS rings of ENTRIES entries of `entry_bytes`."""
    import tomllib
    document = tomllib.loads((ROOT / "examples" / "tables.toml").read_text())
    append = document["append"][0]
    append.update(lists=LISTS, entries=ENTRIES, batch=BATCH, data_len=entry_bytes)
    append["qp"]["length"] = LISTS * ENTRIES * entry_bytes
    return Tables.from_dict(document, source="export benchmark tables")


class RingWriter:
    """Writes Append batches into `buffer` as the XDP responder executes the translator's WRITEs: batch after
    batch at each ring's writer position, one count per WRITE in `writes`. Entries are 1, 2, 3, ... (0 is
    empty), spread over the lists in turn."""

    def __init__(self, lists: AppendLists, buffer: np.ndarray, writes: np.ndarray):
        self.lists, self.writes = lists, writes
        self.batches_per_ring = lists.entries // lists.batch
        dtype = {4: np.uint32, 8: np.uint64}[lists.data_len]
        self.batches = buffer.view(dtype).reshape(lists.lists, self.batches_per_ring, lists.batch)
        self.dtype = dtype
        self.written = 0  # entries

    def write(self, batches_per_list: int) -> int:
        """`batches_per_list` batches into every ring; returns the entries written."""
        if batches_per_list <= 0:
            return 0
        lists, batch = self.lists.lists, self.lists.batch
        count = lists * batches_per_list * batch
        values = np.arange(self.written + 1, self.written + 1 + count, dtype=self.dtype)
        positions = (self.writes.astype(np.int64)[:, None] + np.arange(batches_per_list)) % self.batches_per_ring
        self.batches[np.arange(lists)[:, None], positions] = values.reshape(batches_per_list, lists, batch) \
            .transpose(1, 0, 2)
        self.writes += np.uint64(batches_per_list)
        self.written += count
        return count


@dataclass
class Collector:
    """A collector's Append memory for the benchmark: its tables, rings, writer and feeds."""

    tables: Tables
    writer: RingWriter
    feeds: dict[str, AppendFeed]

    @classmethod
    def made(cls, entry_bytes: int) -> Collector:
        tables = bench_tables(entry_bytes)
        lists = tables.append_lists[0]
        buffer = np.zeros(lists.qp.length, dtype=np.uint8)
        writes = np.zeros(lists.lists, dtype=np.uint64)
        feed = AppendFeed(lists, AppendRegion(buffer, lists), writes)
        return cls(tables, RingWriter(lists, buffer, writes), {"bench": feed})


async def _until(condition: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise SoftdtaError(f"export benchmark: not within {within} s: {what}")
        await asyncio.sleep(0.01)


async def _write_at(writer: RingWriter, rate: float, until: asyncio.Event, exporter: Exporter) -> None:
    """Write at `rate` entries/s until `until`; at rate 0, as fast as the exporter takes them: every ring is kept
    at most half full and the backlog under SATURATED_BACKLOG entries, so nothing is lost or dropped."""
    started = time.monotonic()
    per_write = writer.lists.lists * writer.lists.batch
    start_count = writer.written
    poller = next(iter(exporter.feeds.values())).poller
    while not until.is_set():
        if rate:
            due = rate * (time.monotonic() - started) - (writer.written - start_count)
            writer.write(int(due // per_write))
        elif exporter.ledger.backlog_entries < SATURATED_BACKLOG and poller.accounted is not None:
            unread = int((writer.writes.astype(np.int64) - poller.accounted).max())
            writer.write(writer.batches_per_ring // 2 - unread)
        await asyncio.sleep(TICK_S)


async def export_step(url: str, data_dir: Path, entry_bytes: int, rate: float, seconds: float) -> ExportRate:
    """One exporter over fresh rings, the writer at `rate` entries/s for `seconds` (after a warm-up of a tenth),
    then the writer stopped and the exporter left to finish; the acknowledged rate is over the `seconds`."""
    collector = Collector.made(entry_bytes)
    exporter = Exporter(ExportSettings(url), "bench", "10.77.1.1", collector.feeds, data_dir)
    halt, stop_writing = asyncio.Event(), asyncio.Event()
    running = asyncio.create_task(exporter.run(halt))
    await _until(lambda: exporter.connected, 20, "the exporter connecting to nats-server")
    writing = asyncio.create_task(_write_at(collector.writer, rate, stop_writing, exporter))
    await asyncio.sleep(seconds / 10)
    ledger = exporter.ledger
    acknowledged, messages, started = ledger.acknowledged, await _stored(exporter), time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - started
    acknowledged, messages = ledger.acknowledged - acknowledged, await _stored(exporter) - messages
    stop_writing.set()
    await writing
    backlog_at_end = ledger.backlog_entries
    written = collector.writer.written
    try:
        await _until(lambda: ledger.taken + ledger.lost >= written and not ledger.backlog, 60,
                     "the exporter finishing what was written")
    finally:
        halt.set()
        await running
    return ExportRate(entry_bytes=entry_bytes, offered_per_s=int(rate), acknowledged_per_s=int(acknowledged / elapsed),
                      lost_to_overflow=ledger.lost, dropped_from_backlog=ledger.dropped,
                      backlog_at_end=backlog_at_end, messages_per_s=int(messages / elapsed),
                      exact=(ledger.taken + ledger.lost == written
                             and ledger.acknowledged + ledger.dropped == ledger.taken))


async def exporter_idle_cores(url: str, data_dir: Path, entry_bytes: int, seconds: float) -> float:
    """The exporter's CPU time per second over `seconds` with empty rings."""
    collector = Collector.made(entry_bytes)
    exporter = Exporter(ExportSettings(url), "bench", "10.77.1.1", collector.feeds, data_dir)
    halt = asyncio.Event()
    running = asyncio.create_task(exporter.run(halt))
    await _until(lambda: exporter.connected, 20, "the exporter connecting to nats-server")
    cpu, started = time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    cores = (time.process_time() - cpu) / (time.monotonic() - started)
    halt.set()
    await running
    return round(cores, 3)


async def _stored(exporter: Exporter) -> int:
    """The messages the stream holds (every step publishes into the same stream)."""
    context = exporter.broker.context
    return 0 if context is None else int((await context.stream_info(exporter.settings.stream)).state.messages)


def export_throughput(rates: list[int], seconds: float = 2.0, entry_bytes: int = 4) -> ExportThroughput:
    """The exporter at each offered rate (0: unthrottled), one nats-server for all steps."""
    with tempfile.TemporaryDirectory(prefix="softdta-export-bench-") as scratch:
        server = NatsServer(Path(scratch) / "nats").start()
        try:
            steps = []
            for index, rate in enumerate(rates):
                data_dir = Path(scratch) / f"collector-{index}"
                data_dir.mkdir()
                steps.append(asyncio.run(export_step(server.url, data_dir, entry_bytes, rate, seconds)))
            idle_dir = Path(scratch) / "collector-idle"
            idle_dir.mkdir()
            idle = asyncio.run(exporter_idle_cores(server.url, idle_dir, entry_bytes, seconds))
        finally:
            server.kill()
    lossless = [step["acknowledged_per_s"] for step in steps
                if step["exact"] and not step["lost_to_overflow"] and not step["dropped_from_backlog"]
                and step["offered_per_s"] and step["acknowledged_per_s"] >= 0.98 * step["offered_per_s"]]
    best = max(step["acknowledged_per_s"] for step in steps)
    return ExportThroughput(lists=LISTS, ring_entries=ENTRIES, batch=BATCH, seconds_per_step=seconds, steps=steps,
                            max_acknowledged_per_s=best, max_lossless_per_s=max(lossless, default=0),
                            idle_cores=idle, goal_per_s=GOAL_ENTRIES_PER_S, met=best >= GOAL_ENTRIES_PER_S)


# --------------------------------------------------------------------------------------------------
# The XDP responder with export on and off


class ResponderBesideExport(TypedDict):
    """`softdta bench`'s export_responder_impact: the XDP responder's ns per request (BPF_PROG_TEST_RUN, restore
    subtracted) in rounds taken alternately without and with an exporter process publishing `export_rate`
    entries/s into a local nats-server."""

    case: str
    pinned: bool  # the test runs on CPU 0, the exporter process and nats-server on CPU 1
    export_rate: int
    exported_per_s: list[int]  # what the exporter had acknowledged per second, per "on" round
    exporter_cores: list[float]  # the exporter process's CPU time per second, per "on" round (nats-server's not in)
    off_ns: Stats
    on_ns: Stats
    ratios: Stats  # on / off, per pair of rounds
    goal_ratio: float
    met: bool


def _export_process(scratch: str, rate: float, cpus: set[int] | None, active: EventType, running: EventType,
                    quit_: EventType, acknowledged: Synchronized[int], cores: Synchronized[float]) -> None:
    """The exporter beside the responder: its own nats-server, and an exporter over rings written at `rate` while
    `active` is set (`running` says it is)."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    server = NatsServer(Path(scratch) / "nats").start()  # inherits the affinity
    try:
        round_ = 0
        while not quit_.is_set():
            if active.wait(0.05):
                round_ += 1
                data_dir = Path(scratch) / f"collector-{round_}"
                data_dir.mkdir()
                asyncio.run(_export_while(server.url, data_dir, rate, active, running, acknowledged, cores))
    finally:
        server.kill()


async def _export_while(url: str, data_dir: Path, rate: float, active: EventType, running: EventType,
                        acknowledged: Synchronized[int], cores: Synchronized[float]) -> None:
    collector = Collector.made(4)
    exporter = Exporter(ExportSettings(url), "bench", "10.77.1.1", collector.feeds, data_dir)
    halt, stop_writing = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(exporter.run(halt))
    await _until(lambda: exporter.connected, 20, "the exporter connecting to nats-server")
    writing = asyncio.create_task(_write_at(collector.writer, rate, stop_writing, exporter))
    await _until(lambda: exporter.ledger.acknowledged > 0, 20, "the first entries acknowledged")
    await asyncio.sleep(WARM_S)
    acknowledged.value, started, cpu = exporter.ledger.acknowledged, time.monotonic(), time.process_time()
    running.set()
    while active.is_set():
        await asyncio.sleep(0.01)
    elapsed = time.monotonic() - started
    acknowledged.value = int((exporter.ledger.acknowledged - acknowledged.value) / elapsed)
    cores.value = (time.process_time() - cpu) / elapsed
    stop_writing.set()
    await writing
    halt.set()
    await task
    running.clear()


def export_responder_impact(repeat: int, pairs: int = 10, case: str = "uc-write-8", rate: float = GOAL_ENTRIES_PER_S,
                            pinned: bool = True) -> ResponderBesideExport:
    """The XDP responder's ns per request in `pairs` pairs of rounds, off then on, each of `repeat` test runs."""
    from softdta.lab.benchmarks.collector import responder_harness
    context = multiprocessing.get_context("spawn")
    active, running, quit_ = context.Event(), context.Event(), context.Event()
    acknowledged, cores = context.Value("q", 0), context.Value("d", 0.0)
    cpus = os.sched_getaffinity(0)
    pin = pinned and len(cpus) >= 2
    with tempfile.TemporaryDirectory(prefix="softdta-export-bench-") as scratch:
        child = context.Process(target=_export_process, daemon=True,
                                args=(scratch, rate, {sorted(cpus)[1]} if pin else None, active, running, quit_,
                                      acknowledged, cores))
        child.start()
        try:
            if pin:
                os.sched_setaffinity(0, {sorted(cpus)[0]})
            off, on, exported, exporter_cores = [], [], [], []
            with responder_harness(case) as (responder, _, frame):
                restore = responder.object.programs["bench_restore"]
                respond = responder.object.programs["bench_respond"]

                def measured() -> float:
                    samples = []
                    for _ in range(TEST_RUNS_PER_ROUND):
                        restore_ns = restore.test_run(frame, repeat=repeat).duration_ns
                        samples.append(float(respond.test_run(frame, repeat=repeat).duration_ns - restore_ns))
                    return statistics.median(samples)

                measured()  # warm
                for _ in range(pairs):
                    off.append(measured())
                    active.set()
                    if not running.wait(30):
                        raise SoftdtaError("export benchmark: the exporter process did not start exporting within "
                                           "30 s")
                    on.append(measured())
                    active.clear()
                    _wait_cleared(running, child)
                    exported.append(int(acknowledged.value))
                    exporter_cores.append(round(cores.value, 2))
        finally:
            os.sched_setaffinity(0, cpus)
            quit_.set()
            active.clear()
            child.join(30)
            if child.is_alive():
                child.kill()
    ratios = [after / before for before, after in zip(off, on)]
    return ResponderBesideExport(case=case, pinned=pin, export_rate=int(rate), exported_per_s=exported,
                                 exporter_cores=exporter_cores, off_ns=stats(off), on_ns=stats(on),
                                 ratios=stats(ratios), goal_ratio=GOAL_RESPONDER_RATIO,
                                 met=statistics.median(ratios) <= GOAL_RESPONDER_RATIO)


def _wait_cleared(event: EventType, child: multiprocessing.process.BaseProcess) -> None:
    deadline = time.monotonic() + 60
    while event.is_set():
        if not child.is_alive() or time.monotonic() > deadline:
            raise SoftdtaError("export benchmark: the exporter process did not stop exporting within 60 s")
        time.sleep(0.01)
