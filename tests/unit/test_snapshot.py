"""Snapshots as Parquet and SQL over them: a collector filled by the reference translator with every primitive,
snapshot through the query service's POST /snapshot into real files, read back with pyarrow and DuckDB and
compared with what the translator wrote (replayed from the reports)."""

import asyncio
import errno
import os
import re
import subprocess
from collections import defaultdict
from datetime import datetime, timezone

import numpy as np
import pyarrow.parquet as pq
import pytest
import uvloop

from softdta.collector.service import OfflineSource, serve
from softdta.collector.snapshot import SnapshotError, Snapshots, SnapshotTable
from softdta.collector.warehouse import WarehouseError, query
from softdta.core import workload
from softdta.core.primitives.key_write.queries import key_write_snapshot
from softdta.core.primitives.key_write.region import KeyWriteRegion
from softdta.spec import DtaOpcode
from softdta.wire.hashing import key_checksum, key_slot
from tests.unit import test_service as service_tests
from tests.unit.test_service import TAKE, TOKEN, Service, flush, new_pipeline, send

filled = service_tests.filled  # the fixtures: a collector the translator filled with every primitive but Append,
start_service = service_tests.start_service  # and a query service over one

WHEN = datetime(2026, 11, 28, 1, 2, 3, 456789, tzinfo=timezone.utc)


def snapshot_of(service, directory):
    """POST /snapshot: the files of the snapshot written, as {table: pyarrow table}."""
    answer = service.call("POST", "/snapshot", headers=TAKE)
    files = answer["files"]
    assert all(path.startswith(str(directory)) for path in files)
    return {os.path.basename(path).removesuffix(".parquet"): pq.read_table(path) for path in files}, answer


@pytest.fixture
def snapshot_service(filled, start_service, tmp_path):
    class WithSnapshots(Service):
        def __init__(self, source, token, snapshots):
            self.loop = asyncio.Runner(loop_factory=uvloop.new_event_loop)
            self.server = self.loop.run(serve(source, "127.0.0.1", 0, token, snapshots))
            self.http = self.loop.run(self._session(f"http://127.0.0.1:{self.server.addresses[0][1]}"))

    started = []

    def start(collector, directory=tmp_path / "snapshots", **options):
        snapshots = Snapshots(directory, options.pop("name", "c1"), **options)
        started.append(WithSnapshots(OfflineSource(collector), TOKEN, snapshots))
        return started[-1], snapshots

    yield start
    for service in started:
        service.close()


def key_write_truth(filled):
    """Slot -> (checksum, big-endian value) as the translator wrote them, later writes winning."""
    structure = filled.structure(DtaOpcode.KEY_WRITE)
    slots = {}
    for report in filled.key_write:
        for copy in range(report.redundancy):
            slot = key_slot(report.key, copy, structure.slot_count, structure.key_hash)
            slots[slot] = (key_checksum(report.key), int.from_bytes(report.data, "big"))
    return slots


def test_every_primitive_decodes_to_what_the_translator_wrote(filled, snapshot_service, tmp_path):
    service, snapshots = snapshot_service(filled.collector)
    tables, answer = snapshot_of(service, tmp_path / "snapshots")
    assert set(tables) == {"key_write", "key_increment", "postcarding", "sketch_merge", "append"}
    assert tables["append"].num_rows == 0  # this collector's Append lists are empty

    key_write = tables["key_write"].to_pydict()
    truth = key_write_truth(filled)
    assert sorted(key_write["slot"]) == sorted(truth)
    assert {slot: (checksum, value) for slot, checksum, value in
            zip(key_write["slot"], key_write["checksum"], key_write["value"])} == truth

    structure = filled.structure(DtaOpcode.KEY_INCREMENT)
    counters = defaultdict(int)
    for report in filled.key_increment:
        for copy in range(report.redundancy):
            counters[key_slot(report.key, copy, structure.slot_count, structure.key_hash)] += report.counter
    key_increment = tables["key_increment"].to_pydict()
    assert dict(zip(key_increment["slot"], key_increment["counter"])) == dict(counters)

    sketch = tables["sketch_merge"].to_pydict()
    merged = service.call("GET", "/sketch-merge/sketch-merge@10.77.1.1")["matrix"]
    assert len(sketch["value"]) == len(merged) * len(merged[0])
    assert all(merged[column][row] == value for column, row, value in zip(sketch["column"], sketch["row"],
                                                                           sketch["value"]))
    assert any(sketch["value"])

    postcards = tables["postcarding"].to_pydict()
    region = filled.region(DtaOpcode.POSTCARDING)
    occupied = np.flatnonzero(region.occupied())
    assert postcards["slot"] == occupied.tolist()
    hops = filled.structure(DtaOpcode.POSTCARDING).hops
    assert [name for name in tables["postcarding"].column_names if name.startswith("hop_")] == \
        [f"hop_{hop}" for hop in range(hops)]
    assert np.array([postcards[f"hop_{hop}"] for hop in range(hops)]).T.tolist() == \
        region.values[occupied].tolist()

    for table in (table for table in tables.values() if table.num_rows):
        columns = table.to_pydict()
        assert set(columns["collector"]) == {"c1"} and set(columns["epoch"]) == {0}
        assert len(set(columns["time"])) == 1 and next(iter(columns["time"])).tzinfo is not None
    assert answer["rows"] == {name: table.num_rows for name, table in tables.items()}
    assert snapshots.written == 1 and snapshots.failed == 0
    assert 'softdta_snapshots_total{result="written"} 1.0' in service.call("GET", "/metrics")


def test_append_lists_are_snapshot_oldest_first_and_nothing_is_taken(snapshot_service, tmp_path):
    tables, translator, collector, reporter = new_pipeline()
    reports = workload.append(1000, seed=4, lists=16)
    send(translator, collector, reporter, reports)
    flush(translator, collector)
    service, _ = snapshot_service(collector)
    service.call("POST", "/append/append0@10.77.1.1?list=3", headers=TAKE)  # list 3: taken before the snapshot
    service.call("GET", "/append/append0@10.77.1.1")
    snapshot, _ = snapshot_of(service, tmp_path / "snapshots")
    append = snapshot["append"].to_pydict()
    got = defaultdict(list)
    for list_id, position, entry in zip(append["list_id"], append["position"], append["entry"]):
        assert position == len(got[list_id])
        got[list_id].append(entry)
    sent = {list_id: [int.from_bytes(r.data, "big") for r in reports if r.list_id == list_id]
            for list_id in range(16) if list_id != 3}
    assert dict(got) == sent
    waiting = service.call("POST", "/append/append0@10.77.1.1", headers=TAKE)["lists"]  # still there to take
    assert {int(list_id): listed["entries"] for list_id, listed in waiting.items()} == sent


def test_a_snapshot_needs_the_token_and_a_directory(filled, snapshot_service, start_service):
    service, snapshots = snapshot_service(filled.collector)
    service.call("POST", "/snapshot", status=401)
    service.call("POST", "/snapshot", status=401, headers={"Authorization": "Bearer wrong"})
    assert snapshots.written == 0
    without = start_service(OfflineSource(filled.collector))
    assert "set [snapshot] dir" in without.call("POST", "/snapshot", status=409, headers=TAKE)["error"]


def failing_parts(directory, seen):
    """A table's parts that fail after the first one was written, checking meanwhile that no .parquet file of it
    is visible yet. A part is taken while the one before it is written: when the third is asked for, the first
    was written."""
    yield {"slot": np.arange(10, dtype=np.uint32)}
    yield {"slot": np.arange(10, 20, dtype=np.uint32)}
    seen.extend(path.name for path in directory.rglob("*") if path.is_file())
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failing_write_leaves_no_file_and_says_so_in_one_line(tmp_path):
    lines = []
    snapshots = Snapshots(tmp_path, "c1", log=lines.append)
    seen = []
    good = SnapshotTable("first", [{"value": np.arange(5, dtype=np.uint64)}])
    with pytest.raises(SnapshotError) as raised:
        snapshots.write([good, SnapshotTable("second", failing_parts(tmp_path, seen))], WHEN)
    assert seen and all(re.fullmatch(r"(first\.parquet|\.second\.parquet\.\d+\.tmp)", name) for name in seen), seen
    assert [name for name in seen if name.endswith(".tmp")]  # it was being written, under a hidden name
    assert list(tmp_path.rglob("*.parquet")) == [] and list(tmp_path.rglob("*.tmp")) == []
    assert not (tmp_path / "c1" / "20261128T010203.456789Z").exists()
    assert "No space left on device (ENOSPC)" in raised.value.line() and "free space" in raised.value.line()
    assert lines == [raised.value.line()] and "\n" not in lines[0]
    assert (snapshots.written, snapshots.failed) == (0, 1)
    written = snapshots.write([good], WHEN)
    assert [path.name for path in written.files] == ["first.parquet"] and snapshots.written == 1


def test_fixed_size_values_and_the_columns_every_file_has(tmp_path):
    raw = bytearray(16 * 16)
    region = KeyWriteRegion(raw, 16, 12)
    region.checksums[3] = 7
    region.data[3] = np.arange(12, dtype=np.uint8)
    region.data[9, 0] = 1  # written with a zero checksum: still occupied
    snapshots = Snapshots(tmp_path, "edge-1", epoch=lambda: 41)
    written = snapshots.write([SnapshotTable("key_write", key_write_snapshot(region, rows=4))], WHEN)
    table = pq.read_table(written.files[0])
    assert table.num_rows == 2 and pq.ParquetFile(written.files[0]).num_row_groups == 2  # parts as row groups
    assert str(table.schema.field("value").type) == "fixed_size_binary[12]"
    assert str(table.schema.field("collector").type) == "string"
    assert str(table.schema.field("time").type) == "timestamp[us, tz=UTC]"
    rows = table.to_pylist()
    assert [(row["slot"], row["checksum"], row["value"]) for row in rows] == \
        [(3, 7, bytes(range(12))), (9, 0, b"\x01" + bytes(11))]
    assert {(row["collector"], row["epoch"], row["time"]) for row in rows} == {("edge-1", 41, WHEN)}


def test_sql_joins_snapshots_of_two_collectors(filled, snapshot_service, tmp_path):
    root = tmp_path / "warehouse"
    for name in ("c1", "c2"):
        service, _ = snapshot_service(filled.collector, directory=root / f"site-{name}", name=name)
        service.call("POST", "/snapshot", headers=TAKE)
    counts = query(root, "SELECT collector, count(*) AS slots FROM key_write GROUP BY collector ORDER BY collector")
    occupied = int(np.count_nonzero(filled.region(DtaOpcode.KEY_WRITE).occupied()))
    assert counts.columns == ["collector", "slots"] and counts.rows == [("c1", occupied), ("c2", occupied)]
    joined = query(root, "SELECT w.collector, count(*) FROM key_write w JOIN key_increment i "
                         "ON w.collector = i.collector AND w.slot = i.slot GROUP BY ALL ORDER BY 1")
    assert [row[0] for row in joined.rows] == ["c1", "c2"] and joined.rows[0][1] > 0
    with pytest.raises(WarehouseError, match="the statement failed: .*key_writ") as refused:
        query(root, "SELECT * FROM key_writ")
    assert "the tables are append, key_increment, key_write, postcarding, sketch_merge" in refused.value.line()
    (tmp_path / "empty").mkdir()
    with pytest.raises(WarehouseError, match="no snapshots"):
        query(tmp_path / "empty", "SELECT 1")
    with pytest.raises(WarehouseError, match="no such directory"):
        query(tmp_path / "missing", "SELECT 1")


@pytest.mark.privileged
@pytest.mark.parametrize("mount_options,words", [("size=4k", "No space left on device (ENOSPC)"),
                                                 ("ro", "Read-only file system (EROFS)")])
def test_a_full_or_read_only_disk_keeps_the_service_running(filled, snapshot_service, tmp_path, mount_options,
                                                             words, capfd):
    mountpoint = tmp_path / "disk"
    mountpoint.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", mount_options, "tmpfs", str(mountpoint)], check=True)
    try:
        service, snapshots = snapshot_service(filled.collector, directory=mountpoint)
        error = service.call("POST", "/snapshot", status=507, headers=TAKE)["error"]
        assert words in error
        assert service.call("GET", "/health")["status"] == "ok"
        metrics = service.call("GET", "/metrics")
        assert 'softdta_snapshots_total{result="failed"} 1.0' in metrics
        assert 'softdta_snapshots_total{result="written"} 0.0' in metrics
        assert list(mountpoint.rglob("*.parquet")) == [] and list(mountpoint.rglob("*.tmp")) == []
        said = [line for line in capfd.readouterr().err.splitlines() if "snapshot" in line]
        assert len(said) == 1 and words in said[0]
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


def test_a_plug_in_without_a_snapshot_is_skipped_in_one_line(snapshot_service, tmp_path):
    from softdta.core import registry
    from softdta.core.offline import OfflineCollector
    from softdta.core.tables import Tables
    from tests.primitives.key_max import KeyMax
    from tests.unit.test_adding_a_primitive import COLLECTOR, TABLES

    registry.register(KeyMax)
    try:
        lines = []
        service, snapshots = snapshot_service(OfflineCollector(Tables.from_dict(TABLES)), log=lines.append)
        for _ in range(2):
            assert service.call("POST", "/snapshot", headers=TAKE)["files"] == []
        assert lines == [f"snapshots skip key-max@{COLLECTOR}: primitive key-max declares no snapshot "
                         "(Primitive.snapshot)"]
        assert snapshots.written == 2
    finally:
        registry.unregister(KeyMax)
