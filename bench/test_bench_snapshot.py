"""Snapshots as Parquet and SQL over them (docs/export.md): a snapshot of a 1 GiB Key-Write region (goal: 5 s), and
DuckDB answering a GROUP BY over 10 snapshots of it (goal: 2 s). With --benchmark-disable, a 16 MiB region.

The region has 8-byte slots (u32 checksum, 4-byte data), a fraction of them written with random checksums and
values (`fill`: 0.1 is a store at load factor 0.1, 1.0 every slot written, the most rows a snapshot can have)."""

import shutil

import numpy as np
import pytest

from bench.conftest import benchmarks_disabled
from softdta.collector.snapshot import SNAPSHOT_ROWS, Snapshots, SnapshotTable
from softdta.collector.warehouse import query
from softdta.core.primitives.key_write.queries import key_write_snapshot
from softdta.core.primitives.key_write.region import KeyWriteRegion

GIB = 1 << 30
SNAPSHOT_GOAL_S = 5.0
GROUP_BY_GOAL_S = 2.0


def key_write_region(size: int, fill: float, seed: int = 1) -> KeyWriteRegion:
    raw = np.zeros(size, dtype=np.uint8)
    region = KeyWriteRegion(raw, 8, 4)
    rng = np.random.default_rng(seed)
    words = raw.view("<u8")
    written = rng.random(region.slot_count) < fill
    words[written] = rng.integers(1, 1 << 63, size=int(np.count_nonzero(written)), dtype=np.uint64)
    return region


@pytest.fixture(scope="module")
def region_size(pytestconfig) -> int:
    return 16 << 20 if benchmarks_disabled(pytestconfig) else GIB


@pytest.mark.parametrize("fill", [0.1, 0.5, 1.0])
def test_snapshot_of_a_key_write_region(benchmark, region_size, fill, tmp_path):
    region = key_write_region(region_size, fill)
    occupied = int(np.count_nonzero(region.occupied()))
    snapshots = Snapshots(tmp_path, "bench")

    def snapshot():
        shutil.rmtree(tmp_path / "bench", ignore_errors=True)
        return snapshots.write([SnapshotTable("key_write", key_write_snapshot(region, SNAPSHOT_ROWS))])

    benchmark.group = "snapshot"
    written = benchmark.pedantic(snapshot, rounds=3, iterations=1)
    assert written.rows == {"key_write": occupied}
    benchmark.extra_info.update(region_bytes=region_size, rows=occupied, file_bytes=written.files[0].stat().st_size,
                                goal_s=SNAPSHOT_GOAL_S)


def test_group_by_over_ten_snapshots(benchmark, region_size, tmp_path):
    region = key_write_region(region_size, 0.1)
    for collector in range(10):
        Snapshots(tmp_path, f"c{collector}").write([SnapshotTable("key_write", key_write_snapshot(region,
                                                                                                  SNAPSHOT_ROWS))])
    statement = "SELECT collector, count(*) AS slots, sum(value) AS total FROM key_write GROUP BY collector"
    benchmark.group = "sql"
    answer = benchmark.pedantic(query, args=(tmp_path, statement), rounds=5, iterations=1)
    occupied = int(np.count_nonzero(region.occupied()))
    assert sorted(answer.rows) == sorted((f"c{collector}", occupied, int(region.data.view(">u4").astype(np.uint64)
                                                                            .sum())) for collector in range(10))
    benchmark.extra_info.update(snapshots=10, rows=10 * occupied, goal_s=GROUP_BY_GOAL_S)
