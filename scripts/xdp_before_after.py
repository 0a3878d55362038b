#!/usr/bin/env python3
"""The XDP translator's ns per report, per primitive, and the XDP responder's ns per request, per case, at git
revisions and in the working tree, side by side.

    sudo taskset -c 1 python3 scripts/xdp_before_after.py REVISION... [--rounds 31] [--repeat 100000]

Each revision is checked out in a temporary worktree, and a worker process runs its own benchmark harnesses
(bench/bpf/translator_bench.bpf.c, bench/bpf/responder_bench.bpf.c) with its own control plane, so revisions
whose map layouts differ compare too. The workers take turns: each round runs every case once in every
revision, with BPF_PROG_TEST_RUN and the harness's restore subtracted. It prints the medians, and the median of
the per-round ratios to the first revision, which holds up where absolute times on a shared VM do not. Every
other round runs the workers in reverse order. Unpinned, the same code twice came out up to 1.3 apart; with
every worker on one CPU (taskset), within 0.94-1.13.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ("Key-Write N=1", "Key-Write N=2", "Key-Increment N=1", "Append, batch 16", "Postcarding, 5 hops",
         "Sketch-Merge, batch 8")


def worker(repeat: int) -> None:
    """In a revision's tree (the current directory, first on PYTHONPATH): load every case's harness, then
    answer each line on stdin with one round, a JSON object of ns per report by case."""
    from softdta.core.tables import Tables
    from softdta.core.workload import ReporterAddress
    from softdta.engines.xdp import XdpTranslator
    from softdta.lab.benchmarks.collector import RESPONDER_CASES, responder_harness
    try:
        from softdta.lab.benchmarks.translator import load_reports
    except ModuleNotFoundError:  # a revision from before the benchmarks were a package
        from softdta.lab.benchmarks import load_reports
    from softdta.spec import DtaOpcode
    from softdta.wire import dta

    harness = Path.cwd() / "bench" / "bpf" / "translator_bench.bpf.c"

    def case(name: str) -> tuple[Tables, list]:
        tables = Tables.from_toml(Path.cwd() / "examples" / "tables.toml")
        if name.startswith("Key-Write"):
            copies = int(name[-1])
            return tables, [dta.key_write(key, key * 7, copies) for key in range(1, 17)]
        if name.startswith("Key-Increment"):
            return tables, [dta.key_increment(key, 1, 1) for key in range(1, 17)]
        if name.startswith("Append"):
            lists = tables.append_lists[0]
            lists.batch, lists.entries = 16, 256
            return tables, [dta.append(lists.first_list, value) for value in range(16)]
        if name.startswith("Postcarding"):
            return tables, [dta.postcard(0x0A000001, hop, hop) for hop in range(1, 6)]
        sketch = next(s for s in tables.structures if s.primitive is DtaOpcode.SKETCH_MERGE)
        sketch.columns, sketch.reporters, sketch.batch = 16, 1, 8
        return tables, [dta.sketch_column(0, column, [column, 1, 2, 3]) for column in range(16)]

    kernels = {}
    for name in CASES:
        tables, reports = case(name)
        reporter = ReporterAddress(bytes.fromhex("025d7a000901"), bytes([10, 77, 9, 1]), tables.mac,
                                   tables.structures[0].qp.collector_ip)
        frames = [reporter.frame(report) for report in reports]
        kernel = XdpTranslator(tables, source=harness, flush_idle_ns=0)
        load_reports(kernel, frames)  # the revision's own loader, which knows its harness's layout
        kernels[name] = (kernel, frames[0])
    with contextlib.ExitStack() as stack:
        responders = {f"responder {case}": stack.enter_context(responder_harness(case))
                      for case in RESPONDER_CASES}
        print("ready", flush=True)
        for _ in sys.stdin:
            round_ns = {}
            for name, (kernel, frame) in kernels.items():
                programs = kernel.object.programs
                round_ns[name] = (programs["bench_translate"].test_run(frame, repeat=repeat).duration_ns
                                  - programs["bench_restore"].test_run(frame, repeat=repeat).duration_ns)
            for name, (responder, _, frame) in responders.items():
                programs = responder.object.programs
                round_ns[name] = (programs["bench_respond"].test_run(frame, repeat=repeat).duration_ns
                                  - programs["bench_restore"].test_run(frame, repeat=repeat).duration_ns)
            print(json.dumps(round_ns), flush=True)


def start(tree: Path, repeat: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", "--repeat", str(repeat)],
                               cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        raise SystemExit(f"the worker in {tree} did not start; its error is above")
    return process


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="*", help="git revisions to compare with the working tree")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--repeat", type=int, default=100_000, help="test runs per measurement")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.repeat)
        return 0
    names = [*args.revisions, "working tree"]
    with tempfile.TemporaryDirectory() as scratch:
        trees = []
        for revision in args.revisions:
            tree = Path(scratch) / revision
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), revision],
                           check=True)
            trees.append(tree)
        workers = []
        try:
            workers = [start(tree, args.repeat) for tree in [*trees, ROOT]]
            samples: list[list[dict]] = [[] for _ in workers]
            for round_number in range(args.rounds):
                turns = list(zip(workers, samples))
                # every other round in reverse, so that going first or last favours no revision
                for process, taken in turns if round_number % 2 == 0 else reversed(turns):
                    assert process.stdin is not None and process.stdout is not None
                    process.stdin.write("round\n")
                    process.stdin.flush()
                    taken.append(json.loads(process.stdout.readline()))
        finally:
            for process in workers:
                process.communicate(timeout=60)
            for tree in trees:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
    print("| case | " + " | ".join(names) + " | " + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |")
    print("| --- |" + " ---: |" * (2 * len(names) - 1))
    for case in samples[0][0]:
        medians = [f"{statistics.median(r[case] for r in taken):.0f} ns" for taken in samples]
        ratios = [f"{statistics.median(a[case] / b[case] for a, b in zip(taken, samples[0])):.2f}"
                  for taken in samples[1:]]
        print(f"| {case} | " + " | ".join(medians + ratios) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
