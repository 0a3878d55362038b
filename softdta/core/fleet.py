"""The fleet's slot map: which collectors own each slot of the partition hash, and how a controller assigns it
(sans-IO; docs/fleet.md).

A report's partition key (`Primitive.partition_key`) hashes to one of 2^slot_bits slots (`wire.hashing`); the slot
map gives each slot an ordered replica set of collectors, under an epoch that only grows. `assign` computes a map
from the members and their weights: every replica position is filled to weighted quotas (largest remainder), so
the slots per collector differ by at most one at equal weights, and it keeps every assignment of the previous map
that its quotas allow, so a join or a leave moves only what it must. Ties break by a rendezvous score of
(member, slot), so every controller computes the same map from the same input.
"""

from __future__ import annotations

import heapq
import ipaddress
import json
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from softdta.errors import SoftdtaError
from softdta.spec import DEFAULT_SLOT_BITS, MAX_REPLICAS, MAX_SLOT_BITS
from softdta.wire.hashing import partition_slot

# etcd keys under /softdta/<fleet name>/: what each process writes and watches there (docs/fleet.md)
MEMBERS = "members/"  # + collector name: its Member, under the collector's lease
SLOT_MAP = "slotmap"  # the SlotMap, replaced by compare-and-swap on its revision
LEADER = "leader"  # the leading controller's id, under its lease
APPLIED = "applied/"  # + translator or reporter name: the epoch it applies, under its lease


def fleet_prefix(fleet: str) -> str:
    return f"/softdta/{fleet}/"


class FleetError(SoftdtaError, ValueError):
    """A slot map, membership record or fleet setting that cannot be used."""


@dataclass(frozen=True)
class Member:
    """A collector as it registers in the fleet: where translators connect and routers query it."""

    name: str
    ip: str  # the collector's RoCE address: what its structures are keyed by
    mac: str
    control: str  # HOST:PORT of its control protocol (softdta collector run --control)
    query: str  # base URL of its query service
    weight: float = 1.0
    layout: str = ""  # its regions' layout fingerprint: another one under the same name bumps the epoch

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise FleetError(f"collector name {self.name!r} must be non-empty and without '/'")
        try:
            ipaddress.IPv4Address(self.ip)
        except ValueError:
            raise FleetError(f"collector {self.name}: ip {self.ip!r} is not an IPv4 address") from None
        if not (self.weight > 0 and math.isfinite(self.weight)):
            raise FleetError(f"collector {self.name}: weight {self.weight} must be a positive number")

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Member:
        try:
            fields = json.loads(text)
            return cls(**{name: fields[name] for name in ("name", "ip", "mac", "control", "query")},
                       weight=float(fields.get("weight", 1.0)), layout=str(fields.get("layout", "")))
        except (ValueError, KeyError, TypeError) as error:
            raise FleetError(f"collector registration is malformed ({error}); re-register the collector") from None


@dataclass(frozen=True)
class SlotMap:
    """Slot -> ordered replica set of member names, under `epoch`; `members` gives each named collector's IP."""

    epoch: int
    slot_bits: int
    replicas: int  # the replica sets' size (fewer when the fleet has fewer collectors)
    members: Mapping[str, str]  # name -> collector IP
    slots: tuple[tuple[str, ...], ...]
    _index: dict[str, list[int]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for name, ip in self.members.items():
            try:
                ipaddress.IPv4Address(ip)
            except ValueError:
                raise FleetError(f"slot map: collector {name}'s ip {ip!r} is not an IPv4 address") from None
        if not 1 <= self.slot_bits <= MAX_SLOT_BITS:
            raise FleetError(f"slot map: slot_bits {self.slot_bits} must be 1..{MAX_SLOT_BITS}")
        if self.epoch < 1:
            raise FleetError(f"slot map: epoch {self.epoch} must be at least 1")
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise FleetError(f"slot map: replicas {self.replicas} must be 1..{MAX_REPLICAS}")
        if len(self.slots) != 1 << self.slot_bits:
            raise FleetError(f"slot map: {len(self.slots)} slots, slot_bits {self.slot_bits} needs "
                             f"{1 << self.slot_bits}")
        for slot, owners in enumerate(self.slots):
            if not 1 <= len(owners) <= self.replicas or len(set(owners)) != len(owners):
                raise FleetError(f"slot map: slot {slot} has replica set {list(owners)}; it needs 1..{self.replicas} "
                                 "distinct collectors")
            for name in owners:
                if name not in self.members:
                    raise FleetError(f"slot map: slot {slot} names unknown collector {name!r}; the controller must "
                                     "list every collector it assigns under members")

    @property
    def slot_count(self) -> int:
        return 1 << self.slot_bits

    def slot_of(self, partition_key: bytes) -> int:
        return partition_slot(partition_key, self.slot_bits)

    def owners(self, partition_key: bytes) -> tuple[str, ...]:
        return self.slots[self.slot_of(partition_key)]

    def slots_of(self, name: str) -> list[int]:
        """The slots whose replica set holds `name`, at any position."""
        if not self._index:
            for slot, owners in enumerate(self.slots):
                for owner in owners:
                    self._index.setdefault(owner, []).append(slot)
        return self._index.get(name, [])

    def primary_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(self.members, 0)
        for owners in self.slots:
            counts[owners[0]] += 1
        return counts

    def max_over_mean(self) -> float:
        """The load balance: the most slots any collector leads over the mean."""
        counts = [count for name, count in self.primary_counts().items() if name in self.assigned()]
        return max(counts) / (sum(counts) / len(counts))

    def assigned(self) -> set[str]:
        return {name for owners in self.slots for name in owners}

    def to_json(self) -> str:
        names = sorted(self.members)
        index = {name: i for i, name in enumerate(names)}
        return json.dumps({"epoch": self.epoch, "slot_bits": self.slot_bits, "replicas": self.replicas,
                           "members": {name: self.members[name] for name in names},
                           "slots": [[index[name] for name in owners] for owners in self.slots]},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> SlotMap:
        try:
            document = json.loads(text)
            members = {str(name): str(ip) for name, ip in document["members"].items()}
            names = sorted(members)
            slots = tuple(tuple(_member_name(names, i, slot) for i in owners)
                          for slot, owners in enumerate(document["slots"]))
            return cls(int(document["epoch"]), int(document["slot_bits"]), int(document["replicas"]), members, slots)
        except FleetError:
            raise
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
            raise FleetError(f"slot map is malformed ({type(error).__name__}: {error}); let the controller write "
                             "a new epoch") from None


def _member_name(names: list[str], index: object, slot: int) -> str:
    """The name a slot map's JSON gives by its index into the sorted member names (never counted from the end)."""
    if type(index) is not int or not 0 <= index < len(names):
        raise FleetError(f"slot map: slot {slot} names unknown collector {index!r}: members lists {len(names)}; let "
                         "the controller write a new epoch")
    return names[index]


def check_successor(current: SlotMap | None, new: SlotMap) -> None:
    """A map may replace `current` only with a larger epoch: an older one is a stale write or a split brain."""
    if current is not None and new.epoch <= current.epoch:
        raise FleetError(f"slot map epoch {new.epoch} does not follow epoch {current.epoch}; ignoring it (a stale "
                         "controller wrote it)")


def moved_fraction(old: SlotMap, new: SlotMap) -> float:
    """The fraction of (slot, replica position) assignments that changed owner."""
    if old.slot_bits != new.slot_bits:
        return 1.0
    positions = max(old.replicas, new.replicas)
    changed = sum(1 for before, after in zip(old.slots, new.slots) for position in range(positions)
                  if (before[position] if position < len(before) else None)
                  != (after[position] if position < len(after) else None))
    return changed / (len(new.slots) * positions)


def rendezvous_scores(names: Iterable[str], slot_count: int) -> npt.NDArray[np.uint64]:
    """(members, slots) scores: a splitmix64 of the member's CRC and the slot, the same on every controller."""
    seeds = np.array([zlib.crc32(name.encode()) for name in names], dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (seeds[:, None] << np.uint64(32)) ^ np.arange(slot_count, dtype=np.uint64)[None, :]
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def quotas(weights: Mapping[str, float], total: int) -> dict[str, int]:
    """`total` split by weight, largest remainder first (ties by name): counts differ from the ideal by < 1."""
    whole = sum(weights.values())
    ideal = {name: total * weight / whole for name, weight in weights.items()}
    counts = {name: int(share) for name, share in ideal.items()}
    rest = sorted(weights, key=lambda name: (counts[name] - ideal[name], name))
    for name in rest[:total - sum(counts.values())]:
        counts[name] += 1
    return counts


def assign(members: Mapping[str, Member], *, replicas: int, slot_bits: int = DEFAULT_SLOT_BITS,
           previous: SlotMap | None = None) -> SlotMap:
    """The slot map for `members`, moving as little of `previous` as the quotas allow; epoch previous + 1."""
    if not members:
        raise FleetError("no collector is registered; start a collector with --fleet before the controller")
    if previous is not None and previous.slot_bits != slot_bits:
        previous = None  # another table size: nothing carries over
    names = sorted(members)
    weights = {name: members[name].weight for name in names}
    slot_count = 1 << slot_bits
    depth = min(replicas, len(names))
    scores = rendezvous_scores(names, slot_count)
    number = {name: i for i, name in enumerate(names)}
    table = np.full((depth, slot_count), -1, dtype=np.int64)
    for position in range(depth):
        quota = quotas(weights, slot_count)
        _keep(table, position, previous, number, quota, scores)
        _fill(table, position, quota, scores, names, _later_owners(previous, position, number))
    slots = tuple(tuple(names[table[position, slot]] for position in range(depth)) for slot in range(slot_count))
    return SlotMap((previous.epoch if previous else 0) + 1, slot_bits, depth,
                   {name: members[name].ip for name in names}, slots)


def _keep(table: npt.NDArray[np.int64], position: int, previous: SlotMap | None, number: Mapping[str, int],
          quota: dict[str, int], scores: npt.NDArray[np.uint64]) -> None:
    """Keep the previous owners of this position, the best-scoring ones of each up to its quota."""
    if previous is None:
        return
    candidates: dict[int, list[int]] = {}
    for slot, owners in enumerate(previous.slots):
        if position < len(owners) and owners[position] in number:
            member = number[owners[position]]
            if member not in table[:position, slot]:
                candidates.setdefault(member, []).append(slot)
    name_of = {i: name for name, i in number.items()}
    for member, slots in candidates.items():
        kept = sorted(slots, key=lambda slot: -int(scores[member, slot]))[:quota[name_of[member]]]
        table[position, kept] = member


def _later_owners(previous: SlotMap | None, position: int, number: Mapping[str, int]) -> set[tuple[int, int]]:
    """(member, slot) where the member holds a later position of the slot: taking this one would move that one."""
    if previous is None:
        return set()
    return {(number[name], slot) for slot, owners in enumerate(previous.slots)
            for name in owners[position + 1:] if name in number}


def _fill(table: npt.NDArray[np.int64], position: int, quota: Mapping[str, int], scores: npt.NDArray[np.uint64],
          names: list[str], later: set[tuple[int, int]]) -> None:
    """Maglev-style filling: the member furthest below its quota takes its best-scoring free slot, in turn; first
    without the slots where it holds a later position, then, if it must, with them."""
    row = table[position]
    slot_count = len(row)
    counts = np.bincount(row[row >= 0], minlength=len(names))
    deficits = [(counts[i] - quota[name], i) for i, name in enumerate(names)]
    heap = [entry for entry in deficits if entry[0] < 0]
    heapq.heapify(heap)
    free = set(np.flatnonzero(row < 0).tolist())
    filled = sorted(free)
    preference: dict[int, list[int]] = {}
    cursor = dict.fromkeys(range(len(names)), 0)
    relaxed: set[int] = set()
    while free:
        if not heap:  # quotas met but slots left, where replica sets blocked a member: the least loaded go over
            heap = [(counts[i] - quota[name], i) for i, name in enumerate(names) if cursor[i] < slot_count]
            if not heap:
                raise FleetError(f"cannot fill replica position {position}: too few collectors for the replica "
                                 "sets; lower replicas")
            heapq.heapify(heap)
        deficit, member = heapq.heappop(heap)
        order = preference.get(member)
        if order is None:
            order = preference[member] = np.argsort(scores[member], kind="stable")[::-1].tolist()
        slot = None
        while cursor[member] < slot_count:
            candidate = order[cursor[member]]
            cursor[member] += 1
            if candidate in free and member not in table[:position, candidate] and \
                    (member in relaxed or (member, candidate) not in later):
                slot = candidate
                break
        if slot is None:
            if member not in relaxed:
                relaxed.add(member)
                cursor[member] = 0
                heapq.heappush(heap, (deficit, member))
            continue  # this member can take no more slots at this position
        row[slot] = member
        free.discard(slot)
        counts[member] += 1
        if deficit + 1 < 0:
            heapq.heappush(heap, (deficit + 1, member))
    if relaxed:
        _unblock(table, position, filled, later)


def _unblock(table: npt.NDArray[np.int64], position: int, filled: list[int], later: set[tuple[int, int]]) -> None:
    """Where the filling gave a member a slot it holds a later position of (the slots left at the end of the
    turns may all be such), swap it with a slot filled at this position whose member may take both: counts stay,
    and the later position does not move."""
    row = table[position]
    for slot in filled:
        member = int(row[slot])
        if (member, slot) not in later:
            continue
        for other in filled:
            swap = int(row[other])
            if swap != member and (swap, slot) not in later and (member, other) not in later \
                    and swap not in table[:position, slot] and member not in table[:position, other]:
                row[slot], row[other] = swap, member
                break
