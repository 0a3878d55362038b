"""Key-Increment's query: Count-Min estimates (the engine, `keyincrement_query`, and `CountLookup`, what the query
service answers at `POST /key-increment/<structure>`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from softdta.core.primitives.key_increment.region import KeyIncrementRegion
from softdta.core.query import Keys, StructureQuery, as_key_rows, hex_rows, integer, key_rows
from softdta.core.tables import Structure
from softdta.spec import MAX_REDUNDANCY, KeyHash
from softdta.wire.hashing import key_hashes_rows


def key_increment_snapshot(region: KeyIncrementRegion, rows: int) -> Iterator[dict[str, npt.NDArray[Any]]]:
    """The nonzero counters, `rows` slots at a time: slot (u32) and counter (u64)."""
    for first in range(0, max(region.slot_count, 1), rows):
        counters = region.counters[first:first + rows]
        written = counters != 0
        yield {"slot": np.flatnonzero(written).astype(np.uint32) + np.uint32(first),
               "counter": counters[written].astype(np.uint64)}


def keyincrement_query(region: KeyIncrementRegion, keys: Keys, redundancy: int,
                       key_hash: KeyHash = KeyHash.DTA_V1) -> np.ndarray:
    """Count-Min estimate: the minimum of the key's `redundancy` counters (u64)."""
    _, hashes = key_hashes_rows(as_key_rows(keys), redundancy, key_hash)
    estimate: np.ndarray = region.counters[hashes & np.uint32(region.slot_count - 1)].min(axis=0)
    return estimate


@dataclass
class CountAnswer:
    structure: str
    redundancy: int
    keys: npt.NDArray[np.uint8]  # (count, key_len) rows
    counts: npt.NDArray[np.uint64]

    def json(self) -> dict[str, Any]:
        keys = hex_rows(self.keys.tobytes(), self.keys.shape[1])
        return {"structure": self.structure, "redundancy": self.redundancy,
                "results": [{"key": key, "count": count} for key, count in zip(keys, self.counts.tolist())]}

    def rows(self) -> bytes:
        """The binary answer (the query service's key-rows form): each key's count, u64
        big-endian, in order."""
        return self.counts.astype(">u8").tobytes()


@dataclass(frozen=True)
class CountLookup(StructureQuery[KeyIncrementRegion]):
    """Each key's count: the minimum of its `redundancy` counters."""

    required_fields = ("keys", "redundancy")

    name: str
    structure: Structure
    keys: npt.NDArray[np.uint8]
    redundancy: int

    @classmethod
    def parse(cls, fields: dict[str, Any], structure: Structure, name: str) -> CountLookup:
        rows = key_rows(fields["keys"], structure, name)
        return cls(name, structure, rows, integer(fields["redundancy"], "redundancy", 1, MAX_REDUNDANCY))

    def answer(self, region: KeyIncrementRegion) -> CountAnswer:
        counts = keyincrement_query(region, self.keys, self.redundancy, self.structure.key_hash)
        return CountAnswer(self.name, self.redundancy, self.keys, counts.astype(np.uint64))
