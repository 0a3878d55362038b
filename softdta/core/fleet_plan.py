"""`softdta fleet plan`: what a fleet of a given size does, by simulation (sans-IO; docs/fleet.md).

It assigns the slot map of N collectors the way the controller does (`fleet.assign`), then adds one collector and
removes one, and counts: the load balance (the most slots a collector leads over the mean), the fraction of
assignments each change moves next to its ideal, and what each membership change writes to etcd: the member's
put or delete, one compare-and-swap of the slot map, and one `applied/<name>` put from every reporter and
translator that watches the map, which also each receive the new map.
"""

from __future__ import annotations

import ipaddress
import json
import math
from dataclasses import asdict, dataclass

from softdta.core.fleet import (
    APPLIED,
    MEMBERS,
    SLOT_MAP,
    FleetError,
    Member,
    SlotMap,
    assign,
    fleet_prefix,
    moved_fraction,
)
from softdta.spec import DEFAULT_SLOT_BITS, MAX_REPLICAS, MAX_SLOT_BITS

BALANCE_GOAL = 1.10  # max/mean slots per collector, for 3..64 collectors at 4096 slots
MOVED_ON_JOIN_GOAL = 1.2  # x 1/N: the fraction of assignments one join may move
MAX_PLAN_COLLECTORS = 10_000
MAX_PLAN_ASSIGNMENTS = 1 << 24  # collectors x slots: the simulation's score table (about 800 MB at this size)
ETCD_MAX_REQUEST_BYTES = 1_572_864  # etcd's default --max-request-bytes (1.5 MiB): a larger slot map is refused
PLAN_FLEET = "fleet"  # the fleet name the simulated etcd keys are counted under


@dataclass(frozen=True)
class PlanInput:
    collectors: int
    reporters: int  # reporters and translators that watch the slot map
    replicas: int = 1
    slot_bits: int = DEFAULT_SLOT_BITS
    churn_per_hour: float = 1.0  # collector joins per hour; as many leave, so the fleet keeps its size

    def __post_init__(self) -> None:
        if not 2 <= self.collectors <= MAX_PLAN_COLLECTORS:
            raise FleetError(f"--collectors {self.collectors} must be 2..{MAX_PLAN_COLLECTORS} (a plan simulates "
                             "one leaving)")
        if self.reporters < 0:
            raise FleetError(f"--reporters {self.reporters} must be 0 or more")
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise FleetError(f"--replicas {self.replicas} must be 1..{MAX_REPLICAS}")
        if not 1 <= self.slot_bits <= MAX_SLOT_BITS:
            raise FleetError(f"--slot-bits {self.slot_bits} must be 1..{MAX_SLOT_BITS}")
        if not (self.churn_per_hour >= 0 and math.isfinite(self.churn_per_hour)):
            raise FleetError(f"--churn {self.churn_per_hour} must be a number of joins per hour, 0 or more")
        if self.collectors << self.slot_bits > MAX_PLAN_ASSIGNMENTS:
            raise FleetError(f"{self.collectors} collectors x {1 << self.slot_bits} slots is too large to simulate "
                             f"(the score table holds each pair); lower --slot-bits or --collectors")


@dataclass(frozen=True)
class Plan:
    collectors: int
    reporters: int
    replicas: int
    slot_bits: int
    slots: int
    max_over_mean: float  # the most slots a collector leads over the mean
    best_max_over_mean: float  # what slots of one size allow: ceil(slots / N) over slots / N
    balance_goal: float
    moved_on_join: float  # fraction of (slot, replica) assignments one join moves
    ideal_on_join: float  # 1 / (N + 1): the joiner's share
    join_goal: float  # 1.2 / N
    moved_on_leave: float
    ideal_on_leave: float  # the leaver's share of the assignments
    member_bytes: int  # one members/<collector> put (key + value)
    slot_map_bytes: int  # one slot-map write (key + value)
    applied_bytes: int  # one applied/<name> put (key + value)
    writes_per_change: int  # member put/delete + slot-map CAS + one applied put per watcher
    bytes_per_change: int
    watch_bytes_per_change: int  # the new slot map sent to every watcher
    churn_per_hour: float
    changes_per_hour: float  # joins and as many leaves
    writes_per_second: float  # averaged over the hour
    bytes_per_second: float
    slot_map_fits_etcd: bool  # under etcd's default request limit

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def collector(index: int) -> Member:
    """The index-th simulated collector, with addresses shaped as a real one registers them."""
    ip = str(ipaddress.IPv4Address(0x0A000001 + index))
    return Member(f"collector-{index:05d}", ip, f"02:00:{index >> 24 & 0xFF:02x}:{index >> 16 & 0xFF:02x}:"
                  f"{index >> 8 & 0xFF:02x}:{index & 0xFF:02x}", f"{ip}:4791", f"http://{ip}:8040")


def applied_record(epoch: int) -> str:
    """An `applied/<name>` value as a reporter writes it after applying `epoch`."""
    return json.dumps({"epoch": epoch, "generation": epoch, "at_ns": 1_700_000_000_000_000_000})


def plan(given: PlanInput) -> Plan:
    members = {member.name: member for member in map(collector, range(given.collectors))}
    before = assign(members, replicas=given.replicas, slot_bits=given.slot_bits)
    joiner = collector(given.collectors)
    joined = assign({**members, joiner.name: joiner}, replicas=given.replicas, slot_bits=given.slot_bits,
                    previous=before)
    leaver = sorted(members)[given.collectors // 2]
    left = assign({name: m for name, m in members.items() if name != leaver}, replicas=given.replicas,
                  slot_bits=given.slot_bits, previous=before)
    slots = 1 << given.slot_bits
    prefix = fleet_prefix(PLAN_FLEET)
    member_bytes = len(prefix + MEMBERS + joiner.name) + len(joiner.to_json())
    slot_map_bytes = len(prefix + SLOT_MAP) + len(joined.to_json())
    reporter_name = f"reporter-{max(given.reporters - 1, 0):05d}"
    applied_bytes = len(prefix + APPLIED + reporter_name) + len(applied_record(joined.epoch))
    writes_per_change = 2 + given.reporters
    bytes_per_change = member_bytes + slot_map_bytes + given.reporters * applied_bytes
    changes_per_hour = 2 * given.churn_per_hour
    return Plan(
        collectors=given.collectors, reporters=given.reporters, replicas=before.replicas,
        slot_bits=given.slot_bits, slots=slots,
        max_over_mean=round(before.max_over_mean(), 4),
        best_max_over_mean=round(math.ceil(slots / given.collectors) / (slots / given.collectors), 4),
        balance_goal=BALANCE_GOAL,
        moved_on_join=round(moved_fraction(before, joined), 6),
        ideal_on_join=round(1 / (given.collectors + 1), 6),
        join_goal=round(MOVED_ON_JOIN_GOAL / given.collectors, 6),
        moved_on_leave=round(moved_fraction(before, left), 6),
        ideal_on_leave=round(_share(before, leaver), 6),
        member_bytes=member_bytes, slot_map_bytes=slot_map_bytes, applied_bytes=applied_bytes,
        writes_per_change=writes_per_change, bytes_per_change=bytes_per_change,
        watch_bytes_per_change=given.reporters * slot_map_bytes,
        churn_per_hour=given.churn_per_hour, changes_per_hour=changes_per_hour,
        writes_per_second=round(changes_per_hour * writes_per_change / 3600, 4),
        bytes_per_second=round(changes_per_hour * bytes_per_change / 3600, 1),
        slot_map_fits_etcd=slot_map_bytes <= ETCD_MAX_REQUEST_BYTES)


def _share(slot_map: SlotMap, name: str) -> float:
    """The fraction of the map's (slot, replica) assignments that `name` holds."""
    return len(slot_map.slots_of(name)) / (slot_map.slot_count * slot_map.replicas)
