"""Postcarding's state: one structure's cache as arrays, a row per cache entry, which the reference translator
reads and writes an entry at a time and the vector path a batch at a time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from softdta.core.tables import Structure
from softdta.wire.columns import Rows

Words = npt.NDArray[np.uint64]


@dataclass
class PostcardEntry:
    """The path waiting in one cache entry, as read out of the cache."""

    key: bytes
    path_length: int
    values: list[int]
    hop_mask: int = 0
    first_ns: int = 0
    token: int = 0


def key_words(keys: Rows) -> Words:
    """Keys (rows of bytes) as rows of 64-bit words, zero-padded: numpy compares and moves a word per row faster
    than a row of bytes."""
    count, length = keys.shape
    padded = np.zeros((count, -(-length // 8) * 8), dtype=np.uint8)
    padded[:, :length] = keys
    return padded.view(np.uint64)


class PostcardCache:
    """The cache entries of one structure. Only the rows that are `live` hold a path, whose key is kept as words
    (`key_words`) with its slot hash and checksum, which the path's write takes. Read as a mapping of entry index
    to the path that waits there: `get`, and iteration over the indices of the entries that hold one."""

    def __init__(self, structure: Structure):
        entries = structure.cache_entries
        self.shape = (entries, structure.hops, structure.key_len)
        self.live = np.zeros(entries, dtype=bool)
        self.keys: Words = np.zeros((entries, -(-structure.key_len // 8)), dtype=np.uint64)
        self.path_lengths = np.zeros(entries, dtype=np.int64)
        self.values: npt.NDArray[np.uint32] = np.zeros((entries, structure.hops), dtype=np.uint32)
        self.masks = np.zeros(entries, dtype=np.int64)
        self.first_ns = np.zeros(entries, dtype=np.int64)
        self.tokens = np.zeros(entries, dtype=np.int64)
        self.slot_hashes = np.zeros(entries, dtype=np.uint32)
        self.checksums = np.zeros(entries, dtype=np.uint32)

    def fits(self, structure: Structure) -> bool:
        return self.shape == (structure.cache_entries, structure.hops, structure.key_len)

    def key(self, index: int) -> bytes:
        return bytes(self.keys[index].tobytes()[:self.shape[2]])

    def __iter__(self) -> Iterator[int]:
        return iter(np.flatnonzero(self.live).tolist())

    def __len__(self) -> int:
        return int(self.live.sum())

    def get(self, index: int) -> PostcardEntry | None:
        """The path waiting in entry `index`, or None."""
        if not self.live[index]:
            return None
        return PostcardEntry(self.key(index), int(self.path_lengths[index]), self.values[index].tolist(),
                             int(self.masks[index]), int(self.first_ns[index]), int(self.tokens[index]))

    def begin(self, index: npt.NDArray[np.int64] | int, keys: Words, slot_hashes: npt.NDArray[np.uint32] | int,
              checksums: npt.NDArray[np.uint32] | int, path_lengths: npt.NDArray[np.int64] | int, now_ns: int,
              token: int = 0) -> None:
        """New paths in entries `index`, with no hops yet (a token of 0: the flush queue names them later)."""
        self.live[index] = True
        self.keys[index] = keys
        self.slot_hashes[index] = slot_hashes
        self.checksums[index] = checksums
        self.path_lengths[index] = path_lengths
        self.values[index] = 0
        self.masks[index] = 0
        self.first_ns[index] = now_ns
        self.tokens[index] = token

    def __eq__(self, other: object) -> bool:
        """Equal in the paths that wait (what a free entry held last does not count)."""
        if not isinstance(other, PostcardCache):
            return NotImplemented
        live = self.live
        return self.shape == other.shape and bool((live == other.live).all()) and all(
            np.array_equal(mine[live], theirs[live]) for mine, theirs in (
                (self.keys, other.keys), (self.path_lengths, other.path_lengths), (self.values, other.values),
                (self.masks, other.masks), (self.first_ns, other.first_ns), (self.tokens, other.tokens)))
