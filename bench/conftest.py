"""Fixtures of the softdta microbenchmarks (pytest-benchmark); see bench/README.md.

Sizes follow the run: with benchmarks enabled the Key-Write store is the full 2^24 slots (128 MiB) and the Append
region holds 4096 lists; with `--benchmark-disable` (each benchmark body runs once, as a correctness test) the
same load factors are kept on smaller stores so the run stays quick.
"""

import os

# Every benchmark is meant to measure one core. numpy's element-wise kernels, fancy indexing and CRC table
# look-ups used here are single-threaded anyway; this only pins BLAS/OpenMP pools in case anything pulls them in
# (it has no effect if numpy was imported before this file, which is harmless for the same reason).
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from softdta.frames import ip_bytes, mac_bytes  # noqa: E402
from softdta.hashing import key_hashes_rows  # noqa: E402
from softdta.regions import KeyWriteRegion  # noqa: E402
from softdta.spec import KeyHash  # noqa: E402
from softdta.tables import Tables  # noqa: E402
from softdta.workload import ReporterAddress  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_TABLES = ROOT / "examples" / "tables.toml"
COLLECTOR_IP = ip_bytes("10.77.1.1")

KEYWRITE_SLOT_SIZE = 8  # u32 key checksum + 4 bytes of data
KEYWRITE_DATA_LEN = 4
KEYWRITE_LOAD = 0.1  # keys written per slot (each key writes N copies)


def benchmarks_disabled(config) -> bool:
    session = getattr(config, "_benchmarksession", None)
    if session is not None:
        return session.disabled
    return bool(config.getoption("benchmark_disable", False)) and not config.getoption("benchmark_enable", False)


@dataclass(frozen=True)
class Sizes:
    keywrite_slot_bits: int
    keywrite_query_batch: int
    append_lists: int
    append_entries: int = 256
    append_batch: int = 16
    translator_reports: int = 2000


@pytest.fixture(scope="session")
def sizes(pytestconfig) -> Sizes:
    if benchmarks_disabled(pytestconfig):
        return Sizes(keywrite_slot_bits=20, keywrite_query_batch=1 << 16, append_lists=256, translator_reports=400)
    return Sizes(keywrite_slot_bits=24, keywrite_query_batch=1 << 20, append_lists=4096)


@pytest.fixture
def record_rate():
    """`record_rate(benchmark, items, rate_key, ns_key)`: items/s and ns/item from the median, into extra_info.

    The median is the time of one call of the benchmarked function, which handles `items` items. Returns the
    rate, or None when benchmarks are disabled (nothing is timed then).
    """

    def record(benchmark, items: int, rate_key: str, ns_key: str) -> float | None:
        benchmark.extra_info["items_per_call"] = items
        if benchmark.stats is None:
            return None
        median = benchmark.stats.stats.median
        benchmark.extra_info[rate_key] = items / median
        benchmark.extra_info[ns_key] = median / items * 1e9
        return items / median

    return record


# --------------------------------------------------------------------------------------------------
# Key-Write stores, filled with numpy exactly where the translator would have written


@dataclass
class KeyWriteStore:
    region: KeyWriteRegion
    redundancy: int
    scheme: KeyHash
    keys_written: int
    query_rows: np.ndarray  # (batch, 4) uint8 wire-order keys, a random sample of the written keys
    query_truth: np.ndarray  # their data as big-endian u32 (what keywrite_query returns)


def _distinct_keys(rng: np.random.Generator, count: int) -> np.ndarray:
    keys = np.unique(rng.integers(0, 1 << 32, size=count + count // 8 + 1024, dtype=np.uint64).astype(np.uint32))
    rng.shuffle(keys)
    assert keys.size >= count
    return keys[:count]


def _key_rows(keys: np.ndarray) -> np.ndarray:
    """u32 keys to (count, 4) uint8 wire (big-endian) rows, as `hashing.keys_to_rows` but without u64 shifts."""
    return np.ascontiguousarray(keys.astype(">u4")).view(np.uint8).reshape(keys.size, 4)


def fill_keywrite_store(slot_bits: int, redundancy: int, scheme: KeyHash, batch: int, seed: int = 24) -> KeyWriteStore:
    """A store of 2^slot_bits slots after LOAD * slots keys were each written N times, in arrival order.

    Per key, the translator writes (checksum, data) to the N slots of its copies; a later key overwrites an
    earlier one in a shared slot. A single numpy scatter over the key-major (key, copy) order reproduces that:
    for repeated indices the last assignment wins.
    """
    slot_count = 1 << slot_bits
    rng = np.random.default_rng(seed)
    count = int(KEYWRITE_LOAD * slot_count)
    keys = _distinct_keys(rng, count)
    rows = _key_rows(keys)
    data = rng.integers(1, 1 << 32, size=count, dtype=np.uint64).astype(np.uint32)
    region = KeyWriteRegion(bytearray(slot_count * KEYWRITE_SLOT_SIZE), KEYWRITE_SLOT_SIZE, KEYWRITE_DATA_LEN)
    checksums, hashes = key_hashes_rows(rows, redundancy, scheme)
    slots = (hashes & np.uint32(slot_count - 1)).T.ravel()  # key-major: key 0 copy 0..N-1, key 1, ...
    region.checksums[slots] = np.repeat(checksums, redundancy)
    words = region.data.view(">u4").reshape(slot_count)  # data as reported: big-endian on the wire
    words[slots] = np.repeat(data, redundancy)
    sample = rng.choice(count, size=min(batch, count), replace=False)
    return KeyWriteStore(region, redundancy, scheme, count, np.ascontiguousarray(rows[sample]), data[sample])


@pytest.fixture(scope="session")
def keywrite_store(sizes):
    """`keywrite_store(redundancy, scheme)`: a filled store, built once per (N, scheme) and kept for the session."""
    cache: dict[tuple[int, KeyHash], KeyWriteStore] = {}

    def get(redundancy: int, scheme: KeyHash) -> KeyWriteStore:
        key = (redundancy, scheme)
        if key not in cache:
            cache[key] = fill_keywrite_store(sizes.keywrite_slot_bits, redundancy, scheme, sizes.keywrite_query_batch)
        return cache[key]

    yield get
    cache.clear()


# --------------------------------------------------------------------------------------------------
# Translator inputs


@pytest.fixture
def tables() -> Tables:
    return Tables.from_toml(EXAMPLE_TABLES)


@pytest.fixture
def reporter(tables) -> ReporterAddress:
    return ReporterAddress(mac=mac_bytes("02:5d:7a:00:09:01"), ip=ip_bytes("10.77.9.1"), translator_mac=tables.mac,
                           collector_ip=COLLECTOR_IP)
