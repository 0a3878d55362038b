"""Key-Write's query: look keys up over their copies and vote (the engine, `key_write_query`, and `KeyLookup`,
what the query service answers at `POST /key-write/<structure>`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from softdta.core.primitives.key_write.region import KeyWriteRegion
from softdta.core.query import Keys, QueryError, StructureQuery, as_key_rows, hex_rows, integer, key_rows
from softdta.core.tables import Structure
from softdta.spec import MAX_REDUNDANCY, KeyHash
from softdta.wire.hashing import key_hashes_rows


@dataclass
class KeyWriteAnswer:
    """Per key: `found`, the winning value (`values`, big-endian u32 or raw rows) and how many copies agreed."""

    found: np.ndarray
    values: np.ndarray
    votes: np.ndarray


def _data_words(region: KeyWriteRegion) -> np.ndarray:
    """Data as one comparable scalar per slot: integers for 4/8 bytes, void records otherwise."""
    dtype = {4: ">u4", 8: ">u8"}.get(region.data_len, f"V{region.data_len}")
    return region.data.view(dtype).reshape(region.slot_count)


def key_write_query(region: KeyWriteRegion, keys: Keys, redundancy: int = MAX_REDUNDANCY, consensus: int = 1,
                    key_hash: KeyHash = KeyHash.DTA_V1) -> KeyWriteAnswer:
    """Look keys up over `redundancy` copies; the plurality value wins if it has at least `consensus` votes.

    Copies whose stored checksum differs from the key's are ignored. A tie between different values returns
    nothing rather than a guess. Querying with more copies than were written is harmless: unused copies look
    like overwritten ones.
    """
    if not 1 <= redundancy <= MAX_REDUNDANCY:
        raise ValueError(f"redundancy must be 1..{MAX_REDUNDANCY}")
    key_rows = as_key_rows(keys)
    checksums, hashes = key_hashes_rows(key_rows, redundancy, key_hash)
    slots = hashes & np.uint32(region.slot_count - 1)
    matches = region.checksums[slots] == checksums
    words = _data_words(region)[slots]
    votes = np.zeros(matches.shape, dtype=np.int8)
    for i in range(redundancy):
        for j in range(redundancy):
            votes[i] += matches[j] & (words[j] == words[i])
    votes *= matches
    best = votes.argmax(axis=0)
    columns = np.arange(key_rows.shape[0])
    best_votes = votes[best, columns]
    best_words = words[best, columns]
    tied = np.zeros(key_rows.shape[0], dtype=bool)
    for i in range(redundancy):
        tied |= (votes[i] == best_votes) & (words[i] != best_words)
    found = (best_votes >= max(consensus, 1)) & ~tied
    return KeyWriteAnswer(found, best_words, np.where(found, best_votes, 0))


@dataclass
class KeyLookupAnswer:
    """Per key: its value if found, its votes, and its status: "found", "empty" (none of its slots was ever
    written: not reported) or "collided" (overwritten by other keys, or copies that disagree: data lost)."""

    structure: str
    redundancy: int
    consensus: int
    keys: list[str]
    values: list[str | None]
    votes: list[int]
    status: npt.NDArray[np.str_]

    def json(self) -> dict[str, Any]:
        counts = {state: int(np.count_nonzero(self.status == state)) for state in ("found", "empty", "collided")}
        results = [{"key": key, "value": value, "votes": votes, "status": state}
                   for key, value, votes, state in zip(self.keys, self.values, self.votes, self.status.tolist())]
        return {"structure": self.structure, "redundancy": self.redundancy, "consensus": self.consensus, **counts,
                "results": results}


@dataclass(frozen=True)
class KeyLookup(StructureQuery[KeyWriteRegion]):
    """Keys looked up over `redundancy` copies: the plurality value (mode "plurality"), or a value at least
    `consensus` copies agree on (mode "consensus"; by default all of them)."""

    required_fields = ("keys", "redundancy")
    optional_fields = ("mode", "consensus")

    name: str
    structure: Structure
    keys: npt.NDArray[np.uint8]
    redundancy: int
    consensus: int = 1

    @classmethod
    def parse(cls, fields: dict[str, Any], structure: Structure, name: str) -> KeyLookup:
        rows = key_rows(fields["keys"], structure, name)
        redundancy = integer(fields["redundancy"], "redundancy", 1, MAX_REDUNDANCY)
        mode = fields.get("mode", "plurality")
        if mode == "plurality":
            if "consensus" in fields:
                raise QueryError('consensus applies to mode "consensus" only')
            consensus = 1
        elif mode == "consensus":  # default: every copy must agree
            consensus = integer(fields.get("consensus", redundancy), "consensus", 1, redundancy)
        else:
            raise QueryError(f'mode must be "plurality" or "consensus", got {json.dumps(mode)}')
        return cls(name, structure, rows, redundancy, consensus)

    def answer(self, region: KeyWriteRegion) -> KeyLookupAnswer:
        structure = self.structure
        answer = key_write_query(region, self.keys, self.redundancy, self.consensus, structure.key_hash)
        _, hashes = key_hashes_rows(self.keys, self.redundancy, structure.key_hash)
        slots = hashes & np.uint32(region.slot_count - 1)
        written = ((region.checksums[slots] != 0) | region.data[slots].any(axis=-1)).any(axis=0)
        status = np.where(answer.found, "found", np.where(written, "collided", "empty"))
        values = hex_rows(answer.values.astype(answer.values.dtype.newbyteorder(">")).tobytes(), structure.data_len)
        return KeyLookupAnswer(self.name, self.redundancy, self.consensus, hex_rows(self.keys.tobytes(),
                                                                                    structure.key_len),
                               [value if found else None for value, found in zip(values, answer.found.tolist())],
                               answer.votes.tolist(), status)
