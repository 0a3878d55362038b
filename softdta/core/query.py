"""Query engines over collector memory, vectorized with numpy (sans-IO: they read and clear arrays only)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias, cast

import numpy as np
import numpy.typing as npt

from softdta.core.regions import AppendRegion, KeyIncrementRegion, KeyWriteRegion, PostcardRegion
from softdta.spec import MAX_REDUNDANCY, POSTCARD_HOP_POLYNOMIALS, KeyHash
from softdta.wire.hashing import crc32_rows, key_hashes_rows, keys_to_rows

BLANK = -1

# Keys as the queries take them: (count, key_len) uint8 rows, integers, or byte strings.
Keys: TypeAlias = np.ndarray | Sequence[int] | Sequence[bytes]


def as_key_rows(keys: Keys, key_len: int = 4) -> np.ndarray:
    """Keys as a (count, key_len) uint8 array: accepts such an array, integers, or a list of bytes."""
    if isinstance(keys, np.ndarray) and keys.ndim == 2 and keys.dtype == np.uint8:
        return keys
    if len(keys) and isinstance(keys[0], (bytes, bytearray)):
        return np.frombuffer(b"".join(cast(Sequence[bytes], keys)), dtype=np.uint8).reshape(len(keys), key_len)
    return keys_to_rows(keys, key_len)


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


def keyincrement_query(region: KeyIncrementRegion, keys: Keys, redundancy: int,
                       key_hash: KeyHash = KeyHash.DTA_V1) -> np.ndarray:
    """Count-Min estimate: the minimum of the key's `redundancy` counters (u64)."""
    _, hashes = key_hashes_rows(as_key_rows(keys), redundancy, key_hash)
    estimate: np.ndarray = region.counters[hashes & np.uint32(region.slot_count - 1)].min(axis=0)
    return estimate


@dataclass
class PostcardAnswer:
    """Per key and hop, the decoded value or BLANK; `complete` when every hop up to `hops` decoded."""

    values: np.ndarray
    complete: np.ndarray


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


class AppendPoller:
    """Drains Append rings with one tail pointer per list.

    The translator writes whole batches at batch-aligned positions, and the poller zeroes what it consumed,
    so a batch holding any non-zero entry is new. Entry value 0 therefore means "empty" (as in dta-v1).

    A writer that gets a whole ring ahead of the poller (a lap) overwrites batches nobody read. With `writes`,
    the WRITEs executed into each ring as the responder counts them (xdp backend, reference responder), the
    poller sees that: it counts the batches overwritten, and reads the ring from the writer's position, so the
    survivors still come oldest first. Without it (an RDMA NIC counts nothing) a lap goes unnoticed.
    """

    def __init__(self, region: AppendRegion, writes: np.ndarray | None = None):
        self.region = region
        self.batch = region.lists.batch
        self.batches_per_ring = region.lists.entries // self.batch
        shape = (region.lists.lists, self.batches_per_ring, self.batch) + region.rings.shape[2:]
        self._batches = region.rings.reshape(shape)
        self.tails = np.zeros(region.lists.lists, dtype=np.int64)
        self.writes = writes
        # WRITEs accounted for per ring: taken, or counted as overwritten; the batches in the rings now are not
        self.accounted: np.ndarray | None = None if writes is None else \
            writes.astype(np.int64) - self._runs(self.tails)[1]

    def poll(self) -> dict[int, np.ndarray]:
        """New entries of every list (oldest first), keyed by list id; lists with nothing new are left out.
        They are taken: zeroed in the ring, and the list's tail moves past them."""
        return self.poll_counting_laps()[0]

    def poll_counting_laps(self) -> tuple[dict[int, np.ndarray], dict[int, int]]:
        """`poll`, and the entries that laps overwrote before they were read, by list id (lists with a loss)."""
        return self._new(take=True)

    def peek(self) -> tuple[dict[int, np.ndarray], dict[int, int]]:
        """What `poll_counting_laps` would return, leaving the rings and tails as they are."""
        return self._new(take=False)

    def _new(self, take: bool) -> tuple[dict[int, np.ndarray], dict[int, int]]:
        ring = self.batches_per_ring
        tails, overwritten = self.tails.copy(), np.zeros_like(self.tails)
        if self.writes is not None:
            unread = self.writes.astype(np.int64) - cast(np.ndarray, self.accounted)  # set whenever writes is
            lapped = unread > ring
            overwritten[lapped] = unread[lapped] - ring
            tails[lapped] = (tails[lapped] + unread[lapped]) % ring  # the writer's position: the oldest batch
        order, run = self._runs(tails)
        first = self.region.lists.first_list
        new: dict[int, np.ndarray] = {}
        for index in np.nonzero(run)[0]:
            taken = order[index, :run[index]]
            entries = self._batches[index, taken].reshape((-1,) + self._batches.shape[3:])
            nonzero = entries.reshape(entries.shape[0], -1).any(axis=1)
            new[first + int(index)] = entries[nonzero].copy()
            if take:
                self._batches[index, taken] = 0
        if take:
            self.tails = (tails + run) % ring
            if self.accounted is not None:
                self.accounted += overwritten + run
        lost = {first + int(index): int(overwritten[index]) * self.batch for index in np.nonzero(overwritten)[0]}
        return new, lost

    def _runs(self, tails: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per list, the ring's batch positions from its tail on, and how many of them in a row are written."""
        ring = self.batches_per_ring
        # any() over an axis is an array (numpy's stubs also allow a scalar)
        written = cast(np.ndarray, self._batches.reshape(self._batches.shape[0], ring, -1).any(axis=2))
        order = (tails[:, None] + np.arange(ring)) % ring
        run = np.cumprod(written[np.arange(written.shape[0])[:, None], order], axis=1).sum(axis=1)
        return order, run
