"""Parquet files of snapshots, written with pyarrow (softdta.collector.snapshot says what and where; this module
is loaded only by a collector that takes snapshots)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import ArrowException

from softdta.core.primitives.base import SnapshotColumns

__all__ = ["ArrowException", "write_atomically"]

COMPRESSED = {"epoch": "lz4", "time": "lz4"}  # the same in every row of a file; lz4 takes a fourth of zstd's time


def write_atomically(path: Path, parts: Iterable[SnapshotColumns], collector: str, epoch: int,
                      taken: datetime) -> int:
    """Write `parts` as row groups of a Parquet file at `path`, through a hidden temporary file in the same directory
    (fsynced, then renamed); the rows written."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    rows = 0
    try:
        writer: pq.ParquetWriter | None = None
        try:
            for batch in _ahead(_record_batch(part, collector, epoch, taken) for part in parts):
                if writer is None:
                    writer = pq.ParquetWriter(temporary, batch.schema, store_schema=False, **_options(batch))
                if batch.num_rows:
                    writer.write_batch(batch, row_group_size=batch.num_rows)
                    rows += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise ValueError(f"{path.name}: the primitive's snapshot gave no part")  # a primitive's bug
        descriptor = os.open(temporary, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.rename(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise
    return rows


def _ahead(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`batches`, each next one decoded on a thread while the caller writes the one before (numpy and pyarrow let go
    of the GIL: a snapshot takes about the longer of the two, not their sum)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="softdta-snapshot-decode") as decoder:
        coming = decoder.submit(next, batches, None)
        while (batch := coming.result()) is not None:
            coming = decoder.submit(next, batches, None)
            yield batch


def _record_batch(part: SnapshotColumns, collector: str, epoch: int, taken: datetime) -> pa.RecordBatch:
    """One part with the columns every file has: collector, epoch, time."""
    count = len(next(iter(part.values()))) if part else 0
    when = np.datetime64(taken.astimezone(timezone.utc).replace(tzinfo=None), "us")
    columns: dict[str, pa.Array] = {
        "collector": pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, dtype=np.int32)), pa.array([collector])),
        "epoch": pa.array(np.full(count, epoch, dtype=np.int64)),
        "time": pa.array(np.full(count, when), type=pa.timestamp("us", tz="UTC"))}
    for name, values in part.items():
        columns[name] = _arrow(values)
    return pa.RecordBatch.from_pydict(columns)


def _options(batch: pa.RecordBatch) -> dict[str, Any]:
    """How each column is encoded, for speed (a 1 GiB region's slots are some 10^8 rows): the collector's name once,
    in a dictionary; epoch and time plain, which lz4 squeezes 200-fold; slots and positions delta-encoded (they
    grow row by row). The rest is what was written (checksums, values: random bits): plain and uncompressed, as
    compressing or trying a dictionary costs more time than it saves. Statistics (min, max) for the columns a query
    filters on."""
    names = batch.schema.names
    keys = [name for name in ("slot", "position", "list_id", "column") if name in names]
    return {"use_dictionary": ["collector"], "compression": {name: COMPRESSED.get(name, "none") for name in names},
            "column_encoding": {name: "DELTA_BINARY_PACKED" for name in keys if name in ("slot", "position")},
            "write_statistics": ["collector", "epoch", "time", *keys]}


def _arrow(values: npt.NDArray[Any]) -> pa.Array:
    """A column: a 1-D array as it is, rows of bytes (a 2-D uint8 array) as fixed-size binary values."""
    if values.ndim == 1:
        return pa.array(values)
    rows = np.ascontiguousarray(values, dtype=np.uint8)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(rows.shape[1]), rows.shape[0],
                                                [None, pa.py_buffer(rows.tobytes())])
