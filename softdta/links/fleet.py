"""A translator that follows a fleet in etcd (docs/fleet.md): its slot map and members become translator tables.

`FleetLinks` reads `/softdta/<fleet>/slotmap` and `members/` and watches them. It keeps one control link
(links/control.py) to each collector the map names, connecting to new ones and dropping those that left, and
builds the tables from every connected collector's advertisements plus a `[fleet]` section: the fleet address, the
map's epoch, and each slot's replicas that are connected, in order. After the engine applies a generation of tables
it writes `applied/<translator>` = {"epoch", "generation", "at_ns", "replicas_unconnected"} under its own lease:
the last says how many replicas of that epoch's map it had no queue pairs to yet (0: the map is applied in full).

Nothing etcd sends can stop the translator or make it write to the wrong collector: a malformed map or one whose
epoch does not grow is refused (logged, counted) and the last good one stays; when etcd is unreachable the
translator runs on its last epoch, says so in its status file (`softdta translator stats`), and re-reads and
re-watches from the current revision when etcd answers again.
"""

from __future__ import annotations

import json
import queue
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from softdta.collector.control import ControlError
from softdta.core.fleet import APPLIED, MEMBERS, SLOT_MAP, FleetError, Member, SlotMap, check_successor, fleet_prefix
from softdta.core.settings import TableError
from softdta.core.tables import Tables
from softdta.etcd.client import Etcd, EtcdUnavailable, KeyValue, WatchEvent
from softdta.links.control import CollectorLinks
from softdta.spec import DEFAULT_SLOT_BITS

FIRST_QPN = 0x1000
QPNS_PER_COLLECTOR = 0x100  # each collector's queue pairs get local QPNs of their own: base + structure
RETRY_FIRST_S, RETRY_MOST_S = 0.1, 2.0  # etcd and collectors that do not answer are retried this often
CONNECT_RETRY_S = 1.0
APPLIED_TTL_S = 10
APPLIED_POLL_S = 0.002  # how often a pending generation is looked for in the engine


def fleet_status_file(secrets_file: Path) -> Path:
    """Where a translator keeps its fleet status (beside its collectors' secrets): `translator stats` reads it."""
    return secrets_file.with_suffix(".fleet.json")


def collector_secrets_file(secrets_file: Path, collector: str) -> Path:
    """Each collector's session secrets, so a restarted translator reclaims its queue pairs there."""
    return secrets_file.with_suffix(f".{collector}.json")


def log_line(line: str) -> None:
    print(f"softdta: fleet: {line}", flush=True)


class _Relay(queue.Queue[Tables]):
    """A collector link's updates queue that tells the fleet to rebuild its tables instead of queueing."""

    def __init__(self, changed: Callable[[], None]):
        super().__init__()
        self.changed = changed

    def put(self, item: Tables, block: bool = True, timeout: float | None = None) -> None:
        self.changed()


class FleetLinks:
    """The translator's tables from fleet `fleet` in `etcd` (a links.source.TableSource).

    `address` is the fleet address reporters send to; `across` puts copy n of a redundant report at replica n;
    `name` names this translator under applied/. `token`, `tls`, `queues` are as for CollectorLinks;
    `secrets_file`, when given, keeps each collector's session secrets beside it and the fleet status in
    `fleet_status_file(secrets_file)`."""

    def __init__(self, translator: dict[str, Any], etcd: Etcd, fleet: str, address: str, *, name: str,
                 across: bool = False, token: str = "", tls: ssl.SSLContext | None = None, queues: int = 1,
                 secrets_file: Path | None = None, log: Callable[[str], None] = log_line):
        self.translator, self.etcd, self.fleet, self.address, self.name = translator, etcd, fleet, address, name
        self.across, self.token, self.tls, self.queues, self.log = across, token, tls, queues, log
        self.secrets_file = secrets_file
        self.status_file = fleet_status_file(secrets_file) if secrets_file else None
        self.prefix = fleet_prefix(fleet)
        self.updates: queue.Queue[Tables] = queue.Queue()
        self.failed_qpns: Callable[[], set[int]] = set
        self.next_psns: Callable[[], dict[int, int]] = dict
        self.current_tables: Callable[[], Tables | None] = lambda: None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._slot_map: SlotMap | None = None
        self._slot_map_revision = 0
        self._members: dict[str, Member] = {}
        self._links: dict[str, tuple[Member, CollectorLinks]] = {}  # connected collectors, by member name
        self._connecting: set[str] = set()
        self._retry_at: dict[str, float] = {}
        self._qpn_bases: dict[str, int] = {}
        self._unregistered_logged: set[str] = set()
        # (tables, generation, epoch, replicas unconnected)
        self._emitted: deque[tuple[Tables, int, int, int]] = deque(maxlen=64)
        self._generation = 0
        self._started = False
        self._threads: list[threading.Thread] = []
        self.status: dict[str, Any] = {
            "fleet": fleet, "translator": name, "address": address, "etcd": etcd.endpoint, "etcd_reachable": True,
            "etcd_unreachable_since_ns": 0, "etcd_outages": 0, "running": True,
            "epoch": 0, "generation": 0, "applied_at_ns": 0, "applied_unconnected": 0, "published_generation": 0,
            "slot_map_epoch": 0,
            "slot_map_seen_at_ns": 0, "built_at_ns": 0,
            "slot_maps_refused": 0, "last_refusal": "", "members_refused": 0, "tables_refused": 0,
            "replicas_unconnected": 0, "slots_unmapped": 0, "collectors": {}}

    # ----------------------------------------------------------------------------------------------
    # TableSource

    def start(self, connect_within: float = 15.0) -> Tables:
        """Read the fleet, connect to its collectors (those that do not answer within `connect_within` are
        retried in the background) and give the first tables. etcd must answer now."""
        revision = self._read_all()
        with self._lock:
            pending = self._reconcile()
        deadline = time.monotonic() + connect_within
        for thread in pending:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            tables, epoch = self._build()
            self._started = True
            self._emit(tables, epoch, queue_it=False)
        self._spawn(self._follow, "softdta-fleet-watch", revision)
        self._spawn(self._publish, "softdta-fleet-applied")
        return tables

    def tables(self) -> Tables:
        with self._lock:
            return self._build()[0]

    def report_failures(self, failed_qpns: Callable[[], set[int]]) -> None:
        self.failed_qpns = failed_qpns

    def report_psns(self, next_psns: Callable[[], dict[int, int]]) -> None:
        self.next_psns = next_psns

    def report_applied(self, current_tables: Callable[[], Tables | None]) -> None:
        """How to read the tables the engine runs: each generation seen there is published under applied/."""
        self.current_tables = current_tables

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        with self._lock:
            links = [link for _, link in self._links.values()]
            self._links.clear()
        for link in links:
            link.close()
        self.status["running"] = False
        self._write_status()

    # ----------------------------------------------------------------------------------------------
    # etcd

    def _read_all(self) -> int:
        """Read the map and the members afresh (at start and after an outage); the revision they were read at."""
        kvs, revision = self.etcd.get_prefix(self.prefix)
        members = {}
        slot_map: KeyValue | None = None
        for kv in kvs:
            if kv.key == self.prefix + SLOT_MAP:
                slot_map = kv
            elif kv.key.startswith(self.prefix + MEMBERS):
                member = self._member(kv.key, kv.value)
                if member is not None:
                    members[member.name] = member
        with self._lock:
            self._members = members
            if slot_map is not None:
                self._take_slot_map(slot_map.value, slot_map.mod_revision)
        return revision

    def _member(self, key: str, value: bytes) -> Member | None:
        name = key[len(self.prefix + MEMBERS):]
        try:
            member = Member.from_json(value)
        except FleetError as error:
            self.status["members_refused"] += 1
            self.log(f"registration {key} refused: {error}")
            return None
        if member.name != name:
            self.status["members_refused"] += 1
            self.log(f"registration {key} refused: it names collector {member.name!r}; the key must be "
                     f"{MEMBERS}{member.name}")
            return None
        return member

    def _take_slot_map(self, value: bytes, mod_revision: int) -> bool:
        """A slot map etcd holds: taken if well formed and newer, else refused and the running one kept."""
        if mod_revision == self._slot_map_revision:
            return False  # the one already taken (a re-read after an outage)
        try:
            slot_map = SlotMap.from_json(value)
            check_successor(self._slot_map, slot_map)
        except FleetError as error:
            self.status["slot_maps_refused"] += 1
            self.status["last_refusal"] = str(error)
            running = f"epoch {self._slot_map.epoch}" if self._slot_map else "no slot map"
            self.log(f"slot map refused, {running} stays: {error}")
            self._write_status()
            return False
        self._slot_map, self._slot_map_revision = slot_map, mod_revision
        self.status.update(slot_map_epoch=slot_map.epoch, slot_map_seen_at_ns=time.time_ns())
        return True

    def _follow(self, revision: int) -> None:
        """Watch the fleet's keys from `revision` + 1; when etcd goes away, retry, then re-read and re-watch."""
        retry = RETRY_FIRST_S
        while not self._stop.is_set():
            try:
                watch = self.etcd.watch(self.prefix, revision + 1, idle_timeout=0.5)
                try:
                    self._reachable()
                    retry = RETRY_FIRST_S
                    while not self._stop.is_set():
                        batch = next(watch)
                        if batch:
                            revision = max(revision, *(event.mod_revision for event in batch))
                            self._events(batch)
                        self._connect_missing()
                finally:
                    watch.close()
            except (EtcdUnavailable, StopIteration) as error:
                if self._stop.is_set():
                    return
                self._unreachable(str(error) or "the watch ended")
            while not self._stop.wait(retry):
                self._connect_missing()
                try:
                    revision = self._read_all()
                except EtcdUnavailable as error:
                    self._unreachable(str(error))
                    retry = min(retry * 2, RETRY_MOST_S)
                    continue
                self._reachable()
                self._connect_missing()
                self._rebuild()
                break

    def _events(self, batch: list[WatchEvent]) -> None:
        changed = False
        with self._lock:
            for event in batch:
                if event.key == self.prefix + SLOT_MAP:
                    if event.kind == "put":
                        changed |= self._take_slot_map(event.value, event.mod_revision)
                    else:
                        self.log("the slot map was deleted from etcd; running on epoch "
                                 f"{self._slot_map.epoch if self._slot_map else 0} until a controller writes one")
                elif event.key.startswith(self.prefix + MEMBERS):
                    name = event.key[len(self.prefix + MEMBERS):]
                    member = self._member(event.key, event.value) if event.kind == "put" else None
                    if member is not None:
                        self._members[name] = member
                    elif event.kind == "delete":
                        self._members.pop(name, None)  # its link stays while the map names it
            self._reconcile()
        if changed:
            self._rebuild()

    def _reachable(self) -> None:
        if not self.status["etcd_reachable"]:
            self.status.update(etcd_reachable=True, etcd_unreachable_since_ns=0)
            self.log(f"etcd at {self.etcd.endpoint} answers again; re-reading the fleet and watching on")
            self._write_status()

    def _unreachable(self, reason: str) -> None:
        if self.status["etcd_reachable"]:
            self.status.update(etcd_reachable=False, etcd_unreachable_since_ns=time.time_ns(),
                               etcd_outages=self.status["etcd_outages"] + 1)
            self.log(f"{reason}; running on epoch {self.status['epoch']} and retrying")
            self._write_status()

    # ----------------------------------------------------------------------------------------------
    # collectors

    def _reconcile(self) -> list[threading.Thread]:
        """Drop the links to collectors the map no longer names; start connecting to the ones it names (with the
        lock held). The threads that connect."""
        wanted = set(self._slot_map.members) if self._slot_map else set()
        for name in [name for name, (member, _) in self._links.items()
                     if name not in wanted or self._moved(name, member)]:
            _, link = self._links.pop(name)
            self.log(f"collector {name} left the slot map, moved or came back with other regions; its link is closed")
            self._spawn(link.close, f"softdta-fleet-close {name}", joined=False)  # its thread may wait for our lock
            self.status["collectors"].pop(name, None)
        threads = []
        now = time.monotonic()
        for name in sorted(wanted - set(self._links) - self._connecting):
            member = self._members.get(name)
            if member is None:
                if name not in self._unregistered_logged:
                    self._unregistered_logged.add(name)
                    self.log(f"collector {name} of the slot map is not registered under {self.prefix}{MEMBERS}; "
                             "its slots go to their other replicas until it registers")
                self.status["collectors"][name] = "not registered"
                continue
            self._unregistered_logged.discard(name)
            if self._retry_at.get(name, 0.0) > now:
                continue
            self._connecting.add(name)
            self.status["collectors"][name] = "connecting"
            threads.append(self._spawn(self._connect, f"softdta-fleet-connect {name}", member, joined=False))
        return threads

    def _moved(self, name: str, connected: Member) -> bool:
        """Whether the collector registered again at another control address or with other regions: the link's
        queue pairs and advertisements describe what is no longer there."""
        member = self._members.get(name)
        return member is not None and (member.control, member.layout) != (connected.control, connected.layout)

    def _connect_missing(self) -> None:
        with self._lock:
            self._reconcile()

    def _connect(self, member: Member) -> None:
        host, _, port = member.control.rpartition(":")
        with self._lock:
            base = self._qpn_bases.setdefault(member.name, FIRST_QPN + QPNS_PER_COLLECTOR * len(self._qpn_bases))
        link = CollectorLinks(self.translator, [(host, int(port) if port.isdigit() else 0)], self.token,
                              first_qpn=base, tls=self.tls, queues=self.queues,
                              secrets_file=collector_secrets_file(self.secrets_file, member.name)
                              if self.secrets_file else None)
        link.report_failures(lambda: self.failed_qpns())
        link.report_psns(lambda: self.next_psns())
        link.updates = _Relay(self._rebuild)
        try:
            link.start()
        except (ControlError, OSError) as error:
            link.close()
            with self._lock:
                self._connecting.discard(member.name)
                self._retry_at[member.name] = time.monotonic() + CONNECT_RETRY_S
                if self.status["collectors"].get(member.name) != "unreachable":
                    self.log(f"collector {member.name} at {member.control}: {error}; retrying")
                self.status["collectors"][member.name] = "unreachable"
            self._write_status()
            return
        with self._lock:
            self._connecting.discard(member.name)
            if self._stop.is_set() or self._slot_map is None or member.name not in self._slot_map.members \
                    or self._members.get(member.name, member).control != member.control:
                keep = False
            else:
                keep = True
                self._links[member.name] = (member, link)
                self.status["collectors"][member.name] = "connected"
        if not keep:
            link.close()
            return
        self.log(f"connected to collector {member.name} at {member.control}")
        self._rebuild()

    # ----------------------------------------------------------------------------------------------
    # tables

    def _build(self) -> tuple[Tables, int]:
        """The tables of the connected collectors and the running slot map, and its epoch (with the lock held).
        A replica not connected is left out of its slot: the others take its reports, or, with none left, the
        data path drops them as unmapped."""
        document: dict[str, Any] = {"translator": self.translator, "collectors": [], "structures": [], "append": []}
        name_of_ip: dict[str, str] = {}
        for _, link in sorted(self._links.values(), key=lambda entry: entry[0].name):
            part = link.document()
            for key in ("collectors", "structures", "append"):
                document[key] += part[key]
            name_of_ip.update({collector["ip"]: collector["name"] for collector in part["collectors"]})
        slot_map = self._slot_map
        epoch, slot_bits = (slot_map.epoch, slot_map.slot_bits) if slot_map else (0, DEFAULT_SLOT_BITS)
        slots: list[list[str]] = [[] for _ in range(1 << slot_bits)]
        unconnected = 0
        if slot_map is not None:
            connected = {name: name_of_ip[ip] for name, ip in slot_map.members.items() if ip in name_of_ip}
            for slot, owners in enumerate(slot_map.slots):
                slots[slot] = [connected[name] for name in owners if name in connected]
                unconnected += len(owners) - len(slots[slot])
        document["fleet"] = {"address": self.address, "epoch": epoch, "slot_bits": slot_bits, "across": self.across,
                             "slots": slots}
        tables = Tables.from_dict(document, f"fleet {self.fleet} (epoch {epoch})")
        unmapped = sum(1 for replicas in slots if not replicas)
        if slot_map is not None and (unconnected, unmapped) != (self.status["replicas_unconnected"],
                                                                 self.status["slots_unmapped"]) and unconnected:
            self.log(f"epoch {epoch}: {unconnected} replicas of {len(slots)} slots are not connected and left out; "
                     f"{unmapped} slots have no connected replica (their reports are dropped as unmapped)")
        self.status.update(replicas_unconnected=unconnected, slots_unmapped=unmapped)
        return tables, epoch

    def _rebuild(self) -> None:
        """New tables for the engine; tables that do not validate are refused and the running ones stay."""
        with self._lock:
            if not self._started or self._stop.is_set():
                return
            try:
                tables, epoch = self._build()
            except TableError as error:
                self.status["tables_refused"] += 1
                self.log(f"tables refused, the running ones stay: {error}")
                self._write_status()
                return
            self._emit(tables, epoch)

    def _emit(self, tables: Tables, epoch: int, queue_it: bool = True) -> None:
        self._generation += 1
        self._emitted.append((tables, self._generation, epoch, self.status["replicas_unconnected"]))
        self.status["built_at_ns"] = time.time_ns()
        if queue_it:
            self.updates.put(tables)

    # ----------------------------------------------------------------------------------------------
    # applied/

    def _publish(self) -> None:
        """Find each generation the engine runs and write it under applied/, under a lease kept alive here."""
        key = self.prefix + APPLIED + self.name
        lease, renew_at, published, retry_at = 0, 0.0, 0, 0.0
        while not self._stop.wait(APPLIED_POLL_S if self._pending() else 0.05):
            self._observe_applied()
            now = time.monotonic()
            if now < retry_at or (published == self.status["generation"] and now < renew_at):
                continue
            try:
                if lease and now >= renew_at and self.etcd.keepalive(lease) == 0:
                    lease = 0  # expired while etcd was away: the record goes again under a new lease
                if not lease:
                    lease, published = self.etcd.grant(APPLIED_TTL_S), 0
                renew_at = now + APPLIED_TTL_S / 3
                generation = self.status["generation"]
                if generation and published != generation:
                    self.etcd.put(key, json.dumps({"epoch": self.status["epoch"], "generation": generation,
                                                   "at_ns": self.status["applied_at_ns"],
                                                   "replicas_unconnected": self.status["applied_unconnected"]}),
                                  lease=lease)
                    published = generation
                    self.status["published_generation"] = generation
                    self._write_status()
                self._reachable()
            except EtcdUnavailable as error:
                if "lease not found" in str(error):
                    lease = 0
                else:
                    self._unreachable(str(error))
                retry_at = now + RETRY_FIRST_S * 5

    def _pending(self) -> bool:
        return bool(self._emitted) and self._emitted[-1][1] != self.status["generation"]

    def _observe_applied(self) -> None:
        current = self.current_tables()
        if current is None:
            return
        with self._lock:
            for tables, generation, epoch, unconnected in reversed(self._emitted):
                if tables is current:
                    if generation > self.status["generation"]:
                        self.status.update(generation=generation, epoch=epoch, applied_unconnected=unconnected,
                                           applied_at_ns=time.time_ns())
                        self._write_status()
                    return

    def _write_status(self) -> None:
        if self.status_file is None:
            return
        partial = self.status_file.with_suffix(".partial")
        with self._lock:  # one writer at a time, and no change to the status while it is written
            try:
                self.status_file.parent.mkdir(parents=True, exist_ok=True)
                partial.write_text(json.dumps(self.status, sort_keys=True))
                partial.replace(self.status_file)
            except OSError:
                pass  # the status is for `translator stats`; the translator runs on without it

    def _spawn(self, target: Callable[..., None], name: str, *args: Any, joined: bool = True) -> threading.Thread:
        """A thread for `target`; `joined` ones (the watch, the publisher) are waited for at close."""
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        if joined:
            self._threads.append(thread)
        return thread
