"""Key-Write queries: queries per second per core against a store filled where the translator would have written,
and query success against load (simulated, beside the analytical bound)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from softdta.core.analysis import (
    key_write_empty_return_bound,
    key_write_wrong_output_bound,
    simulate_query_success_curve,
)
from softdta.core.primitives.key_write.queries import key_write_query
from softdta.core.primitives.key_write.region import KeyWriteRegion
from softdta.lab.benchmarks.workloads import ROUNDS, Stats, stats
from softdta.spec import KeyHash
from softdta.wire.hashing import key_hashes_rows

# Key-Write stores, filled with numpy exactly where the translator would have written
KEY_WRITE_SLOT_SIZE = 8  # u32 key checksum + 4 bytes of data
KEY_WRITE_DATA_LEN = 4
KEY_WRITE_LOAD = 0.1  # keys written per slot (each key writes N copies)


@dataclass
class KeyWriteStore:
    region: KeyWriteRegion
    redundancy: int
    scheme: KeyHash
    keys_written: int
    query_rows: npt.NDArray[np.uint8]  # (batch, 4) wire-order keys, a random sample of the written keys
    query_truth: npt.NDArray[np.uint32]  # their data as big-endian u32 (what key_write_query returns)


def _distinct_keys(rng: np.random.Generator, count: int) -> npt.NDArray[np.uint32]:
    keys = np.unique(rng.integers(0, 1 << 32, size=count + count // 8 + 1024, dtype=np.uint64).astype(np.uint32))
    rng.shuffle(keys)
    assert keys.size >= count
    return keys[:count]


def _key_rows(keys: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint8]:
    """u32 keys to (count, 4) uint8 wire (big-endian) rows, as `hashing.keys_to_rows` but without u64 shifts."""
    return np.ascontiguousarray(keys.astype(">u4")).view(np.uint8).reshape(keys.size, 4)


def fill_key_write_store(slot_bits: int, redundancy: int, scheme: KeyHash, batch: int, seed: int = 24) -> KeyWriteStore:
    """A store of 2^slot_bits slots after LOAD * slots keys were each written N times, in arrival order.

    Per key, the translator writes (checksum, data) to the N slots of its copies; a later key overwrites an
    earlier one in a shared slot. A single numpy scatter over the key-major (key, copy) order reproduces that:
    for repeated indices the last assignment wins.
    """
    slot_count = 1 << slot_bits
    rng = np.random.default_rng(seed)
    count = int(KEY_WRITE_LOAD * slot_count)
    keys = _distinct_keys(rng, count)
    rows = _key_rows(keys)
    data = rng.integers(1, 1 << 32, size=count, dtype=np.uint64).astype(np.uint32)
    region = KeyWriteRegion(bytearray(slot_count * KEY_WRITE_SLOT_SIZE), KEY_WRITE_SLOT_SIZE, KEY_WRITE_DATA_LEN)
    checksums, hashes = key_hashes_rows(rows, redundancy, scheme)
    slots = (hashes & np.uint32(slot_count - 1)).T.ravel()  # key-major: key 0 copy 0..N-1, key 1, ...
    region.checksums[slots] = np.repeat(checksums, redundancy)
    words = region.data.view(">u4").reshape(slot_count)  # data as reported: big-endian on the wire
    words[slots] = np.repeat(data, redundancy)
    sample = rng.choice(count, size=min(batch, count), replace=False)
    return KeyWriteStore(region, redundancy, scheme, count, np.ascontiguousarray(rows[sample]), data[sample])


def query_rate(slot_bits: int, batch: int) -> dict[str, Stats]:
    """Key-Write queries per second per core at N = 1, 2, 4 (numpy engine), against the paper's 1.8 M/s (C++)."""
    results = {}
    for n in (1, 2, 4):
        store = fill_key_write_store(slot_bits, n, KeyHash.INDEPENDENT, batch)
        samples = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            key_write_query(store.region, store.query_rows, n, key_hash=KeyHash.INDEPENDENT)
            samples.append(len(store.query_rows) / (time.perf_counter() - started))
        results[f"n{n}"] = stats(samples)
    return results


def query_success(slots: int, queries: int) -> list[dict[str, float]]:
    """Key-Write query success against load, simulated and bounded, for N = 1, 2, 4 (the paper's Figure 12)."""
    rows = simulate_query_success_curve(slots, [0.05, 0.1, 0.2, 0.4, 0.7, 1.0], [1, 2, 4], queries=queries)
    for row in rows:
        n = int(row["n"])  # the curve's rows hold every field as a number; N is a whole one
        row["bound"] = 1 - key_write_empty_return_bound(row["alpha"], n) - key_write_wrong_output_bound(row["alpha"], n)
    return rows
