"""Two revisions' benchmarks side by side in one run on this machine: `softdta bench --quick` (and, unless
--no-core, the pytest-benchmark suite in bench/) of each, interleaved A, B, A, B, ... so that a noisy neighbour
hits both alike. Each side runs its own tree, a git worktree under /tmp removed at the end. Prints, per metric,
the median over rounds of each side, after/before, and each side's spread ((max - min) / median). Root.

    python3 scripts/bench_side_by_side.py REV_BEFORE REV_AFTER [--rounds 3] [--core-rounds 1] [--no-core]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# counts and settings, not measurements: the same on both sides whenever the run worked
NOT_MEASURED = {"min", "max", "rounds", "received", "sent", "drops", "structure_redundancy", "rx_queues",
                "seconds_per_step", "profiled_step", "machine", "seconds", "query_success"}
PRIVILEGED_LOCK = "/tmp/softdta-priv.lock"  # what every privileged run here holds, so none shares the lab with another
LAB_FREE_WAIT_S = 300.0  # how long a round waits for someone else's lab to come down before it is given up


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


class Side:
    """One revision in its own worktree, whose code every run imports."""

    def __init__(self, label: str, revision: str, scratch: Path):
        self.label, self.revision = label, revision
        self.commit = git("rev-parse", "--verify", f"{revision}^{{commit}}")
        self.tree = scratch / label
        git("worktree", "add", "--detach", str(self.tree), self.commit)
        self.env = {**os.environ, "PYTHONPATH": str(self.tree), "PYTHONDONTWRITEBYTECODE": "1"}
        self.bench: list[dict[str, float]] = []
        self.core: list[dict[str, float]] = []
        self.failures: list[str] = []

    def python(self, *args: str, timeout: float = 1800, locked: bool = False) -> subprocess.CompletedProcess[str]:
        lock = ["flock", PRIVILEGED_LOCK] if locked else []
        return subprocess.run([*lock, sys.executable, *args], cwd=self.tree, env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def imported_from(self) -> str:
        """Where `import softdta` finds the package when this side runs: it must be this side's tree."""
        found = self.python("-c", "import softdta; print(softdta.__file__)").stdout.strip()
        if not found.startswith(str(self.tree) + "/"):
            raise SystemExit(f"{self.label} imports softdta from {found}, not from its tree {self.tree}")
        return found

    def run_bench(self, out: Path) -> None:
        for attempt in range(2):
            done = self.python("-m", "softdta.cli", "bench", "--quick", "--out", str(out), locked=True)
            if done.returncode == 0:
                self.bench.append(flatten(json.loads((out / "comparison.json").read_text())))
                return
            reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
            if attempt == 0 and "lab is already up" in reason:  # another user's lab: wait for it, then once more
                wait_for_lab_free()
                continue
            self.failures.append(f"softdta bench --quick: {reason}")
            return

    def run_core(self, out: Path) -> None:
        done = self.python("-m", "pytest", "bench", "--benchmark-only", "--benchmark-json", str(out), "-q",
                           "-p", "no:cacheprovider", locked=True)
        if done.returncode != 0 or not out.exists():
            lines = [line for line in done.stdout.splitlines() if "FAILED" in line or "Error" in line]
            self.failures.append(f"pytest bench: {(lines or ['exit status ' + str(done.returncode)])[-1]}")
            return
        self.core.append({core_name(bench["name"]): bench["stats"]["median"] * 1e9
                          for bench in json.loads(out.read_text())["benchmarks"]})


def wait_for_lab_free() -> None:
    deadline = time.monotonic() + LAB_FREE_WAIT_S
    while time.monotonic() < deadline:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if "sdta-lab-" not in listed:
            return
        time.sleep(2)


def core_name(name: str) -> str:
    """A pytest-benchmark test name the same in both revisions (keywrite was renamed key_write)."""
    return "core " + name.replace("keywrite", "key_write") + " ns"


def flatten(results: object, path: str = "") -> dict[str, float]:
    """The measurements of comparison.json, one per path (a Stats object is its median)."""
    if isinstance(results, dict):
        if "median" in results and "rounds" in results:
            return {path: float(results["median"])} | flatten({k: v for k, v in results.items()
                                                               if k not in {"median", "min", "max", "rounds"}}, path)
        flat: dict[str, float] = {}
        for key, value in results.items():
            if key not in NOT_MEASURED:
                flat |= flatten(value, f"{path}.{key}" if path else key)
        return flat
    if isinstance(results, (int, float)) and not isinstance(results, bool):
        return {path: float(results)}
    return {}  # lists (the live ladders' steps), strings, None


def medians(rounds: list[dict[str, float]]) -> dict[str, tuple[float, float]]:
    """Per metric: the median over rounds, and the spread (max - min) / median."""
    names = list(dict.fromkeys(name for each in rounds for name in each))
    summary = {}
    for name in names:
        values = [each[name] for each in rounds if name in each]
        middle = statistics.median(values)
        summary[name] = (middle, (max(values) - min(values)) / abs(middle) if middle else 0.0)
    return summary


def table(before: Side, after: Side) -> str:
    lines = [f"before {before.revision} = {before.commit[:12]} ({len(before.bench)} bench rounds, "
             f"{len(before.core)} core rounds); after {after.revision} = {after.commit[:12]} "
             f"({len(after.bench)} bench rounds, {len(after.core)} core rounds)",
             "medians over rounds; spread = (max - min) / median over rounds; ns: lower is better, per_s and "
             "scaling: higher is better", ""]
    header = f"{'metric':78} {'before':>14} {'after':>14} {'after/before':>12} {'spread b':>9} {'spread a':>9}"
    lines += [header, "-" * len(header)]
    for kind in ("bench", "core"):
        old, new = medians(getattr(before, kind)), medians(getattr(after, kind))
        for name in list(dict.fromkeys([*old, *new])):
            b, a = old.get(name), new.get(name)
            ratio = f"{a[0] / b[0]:12.3f}" if a and b and b[0] else f"{'-':>12}"
            lines.append(f"{name[:78]:78} {fmt(b and b[0]):>14} {fmt(a and a[0]):>14} {ratio} "
                         f"{pct(b and b[1]):>9} {pct(a and a[1]):>9}")
    for side in (before, after):
        lines += [f"{side.label} {side.revision}: {failure}" for failure in side.failures]
    return "\n".join(lines)


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=3, help="softdta bench --quick runs per side (default 3)")
    parser.add_argument("--core-rounds", type=int, default=1, help="pytest-benchmark runs per side (default 1)")
    parser.add_argument("--no-core", action="store_true", help="leave out the pytest-benchmark suite")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_side_by_side: the benchmarks load BPF programs and build namespaces; run it as root",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the worktrees are removed on kill too
    scratch = Path(tempfile.mkdtemp(prefix="softdta-side-by-side-"))
    sides: list[Side] = []
    started = time.monotonic()
    try:
        for label, revision in (("before", args.before), ("after", args.after)):
            sides.append(Side(label, revision, scratch))
        for side in sides:
            print(f"{side.label} {side.revision} ({side.commit[:12]}) imports {side.imported_from()}", flush=True)
        for round_ in range(args.rounds):
            for side in sides:
                print(f"round {round_ + 1}/{args.rounds}: softdta bench --quick, {side.label}", flush=True)
                side.run_bench(scratch / f"{side.label}-bench-{round_}")
        for round_ in range(0 if args.no_core else args.core_rounds):
            for side in sides:
                print(f"round {round_ + 1}/{args.core_rounds}: pytest bench, {side.label}", flush=True)
                side.run_core(scratch / f"{side.label}-core-{round_}.json")
        print(f"\n{table(*sides)}\n\n{time.monotonic() - started:.0f} s")
    finally:
        for side in sides:
            git("worktree", "remove", "--force", str(side.tree))
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
