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

import pytest  # noqa: E402

from softdta.lab.benchmarks.queries import KeyWriteStore, fill_key_write_store  # noqa: E402
from softdta.spec import KeyHash  # noqa: E402


def benchmarks_disabled(config) -> bool:
    session = getattr(config, "_benchmarksession", None)
    if session is not None:
        return session.disabled
    return bool(config.getoption("benchmark_disable", False)) and not config.getoption("benchmark_enable", False)


@dataclass(frozen=True)
class Sizes:
    key_write_slot_bits: int
    key_write_query_batch: int
    append_lists: int
    append_entries: int = 256
    append_batch: int = 16
    translator_reports: int = 2000


@pytest.fixture(scope="session")
def sizes(pytestconfig) -> Sizes:
    if benchmarks_disabled(pytestconfig):
        return Sizes(key_write_slot_bits=20, key_write_query_batch=1 << 16, append_lists=256, translator_reports=400)
    return Sizes(key_write_slot_bits=24, key_write_query_batch=1 << 20, append_lists=4096)


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


@pytest.fixture(scope="session")
def key_write_store(sizes):
    """`key_write_store(redundancy, scheme)`: a filled store, built once per (N, scheme) and kept for the session."""
    cache: dict[tuple[int, KeyHash], KeyWriteStore] = {}

    def get(redundancy: int, scheme: KeyHash) -> KeyWriteStore:
        key = (redundancy, scheme)
        if key not in cache:
            cache[key] = fill_key_write_store(sizes.key_write_slot_bits, redundancy, scheme,
                                              sizes.key_write_query_batch)
        return cache[key]

    yield get
    cache.clear()
