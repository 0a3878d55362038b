"""Postcarding's query: decode flows' paths (the engine, `postcard_query`, and `PathLookup`, what the query service
answers at `POST /postcarding/<structure>`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from softdta.core.primitives.postcarding.region import PostcardRegion
from softdta.core.query import BLANK, Keys, QueryError, StructureQuery, as_key_rows, hex_rows, integer, key_rows
from softdta.core.tables import Structure
from softdta.spec import POSTCARD_HOP_POLYNOMIALS
from softdta.wire.hashing import crc32_rows


@dataclass
class PostcardAnswer:
    """Per key and hop, the decoded value or BLANK; `complete` when every hop up to `hops` decoded."""

    values: np.ndarray
    complete: np.ndarray


def postcard_snapshot(region: PostcardRegion, rows: int) -> Iterator[dict[str, npt.NDArray[Any]]]:
    """The occupied slots, `rows` slots at a time: slot (u32) and each hop's word as written, hop_0 .. hop_<n-1>
    (u32: the hop's value XOR its per-hop checksum; decoding needs the flow's key, which `postcard_query` takes)."""
    for first in range(0, max(region.slot_count, 1), rows):
        words = region.values[first:first + rows]
        written = words.any(axis=1)
        hops = words[written].astype(np.uint32)
        yield {"slot": np.flatnonzero(written).astype(np.uint32) + np.uint32(first),
               **{f"hop_{hop}": np.ascontiguousarray(hops[:, hop]) for hop in range(region.hops)}}


def postcard_query(region: PostcardRegion, keys: Keys, value_set: npt.ArrayLike) -> PostcardAnswer:
    """Decode paths: slot value XOR the hop's checksum must land in `value_set` (a lookup table), else BLANK."""
    key_rows = as_key_rows(keys)
    table = np.unique(np.asarray(value_set, dtype=np.uint32))
    slots = crc32_rows(key_rows) & np.uint32(region.slot_count - 1)
    encoded = region.values[slots]
    values = np.full(encoded.shape, BLANK, dtype=np.int64)
    for hop in range(region.hops):
        decoded = encoded[:, hop] ^ crc32_rows(key_rows, POSTCARD_HOP_POLYNOMIALS[hop])
        position = np.minimum(np.searchsorted(table, decoded), table.size - 1)
        known = table[position] == decoded
        values[known, hop] = decoded[known]
    return PostcardAnswer(values, (values != BLANK).all(axis=1))


@dataclass
class PathAnswer:
    """Per key its path, a value or None per hop, and whether every hop decoded."""

    structure: str
    hops: int
    keys: list[str]
    paths: list[list[int | None]]
    complete: list[bool]

    def json(self) -> dict[str, Any]:
        return {"structure": self.structure, "hops": self.hops, "complete": sum(self.complete),
                "results": [{"key": key, "path": path, "complete": complete}
                            for key, path, complete in zip(self.keys, self.paths, self.complete)]}


@dataclass(frozen=True)
class PathLookup(StructureQuery[PostcardRegion]):
    """Each key's path, decoded against `value_set`, the values hops report (e.g. switch IDs)."""

    required_fields = ("keys", "value_set")

    name: str
    structure: Structure
    keys: npt.NDArray[np.uint8]
    value_set: list[int]

    @classmethod
    def parse(cls, fields: dict[str, Any], structure: Structure, name: str) -> PathLookup:
        rows = key_rows(fields["keys"], structure, name)
        value_set = fields["value_set"]
        if not isinstance(value_set, list) or not value_set:
            raise QueryError("value_set must be a non-empty list of the values hops report (e.g. switch IDs)")
        for index, value in enumerate(value_set):
            integer(value, f"value_set[{index}]", 0, 0xFFFFFFFF)
        return cls(name, structure, rows, value_set)

    def answer(self, region: PostcardRegion) -> PathAnswer:
        decoded = postcard_query(region, self.keys, self.value_set)
        paths = [[None if value == BLANK else value for value in path] for path in decoded.values.tolist()]
        return PathAnswer(self.name, self.structure.hops, hex_rows(self.keys.tobytes(), self.structure.key_len),
                          paths, decoded.complete.tolist())
