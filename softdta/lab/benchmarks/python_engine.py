"""The python engine: reports/s per core live over AF_XDP and AF_PACKET beside the XDP engine, and translation
alone, the oracle a frame at a time against the batch translator (core/batch.py)."""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from softdta.core import workload
from softdta.core.batch import BatchTranslator
from softdta.core.translator import Translator
from softdta.errors import SoftdtaError
from softdta.lab.benchmarks.translator import reference_ns_per_frame, translator_kernel, translator_reference_cases
from softdta.lab.benchmarks.workloads import (
    ROUNDS,
    Stats,
    example_reporter,
    example_tables,
    primitive_workloads,
    sketch_structure,
    stats,
)
from softdta.wire import dta


class EngineRate(Stats):
    """A python engine's CPU per report, live."""

    received: int
    sent: int
    transmit: str
    reports_per_s_per_core: int


class TranslatorRate(Stats):
    reports_per_s_per_core: int


class BatchRate(TranslatorRate):
    times_the_oracle: float


def translator_python_engine(count: int) -> dict[str, EngineRate | TranslatorRate]:
    """Reports/s per core of the python engine (Key-Write N=1, 4-byte keys and data) over AF_XDP and over the
    AF_PACKET fallback, and on the demo's mix of every primitive over AF_XDP, beside the XDP engine on the same
    Key-Writes: CPU time of the engine's thread per report (take the batch from the ring, translate, transmit),
    live on a veth pair between two namespaces. The thread stays on the transmitting CPU, as `serve` keeps it.

    The far end is the floor's sink (bpf/floor.bpf.c: count, drop), the least a receiver does: a veth peer's
    receive runs on the sending CPU, inside the engine's system calls, where a collector's runs on its own
    machine. Every frame the engine counts as sent must reach it. Since the sink runs XDP, frames leave from XDP
    on AF_XDP."""
    from softdta.engines.python import BATCH, PythonEngine
    from softdta.kernel.bpf import BpfObject, attach_xdp
    from softdta.kernel.netns import Namespace, cleanup_prefix, in_netns, veth_pair
    from softdta.kernel.programs import FLOOR_SOURCE, build_object
    from softdta.kernel.tx_ring import RingReporter
    from softdta.spec import FloorCounter, TranslatorCounter
    tables = example_tables()
    reporter = example_reporter(tables)
    key_writes = [reporter.frame(report) for report in workload.key_write(count, 11, redundancy=1)]
    mixed = [reporter.frame(report) for report in
             workload.interleave(list(primitive_workloads(tables, count // 5).values()), 7)]
    prefix = f"sdta-bench{os.getpid()}-"
    cleanup_prefix(prefix)
    results: dict[str, EngineRate | TranslatorRate] = {}
    try:
        far, near = Namespace.create(prefix + "r"), Namespace.create(prefix + "t")
        veth_pair(far, "r0", near, "t0", mac_b=":".join(f"{b:02x}" for b in tables.mac))
        with BpfObject(build_object(FLOOR_SOURCE)) as sink:
            with in_netns(far.name):
                attach_xdp(socket.if_nametoindex("r0"), sink.programs["softdta_floor_sink"].fd)

            def sunk() -> int:
                return sink.maps["floor_counters"].counter_total(FloorCounter.SUNK)

            for case, io, frames in (("af_xdp", "af_xdp", key_writes), ("af_packet", "af_packet", key_writes),
                                     ("af_xdp_mixed", "af_xdp", mixed)):
                samples = []
                for _ in range(ROUNDS):
                    with in_netns(near.name):
                        engine = PythonEngine(example_tables(), io=io, flush_idle_ns=10**12)
                        engine.attach(["t0"])
                    pinned: AbstractContextManager[object] = (
                        engine.transmitter.pinned() if engine.transmitter is not None else nullcontext())
                    before = sunk()
                    with engine, RingReporter("r0", far.name, 256) as ring, pinned:
                        for first in range(0, len(frames), BATCH):  # a burst of what one step takes
                            for chunk in range(first, min(first + BATCH, len(frames)), 128):
                                ring.send(frames[chunk:chunk + 128])
                            time.sleep(0.003)  # the kernel moves the burst into the engine's ring (AF_PACKET: 1 ms)
                            while engine.step():
                                pass
                        samples.append(engine.run_time_ns / max(engine.runs, 1))
                        received, transmit = engine.runs, engine.transmit_path
                        sent = engine.translator.counters[TranslatorCounter.TX_FRAMES]
                    _until_arrived(lambda: sunk() - before, sent, case)
                results[case] = EngineRate(**stats(samples), received=received, sent=len(frames),
                                           transmit=transmit,
                                           reports_per_s_per_core=round(1e9 / statistics.median(samples)))
    finally:
        cleanup_prefix(prefix)
    reference = translator_reference_cases({"key-write-n1": workload.key_write(count, 11, redundancy=1)},
                                           count)["key-write-n1"]
    kernel = translator_kernel(100_000, {"key-write-n1": [dta.key_write(k, k, 1) for k in range(1, 17)]})
    results["reference_translator_alone"] = TranslatorRate(**reference,
                                                           reports_per_s_per_core=round(1e9 / reference["median"]))
    results["xdp"] = TranslatorRate(**kernel["key-write-n1"],
                                    reports_per_s_per_core=round(1e9 / kernel["key-write-n1"]["median"]))
    return results


def _until_arrived(arrived: Callable[[], int], sent: int, case: str, within: float = 5.0) -> None:
    """Every frame the engine sent reached the far end (a veth peer may take them in a later softirq)."""
    if not sent:
        raise SoftdtaError(f"python engine benchmark, {case}: the engine sent no frame")
    deadline = time.monotonic() + within
    while arrived() != sent:
        if time.monotonic() > deadline:
            raise SoftdtaError(f"python engine benchmark, {case}: the far end took {arrived()} of the {sent} frames "
                               f"the engine sent, within {within} s")
        time.sleep(0.01)


def translator_batch(count: int) -> dict[str, dict[str, TranslatorRate]]:
    """Reports/s per core of translation alone (no packet I/O; thread CPU time), side by side: the oracle a frame
    at a time, and the batch translator (core/batch.py) at the python engine's step and at 1024 frames, a batch
    that amortizes numpy's per-call cost. On Key-Write N=1, on each other primitive as the example tables hold it
    (Sketch-Merge: whole epochs, one after another), and on a mix of every primitive in the demo's proportions."""
    from softdta.engines.python import BATCH
    tables = example_tables()
    reporter = example_reporter(tables)
    mixed = workload.interleave(list(primitive_workloads(tables, count // 5).values()), 7)
    lists = tables.append_lists[0]
    sketch = sketch_structure(tables)
    epoch = sketch.reporters * sketch.columns
    cases = {"key-write-n1": workload.key_write(count, 11, redundancy=1),
             "key-increment": workload.key_increment(count, 12, redundancy=1, flows=200),
             "append": workload.append(count, 13, lists.lists, lists.first_list),
             "postcarding": workload.postcards(count // 5, 14, 5),
             "sketch-merge": [report for seed in range(max(1, count // epoch)) for report in
                              workload.sketch_epoch(sketch.reporters, sketch.columns, sketch.rows, seed)],
             "mixed": mixed}
    results: dict[str, dict[str, TranslatorRate]] = {}
    for name, reports in cases.items():
        frames = [reporter.frame(report) for report in reports]
        oracle = reference_ns_per_frame(frames, time.thread_time_ns)
        results[name] = {"oracle": TranslatorRate(**oracle, reports_per_s_per_core=round(1e9 / oracle["median"]))}
        for size in (BATCH, 1024):
            samples = []
            for _ in range(ROUNDS):
                batch = BatchTranslator(Translator(example_tables()))
                started = time.thread_time_ns()
                for first in range(0, len(frames), size):
                    batch.process_batch(frames[first:first + size])
                samples.append((time.thread_time_ns() - started) / len(frames))
            timing = stats(samples)
            results[name][f"batch_{size}"] = BatchRate(
                **timing, reports_per_s_per_core=round(1e9 / timing["median"]),
                times_the_oracle=round(oracle["median"] / timing["median"], 1))
    return results
