"""Where a running translator's tables come from, and where news of its failed queue pairs goes: a tables file,
softdta collectors over the control protocol (links/control.py), or original-DTA collectors over rdma_cm
(links/cm.py)."""

from __future__ import annotations

import queue
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from softdta.core.tables import Tables


class TableSource(Protocol):
    """`start()` gives the first tables; later ones are put on `updates` (or given by `tables()` on demand, a
    SIGHUP), and the translator applies them between ticks. `report_failures` hands the source a way to find the
    translator's failed QPs (local QPNs), so that it can have them re-created; `report_psns` a way to read the PSN
    each QP sends next (local QPN -> PSN), so that a queue pair a collector makes anew starts there."""

    updates: queue.Queue[Tables]

    def start(self) -> Tables: ...

    def tables(self) -> Tables: ...

    def report_failures(self, failed_qpns: Callable[[], set[int]]) -> None: ...

    def report_psns(self, next_psns: Callable[[], dict[int, int]]) -> None: ...

    def close(self) -> None: ...


class TablesFile:
    """Tables from a TOML file (docs/tables.md), read again on every `tables()`; nobody re-creates a failed QP."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.updates: queue.Queue[Tables] = queue.Queue()

    def start(self) -> Tables:
        return self.tables()

    def tables(self) -> Tables:
        return Tables.from_toml(self.path)

    def report_failures(self, failed_qpns: Callable[[], set[int]]) -> None:
        pass

    def report_psns(self, next_psns: Callable[[], dict[int, int]]) -> None:
        pass

    def close(self) -> None:
        pass
