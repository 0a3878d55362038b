"""Snapshots as Parquet: a collector's structures and Append ranges, decoded by their primitives
(`Primitive.snapshot`, `append.queries.append_snapshot`), written with pyarrow (docs/export.md, "Snapshots as
Parquet").

One snapshot is a directory `<dir>/<collector>/<UTC time>/` with one file per table, `<table>.parquet`. Every
file also has the columns collector (string), epoch (int64: the fleet's slot-map epoch, 0 outside a fleet) and
time (timestamp, UTC: when the snapshot was taken). Each file is written to a hidden temporary file in the same
directory, fsynced and renamed, so a reader never sees part of one; a snapshot that fails removes what it wrote.
Each part a primitive decodes becomes one row group, so memory stays bounded whatever the region's size.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from softdta.core.primitives.base import SnapshotColumns
from softdta.errors import SoftdtaError

SNAPSHOT_ROWS = 1 << 21  # slots a primitive decodes per part: one row group, a bounded share of memory


class SnapshotError(SoftdtaError, OSError):
    """A snapshot could not be written; the collector keeps running and the message names the fix."""


@dataclass(frozen=True)
class SnapshotTable:
    """One table of a snapshot: its name (the file's) and its content, part by part (`Primitive.snapshot`)."""

    name: str
    parts: Iterable[SnapshotColumns]


@dataclass
class Snapshot:
    """A snapshot written: its files, and the rows of each table."""

    directory: Path
    files: list[Path] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)


def log_to_stderr(line: str) -> None:
    print(f"softdta: {line}", file=sys.stderr, flush=True)


class Snapshots:
    """Writes a collector's snapshots under `directory`, one at a time (the caller serializes them), and counts
    them: `written`, `failed`. `every` is the period of the collector's own snapshots (None: on request only);
    `epoch` gives the fleet's epoch now (0 outside a fleet)."""

    def __init__(self, directory: Path, collector: str, *, every: float | None = None,
                 epoch: Callable[[], int] = lambda: 0, log: Callable[[str], None] = log_to_stderr):
        self.directory = directory
        self.collector = collector
        self.every = every
        self.epoch = epoch
        self.log = log
        self.written = self.failed = 0
        self.skipped: set[str] = set()

    def skip(self, structure: str, primitive: str) -> None:
        """A structure whose primitive declares no snapshot: said once."""
        if structure not in self.skipped:
            self.skipped.add(structure)
            self.log(f"snapshots skip {structure}: primitive {primitive} declares no snapshot (Primitive.snapshot)")

    def write(self, tables: list[SnapshotTable], now: datetime | None = None) -> Snapshot:
        """Write one snapshot of `tables`; raises SnapshotError (and counts a failure) if it cannot, leaving no
        file of it behind."""
        taken = now or datetime.now(timezone.utc)
        snapshot = Snapshot(self.directory / self.collector / taken.strftime("%Y%m%dT%H%M%S.%fZ"))
        from softdta.collector.parquet import ArrowException, write_atomically  # pyarrow: where snapshots are taken
        try:
            epoch = self.epoch()
            snapshot.directory.mkdir(parents=True, exist_ok=True)
            for table in tables:
                path = snapshot.directory / f"{table.name}.parquet"
                snapshot.rows[table.name] = write_atomically(path, table.parts, self.collector, epoch, taken)
                snapshot.files.append(path)
            _fsync_directory(snapshot.directory)
            _fsync_directory(snapshot.directory.parent)
        except (OSError, ArrowException) as error:
            self.failed += 1
            _remove(snapshot)
            problem = SnapshotError(f"snapshot into {self.directory} failed: {_reason(error)}",
                                    hint=_fix(error, self.directory))
            self.log(problem.line())
            raise problem from None
        self.written += 1
        return snapshot


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _remove(snapshot: Snapshot) -> None:
    """What a failed snapshot wrote: its files, then its directory if nothing else is in it."""
    for path in snapshot.files:
        with contextlib.suppress(OSError):
            path.unlink()
    with contextlib.suppress(OSError):
        snapshot.directory.rmdir()


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno is not None and error.errno in errno.errorcode:
        return f"{error.strerror} ({errno.errorcode[error.errno]})"
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _fix(error: BaseException, directory: Path) -> str:
    code = error.errno if isinstance(error, OSError) else None
    if code in (errno.ENOSPC, errno.EDQUOT):
        return f"free space on the filesystem of {directory}, or set [snapshot] dir to another one"
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"make {directory} writable by the collector, or set [snapshot] dir to a writable directory"
    return f"check {directory}, or set [snapshot] dir to another directory"
