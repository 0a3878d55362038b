"""The fleet's query router: one query over every collector of a fleet, answered as one collector would
(docs/fleet.md, "Federated queries").

It reads the slot map and the members (their query URLs) from etcd and watches both; it keeps the HISTORY_EPOCHS
epochs before the current one too (data stays where the epoch that wrote it put it). A keyed query (Key-Write,
Key-Increment, Postcarding) hashes each key's partition key (asked of the primitive) to its slot, groups the keys
by owning collector and sends each collector one batched request, all at once; Append lists, Sketch-Merge sketches
and every key whose slot's owners differ in an older epoch are read from the owners of each epoch, and the answers
are merged:

  Key-Write     the copies' votes summed over the replicas read (copy n lives on replica n % R when the fleet
                writes copies across collectors), then plurality or consensus as one collector decides; across an
                epoch change the newer epoch's value wins
  Key-Increment the owners' counts summed over the two epochs
  Postcarding   the newer epoch's path wins (the older one if the newer decodes no hop)
  Sketch-Merge  the owners' sketches merged as the sketch merges (sum or max)
  Append        the owners' entries concatenated, the older epoch's first

A collector that does not answer makes the answer partial: `"partial": true`, `"missing_slots"` the slots it should
have answered for, `"down"` the collectors that failed, and a key it alone held gets status "missing". Never a silent
gap. Key-Write and Key-Increment travel as key rows (the collector service's binary form), the rest as JSON.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp
import numpy as np
import numpy.typing as npt
import uvloop
from aiohttp import web

from softdta.collector.service import MAX_BODY_BYTES, ROWS_CONTENT_TYPE
from softdta.core import registry
from softdta.core.fleet import MEMBERS, SLOT_MAP, FleetError, Member, SlotMap, check_successor, fleet_prefix
from softdta.core.primitives import Append, PluginReport, Primitive
from softdta.core.primitives.key_increment.queries import CountLookup
from softdta.core.primitives.key_write.queries import LOOKUP_STATUSES, KeyLookup, parse_lookup_rows
from softdta.core.primitives.postcarding.queries import PathLookup
from softdta.core.primitives.sketch_merge.queries import MergedSketch
from softdta.core.query import MAX_KEYS, QueryError, checked_fields, hex_rows, integer, key_rows
from softdta.core.tables import Structure
from softdta.errors import SoftdtaError
from softdta.etcd.client import Etcd, EtcdUnavailable
from softdta.spec import MAX_REDUNDANCY
from softdta.wire.hashing import partition_slot, partition_slots_rows

log = logging.getLogger("softdta.fleet.router")
# epochs before the current one whose owners a query reads too: data stays where the epoch that wrote it put it
HISTORY_EPOCHS = 8
REQUEST_TIMEOUT_S = 5.0  # one collector's answer; a collector slower than this counts as down for the query
RETRY_S = 1.0  # between attempts to reach etcd again
FOUND, EMPTY, COLLIDED = (LOOKUP_STATUSES.index(state) for state in ("found", "empty", "collided"))
MISSING = len(LOOKUP_STATUSES)  # a key none of whose owners answered
STATUSES = (*LOOKUP_STATUSES, "missing")


class RouterError(SoftdtaError, ValueError):
    """A query the router cannot answer as asked; the message says what to send instead."""


# --------------------------------------------------------------------------------------------------
# The fleet as etcd has it: the slot map, the one before it, and the members


@dataclass(frozen=True)
class FleetView:
    current: SlotMap | None = None
    history: tuple[SlotMap, ...] = ()  # the epochs before `current`, newest first: their owners are read too
    members: dict[str, Member] = field(default_factory=dict)
    etcd_up: bool = False

    def epochs(self) -> list[SlotMap]:
        """The maps to read, newest first."""
        return ([self.current] if self.current is not None else []) + list(self.history)

    def behind(self, new: SlotMap, depth: int) -> tuple[SlotMap, ...]:
        """The history once `new` replaces the current map: at most `depth` epochs."""
        return ((self.current,) if self.current is not None else ()) + self.history[:max(0, depth - 1)]


class FleetWatch:
    """Keeps a `FleetView` of fleet `fleet` from etcd: read once, then watched; when etcd goes away the last view
    stays in force and the watch is set up again once etcd answers. It keeps the `depth` epochs before the current
    one (from etcd's history at start): data written in any of them may still be only where they put it."""

    def __init__(self, etcd: Etcd, fleet: str, depth: int = HISTORY_EPOCHS):
        self.etcd, self.fleet, self.prefix, self.depth = etcd, fleet, fleet_prefix(fleet), depth
        self.view = FleetView()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.changed = threading.Condition()

    def load(self) -> int:
        """Read the map (and the one before it, from etcd's history) and the members; the revision read at."""
        kvs, revision = self.etcd.get_prefix(self.prefix)
        members: dict[str, Member] = {}
        current, history = None, []
        for kv in kvs:
            name = kv.key[len(self.prefix):]
            if name == SLOT_MAP:
                current = self._map(kv.value)
                history = self._history(kv.key, kv.mod_revision, current)
            elif name.startswith(MEMBERS):
                member = self._member(kv.value)
                if member is not None:
                    members[member.name] = member
        known = self.view  # epochs this router saw that etcd's history no longer has
        if current is not None:
            seen = {slot_map.epoch for slot_map in history}
            history += [slot_map for slot_map in known.epochs()
                        if slot_map.epoch < current.epoch and slot_map.epoch not in seen]
            history.sort(key=lambda slot_map: -slot_map.epoch)
        self._publish(FleetView(current, tuple(history[:self.depth]), members, etcd_up=True))
        return revision

    def _history(self, key: str, revision: int, current: SlotMap | None) -> list[SlotMap]:
        """The maps before `current`, newest first, from etcd's history (as far as it was not compacted)."""
        history: list[SlotMap] = []
        newest = current
        while newest is not None and len(history) < self.depth:
            older, revision = self._map_at(key, revision - 1)
            if older is None or older.epoch >= newest.epoch:
                break
            history.append(older)
            newest = older
        return history

    def _map_at(self, key: str, revision: int) -> tuple[SlotMap | None, int]:
        """The map as it was at `revision` and the revision it was written at (None if etcd compacted it away, or
        there was none)."""
        if revision < 1:
            return None, 0
        try:
            answer = self.etcd.call("kv/range", {"key": base64.b64encode(key.encode()).decode(),
                                                 "revision": str(revision)})
        except EtcdUnavailable as error:
            log.info("older slot maps are not in etcd's history (%s); reading the epochs this router saw", error)
            return None, 0
        kvs = answer.get("kvs", [])
        if not kvs:
            return None, 0
        return self._map(base64.b64decode(kvs[0]["value"])), int(kvs[0].get("mod_revision", 0))

    @staticmethod
    def _map(value: bytes) -> SlotMap | None:
        try:
            return SlotMap.from_json(value)
        except FleetError as error:
            log.warning("ignoring the slot map in etcd: %s", error)
            return None

    @staticmethod
    def _member(value: bytes) -> Member | None:
        try:
            return Member.from_json(value)
        except FleetError as error:
            log.warning("ignoring a membership record: %s", error)
            return None

    def _publish(self, view: FleetView) -> None:
        with self.changed:
            self.view = view
            self.changed.notify_all()

    def apply(self, kind: str, key: str, value: bytes) -> None:
        """One watched change."""
        view, name = self.view, key[len(self.prefix):]
        if name == SLOT_MAP and kind == "put":
            new = self._map(value)
            if new is None:
                return
            try:
                check_successor(view.current, new)
            except FleetError as error:
                log.warning("%s", error)
                return
            self._publish(FleetView(new, view.behind(new, self.depth), view.members, view.etcd_up))
        elif name.startswith(MEMBERS):
            members = dict(view.members)
            member = self._member(value) if kind == "put" else None
            members.pop(name[len(MEMBERS):], None)
            if member is not None:
                members[member.name] = member
            self._publish(FleetView(view.current, view.history, members, view.etcd_up))

    def start(self) -> FleetWatch:
        """Read the fleet now (raises EtcdUnavailable if etcd does not answer), then follow it on a thread."""
        revision = self.load()
        self.thread = threading.Thread(target=self._follow, args=(revision,), name="fleet-router-watch",
                                       daemon=True)
        self.thread.start()
        return self

    def _follow(self, revision: int) -> None:
        while not self.stopping.is_set():
            try:
                if revision == 0:
                    revision = self.load()
                    log.info("etcd answers again: epoch %s", self.view.current.epoch if self.view.current else None)
                watch = self.etcd.watch(self.prefix, revision + 1, idle_timeout=0.5)
                try:
                    for batch in watch:
                        if self.stopping.is_set():
                            break
                        for event in batch:
                            self.apply(event.kind, event.key, event.value)
                            revision = max(revision, event.mod_revision)
                finally:
                    watch.close()
            except EtcdUnavailable as error:
                if self.view.etcd_up:
                    log.warning("etcd is unavailable (%s); routing on epoch %s until it answers", error,
                                self.view.current.epoch if self.view.current else None)
                    view = self.view
                    self._publish(FleetView(view.current, view.history, view.members, etcd_up=False))
                revision = 0
                self.stopping.wait(RETRY_S)

    def wait_for(self, condition: Callable[[FleetView], bool], timeout: float) -> FleetView:
        """The view once `condition` holds of it (raises TimeoutError after `timeout` s)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not condition(self.view):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the fleet's view did not reach the expected state")
                self.changed.wait(left)
            return self.view

    def close(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=5)


# --------------------------------------------------------------------------------------------------
# What one federated query reads: per member, which keys


@dataclass
class Plan:
    """Which collector each key (or list, or sketch) is read from, per epoch (newest first) and replica position:
    owners[e][p] is an index into `members` per key (-1: no replica there). `slots[e]` the keys' slots."""

    members: list[str]
    owners: list[list[npt.NDArray[np.int64]]]
    slots: list[npt.NDArray[np.int64]]

    @functools.cached_property
    def reads(self) -> dict[int, npt.NDArray[np.int64]]:
        """Member index -> the keys (indices) it is asked about: each once, however many epochs need it."""
        count = self.slots[0].size
        need = np.zeros((len(self.members), count), dtype=bool)
        for epoch in self.owners:
            for owner in epoch:
                wanted = owner >= 0
                need[owner[wanted], np.nonzero(wanted)[0]] = True
        return {member: np.nonzero(need[member])[0] for member in range(len(self.members)) if need[member].any()}


def plan(view: FleetView, slots_of: Callable[[SlotMap], npt.NDArray[np.int64]], positions: int) -> Plan:
    """The reads of keys whose slots `slots_of(map)` gives: the first `positions` replicas of each key's slot in
    the current map, and those of each older map where the slot's replica set differs from the current one."""
    epochs = view.epochs()
    names = sorted({name for slot_map in epochs for name in slot_map.assigned()})
    owners, slots = [], []
    newest: npt.NDArray[np.int64] | None = None
    for slot_map in epochs:
        table = _owner_table(slot_map, tuple(names), positions)
        key_slots = slots_of(slot_map)
        epoch = [table[position][key_slots] for position in range(positions)]
        if newest is not None:  # an older epoch: read only where the replica set changed
            changed = (np.stack(epoch) != newest).any(axis=0)
            epoch = [np.where(changed, owner, -1) for owner in epoch]
        else:
            newest = np.stack(epoch)
        owners.append(epoch)
        slots.append(key_slots)
    return Plan(names, owners, slots)


_OWNER_TABLES: dict[tuple[int, tuple[str, ...], int], tuple[SlotMap, npt.NDArray[np.int64]]] = {}


def _owner_table(slot_map: SlotMap, names: tuple[str, ...], positions: int) -> npt.NDArray[np.int64]:
    """(positions, slots): the index in `names` of each slot's replica at each position, -1 where it has none.
    Kept for the last few maps: every query over a map asks for the same."""
    key = (id(slot_map), names, positions)
    known = _OWNER_TABLES.get(key)
    if known is not None and known[0] is slot_map:
        return known[1]
    number = {name: i for i, name in enumerate(names)}
    table = np.full((positions, slot_map.slot_count), -1, dtype=np.int64)
    for slot, replicas in enumerate(slot_map.slots):
        for position, name in enumerate(replicas[:positions]):
            table[position, slot] = number[name]
    if len(_OWNER_TABLES) >= 8:
        _OWNER_TABLES.clear()
    _OWNER_TABLES[key] = (slot_map, table)
    return table


@dataclass
class Reads:
    """What each member answered of a plan: per member index, its answer (None: it did not answer)."""

    answers: dict[int, Any]
    down: set[int] = field(default_factory=set)


def missing_slots(plan_: Plan, reads: Reads) -> list[int]:
    """The current map's slots of keys that some unanswered read was for."""
    failed = np.array(sorted(reads.down), dtype=np.int64)
    lost = np.zeros(plan_.slots[0].size, dtype=bool)
    for epoch in plan_.owners:
        for owner in epoch:
            lost |= np.isin(owner, failed)
    return sorted(set(plan_.slots[0][lost].tolist()))


def _partial(plan_: Plan, reads: Reads) -> dict[str, Any]:
    missing = missing_slots(plan_, reads)
    return {"partial": bool(missing), "missing_slots": missing, "down": sorted(plan_.members[m] for m in reads.down)}


# --------------------------------------------------------------------------------------------------
# The router


@dataclass
class Collector:
    """A member's query service as the router found it: its structures by primitive name, its Append ranges."""

    url: str
    structures: dict[str, dict[str, Any]]
    ranges: list[dict[str, Any]]

    def range_of(self, list_id: int) -> dict[str, Any] | None:
        return next((r for r in self.ranges if r["first_list"] <= list_id < r["first_list"] + r["lists"]), None)


@dataclass
class KeyWriteResult:
    """Per key: status (an index into STATUSES), votes, value rows (zero unless found)."""

    status: npt.NDArray[np.uint8]
    votes: npt.NDArray[np.int64]
    values: npt.NDArray[np.uint8]
    epoch: int
    partial: dict[str, Any]


class Router:
    """Federated queries over the fleet that `view()` describes (a FleetWatch's, or a fixed one). Use it inside
    `async with`: it holds one HTTP session to the collectors."""

    def __init__(self, view: Callable[[], FleetView], fleet: str, timeout: float = REQUEST_TIMEOUT_S):
        self.view, self.fleet, self.timeout = view, fleet, timeout
        self.collectors: dict[str, Collector] = {}
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Router:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout),
                                             connector=aiohttp.TCPConnector(limit=0, limit_per_host=16))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()

    def name(self, primitive: type[Primitive]) -> str:
        """What the router calls the fleet's structure of `primitive` (its routes: /<primitive>/<name>)."""
        return f"{primitive.name}@{self.fleet}"

    def _current(self) -> FleetView:
        view = self.view()
        if view.current is None:
            raise RouterError(f"fleet {self.fleet!r} has no slot map in etcd yet; start `softdta fleet controller` "
                              "and a collector with --fleet")
        return view

    # ----------------------------------------------------------------------------------------------
    # talking to the collectors

    async def collector(self, name: str, view: FleetView) -> Collector | None:
        """The member's query service and what it holds (asked once per URL); None if it is not registered or does
        not answer."""
        member = view.members.get(name)
        if member is None:
            return None
        known = self.collectors.get(name)
        if known is not None and known.url == member.query:
            return known
        try:
            listed = await self._get_json(member.query, "/structures")
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            log.warning("collector %s at %s does not answer (%s)", name, member.query, error)
            return None
        structures = {entry["primitive"]: entry for entry in listed["structures"] if "first_list" not in entry}
        ranges = [entry for entry in listed["structures"] if "first_list" in entry]
        found = Collector(member.query, structures, ranges)
        self.collectors[name] = found
        return found

    def forget(self, name: str) -> None:
        """Ask the member what it holds again next time (it failed a query: it may have restarted)."""
        self.collectors.pop(name, None)

    async def _get_json(self, url: str, path: str, params: dict[str, str] | None = None,
                        headers: dict[str, str] | None = None, method: str = "GET") -> dict[str, Any]:
        assert self.session is not None, "use the router inside `async with`"
        async with self.session.request(method, url + path, params=params, headers=headers) as response:
            body = await response.read()
            if response.status != 200:
                raise aiohttp.ClientResponseError(response.request_info, (), status=response.status,
                                                  message=body[:300].decode(errors="replace"))
            return cast(dict[str, Any], json.loads(body))

    async def _post(self, url: str, path: str, body: bytes, content_type: str,
                    params: dict[str, str] | None = None) -> bytes:
        assert self.session is not None, "use the router inside `async with`"
        async with self.session.post(url + path, data=body, params=params,
                                     headers={"Content-Type": content_type}) as response:
            answer = await response.read()
            if response.status != 200:
                raise aiohttp.ClientResponseError(response.request_info, (), status=response.status,
                                                  message=answer[:300].decode(errors="replace"))
            return answer

    async def _gather(self, view: FleetView, names: Sequence[str], members: Sequence[int],
                      ask: Callable[[int, Collector], Any]) -> Reads:
        """Run `ask(member, collector)` for each member at once; a member that fails is down for this query."""
        async def one(member: int) -> tuple[int, Any]:
            found = await self.collector(names[member], view)
            if found is None:
                return member, None
            try:
                return member, await ask(member, found)
            except (aiohttp.ClientError, TimeoutError, ValueError) as error:
                log.warning("collector %s failed a query (%s)", names[member], error)
                self.forget(names[member])
                return member, None
        answered = await asyncio.gather(*(one(member) for member in members))
        reads = Reads({m: answer for m, answer in answered if answer is not None})
        reads.down = {m for m, answer in answered if answer is None}
        return reads

    # ----------------------------------------------------------------------------------------------
    # keyed queries

    def _key_len(self, primitive: type[Primitive]) -> int:
        lengths = {c.structures[primitive.name]["key_len"] for c in self.collectors.values()
                   if primitive.name in c.structures}
        if len(lengths) > 1:
            raise RouterError(f"the fleet's collectors disagree on {primitive.name}'s key_len ({sorted(lengths)}); "
                              "give them one layout")
        if not lengths:
            raise RouterError(f"no collector of fleet {self.fleet!r} answers with a {primitive.name} structure")
        return int(lengths.pop())

    async def _discover(self, view: FleetView) -> None:
        names = sorted({name for slot_map in view.epochs() for name in slot_map.assigned()})
        await asyncio.gather(*(self.collector(name, view) for name in names))

    async def key_rows(self, primitive: type[Primitive], keys: Any) -> npt.NDArray[np.uint8]:
        """Keys as the collectors take them (hex strings or integers), as rows of the fleet's key_len."""
        await self._discover(self._current())
        key_len = self._key_len(primitive)
        return key_rows(keys, cast(Structure, _KeyShape(key_len)), self.name(primitive))  # reads key_len only

    def _slots(self, primitive: type[Primitive], rows: npt.NDArray[np.uint8]
               ) -> Callable[[SlotMap], npt.NDArray[np.int64]]:
        """Each key's slot in a map: the partition hash of what the primitive says its partition key is."""
        if primitive.partitioned_by == "key":  # the key itself, in wire order (Primitive.partition_key)
            return lambda slot_map: partition_slots_rows(rows, slot_map.slot_bits).astype(np.int64)
        keys = [primitive.partition_key(PluginReport(primitive.opcode, {"key": bytes(row)})) for row in rows]
        return lambda slot_map: np.array([partition_slot(key, slot_map.slot_bits) for key in keys], dtype=np.int64)

    async def _keyed(self, primitive: type[Primitive], rows: npt.NDArray[np.uint8], positions: int,
                     ask: Callable[[Collector, npt.NDArray[np.uint8]], Any]) -> tuple[FleetView, Plan, Reads]:
        view = self._current()
        plan_ = plan(view, self._slots(primitive, rows), positions)
        reads_of = plan_.reads

        async def ask_member(member: int, collector: Collector) -> Any:
            if primitive.name not in collector.structures:
                raise ValueError(f"it has no {primitive.name} structure")
            return await ask(collector, rows[reads_of[member]])
        reads = await self._gather(view, plan_.members, list(reads_of), ask_member)
        return view, plan_, reads

    async def _rows(self, collector: Collector, primitive: type[Primitive], rows: npt.NDArray[np.uint8],
                    params: dict[str, str]) -> bytes:
        """The binary answer of `collector` for `rows`, in requests of at most MAX_KEYS keys (run at once)."""
        path = f"/{primitive.name}/{collector.structures[primitive.name]['name']}"
        step = min(MAX_KEYS, MAX_BODY_BYTES // rows.shape[1])
        parts = await asyncio.gather(*(self._post(collector.url, path, rows[low:low + step].tobytes(),
                                                  ROWS_CONTENT_TYPE, params)
                                       for low in range(0, rows.shape[0], step)))
        return b"".join(parts)

    async def key_write(self, primitive: type[Primitive], rows: npt.NDArray[np.uint8], redundancy: int,
                        consensus: int = 1) -> KeyWriteResult:
        """Key-Write lookups (or a plug-in's with Key-Write's query) over the fleet: the copies' votes summed over
        the first min(redundancy, R) replicas, plurality (consensus 1) or at least `consensus` votes; the newer
        epoch's value wins."""
        data_len = 0

        async def ask(collector: Collector, asked: npt.NDArray[np.uint8]) -> tuple[Any, ...]:
            nonlocal data_len
            data_len = collector.structures[primitive.name]["data_len"]
            raw = await self._rows(collector, primitive, asked, {"redundancy": str(redundancy)})
            return parse_lookup_rows(raw, data_len)
        view, plan_, reads = await self._keyed(primitive, rows, min(redundancy, MAX_REDUNDANCY), ask)
        if not data_len:
            data_len = next((c.structures[primitive.name]["data_len"] for c in self.collectors.values()
                             if primitive.name in c.structures), 4)
        status, votes, values = merge_key_write(plan_, reads, rows.shape[0], data_len, consensus)
        assert view.current is not None
        return KeyWriteResult(status, votes, values, view.current.epoch, _partial(plan_, reads))

    async def key_increment(self, primitive: type[Primitive], rows: npt.NDArray[np.uint8], redundancy: int
                            ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_], int, dict[str, Any]]:
        """Count-Min estimates over the fleet: each epoch's owner's count, summed (counts, missing, epoch,
        partial)."""
        async def ask(collector: Collector, asked: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint64]:
            raw = await self._rows(collector, primitive, asked, {"redundancy": str(redundancy)})
            return np.frombuffer(raw, dtype=">u8").astype(np.uint64)
        view, plan_, reads = await self._keyed(primitive, rows, 1, ask)
        counts = np.zeros(rows.shape[0], dtype=np.uint64)
        missing = np.zeros(rows.shape[0], dtype=bool)
        for owner, answer_of in _per_key(plan_, reads, rows.shape[0]):
            for member, indices, answer in answer_of:
                counts[indices] += answer
            missing |= owner
        assert view.current is not None
        return counts, missing, view.current.epoch, _partial(plan_, reads)

    async def postcarding(self, primitive: type[Primitive], rows: npt.NDArray[np.uint8], value_set: list[int]
                          ) -> tuple[list[list[int | None]], list[bool], list[bool], int, dict[str, Any]]:
        """Paths over the fleet: the newest epoch's path that decodes any hop (paths, complete, missing, epoch,
        partial)."""
        async def ask(collector: Collector, asked: npt.NDArray[np.uint8]) -> list[dict[str, Any]]:
            path = f"/{primitive.name}/{collector.structures[primitive.name]['name']}"
            step = MAX_KEYS
            parts = await asyncio.gather(*(self._post(collector.url, path, json.dumps(
                {"keys": hex_rows(asked[low:low + step].tobytes(), asked.shape[1]), "value_set": value_set}).encode(),
                "application/json") for low in range(0, asked.shape[0], step)))
            return [result for part in parts for result in json.loads(part)["results"]]
        view, plan_, reads = await self._keyed(primitive, rows, 1, ask)
        count = rows.shape[0]
        hops = next((c.structures[primitive.name].get("hops", 0) for c in self.collectors.values()
                     if primitive.name in c.structures), 0)
        paths: list[list[int | None]] = [[None] * hops for _ in range(count)]
        complete, decided = [False] * count, [False] * count
        missing = [False] * count
        for unanswered, answer_of in _per_key(plan_, reads, count):  # newest epoch first
            for member, indices, answer in answer_of:
                for index, result in zip(indices.tolist(), answer):
                    if not decided[index] and any(hop is not None for hop in result["path"]):
                        paths[index], complete[index], decided[index] = result["path"], result["complete"], True
            for index in np.nonzero(unanswered)[0].tolist():
                missing[index] = missing[index] or not decided[index]
        assert view.current is not None
        return paths, complete, missing, view.current.epoch, _partial(plan_, reads)

    # ----------------------------------------------------------------------------------------------
    # whole-structure queries

    async def sketch(self, primitive: type[Primitive]) -> dict[str, Any]:
        """The fleet's sketch: its owners' in every epoch kept, merged as the sketch merges."""
        view = self._current()
        key = primitive.partition_key(PluginReport(primitive.opcode, {}))
        plan_ = plan(view, lambda slot_map: np.array([slot_map.slot_of(key)], dtype=np.int64), 1)
        path_of = f"/{primitive.name}/"

        async def ask(member: int, collector: Collector) -> dict[str, Any]:
            if primitive.name not in collector.structures:
                raise ValueError(f"it has no {primitive.name} structure")
            return await self._get_json(collector.url, path_of + collector.structures[primitive.name]["name"])
        reads = await self._gather(view, plan_.members, list(plan_.reads), ask)
        matrix: npt.NDArray[np.int64] | None = None
        shape: dict[str, Any] = {}
        for answer in reads.answers.values():
            part = np.array(answer["matrix"], dtype=np.int64)
            shape = {name: answer[name] for name in ("columns", "rows", "merge")}
            if matrix is None:
                matrix = part
            elif answer["merge"] == "max":
                matrix = np.maximum(matrix, part)
            else:
                matrix = matrix + part
        assert view.current is not None
        return {"structure": self.name(primitive), **shape, "matrix": [] if matrix is None else matrix.tolist(),
                "epoch": view.current.epoch, **_partial(plan_, reads)}

    async def append(self, list_id: int, take: bool = False, authorization: str | None = None) -> dict[str, Any]:
        """List `list_id` over the fleet: its entries at its holder in each epoch, oldest first
        (each holder read once); `take` takes them (POST with the collectors' token)."""
        view = self._current()
        key = Append.partition_key(_ListReport(list_id))
        await self._discover(view)
        holders: list[str] = []
        for slot_map in reversed(view.epochs()):  # oldest first: its entries came first
            for name in slot_map.owners(key):
                known = self.collectors.get(name)
                if known is None or known.range_of(list_id) is not None:  # an unknown one may hold it
                    if name not in holders:
                        holders.append(name)
                    break
        headers = {"Authorization": authorization} if authorization else None

        async def ask(member: int, collector: Collector) -> dict[str, Any]:
            held = collector.range_of(list_id)
            if held is None:
                raise ValueError(f"it holds no Append range with list {list_id}")
            return await self._get_json(collector.url, f"/{Append.name}/{held['name']}", {"list": str(list_id)},
                                        headers, "POST" if take else "GET")
        plan_ = Plan(holders, [[np.array([i], dtype=np.int64)] for i in range(len(holders))],
                     [np.array([view.current.slot_of(key) if view.current else 0], dtype=np.int64)] * len(holders))
        reads = await self._gather(view, holders, range(len(holders)), ask)
        entries: list[Any] = []
        dropped = 0
        for member in range(len(holders)):
            answer = reads.answers.get(member)
            if answer is not None:
                entries += answer["entries"]
                dropped += answer["dropped"]
        assert view.current is not None
        return {"append": f"{Append.name}@{self.fleet}", "list": list_id, "entries": entries, "dropped": dropped,
                "collectors": holders, "epoch": view.current.epoch, **_partial(plan_, reads)}

    # ----------------------------------------------------------------------------------------------
    # a query as the collector service takes it: JSON fields in, a JSON answer out

    async def query(self, primitive: type[Primitive], fields: dict[str, Any]) -> dict[str, Any]:
        """The fleet's answer to `fields` of `primitive`'s query, shaped as a collector's with the epoch and the
        partial-answer fields added."""
        query = primitive.query
        if query is None or query not in MERGED:
            raise RouterError(f"the router cannot merge {primitive.name}'s query over collectors; query a "
                              "collector directly")
        fields = checked_fields(fields, query.required_fields, query.optional_fields)
        if query is MergedSketch:
            return await self.sketch(primitive)
        rows = await self.key_rows(primitive, fields["keys"])
        name = self.name(primitive)
        if query is KeyLookup:
            redundancy = integer(fields["redundancy"], "redundancy", 1, MAX_REDUNDANCY)
            consensus = _consensus(fields, redundancy)
            result = await self.key_write(primitive, rows, redundancy, consensus)
            return key_write_json(name, rows, redundancy, consensus, result)
        if query is CountLookup:
            redundancy = integer(fields["redundancy"], "redundancy", 1, MAX_REDUNDANCY)
            counts, missing, epoch, partial = await self.key_increment(primitive, rows, redundancy)
            keys = hex_rows(rows.tobytes(), rows.shape[1])
            return {"structure": name, "redundancy": redundancy, "epoch": epoch, **partial, "results": [
                {"key": key, "count": None if lost else count, **({"status": "missing"} if lost else {})}
                for key, count, lost in zip(keys, counts.tolist(), missing.tolist())]}
        value_set = fields["value_set"]
        if not isinstance(value_set, list) or not value_set:
            raise QueryError("value_set must be a non-empty list of the values hops report (e.g. switch IDs)")
        for index, value in enumerate(value_set):
            integer(value, f"value_set[{index}]", 0, 0xFFFFFFFF)
        paths, complete, unread, epoch, partial = await self.postcarding(primitive, rows, value_set)
        keys = hex_rows(rows.tobytes(), rows.shape[1])
        return {"structure": name, "epoch": epoch, "complete": sum(complete), **partial, "results": [
            {"key": key, "path": path, "complete": done, **({"status": "missing"} if lost else {})}
            for key, path, done, lost in zip(keys, paths, complete, unread)]}

    async def structures(self) -> dict[str, Any]:
        """What the router serves (`GET /structures`): one structure per primitive the fleet's collectors hold."""
        view = self._current()
        await self._discover(view)
        served: dict[str, list[str]] = {}
        for name, collector in sorted(self.collectors.items()):
            for primitive in collector.structures:
                served.setdefault(primitive, []).append(name)
            if collector.ranges:
                served.setdefault(Append.name, []).append(name)
        assert view.current is not None
        return {"epoch": view.current.epoch, "older_epochs": [slot_map.epoch for slot_map in view.history],
                "structures": [{"name": f"{primitive}@{self.fleet}", "primitive": primitive, "collectors": names}
                               for primitive, names in sorted(served.items())]}


MERGED = (KeyLookup, CountLookup, PathLookup, MergedSketch)  # the queries whose answers the router can merge


@dataclass(frozen=True)
class _KeyShape:
    key_len: int


@dataclass(frozen=True)
class _ListReport:
    list_id: int


def _consensus(fields: dict[str, Any], redundancy: int) -> int:
    mode = fields.get("mode", "plurality")
    if mode == "plurality":
        if "consensus" in fields:
            raise QueryError('consensus applies to mode "consensus" only')
        return 1
    if mode == "consensus":
        return integer(fields.get("consensus", redundancy), "consensus", 1, redundancy)
    raise QueryError(f'mode must be "plurality" or "consensus", got {json.dumps(mode)}')


def _per_key(plan_: Plan, reads: Reads, count: int
             ) -> list[tuple[npt.NDArray[np.bool_], list[tuple[int, npt.NDArray[np.int64], Any]]]]:
    """Per epoch (newest first), position 0: which keys' owner did not answer, and per answering member the keys
    (indices) it owns there with its answer for them (answers are per member, in the order of `plan.reads`)."""
    reads_of = plan_.reads
    out = []
    for epoch in plan_.owners:
        owner = epoch[0]
        unanswered = np.isin(owner, np.array(sorted(reads.down), dtype=np.int64))
        parts = []
        for member, answer in reads.answers.items():
            mine = owner[reads_of[member]] == member
            if mine.any():
                parts.append((member, reads_of[member][mine], _take(answer, np.nonzero(mine)[0])))
        out.append((unanswered, parts))
    return out


def _take(answer: Any, at: npt.NDArray[np.int64]) -> Any:
    if isinstance(answer, np.ndarray):
        return answer[at]
    return [answer[i] for i in at.tolist()]


def merge_key_write(plan_: Plan, reads: Reads, count: int, data_len: int, consensus: int
                    ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.uint8]]:
    """Per key (status, votes, values): per epoch, the votes each replica gave its value summed over the replicas
    that agree, the plurality (no value on a tie) with at least `consensus` votes; the newest epoch that found the
    key wins."""
    down = np.array(sorted(reads.down), dtype=np.int64)
    value = np.dtype({1: "u1", 2: "u2", 4: "u4", 8: "u8"}.get(data_len, f"V{data_len}"))  # one comparable scalar
    answers = {member: (member_status, member_votes, np.ascontiguousarray(member_values).view(value).reshape(-1))
               for member, (member_status, member_votes, member_values) in reads.answers.items()}
    status = np.full(count, EMPTY, dtype=np.uint8)
    votes = np.zeros(count, dtype=np.int64)
    values = np.zeros(count, dtype=value)
    decided = np.zeros(count, dtype=bool)
    collided = np.zeros(count, dtype=bool)
    missing = np.zeros(count, dtype=bool)
    for epoch in plan_.owners:
        positions = len(epoch)
        found = np.zeros((positions, count), dtype=bool)
        given = np.zeros((positions, count), dtype=np.int64)
        words = np.zeros((positions, count), dtype=value)
        for position, owner in enumerate(epoch):
            if down.size:
                missing |= np.isin(owner, down)
            for member, (member_status, member_votes, member_words) in answers.items():
                asked = plan_.reads[member]
                mine = owner[asked] == member
                at = asked[mine]
                found[position, at] = member_status[mine] == FOUND
                collided[at] |= member_status[mine] == COLLIDED
                given[position, at] = member_votes[mine]
                words[position, at] = member_words[mine]
        if positions == 1:
            best_score, best_words = given[0] * found[0], words[0]
            tied = np.zeros(count, dtype=bool)
        else:
            same = words[:, None] == words[None, :]  # [i, j]: replica i's value is replica j's
            score = np.einsum("ijk,jk->ik", same & found[None, :, :], given) * found  # votes for replica i's value
            best = score.argmax(axis=0)
            columns = np.arange(count)
            best_score, best_words = score[best, columns], words[best, columns]
            tied = ((score == best_score) & (words != best_words) & found).any(axis=0)
        hit = (best_score >= consensus) & ~tied & (best_score > 0) & ~decided
        status[hit], votes[hit], values[hit] = FOUND, best_score[hit], best_words[hit]
        collided |= tied | ((best_score > 0) & ~hit & ~decided)
        decided |= hit
    rest = ~decided
    status[rest & collided] = COLLIDED
    status[rest & missing] = MISSING
    return status, votes, values.view(np.uint8).reshape(count, data_len)


def key_write_json(name: str, rows: npt.NDArray[np.uint8], redundancy: int, consensus: int,
                   result: KeyWriteResult) -> dict[str, Any]:
    names = np.array(STATUSES)[result.status].tolist()
    counts = {state: int(np.count_nonzero(result.status == code)) for code, state in enumerate(STATUSES)}
    found = (result.status == FOUND).tolist()
    values = hex_rows(result.values.tobytes(), result.values.shape[1])
    keys = hex_rows(rows.tobytes(), rows.shape[1])
    return {"structure": name, "redundancy": redundancy, "consensus": consensus, "epoch": result.epoch, **counts,
            **result.partial,
            "results": [{"key": key, "value": value if hit else None, "votes": votes, "status": state}
                        for key, value, hit, votes, state in zip(keys, values, found, result.votes.tolist(), names)]}


# --------------------------------------------------------------------------------------------------
# The router's HTTP service: the collector service's API over the whole fleet


def _json_error(status: type[web.HTTPException], message: str, **details: Any) -> web.HTTPException:
    return status(text=json.dumps({"error": message, **details}), content_type="application/json")


class RouterService:
    def __init__(self, router: Router, watch: FleetWatch | None = None):
        self.router, self.watch = router, watch

    def routes(self) -> list[web.RouteDef]:
        routes = [web.get("/structures", self.structures), web.get("/health", self.health)]
        for primitive in registry.registered():
            if primitive.query in MERGED:
                route = web.post if primitive.query is not None and primitive.query.takes_body() else web.get
                routes.append(route(f"/{primitive.name}/{{name}}", self._handler(primitive)))
        return routes + [web.get(f"/{Append.name}/{{name}}", self.append),
                         web.post(f"/{Append.name}/{{name}}", self.append)]

    def _named(self, request: web.Request, served: str) -> None:
        if request.match_info["name"] != served:
            raise _json_error(web.HTTPNotFound, f"this router serves fleet {self.router.fleet!r} as {served!r}",
                              known=[served])

    def _handler(self, primitive: type[Primitive]) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.Response:
            self._named(request, self.router.name(primitive))
            fields: dict[str, Any] = {}
            if request.method == "POST":
                try:
                    fields = json.loads(await request.read())
                except ValueError as error:
                    raise _json_error(web.HTTPBadRequest, f"body is not valid JSON: {error}") from None
                if not isinstance(fields, dict):
                    raise _json_error(web.HTTPBadRequest, "body must be a JSON object of the query's fields")
            return web.json_response(await self._answered(self.router.query(primitive, fields)))
        return handle

    async def _answered(self, answer: Any) -> dict[str, Any]:
        try:
            return cast(dict[str, Any], await answer)
        except RouterError as error:
            status = web.HTTPServiceUnavailable if "no slot map" in str(error) else web.HTTPBadRequest
            raise _json_error(status, str(error)) from None
        except QueryError as error:
            raise _json_error(web.HTTPBadRequest, str(error)) from None

    async def append(self, request: web.Request) -> web.Response:
        self._named(request, f"{Append.name}@{self.router.fleet}")
        text = request.query.get("list", "")
        if not (text.isascii() and text.isdigit() and len(text) < 11):
            raise _json_error(web.HTTPBadRequest, "list must be a list id: the router reads one list at a time "
                                                  "(?list=<id>)")
        take = request.method == "POST"
        return web.json_response(await self._answered(self.router.append(
            int(text), take, request.headers.get("Authorization"))))

    async def structures(self, request: web.Request) -> web.Response:
        return web.json_response(await self._answered(self.router.structures()))

    async def health(self, request: web.Request) -> web.Response:
        view = self.router.view()
        return web.json_response({
            "status": "ok" if view.current is not None else "no slot map", "fleet": self.router.fleet,
            "epoch": view.current.epoch if view.current else None,
            "older_epochs": [slot_map.epoch for slot_map in view.history],
            "members": sorted(view.members), "etcd": "up" if view.etcd_up else "down (routing on the last epoch)"})


async def serve(router: Router, host: str = "127.0.0.1", port: int = 0) -> web.AppRunner:
    """Serve `router` (entered) on the running loop; `runner.addresses[0][1]` is the bound port."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.add_routes(RouterService(router).routes())
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def run(etcd: Etcd, fleet: str, host: str, port: int, ready: Callable[[int], None] | None = None) -> None:
    """`softdta fleet router`: follow the fleet in etcd and serve its queries until SIGINT or SIGTERM."""
    watch = FleetWatch(etcd, fleet).start()

    async def serve_until_stopped() -> None:
        async with Router(lambda: watch.view, fleet) as router:
            runner = await serve(router, host, port)
            if ready is not None:
                ready(runner.addresses[0][1])
            stop = asyncio.Event()
            for signum in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(signum, stop.set)
            await stop.wait()
            await runner.cleanup()

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve_until_stopped())
    finally:
        watch.close()


def query_once(etcd: Etcd, fleet: str, run_query: Callable[[Router], Any], timeout: float = REQUEST_TIMEOUT_S
               ) -> Any:
    """`softdta fleet query`: read the fleet once from etcd and run one query over it."""
    watch = FleetWatch(etcd, fleet)
    watch.load()

    async def ask() -> Any:
        async with Router(lambda: watch.view, fleet, timeout) as router:
            return await run_query(router)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(ask())
