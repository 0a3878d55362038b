"""A new slot-map epoch reaching the fleet's translators: the time from the controller's etcd commit to the last
translator's applied generation (goal: at most 1 s, docs/fleet.md), on the fleet lab (softdta.lab.fleet_lab)."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import TypedDict

from softdta.lab.fleet_lab import FleetLab

GOAL_S = 1.0


class Propagation(TypedDict):
    """`softdta bench`'s fleet_propagation."""

    translators: int
    collectors: int
    slots: int
    engine: str
    seconds: list[float]  # one per epoch committed: commit -> the last translator's applied generation
    stages_median_s: dict[str, float]  # the first translator's: commit -> map seen, -> tables built, -> applied
    median_s: float
    max_s: float
    goal_s: float
    met: bool


def fleet_propagation(rounds: int = 10, translators: int = 2, engine: str = "xdp") -> Propagation:
    """Commit `rounds` new epochs (a weight change moving slots between two collectors) to a fleet of
    `translators` translators; each round's time from the commit to the last translator's applied generation."""
    with tempfile.TemporaryDirectory(prefix="softdta-fleet-bench-") as run_dir, \
            FleetLab(Path(run_dir), collectors=2, translators=translators, engine=engine) as lab:
        lab.start_etcd()
        lab.start_collectors(1, 2)
        for index in (1, 2):
            lab.register(index)
        current = lab.slot_map((1, 2))
        lab.commit(current.to_json())
        lab.start_translators(*range(1, translators + 1))
        lab.wait_applied(current.epoch)
        seconds = []
        stages: dict[str, list[float]] = {"seen": [], "built": [], "applied": []}
        for round_ in range(rounds):
            current = lab.slot_map((1, 2), previous=current, weights={1 + round_ % 2: 2.0})
            committed = lab.commit(current.to_json())
            seconds.append(round((lab.wait_applied(current.epoch) - committed) / 1e9, 4))
            status = lab.fleet_status(1)
            times = [committed, status["slot_map_seen_at_ns"], status["built_at_ns"], status["applied_at_ns"]]
            for stage, before, after in zip(stages, times, times[1:]):
                stages[stage].append((after - before) / 1e9)
    return Propagation(translators=translators, collectors=2, slots=current.slot_count, engine=engine,
                       seconds=seconds, stages_median_s={stage: round(statistics.median(values), 4)
                                                         for stage, values in stages.items()},
                       median_s=statistics.median(seconds), max_s=max(seconds), goal_s=GOAL_S,
                       met=max(seconds) <= GOAL_S)
