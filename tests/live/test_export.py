"""The export to NATS JetStream against a real nats-server: every Append entry arrives exactly once (by its
de-duplication ID) or is counted as lost, through broker kills, a broker down at start, a stream deleted under
the collector, a full backlog and a collector that stops (cleanly or not) and starts again; a watched key's
state (a flow's decoded postcard path) is published each time it changes.

The collector's memory is the offline collector's (the reference responder), filled by the reference translator,
so each test knows every entry it sent; the exporter and the broker are the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import nats
import pytest

from softdta.collector.export import JOURNAL_FILE, Exporter
from softdta.collector.registration import FleetSettings, current_epoch
from softdta.collector.service import OfflineSource, append_feeds
from softdta.core import workload
from softdta.core.export import (
    COUNT_HEADER,
    KEY_HEADER,
    KIND_HEADER,
    SEQUENCE_HEADER,
    STRUCTURE_HEADER,
    ExportSettings,
    Ledger,
    Watch,
    read_journal,
)
from softdta.core.fleet import SLOT_MAP, fleet_prefix
from softdta.core.offline import OfflineCollector
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.core.workload import ReporterAddress
from softdta.lab.etcd_server import EtcdServer
from softdta.lab.nats_server import NatsServer
from softdta.wire.frames import ip_bytes, mac_bytes
from tests.common import COLLECTOR_IP, EXAMPLE_TABLES, ROOT, ExportedStream, fleet_tables, read_exported

STREAM = "SOFTDTA"
LISTS = 64


@pytest.fixture
def broker(tmp_path):
    server = NatsServer(tmp_path / "nats").start()
    yield server
    server.kill()


class Pipeline:
    """The reference translator writing Append entries into an offline collector, and what it sent per list."""

    def __init__(self) -> None:
        self.tables = Tables.from_toml(EXAMPLE_TABLES)
        self.translator = Translator(self.tables)
        self.collector = OfflineCollector(self.tables)
        self.reporter = ReporterAddress(mac=mac_bytes("02:5d:7a:00:09:01"), ip=ip_bytes("10.77.9.1"),
                                        translator_mac=self.tables.mac, collector_ip=COLLECTOR_IP)
        self.feeds = append_feeds(OfflineSource(self.collector))
        self.sent: dict[int, list[int]] = defaultdict(list)

    def send(self, reports) -> None:
        for report in reports:
            self.sent[report.list_id].append(int.from_bytes(report.data, "big"))
            for frame in self.translator.process(self.reporter.frame(report)).frames:
                self.collector.deliver(frame)

    def flush(self) -> None:
        for frame in self.translator.flush_idle(now_ns=0):
            self.collector.deliver(frame)

    def exporter(self, url: str, data_dir: Path, **settings) -> Exporter:
        return Exporter(ExportSettings(url, **settings), "c1", "10.77.1.1", self.feeds, data_dir)

    @property
    def total(self) -> int:
        return sum(len(values) for values in self.sent.values())


def check_exactly_once(stream: ExportedStream, pipeline: Pipeline, exporter: Exporter) -> dict[str, int]:
    """The strict verdict: copies of one ID are identical; per list the messages tile the sequence space from 0
    with no overlap and no hole; the entries, in order, are what was sent, except where a gap stands for entries
    lost, which the exporter counted. Returns the figures."""
    lists = stream.lists()
    gaps = 0
    for list_id, sent in pipeline.sent.items():
        received, lost_here = lists.get(list_id, ([], 0))
        if lost_here == 0:
            assert received == sent, f"list {list_id}: entries differ from what was sent"
        else:
            assert len(received) + lost_here >= len(sent) and _is_subsequence(received, sent)
        gaps += lost_here
    ledger = exporter.ledger
    assert gaps == ledger.lost + ledger.dropped
    assert ledger.acknowledged + ledger.dropped == ledger.taken and not ledger.backlog
    return {"ids": len(stream.copies), "stored": stream.stored, "gaps": gaps, "taken": ledger.taken}


def _is_subsequence(part: list[int], whole: list[int]) -> bool:
    values = iter(whole)
    return all(any(value == candidate for candidate in values) for value in part)


async def until(condition, within: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.01)


def exported_all(pipeline: Pipeline, exporter: Exporter):
    ledger = exporter.ledger
    return lambda: ledger.taken + ledger.lost >= pipeline.total and not ledger.backlog


async def broker_up_at_last(broker: NatsServer, pipeline: Pipeline, exporter: Exporter, stop: asyncio.Event,
                            task: asyncio.Task) -> ExportedStream:
    """Start the broker that was down, wait until every entry and gap is acknowledged, stop the exporter, and read
    the stream."""
    broker.start()
    try:
        await until(exported_all(pipeline, exporter), 30, "every entry and gap acknowledged once the broker is up")
        stop.set()
        await task
        return await read_exported(broker.url)
    finally:
        broker.kill()


async def run_exporter(exporter: Exporter):
    stop = asyncio.Event()
    return stop, asyncio.create_task(exporter.run(stop))


def test_a_broker_killed_and_restarted_mid_stream_loses_nothing_and_duplicates_nothing(broker, tmp_path):
    """100k Append entries; nats-server is killed with SIGKILL after 30k and started again after 70k."""
    pipeline = Pipeline()
    exporter = pipeline.exporter(broker.url, tmp_path)
    reports = workload.append(100_000, seed=7, lists=LISTS)

    async def scenario():
        stop, task = await run_exporter(exporter)
        for start in range(0, len(reports), 500):
            pipeline.send(reports[start:start + 500])
            if start == 30_000:
                await until(lambda: exporter.ledger.acknowledged > 20_000, 30, "acknowledgements before the kill")
                broker.kill()
            if start == 70_000:
                await until(lambda: not exporter.connected, 30, "the exporter noticing the broker is gone")
                assert exporter.ledger.backlog_entries > 0
                broker.start()
            await asyncio.sleep(0)  # the exporter polls between chunks (a lap is counted, not lost)
        pipeline.flush()
        await until(exported_all(pipeline, exporter), 60, "every entry acknowledged")
        stop.set()
        await task
        return await read_exported(broker.url), await read_exported(broker.url)

    stream, replayed = asyncio.run(scenario())
    assert replayed.copies == stream.copies  # a consumer that replays reads the same messages
    figures = check_exactly_once(stream, pipeline, exporter)
    assert figures["taken"] + exporter.ledger.lost == 100_000
    assert exporter.events["disconnects"] >= 1 and exporter.events["connects"] == 2
    assert stream.stored == len(stream.copies), "JetStream kept two copies of a message ID"


def test_a_broker_down_at_start_gets_everything_once_it_is_up(tmp_path):
    broker = NatsServer(tmp_path / "nats")  # its port chosen, the server not started
    pipeline = Pipeline()
    exporter = pipeline.exporter(broker.url, tmp_path)

    async def scenario():
        stop, task = await run_exporter(exporter)
        pipeline.send(workload.append(5000, seed=1, lists=LISTS))
        pipeline.flush()
        await until(lambda: exporter.ledger.taken == pipeline.total and broker.url in exporter.last_error, 30,
                    "entries taken while the broker is down, which the exporter says")
        assert not exporter.connected and exporter.status()["backlog_entries"] == pipeline.total
        return await broker_up_at_last(broker, pipeline, exporter, stop, task)

    stream = asyncio.run(scenario())
    check_exactly_once(stream, pipeline, exporter)


def test_a_stream_deleted_under_the_collector_is_made_again(broker, tmp_path):
    pipeline = Pipeline()
    exporter = pipeline.exporter(broker.url, tmp_path)

    async def delete_stream() -> None:
        client = await nats.connect(broker.url)
        await client.jetstream().delete_stream(STREAM)
        await client.close()

    async def scenario():
        stop, task = await run_exporter(exporter)
        pipeline.send(workload.append(2000, seed=2, lists=LISTS))
        pipeline.flush()
        await until(exported_all(pipeline, exporter), 30, "the first entries acknowledged")
        await delete_stream()
        before = dict(pipeline.sent)
        pipeline.sent.clear()
        pipeline.send(workload.append(3000, seed=3, lists=LISTS))
        pipeline.flush()
        await until(lambda: exporter.ledger.taken == 5000 and not exporter.ledger.backlog, 30,
                    "the entries after the deletion acknowledged")
        stop.set()
        await task
        return before, await read_exported(broker.url)

    _, stream = asyncio.run(scenario())
    assert exporter.events["stream_recreated"] == 1
    # the new stream holds exactly the entries taken after the deletion, each once
    entries = sum(count for copies in stream.copies.values() for headers, _ in copies[:1]
                  for count in [int(headers[COUNT_HEADER])])
    assert entries == 3000 and stream.stored == len(stream.copies)


def test_a_full_backlog_drops_the_oldest_entries_as_counted_gaps(tmp_path):
    broker = NatsServer(tmp_path / "nats")
    pipeline = Pipeline()
    exporter = pipeline.exporter(broker.url, tmp_path, backlog_entries=1000)

    async def scenario():
        stop, task = await run_exporter(exporter)
        for seed in range(10):  # 10 x 500 entries into 64 rings of 256: never a lap
            pipeline.send(workload.append(500, seed=seed, lists=LISTS))
            await until(lambda: exporter.ledger.taken + exporter.ledger.lost >= pipeline.total - 3 * LISTS, 10,
                        "the exporter taking what was sent")
        pipeline.flush()
        await until(lambda: exporter.ledger.taken == pipeline.total, 10, "everything taken")
        assert exporter.ledger.backlog_entries <= 1000 and exporter.ledger.dropped >= 4000
        return await broker_up_at_last(broker, pipeline, exporter, stop, task)

    stream = asyncio.run(scenario())
    figures = check_exactly_once(stream, pipeline, exporter)
    assert figures["gaps"] == exporter.ledger.dropped and exporter.ledger.lost == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the abandoned loop's tasks
@pytest.mark.parametrize("stop", ["clean", "abandoned"])
def test_a_collector_restart_publishes_no_entry_twice(broker, tmp_path, stop):
    """A first exporter takes entries while the broker is down, then stops cleanly, or is abandoned mid-run as a
    kill -9 leaves it (its journal as written, its tasks never finished); a second one over the same memory and
    data_dir sends them, and the later entries, under the same IDs."""
    pipeline = Pipeline()
    first = pipeline.exporter(broker.url, tmp_path)
    pipeline.send(workload.append(3000, seed=4, lists=LISTS))
    pipeline.flush()

    async def publish_some():
        halt, task = await run_exporter(first)
        await until(lambda: first.ledger.acknowledged > 0 and first.ledger.taken == 3000, 30,
                    "the first exporter publishing")
        broker.kill()  # what it has not had acknowledged yet stays in its journal
        pipeline.send(workload.append(1000, seed=5, lists=LISTS))
        pipeline.flush()
        await until(lambda: first.ledger.taken == 4000 and not first.connected, 30,
                    "the first exporter taking more, and noticing the broker is gone")
        if stop == "clean":
            halt.set()
            await task

    loop = asyncio.new_event_loop()
    loop.run_until_complete(publish_some())
    loop.close()  # "abandoned": the tasks never run again, nothing more is journaled
    gc.collect()  # the abandoned tasks end now, under this test's filter, and not in whichever test runs next
    acknowledged = first.ledger.acknowledged
    assert 0 < acknowledged < 4000
    broker.start()
    second = pipeline.exporter(broker.url, tmp_path)
    assert second.incarnation == first.incarnation
    assert second.ledger.backlog_entries == 4000 - acknowledged

    async def the_rest():
        halt, task = await run_exporter(second)
        pipeline.send(workload.append(1000, seed=6, lists=LISTS))
        pipeline.flush()
        await until(lambda: second.ledger.taken == 1000 and not second.ledger.backlog, 30, "the rest acknowledged")
        halt.set()
        await task
        return await read_exported(broker.url)

    stream = asyncio.run(the_rest())
    assert stream.stored == len(stream.copies)
    total = sum(int(copies[0][0][COUNT_HEADER]) for copies in stream.copies.values())
    assert total == pipeline.total == 5000
    stream.lists()  # each list's messages tile its sequence numbers from 0


def test_watched_postcard_paths_are_published_each_time_they_change_and_not_again_after_a_restart(broker, tmp_path):
    pipeline = Pipeline()
    switch_ids = list(range(1, 1025))
    reports = workload.postcards(40, seed=5, switch_ids=switch_ids)
    flows = sorted({report.key for report in reports})
    hops = sorted(reports, key=lambda report: report.hop)
    paths = {key: [int.from_bytes(report.data, "big") for report in hops if report.key == key] for key in flows}
    watch = Watch("postcarding", tuple(key.hex() for key in flows), (("value_set", switch_ids),), every_s=0.02)
    source = OfflineSource(pipeline.collector)

    def exporter() -> Exporter:
        return Exporter(ExportSettings(broker.url, watches=(watch,)), "c1", "10.77.1.1", pipeline.feeds, tmp_path,
                        structures=source)

    first = exporter()

    async def scenario():
        stop, task = await run_exporter(first)
        await until(lambda: first.ledger.states_acknowledged == len(flows), 30, "the empty paths published")
        pipeline.send(reports)
        pipeline.flush()
        await until(lambda: first.ledger.states_acknowledged == 2 * len(flows), 30, "the decoded paths published")
        stop.set()
        await task
        return await read_exported(broker.url)

    stream = asyncio.run(scenario())
    states = defaultdict(list)
    for copies in stream.copies.values():
        headers, data = copies[0]
        assert headers[KIND_HEADER] == "state" and headers[STRUCTURE_HEADER] == "postcarding@10.77.1.1"
        states[headers[KEY_HEADER]].append((int(headers[SEQUENCE_HEADER]), json.loads(data)))
    assert stream.stored == len(stream.copies) == 2 * len(flows)
    for key in flows:
        (first_version, empty), (second_version, decoded) = sorted(states[key.hex()], key=lambda state: state[0])
        assert (first_version, second_version) == (0, 1)
        assert empty["path"] == [None] * len(paths[key]) and not empty["complete"]
        assert decoded["path"] == paths[key] and decoded["complete"]

    second = exporter()  # the journal gives it every key's last state: nothing changed, nothing is sent
    assert second.poll_watches(now=0.0) == 0 and not second.ledger.backlog


def test_the_documented_consumer_reads_every_entry_once_from_a_plain_shell(broker, tmp_path):
    """examples/export_consumer.py, as docs/export.md shows it, in an environment holding only PATH and HOME."""
    pipeline = Pipeline()
    exporter = pipeline.exporter(broker.url, tmp_path)
    pipeline.send(workload.append(3000, seed=8, lists=LISTS))
    pipeline.flush()

    async def scenario():
        stop, task = await run_exporter(exporter)
        await until(exported_all(pipeline, exporter), 30, "every entry acknowledged")
        stop.set()
        await task

    asyncio.run(scenario())
    messages = len(asyncio.run(read_exported(broker.url)).copies)
    home = tmp_path / "home"
    home.mkdir()
    result = subprocess.run([sys.executable, "examples/export_consumer.py", broker.url, "--messages", str(messages)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home)})
    assert result.returncode == 0, result.stderr
    printed: dict[int, list[int]] = defaultdict(list)
    for line in result.stdout.splitlines():
        where, value = line.split(": ")
        printed[int(where.split()[2])].append(int(value))
    assert printed == pipeline.sent


@pytest.mark.privileged
def test_a_full_disk_under_the_journal_leaves_the_entries_in_their_rings_until_it_has_room(broker, tmp_path, caplog):
    data_dir = tmp_path / "disk"
    data_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(data_dir)], check=True)
    try:
        pipeline = Pipeline()
        exporter = pipeline.exporter(broker.url, data_dir)
        filler = data_dir / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as file:
            while True:
                file.write(bytes(4096))
                file.flush()

        async def scenario():
            stop, task = await run_exporter(exporter)
            pipeline.send(workload.append(2000, seed=9, lists=LISTS))
            pipeline.flush()
            await until(lambda: exporter.events["journal_failures"] >= 3, 30, "the journal refusing writes")
            assert exporter.ledger.taken == 0 and not exporter.ledger.backlog  # nothing taken it could not keep
            filler.unlink()
            await until(exported_all(pipeline, exporter), 30, "every entry acknowledged once the disk has room")
            stop.set()
            await task
            return await read_exported(broker.url)

        stream = asyncio.run(scenario())
        check_exactly_once(stream, pipeline, exporter)
        said = [record.getMessage() for record in caplog.records if "journal" in record.getMessage()]
        assert len(said) == 2 and "No space left on device" in said[0] and "takes writes again" in said[1]
        journal = read_journal((data_dir / JOURNAL_FILE).read_bytes())
        assert Ledger.replayed(journal.messages).next_sequence == exporter.ledger.next_sequence  # it holds them all
    finally:
        subprocess.run(["umount", "--lazy", str(data_dir)], check=True)


def test_the_epoch_stamped_on_exports_is_the_fleets_slot_map_epoch(tmp_path):
    """What `collector up --fleet` stamps (daemon.follow_fleet_epoch reads it every second): the slot map's epoch in
    a real etcd, and the last one known while etcd is away or holds no map."""
    _, slot_map = fleet_tables()
    with EtcdServer(tmp_path / "etcd") as etcd:
        settings = FleetSettings(etcd.endpoint, "f1")
        assert current_epoch(settings, known=0) == 0  # no map yet
        etcd.client().put(fleet_prefix("f1") + SLOT_MAP, slot_map.to_json())
        assert current_epoch(settings, known=0) == slot_map.epoch
        etcd.client().put(fleet_prefix("f1") + SLOT_MAP, "not a slot map")
        assert current_epoch(settings, known=slot_map.epoch) == slot_map.epoch
    assert current_epoch(settings, known=slot_map.epoch) == slot_map.epoch  # etcd stopped
