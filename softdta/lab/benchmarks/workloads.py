"""What every benchmark shares: the example tables and their reporter, the reports per primitive, and how a
timing is summed up (the median of ROUNDS rounds, with its min and max)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TypedDict

from softdta.core import workload
from softdta.core.tables import Structure, Tables
from softdta.errors import SoftdtaError
from softdta.spec import DtaOpcode
from softdta.wire import dta
from softdta.wire.frames import ip_bytes, mac_bytes

ROOT = Path(__file__).resolve().parents[3]
COLLECTOR_IP = ip_bytes("10.77.1.1")
ROUNDS = 5


class Stats(TypedDict):
    """A timing or rate over several rounds."""

    median: float
    min: float
    max: float
    rounds: int


def stats(samples: list[float]) -> Stats:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "rounds": len(samples)}


def example_tables() -> Tables:
    """The example tables (examples/tables.toml), which every benchmark translates with."""
    return Tables.from_toml(ROOT / "examples" / "tables.toml")


def example_reporter(tables: Tables) -> workload.ReporterAddress:
    """A reporter that sends to the example tables' collector."""
    return workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac, COLLECTOR_IP)


def sketch_structure(tables: Tables) -> Structure:
    """The Sketch-Merge area the example tables give their collector."""
    sketch = tables.structure(COLLECTOR_IP, DtaOpcode.SKETCH_MERGE)
    if sketch is None:
        raise SoftdtaError("the benchmark tables have no Sketch-Merge structure for the collector 10.77.1.1",
                           hint="benchmark with examples/tables.toml, which has one")
    return sketch


def primitive_workloads(tables: Tables, count: int) -> dict[str, list[dta.Report]]:
    """Reports per primitive, as the example tables hold them."""
    lists = tables.append_lists[0]
    sketch = sketch_structure(tables)
    return {
        "key-write": workload.key_write(count, 1, 2),
        "key-increment": workload.key_increment(count, 2, 2, flows=200),
        "append": workload.append(count, 3, lists.lists, lists.first_list),
        "postcarding": workload.postcards(max(1, count // 5), 4, 5),
        "sketch-merge": workload.sketch_epoch(sketch.reporters, sketch.columns, sketch.rows, 5),
    }
