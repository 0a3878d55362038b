"""SQL over snapshots: DuckDB over a directory tree of Parquet snapshots from any number of collectors
(`softdta query sql`, docs/export.md "SQL over snapshots"). Each table name (a file's name, `<table>.parquet`) is
a view over every file of that name in the tree, their columns united by name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from softdta.errors import SoftdtaError

TABLE_NAME = re.compile(r"[a-z][a-z0-9_]*")


class WarehouseError(SoftdtaError, ValueError):
    """A directory without snapshots, or a statement DuckDB refuses; the message names the fix."""


@dataclass
class Answer:
    columns: list[str]
    rows: list[tuple[Any, ...]]


def tables_in(directory: Path) -> dict[str, list[Path]]:
    """Every snapshot table under `directory`, with its files (hidden files, being written, left out)."""
    if not directory.is_dir():
        raise WarehouseError(f"{directory}: no such directory", hint="give --dir the directory snapshots are "
                             "written to ([snapshot] dir, by default <data_dir>/snapshots), or one above several")
    tables: dict[str, list[Path]] = {}
    for path in sorted(directory.rglob("*.parquet")):
        if TABLE_NAME.fullmatch(path.stem) and not any(part.startswith(".") for part in
                                                       path.relative_to(directory).parts):
            tables.setdefault(path.stem, []).append(path)
    if not tables:
        raise WarehouseError(f"{directory}: no snapshots (no <table>.parquet below it)",
                             hint="take one with `softdta collector snapshot --config C`, or give --dir the "
                                  "directory they are written to")
    return tables


def query(directory: Path, statement: str) -> Answer:
    """Run `statement` with one view per snapshot table under `directory`."""
    tables = tables_in(directory)
    connection = duckdb.connect(":memory:")
    try:
        for table, files in tables.items():
            listed = ", ".join("'" + str(path).replace("'", "''") + "'" for path in files)
            connection.execute(f'CREATE VIEW "{table}" AS SELECT * FROM read_parquet([{listed}], union_by_name=true)')
        try:
            result = connection.execute(statement)
        except duckdb.Error as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise WarehouseError(f"the statement failed: {first}",
                                 hint=f"the tables are {', '.join(sorted(tables))} "
                                      "(docs/export.md lists their columns)") from None
        if result.description is None:
            return Answer([], [])
        return Answer([column[0] for column in result.description], result.fetchall())
    finally:
        connection.close()
