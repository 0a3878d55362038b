"""The fleet's slot map, by the controller's own assignment: the load balance and the fraction a join moves, next
to their goals (docs/fleet.md). A computation: no fleet runs."""

from __future__ import annotations

import time
from typing import TypedDict

from softdta.core.fleet_plan import PlanInput, plan

FLEET_SIZES = (3, 16, 64)


class FleetBalance(TypedDict):
    collectors: int
    replicas: int
    slots: int
    max_over_mean: float  # the most slots a collector leads over the mean
    balance_goal: float
    moved_on_join: float  # fraction of (slot, replica) assignments one join moves
    ideal_on_join: float  # 1 / (N + 1)
    join_goal: float  # 1.2 / N
    meets_goals: bool
    seconds: float  # to assign the map, the join and the leave


def fleet_balance(sizes: tuple[int, ...] = FLEET_SIZES, replicas: tuple[int, ...] = (1, 2)) -> dict[str, FleetBalance]:
    results: dict[str, FleetBalance] = {}
    for copies in replicas:
        for collectors in sizes:
            started = time.perf_counter()
            result = plan(PlanInput(collectors, reporters=10 * collectors, replicas=copies))
            results[f"{collectors}_collectors_{copies}_replicas"] = {
                "collectors": collectors, "replicas": result.replicas, "slots": result.slots,
                "max_over_mean": result.max_over_mean, "balance_goal": result.balance_goal,
                "moved_on_join": result.moved_on_join, "ideal_on_join": result.ideal_on_join,
                "join_goal": result.join_goal,
                "meets_goals": result.max_over_mean <= result.balance_goal and result.moved_on_join <= result.join_goal,
                "seconds": round(time.perf_counter() - started, 3)}
    return results
