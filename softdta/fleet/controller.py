"""The fleet controller: several may run, one leads by election in etcd and commits each new slot map epoch
(docs/fleet.md, "Control plane on etcd" and "Failure model").

The leader holds /softdta/<fleet>/leader under its lease (created only if absent, kept alive). It watches the fleet's
keys; after a burst of membership changes settles (`debounce` s), it reads the fleet at one revision and, when the
map must change, computes `core.fleet.assign(members, previous=current)` and commits it by compare-and-swap on the
map's mod revision, fenced by its own leader key's: a controller that lost the lead, or raced another, cannot write.
A failed swap is counted and logged, the fleet is read again, and nothing is overwritten blindly. The others watch
the leader key and campaign when it goes.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from softdta.core.fleet import (
    APPLIED,
    LEADER,
    MEMBERS,
    SLOT_MAP,
    FleetError,
    Member,
    SlotMap,
    assign,
    fleet_prefix,
    moved_fraction,
)
from softdta.etcd.client import Etcd, EtcdUnavailable, KeyValue, NotEtcd, Watch
from softdta.etcd.lease import log_to_stderr
from softdta.spec import DEFAULT_SLOT_BITS, MAX_REPLICAS, MAX_SLOT_BITS

LEASE_TTL_S = 5
DEBOUNCE_S = 0.2  # a burst of joins and leaves becomes one epoch
DEBOUNCE_MOST_S = 1.0  # changes that never pause still get an epoch this often
RETRY_FIRST_S = 0.2
RETRY_MOST_S = 2.0

COUNTERS = {
    "epochs_committed": "slot map epochs this controller committed",
    "elections_won": "times this controller became the leader",
    "leadership_lost": "times its lease or leader key was gone while it led",
    "cas_conflicts": "commits refused because the map or the leader key changed since it read them",
    "invalid_maps_replaced": "slot maps in etcd that were malformed or named unknown collectors, replaced",
    "backward_epochs": "slot maps found with an epoch below one already committed or applied, replaced",
    "layout_changes": "collectors that re-registered with another region layout (epoch bumped)",
    "invalid_members": "membership records that are not a collector's advertisement (ignored)",
    "etcd_failures": "calls etcd did not answer",
}


class Stop(Protocol):
    """threading.Event or cli.common.Signals."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def default_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class FleetView:
    """The fleet's keys read at one revision."""

    revision: int
    members: dict[str, Member]
    bad_members: dict[str, str]  # key -> why it is not a Member
    slot_map_kv: KeyValue | None
    slot_map: SlotMap | None  # None when absent or invalid
    slot_map_error: str  # why the map in etcd is unusable ("" when it is fine or absent)
    layouts: dict[str, str]  # each member's layout when the map was committed (the map document's "layouts")
    leader: KeyValue | None
    applied: dict[str, dict[str, Any]]  # translator or reporter -> its {"epoch", "generation", "at_ns"}

    @property
    def highest_epoch(self) -> int:
        """The largest epoch the fleet has seen: the map's (even unusable), or any applied by a translator."""
        epochs = [int(applied.get("epoch", 0)) for applied in self.applied.values()
                  if isinstance(applied.get("epoch", 0), int)]
        if self.slot_map_kv is not None:
            epochs.append(epoch_in(self.slot_map_kv.value))
        return max(epochs, default=0)


def epoch_in(document: bytes) -> int:
    """The epoch a slot map document claims, even when the rest of it is unusable; 0 when it names none."""
    try:
        epoch = json.loads(document).get("epoch", 0)
    except (ValueError, AttributeError):
        return 0
    return epoch if isinstance(epoch, int) and epoch > 0 else 0


def read_fleet(etcd: Etcd, fleet: str) -> FleetView:
    prefix = fleet_prefix(fleet)
    kvs, revision = etcd.get_prefix(prefix)
    members: dict[str, Member] = {}
    bad: dict[str, str] = {}
    slot_map_kv = leader = None
    applied: dict[str, dict[str, Any]] = {}
    for kv in kvs:
        name = kv.key[len(prefix):]
        if name.startswith(MEMBERS):
            try:
                member = Member.from_json(kv.value)
                if member.name != name[len(MEMBERS):]:
                    raise FleetError(f"it names collector {member.name!r}")
                members[member.name] = member
            except FleetError as error:
                bad[kv.key] = str(error)
        elif name == SLOT_MAP:
            slot_map_kv = kv
        elif name == LEADER:
            leader = kv
        elif name.startswith(APPLIED):
            try:
                document = json.loads(kv.value)
            except ValueError:
                continue
            if isinstance(document, dict):
                applied[name[len(APPLIED):]] = document
    slot_map, why, layouts = None, "", {}
    if slot_map_kv is not None:
        try:
            slot_map = SlotMap.from_json(slot_map_kv.value)
            layouts = {str(name): str(layout)
                       for name, layout in json.loads(slot_map_kv.value).get("layouts", {}).items()}
        except FleetError as problem:
            why = str(problem)
        except (ValueError, AttributeError) as problem:
            why, slot_map = f"its layouts are malformed ({problem})", None
    return FleetView(revision, members, bad, slot_map_kv, slot_map, why, layouts, leader, applied)


def map_document(slot_map: SlotMap, members: Mapping[str, Member]) -> str:
    """The slot map's JSON with each member's layout fingerprint beside it: a collector that re-registers with
    another layout is seen by any controller, also one elected after the change."""
    document = json.loads(slot_map.to_json())
    document["layouts"] = {name: members[name].layout for name in sorted(slot_map.members)}
    return json.dumps(document, separators=(",", ":"))


def same_assignment(a: SlotMap, b: SlotMap) -> bool:
    return (a.slot_bits, a.replicas, dict(a.members), a.slots) == (b.slot_bits, b.replicas, dict(b.members), b.slots)


class LostLeadership(Exception):
    """The lease or the leader key is gone: back to campaigning (internal to the controller's loop)."""


class Controller:
    """One controller of fleet `fleet`; `run(stop)` campaigns, leads or follows until `stop` is set."""

    def __init__(self, etcd: Etcd, fleet: str, *, ident: str | None = None, replicas: int = 1,
                 slot_bits: int = DEFAULT_SLOT_BITS, lease_ttl: int = LEASE_TTL_S, debounce: float = DEBOUNCE_S,
                 log: Callable[[str], None] = log_to_stderr):
        if not fleet or "/" in fleet:
            raise FleetError(f"fleet name {fleet!r} must be non-empty and without '/'; give --fleet NAME")
        if not 1 <= replicas <= MAX_REPLICAS:
            raise FleetError(f"--replicas {replicas} must be 1..{MAX_REPLICAS}")
        if lease_ttl < 2:
            raise FleetError(f"--lease-ttl {lease_ttl} is below etcd's shortest lease, 2 s; give 2 or more")
        if not 1 <= slot_bits <= MAX_SLOT_BITS:
            raise FleetError(f"--slot-bits {slot_bits} must be 1..{MAX_SLOT_BITS}")
        self.etcd, self.fleet, self.prefix = etcd, fleet, fleet_prefix(fleet)
        self.ident = ident or default_id()
        self.replicas, self.slot_bits, self.lease_ttl, self.debounce = replicas, slot_bits, lease_ttl, debounce
        self.log = log
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.lease = 0
        self.leader_revision = 0  # mod revision of our leader key while we lead
        self.leading = False
        self.epoch = 0  # the highest epoch seen or committed: a new map always goes above it
        self.last_map: SlotMap | None = None  # the last valid map read or committed
        self.committed_revision = 0  # mod revision of our last commit (its watch event needs no re-read)
        self.read_revision = 0  # the revision of the last read of the fleet
        self.etcd_reachable = True
        self.reported: set[str] = set()  # problems logged once until they change
        self.leader_seen = ""

    @property
    def leader_key(self) -> str:
        return self.prefix + LEADER

    def status(self) -> dict[str, Any]:
        return {"id": self.ident, "fleet": self.fleet, "leading": self.leading, "epoch": self.epoch,
                "etcd_reachable": self.etcd_reachable, **self.counters}

    # ----------------------------------------------------------------------------------------------
    # the loop

    def run(self, stop: Stop) -> None:
        """Campaign, lead or follow until `stop`; etcd unreachable is logged once per outage and retried. A
        NotEtcd on the first contact is raised (the URL is wrong); later ones are retried like any outage."""
        retry, contacted = RETRY_FIRST_S, False
        try:
            while not stop.is_set():
                try:
                    won = self.campaign()
                    contacted = True
                    self._reachable()
                    if won:
                        self.lead(stop)
                    else:
                        self.follow(stop)
                    retry = RETRY_FIRST_S
                except LostLeadership as why:
                    self._step_down(str(why))
                except NotEtcd:
                    if not contacted:
                        raise
                    retry = self._unreachable(retry, stop)
                except EtcdUnavailable as error:
                    self._note_failure(error)
                    retry = self._unreachable(retry, stop)
        finally:
            self.resign()

    def _unreachable(self, retry: float, stop: Stop) -> float:
        """Wait `retry`, then the next wait: growing, but within a third of the lease's TTL, so that the leader
        renews its lease (and keeps its lead) soon enough once etcd answers again."""
        stop.wait(retry)
        return min(retry * 2, RETRY_MOST_S, self.lease_ttl / 3)

    def _note_failure(self, error: EtcdUnavailable) -> None:
        self.counters["etcd_failures"] += 1
        if self.etcd_reachable:
            self.etcd_reachable = False
            self.log(f"controller {self.ident}: {error}; the fleet runs on its last epoch "
                     f"({self.epoch}); retrying")

    def _reachable(self) -> None:
        if not self.etcd_reachable:
            self.etcd_reachable = True
            self.log(f"controller {self.ident}: etcd at {self.etcd.endpoint} answers again")

    def _step_down(self, why: str) -> None:
        if self.leading:
            self.counters["leadership_lost"] += 1
            self.log(f"controller {self.ident}: no longer leading fleet {self.fleet} ({why}); campaigning again")
        self.leading = False
        self.lease = 0

    def resign(self) -> None:
        """Give the lead up at once (revoke the lease, so the leader key goes now)."""
        if self.lease:
            try:
                self.etcd.revoke(self.lease)
            except EtcdUnavailable:
                pass  # it expires within the TTL
        self.lease, self.leading = 0, False

    # ----------------------------------------------------------------------------------------------
    # election

    def campaign(self) -> bool:
        """Create the leader key under a fresh lease if it is absent; True if this controller leads (also when
        the key is still its own from before an outage)."""
        if self.lease and self.etcd.keepalive(self.lease) == 0:
            self.lease = 0
        if not self.lease:
            self.lease = self.etcd.grant(self.lease_ttl)
        won = self.etcd.put_if(self.leader_key, self.ident, mod_revision=0, lease=self.lease)
        current = self.etcd.get(self.leader_key)
        if current is None or current.lease != self.lease:
            if not won and current is not None and current.value.decode(errors="replace") != self.leader_seen:
                self.leader_seen = current.value.decode(errors="replace")
                self.log(f"controller {self.ident}: {self.leader_seen} leads fleet {self.fleet}; standing by")
            return False
        self.leader_revision = current.mod_revision
        if not self.leading:
            self.leading = True
            self.counters["elections_won"] += 1
            self.log(f"controller {self.ident}: leading fleet {self.fleet} (lease TTL {self.lease_ttl} s)")
        return True

    def follow(self, stop: Stop) -> None:
        """Wait until the leader key goes (its lease ended), renewing this controller's own lease meanwhile."""
        kvs, revision = self.etcd.get_prefix(self.leader_key)
        if not any(kv.key == self.leader_key for kv in kvs):
            return
        watch = self.etcd.watch(self.leader_key, revision + 1)
        try:
            while not stop.is_set():
                events = watch.poll(self.lease_ttl / 3)
                if any(event.key == self.leader_key and event.kind == "delete" for event in events):
                    return
                if self.lease and self.etcd.keepalive(self.lease) == 0:
                    self.lease = 0
        finally:
            watch.close()

    # ----------------------------------------------------------------------------------------------
    # leading

    def lead(self, stop: Stop) -> None:
        settled = self.reconcile()
        watch: Watch = self.etcd.watch(self.prefix, self.read_revision + 1)
        renew_at = time.monotonic() + self.lease_ttl / 3
        first_change = last_change = None if settled else time.monotonic()  # changes not yet reconciled
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now >= renew_at:
                    if self.etcd.keepalive(self.lease) == 0:
                        raise LostLeadership("its lease expired")
                    renew_at = now + self.lease_ttl / 3
                wait = renew_at - now
                if last_change is not None and first_change is not None:
                    due = min(last_change + self.debounce, first_change + DEBOUNCE_MOST_S)
                    if now >= due:
                        first_change = last_change = None if self.reconcile() else now
                        continue
                    wait = min(wait, due - now)
                for event in watch.poll(max(wait, 0.0)):
                    name = event.key[len(self.prefix):]
                    if name == LEADER and event.kind == "delete":
                        raise LostLeadership("its leader key was deleted")
                    if name.startswith(MEMBERS) or (name == SLOT_MAP and event.mod_revision != self.committed_revision):
                        last_change = time.monotonic()
                        first_change = first_change or last_change
        finally:
            watch.close()

    def reconcile(self) -> bool:
        """Read the fleet; commit a new epoch if the map is absent, unusable, behind, or not the assignment of
        the registered members (or a member changed its layout). False when the commit was refused (the map or
        the leader key changed since the read): the caller reads again later, nothing is overwritten unread."""
        view = read_fleet(self.etcd, self.fleet)
        self.read_revision = view.revision
        if view.leader is None or view.leader.lease != self.lease:
            raise LostLeadership("its leader key is gone or another controller's")
        self._report_bad_members(view)
        current, highest = view.slot_map, max(self.epoch, view.highest_epoch)
        problem, counter = "", ""
        if view.slot_map_kv is not None and current is None:
            problem, counter = f"the slot map in etcd is unusable ({view.slot_map_error})", "invalid_maps_replaced"
        elif current is not None and current.epoch < highest:
            problem, counter = (f"the slot map's epoch {current.epoch} went backwards (epoch {highest} was committed "
                                "or applied)"), "backward_epochs"
        self.epoch = highest
        if not problem and current is not None:
            self.last_map = current
        if not view.members:
            self._once("no-members", f"controller {self.ident}: no collector is registered in fleet {self.fleet}; "
                                     "keeping the last slot map until one registers")
            return True
        self.reported.discard("no-members")
        previous = self.last_map
        changed_layouts = sorted(name for name, member in view.members.items()
                                 if name in view.layouts and view.layouts[name] != member.layout)
        candidate = assign(view.members, replicas=self.replicas, slot_bits=self.slot_bits, previous=previous)
        if not problem and not changed_layouts and current is not None and same_assignment(candidate, current):
            return True
        new = replace(candidate, epoch=highest + 1)
        expected = view.slot_map_kv.mod_revision if view.slot_map_kv is not None else 0
        revision = self.etcd.put_if(self.prefix + SLOT_MAP, map_document(new, view.members), mod_revision=expected,
                                    unchanged={self.leader_key: self.leader_revision})
        if not revision:
            self.counters["cas_conflicts"] += 1
            self.log(f"controller {self.ident}: epoch {new.epoch} not committed: the slot map or the leader key "
                     "changed since they were read (another controller wrote); reading the fleet again")
            return False
        if counter:
            self.counters[counter] += 1
        self.committed_revision = revision
        self._committed(new, previous, problem, changed_layouts)
        return True

    def _committed(self, new: SlotMap, before: SlotMap | None, problem: str, changed_layouts: list[str]) -> None:
        self.epoch = new.epoch
        self.last_map = new
        self.counters["epochs_committed"] += 1
        moved = f", moved {moved_fraction(before, new):.3f} of the assignments" if before is not None else ""
        why = [problem] if problem else []
        if changed_layouts:
            self.counters["layout_changes"] += len(changed_layouts)
            why.append(f"collector(s) {', '.join(changed_layouts)} re-registered with another region layout: their "
                       "slots stay, translators reconnect to them for the new layout")
        self.log(f"controller {self.ident}: committed epoch {new.epoch} of fleet {self.fleet}: "
                 f"{len(new.members)} collectors ({', '.join(sorted(new.members))}), {new.replicas} replicas"
                 f"{moved}" + (f"; {'; '.join(why)}" if why else ""))

    def _report_bad_members(self, view: FleetView) -> None:
        for key, why in view.bad_members.items():
            mark = f"member {key} {why}"
            if mark not in self.reported:
                self.reported.add(mark)
                self.counters["invalid_members"] += 1
                self.log(f"controller {self.ident}: ignoring {key}: {why}")

    def _once(self, mark: str, line: str) -> None:
        if mark not in self.reported:
            self.reported.add(mark)
            self.log(line)


def fleet_status(etcd: Etcd, fleet: str) -> dict[str, Any]:
    """What `softdta fleet status` prints: members, leader, the current epoch, slots per collector, and the
    epoch each translator or reporter applies."""
    view = read_fleet(etcd, fleet)
    slot_map = view.slot_map
    held = {name: len(slot_map.slots_of(name)) for name in slot_map.members} if slot_map else {}
    led = slot_map.primary_counts() if slot_map else {}
    return {
        "fleet": fleet, "etcd": etcd.endpoint, "revision": view.revision,
        "leader": view.leader.value.decode(errors="replace") if view.leader else None,
        "epoch": slot_map.epoch if slot_map else None,
        "slot_map_problem": view.slot_map_error or None,
        "slot_bits": slot_map.slot_bits if slot_map else None,
        "replicas": slot_map.replicas if slot_map else None,
        "members": {name: {"ip": member.ip, "weight": member.weight, "control": member.control,
                           "query": member.query, "layout": member.layout,
                           "slots_led": led.get(name, 0), "slots_held": held.get(name, 0)}
                    for name, member in sorted(view.members.items())},
        "unregistered_in_map": sorted(set(held) - set(view.members)),
        "invalid_members": view.bad_members,
        "applied": {name: {**applied, "current": slot_map is not None and applied.get("epoch") == slot_map.epoch}
                    for name, applied in sorted(view.applied.items())},
    }


class _Metrics:
    """The controller's counters and state, read at scrape time."""

    def __init__(self, controller: Controller):
        self.controller = controller

    def collect(self) -> list[Metric]:
        controller = self.controller
        counters = CounterMetricFamily("softdta_fleet_controller_events", "Fleet controller events (docs/fleet.md)",
                                       labels=["event"])
        for event, value in controller.counters.items():
            counters.add_metric([event], value)
        leading = GaugeMetricFamily("softdta_fleet_controller_leading", "1 while this controller leads its fleet")
        leading.add_metric([], int(controller.leading))
        epoch = GaugeMetricFamily("softdta_fleet_epoch", "The highest slot map epoch this controller saw or committed")
        epoch.add_metric([], controller.epoch)
        reachable = GaugeMetricFamily("softdta_fleet_etcd_reachable", "1 while etcd answers this controller")
        reachable.add_metric([], int(controller.etcd_reachable))
        return [counters, leading, epoch, reachable]


def serve_metrics(controller: Controller, address: str) -> None:
    """Prometheus text at http://HOST:PORT/metrics, from a thread."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise FleetError(f"--metrics {address!r} is not HOST:PORT")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Metrics(controller))
    try:
        start_http_server(int(port), host, registry)
    except OSError as error:
        raise FleetError(f"cannot serve metrics on {address} ({error.strerror}); give another --metrics") from None
