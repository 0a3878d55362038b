"""The whole comparison behind `softdta bench`: every benchmark in one run, written to comparison.json, with
plots of query success against load and of the translator per report."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np

from softdta.lab.benchmarks.collector import (
    collector_c,
    collector_python,
    collector_xdp_responder,
    memory_writes_per_report,
)
from softdta.lab.benchmarks.export import (
    ExportThroughput,
    ResponderBesideExport,
    export_responder_impact,
    export_throughput,
)
from softdta.lab.benchmarks.fleet import FleetBalance, fleet_balance
from softdta.lab.benchmarks.fleet_propagation import Propagation, fleet_propagation
from softdta.lab.benchmarks.live import (
    LiveDirect,
    LiveKernelGenerator,
    LiveLab,
    translator_live,
    translator_live_direct,
    translator_live_kernel,
    with_floor_fractions,
)
from softdta.lab.benchmarks.local import LocalTranslation, local_translation
from softdta.lab.benchmarks.python_engine import (
    EngineRate,
    TranslatorRate,
    translator_batch,
    translator_python_engine,
)
from softdta.lab.benchmarks.queries import query_rate, query_success
from softdta.lab.benchmarks.router import RouterRate, router_rate
from softdta.lab.benchmarks.translator import (
    FleetLookupCost,
    Scaling,
    empty_program,
    translator_fleet_lookup,
    translator_kernel,
    translator_queue_scaling,
    translator_reference,
    translator_userspace_udp,
)
from softdta.lab.benchmarks.workloads import ROOT, Stats
from softdta.spec import MAX_REDUNDANCY

RESULTS = ROOT / "bench" / "results"


class Machine(TypedDict):
    cpu: str
    cores: int
    kernel: str
    python: str
    quick: bool


class TranslatorNsPerReport(TypedDict):
    xdp: dict[str, Stats]
    empty_xdp_program: Stats
    reference_python: dict[str, Stats]
    userspace_udp_python: dict[str, Stats]


CollectorCpu = TypedDict("CollectorCpu", {"xdp_responder_kernel": dict[str, Stats], "python_asyncio": Stats,
                                          "c_epoll": Stats | None})


class Comparison(TypedDict):
    """comparison.json."""

    machine: Machine
    translator_ns_per_report: TranslatorNsPerReport
    translator_rx_queue_scaling: dict[str, Scaling]
    translator_fleet_slot_lookup: dict[str, FleetLookupCost]
    translator_python_engine: dict[str, EngineRate | TranslatorRate]
    translator_batch: dict[str, dict[str, TranslatorRate]]
    translator_live_lab: LiveLab
    translator_live_lab_kernel_generator: LiveKernelGenerator
    translator_live_direct: dict[str, LiveDirect]
    collector_cpu_ns_per_report: CollectorCpu
    local_translation_ns_per_report: LocalTranslation
    memory_writes_per_report: dict[str, float]
    query_rate_per_core: dict[str, Stats]
    query_success: list[dict[str, float]]
    fleet_slot_map: dict[str, FleetBalance]
    query_router: RouterRate
    fleet_propagation: Propagation
    export_throughput: dict[str, ExportThroughput]
    export_responder_impact: dict[str, ResponderBesideExport]
    seconds: NotRequired[float]


def run(quick: bool = False, out: Path = RESULTS) -> Comparison:
    count = 300 if quick else 3000
    repeat = 10_000 if quick else 1_000_000
    started = time.time()
    results: Comparison = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count() or 1,
                    "kernel": platform.release(), "python": platform.python_version(), "quick": quick},
        "translator_ns_per_report": {"xdp": translator_kernel(repeat), "empty_xdp_program": empty_program(repeat),
                                     "reference_python": translator_reference(count),
                                     "userspace_udp_python": translator_userspace_udp(count)},
        "translator_rx_queue_scaling": translator_queue_scaling(repeat // 10 if quick else repeat),
        "translator_fleet_slot_lookup": translator_fleet_lookup(repeat // 10 if quick else repeat),
        "translator_python_engine": translator_python_engine(1000 if quick else 16384),
        "translator_batch": translator_batch(2000 if quick else 20000),
        "translator_live_lab": translator_live(2000 if quick else 20000,
                                               [20_000, 100_000] if quick else [25_000, 50_000, 100_000, 200_000,
                                                                                400_000, 800_000]),
        "translator_live_lab_kernel_generator": translator_live_kernel(
            [50_000, 100_000] if quick else [25_000, 50_000, 100_000, 200_000, 400_000, 800_000, 0],
            seconds=0.3 if quick else 1.0),
        "translator_live_direct": with_floor_fractions({
            f"{queues}_rx_queues" + ("_floor" if bare else "") + (f"_n{copies}" if copies > 1 else "")
            + (f"_redundancy_{redundancy}" if redundancy > copies else "") + ("_tc_stage" if via_tc else ""):
                translator_live_direct(
                    [100_000, 400_000] if quick else [200_000, 400_000, 800_000, 1_000_000, 1_200_000, 1_600_000,
                                                      2_000_000, 2_400_000, 3_200_000, 0],
                    seconds=0.3 if quick else 1.0, queues=queues, redundancy=max(copies, redundancy), bare=bare,
                    copies=copies, via_tc=via_tc)
            for queues, redundancy, copies, bare, via_tc in (
                (1, 1, 1, True, False), (2, 1, 1, True, False), (1, 1, 1, False, False), (2, 1, 1, False, False),
                (2, MAX_REDUNDANCY, 1, False, False), (2, 2, 2, False, False), (2, 2, 2, False, True))}),
        "collector_cpu_ns_per_report": {"xdp_responder_kernel": collector_xdp_responder(repeat),
                                        "python_asyncio": collector_python(count),
                                        "c_epoll": collector_c(count)},
        "local_translation_ns_per_report": local_translation(repeat),
        "memory_writes_per_report": memory_writes_per_report(count),
        "query_rate_per_core": query_rate(16 if quick else 22, 1 << (12 if quick else 18)),
        "query_success": query_success(1 << (14 if quick else 18), 2000 if quick else 20000),
        "fleet_slot_map": fleet_balance(),
        "query_router": router_rate(10_000 if quick else 100_000, 16 if quick else 22),
        "fleet_propagation": fleet_propagation(3 if quick else 10),
        "export_throughput": {
            f"{entry_bytes}_byte_entries": export_throughput(
                [1_000_000, 0] if quick else [500_000, 1_000_000, 2_000_000, 0], 0.5 if quick else 2.0, entry_bytes)
            for entry_bytes in (4, 8)},
        "export_responder_impact": {
            "pinned" if pinned else "unpinned": export_responder_impact(repeat, 2 if quick else 10, pinned=pinned)
            for pinned in (True, False)},
    }
    results["seconds"] = round(time.time() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.json").write_text(json.dumps(results, indent=2))
    plot(results, out)
    return results


def plot(results: Comparison, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for n in (1, 2, 4):
        rows = [row for row in results["query_success"] if row["n"] == n]
        alphas = [row["alpha"] for row in rows]
        axis.plot(alphas, [row["success"] for row in rows], marker="o", label=f"N={n} simulated")
        axis.plot(alphas, [row["bound"] for row in rows], linestyle="--", label=f"N={n} bound")
    axis.set_xlabel("load: keys written after the queried one, per slot")
    axis.set_ylabel("Key-Write query success")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "query_success.png", dpi=120)
    plt.close(figure)

    translator = results["translator_ns_per_report"]
    names = list(translator["xdp"])
    figure, axis = plt.subplots(figsize=(7, 4))
    width = 0.4
    positions = np.arange(len(names))
    axis.bar(positions - width / 2, [translator["xdp"][n]["median"] for n in names], width, label="XDP (kernel)")
    axis.bar(positions + width / 2, [translator["reference_python"][n]["median"] for n in names], width,
             label="reference (Python)")
    axis.set_yscale("log")
    axis.set_xticks(positions, names, rotation=20)
    axis.set_ylabel("ns per report (log)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "translator.png", dpi=120)
    plt.close(figure)
