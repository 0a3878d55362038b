"""Key-Write's query: look keys up over their copies and vote (the engine, `key_write_query`, and `KeyLookup`,
what the query service answers at `POST /key-write/<structure>`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from softdta.core.primitives.key_write.region import KeyWriteRegion
from softdta.core.query import Keys, QueryError, StructureQuery, as_key_rows, hex_rows, integer, key_rows
from softdta.core.regions import byte_view
from softdta.core.tables import Structure
from softdta.spec import MAX_REDUNDANCY, KeyHash
from softdta.wire.hashing import key_hashes_rows


@dataclass
class KeyWriteAnswer:
    """Per key: `found`, the winning value (`values`, big-endian u32 or raw rows) and how many copies agreed."""

    found: np.ndarray
    values: np.ndarray
    votes: np.ndarray
    written: np.ndarray  # any of the key's slots ever written (not found: overwritten, else never reported)


def _data_words(region: KeyWriteRegion) -> np.ndarray:
    """Data as one comparable scalar per slot: integers for 4/8 bytes, void records otherwise."""
    dtype = {4: ">u4", 8: ">u8"}.get(region.data_len, f"V{region.data_len}")
    return region.data.view(dtype).reshape(region.slot_count)


def key_write_snapshot(region: KeyWriteRegion, rows: int) -> Iterator[dict[str, npt.NDArray[Any]]]:
    """The occupied slots, `rows` slots at a time: slot (u32), checksum (u32) and value (u32 or u64, the reported
    big-endian value, for 4- and 8-byte data; else the data's bytes as rows)."""
    words = _data_words(region)
    # 8-byte slots (4-byte data) are one u64 each: one comparison finds the written ones
    whole = byte_view(region.buffer)[:region.slot_count * 8].view("<u8") if region.slot_size == 8 else None
    for first in range(0, max(region.slot_count, 1), rows):
        stop = min(first + rows, region.slot_count)
        checksums, data = region.checksums[first:stop], words[first:stop]
        if whole is not None:
            written = whole[first:stop] != 0
        else:
            written = (checksums != 0) | (data != 0 if data.dtype.kind == "u" else region.data[first:stop].any(axis=1))
        slots = np.flatnonzero(written).astype(np.uint32) + np.uint32(first)
        values = data[written].astype(data.dtype.newbyteorder("=")) if data.dtype.kind == "u" else \
            region.data[first:stop][written]
        yield {"slot": slots, "checksum": checksums[written], "value": values}


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
    stored = region.checksums[slots]
    matches = stored == checksums
    words = _data_words(region)[slots]
    data_written = words != 0 if words.dtype.kind == "u" else region.data[slots].any(axis=-1)
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
    return KeyWriteAnswer(found, best_words, np.where(found, best_votes, 0), ((stored != 0) | data_written).any(axis=0))


LOOKUP_STATUSES = ("empty", "found", "collided")  # a key's status, numbered as `KeyLookupAnswer.rows` sends it


@dataclass
class KeyLookupAnswer:
    """Per key: its value if found, its votes, and its status: "found", "empty" (none of its slots was ever
    written: not reported) or "collided" (overwritten by other keys, or copies that disagree: data lost)."""

    structure: str
    redundancy: int
    consensus: int
    keys: npt.NDArray[np.uint8]  # (count, key_len) rows
    values: npt.NDArray[np.uint8]  # (count, data_len) rows, zero where not found
    votes: npt.NDArray[np.int8]
    status: npt.NDArray[np.uint8]  # an index into LOOKUP_STATUSES

    def json(self) -> dict[str, Any]:
        names = np.array(LOOKUP_STATUSES)[self.status].tolist()
        counts = {state: int(np.count_nonzero(self.status == code)) for code, state in enumerate(LOOKUP_STATUSES)}
        found = (self.status == LOOKUP_STATUSES.index("found")).tolist()
        values = hex_rows(self.values.tobytes(), self.values.shape[1])
        results = [{"key": key, "value": value if hit else None, "votes": votes, "status": state}
                   for key, value, hit, votes, state in zip(hex_rows(self.keys.tobytes(), self.keys.shape[1]), values,
                                                            found, self.votes.tolist(), names)]
        return {"structure": self.structure, "redundancy": self.redundancy, "consensus": self.consensus, **counts,
                "results": results}

    def rows(self) -> bytes:
        """The binary answer (the query service's key-rows form): per key, in order, its status
        (u8, an index into LOOKUP_STATUSES), its votes (u8) and its value (data_len bytes, zero if not found)."""
        return lookup_rows(self.status, self.votes, self.values)


def lookup_rows(status: npt.NDArray[np.uint8], votes: npt.NDArray[np.integer[Any]],
                values: npt.NDArray[np.uint8]) -> bytes:
    rows = np.empty((status.size, 2 + values.shape[1]), dtype=np.uint8)
    rows[:, 0], rows[:, 1], rows[:, 2:] = status, votes, values
    return rows.tobytes()


def parse_lookup_rows(raw: bytes, data_len: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8],
                                                            npt.NDArray[np.uint8]]:
    """`KeyLookupAnswer.rows` back into (status, votes, values) arrays."""
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 2 + data_len)
    return rows[:, 0], rows[:, 1], rows[:, 2:]


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
        status = np.where(answer.found, 1, np.where(answer.written, 2, 0)).astype(np.uint8)
        values = np.ascontiguousarray(answer.values.astype(answer.values.dtype.newbyteorder(">"))).view(np.uint8)
        values = values.reshape(len(self.keys), structure.data_len) * answer.found[:, None].astype(np.uint8)
        return KeyLookupAnswer(self.name, self.redundancy, self.consensus, self.keys, values,
                               answer.votes.astype(np.int8), status)
