#!/usr/bin/env python3
"""The XDP translator's ns per report, per primitive, before and after a change, measured side by side.

    sudo python3 scripts/xdp_before_after.py REVISION [--rounds 31] [--repeat 100000]

Builds the benchmark harness (bench/bpf/translator_bench.bpf.c) of REVISION from a temporary git worktree and of
the working tree, loads both, and alternates their runs in one process: each round runs every primitive's
reports through both programs with BPF_PROG_TEST_RUN, the harness's restore subtracted. It prints the medians and
the median of the per-round ratios, which holds up where absolute times on a shared VM do not. Both objects are
driven by the working tree's control plane, so REVISION must share its map layouts.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from softdta.engines import xdp  # noqa: E402
from softdta.kernel import bpf_build  # noqa: E402
from softdta.lab.benchmarks import HARNESS, example_reporter, example_tables, load_reports  # noqa: E402
from softdta.wire import dta  # noqa: E402

CASES = {
    "Key-Write N=1": lambda t: [dta.key_write(k, k * 7, 1) for k in range(1, 17)],
    "Key-Write N=2": lambda t: [dta.key_write(k, k * 7, 2) for k in range(1, 17)],
    "Key-Increment N=1": lambda t: [dta.key_increment(k, 1, 1) for k in range(1, 17)],
    "Append (batch 4)": lambda t: [dta.append(t.append_lists[0].first_list, v) for v in range(16)],
    "Postcarding, 5 hops": lambda t: [dta.postcard(0x0A000001, hop, hop) for hop in range(1, 6)],
    "Sketch-Merge (2 reporters)": lambda t: [dta.sketch_column(reporter, column, [column, reporter, 1, 2])
                                             for column in range(8) for reporter in range(2)],
}


def build_revision(revision: str, into: Path) -> Path:
    """The harness object of `revision`, compiled from a detached worktree under `into`."""
    tree = into / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), revision], check=True)
    try:
        target = into / "translator_bench.bpf.o"
        bpf_build.compile_bpf(tree / "bench" / "bpf" / "translator_bench.bpf.c", target, tree / "bpf")
        return target
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


def ns_per_report(kernel: xdp.XdpTranslator, frame: bytes, repeat: int) -> int:
    translate, restore = kernel.object.programs["bench_translate"], kernel.object.programs["bench_restore"]
    return translate.test_run(frame, repeat=repeat).duration_ns - restore.test_run(frame, repeat=repeat).duration_ns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revision", help="the git revision to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--repeat", type=int, default=100_000, help="test runs per measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        before = build_revision(args.revision, Path(scratch))
        built = xdp.build_object
        xdp.build_object = lambda source: before if source == before else built(source)  # type: ignore[assignment]
        print(f"| primitive | {args.revision} | working tree | after / before (median of paired rounds) |")
        print("| --- | ---: | ---: | ---: |")
        for name, reports in CASES.items():
            tables = example_tables()
            frames = [example_reporter(tables).frame(report) for report in reports(tables)]
            samples: dict[str, list[int]] = {"before": [], "after": []}
            with xdp.XdpTranslator(example_tables(), source=before, flush_idle_ns=0) as old, \
                    xdp.XdpTranslator(example_tables(), source=HARNESS, flush_idle_ns=0) as new:
                for kernel in (old, new):
                    load_reports(kernel, frames)
                for _ in range(args.rounds):
                    samples["before"].append(ns_per_report(old, frames[0], args.repeat))
                    samples["after"].append(ns_per_report(new, frames[0], args.repeat))
            ratio = statistics.median(a / b for a, b in zip(samples["after"], samples["before"]))
            print(f"| {name} | {statistics.median(samples['before']):.0f} ns | "
                  f"{statistics.median(samples['after']):.0f} ns | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
