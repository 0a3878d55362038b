"""`softdta collector snapshot` and `softdta query sql` as a user types them: the console script in a plain shell's
environment, against two real `softdta collector up` processes (xdp backend, not attached to an interface), one
snapshot on request and one on its own period; DuckDB then reads both collectors' snapshots together."""

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.common import ROOT, wait_for_line
from tests.live.test_commands_from_a_plain_shell import console_script, failed_in_one_line, plain_environment  # noqa

pytestmark = pytest.mark.privileged

TOKEN = "snapshot-test-token"


def free_ports(count: int) -> list[int]:
    holders = [socket.socket() for _ in range(count)]
    for holder in holders:
        holder.bind(("127.0.0.1", 0))
    ports = [holder.getsockname()[1] for holder in holders]
    for holder in holders:
        holder.close()
    return ports


def collector_config(tmp_path: Path, name: str, snapshot: str = "") -> Path:
    control, query = free_ports(2)
    text = (ROOT / "examples" / "collector.toml").read_text()
    text = text.replace('name = "c1"', f'name = "{name}"').replace('data_dir = "c1-data"', f'data_dir = "{name}-data"')
    text = text.replace("change-me", TOKEN).replace("control_port = 40050", f"control_port = {control}")
    text = text.replace("query_port = 8040", f"query_port = {query}")
    path = tmp_path / f"{name}.toml"
    path.write_text(text + snapshot)
    return path


@pytest.fixture
def run(console_script, tmp_path):  # noqa: F811 (the fixture of the plain-shell tests)
    home = tmp_path / "home"
    home.mkdir()
    started: list[subprocess.Popen] = []

    def softdta(*args, background: bool = False):
        command = [console_script, *map(str, args)]
        if background:
            started.append(subprocess.Popen(command, cwd=tmp_path, env=plain_environment(home), text=True,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            return started[-1]
        return subprocess.run(command, cwd=tmp_path, env=plain_environment(home), capture_output=True, text=True,
                              timeout=120)

    yield softdta
    for process in started:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0, process.stderr.read()


def test_snapshots_of_two_collectors_and_sql_over_them(run, tmp_path):
    name = f"snap{os.getpid() % 100000}"
    first = collector_config(tmp_path, f"{name}a")  # snapshots in its data_dir/snapshots
    second = collector_config(tmp_path, f"{name}b", '\n[snapshot]\ndir = "warehouse/b"\n')
    for config in (first, second):
        wait_for_line(run("collector", "up", "--config", config, *(["--snapshot-every", 0.5] if config == second
                                                                    else []), background=True), " up: ", timeout=60)

    taken = run("collector", "snapshot", "--config", first)
    assert taken.returncode == 0, taken.stderr
    files = [Path(line) for line in taken.stdout.split()]
    data = tmp_path / f"{name}a-data" / "snapshots" / f"{name}a"
    assert sorted(path.name for path in files) == ["append.parquet", "key_increment.parquet", "key_write.parquet",
                                                   "postcarding.parquet", "sketch_merge.parquet"]
    assert all(path.parent.parent == data and path.is_file() for path in files)
    assert pq.read_table(files[0]).schema.names[:3] == ["collector", "epoch", "time"]

    periodic = tmp_path / "warehouse" / "b" / f"{name}b"
    deadline = time.monotonic() + 30
    while len(list(periodic.glob("*/sketch_merge.parquet"))) < 2:  # two periods written
        assert time.monotonic() < deadline, f"no two periodic snapshots in {periodic}"
        time.sleep(0.1)

    first_snapshots = ("SELECT collector, sum(value) AS total, count(*) AS cells FROM sketch_merge s WHERE time = "
                       "(SELECT min(time) FROM sketch_merge WHERE collector = s.collector) GROUP BY collector "
                       "ORDER BY collector")
    grouped = run("query", "sql", first_snapshots,
                  "--dir", tmp_path, "--json")
    assert grouped.returncode == 0, grouped.stderr
    assert grouped.stdout.splitlines() == [
        f'{{"collector": "{name}{suffix}", "total": 0, "cells": 256}}' for suffix in "ab"]
    table = run("query", "sql", "SELECT count(*) AS slots FROM key_write", "--dir", tmp_path / f"{name}a-data")
    assert table.stdout.split() == ["slots", "0"]

    failed_in_one_line(run("query", "sql", "SELECT * FROM no_such_table", "--dir", tmp_path), "no_such_table")
    failed_in_one_line(run("query", "sql", "SELECT 1", "--dir", tmp_path / "missing"), "no such directory")
    failed_in_one_line(run("query", "sql", "SELECT 1", "--dir", tmp_path / "home"), "no snapshots")
    metrics = run("query", "metrics", "--url", "http://127.0.0.1:" + first.read_text().split("query_port = ")[1]
                  .split()[0])
    assert 'softdta_snapshots_total{result="written"} 1.0' in metrics.stdout
