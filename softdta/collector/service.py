"""The collector's query service: one HTTP + JSON API over asyncio (uvloop) for every DTA structure.

It is backend-neutral: collector memory is read through a `QuerySource` (`OfflineSource` wraps the offline
collector). Structures are named "<primitive>@<collector-ip>" (key-write@10.77.1.1) and Append ranges
"append<first-list>@<collector-ip>" (append0@10.77.1.1). Keys are hex strings in wire order ("0a000001") or
integers (their big-endian bytes). Endpoints (details and examples in docs/query.md):

  GET  /structures               every structure and Append range: sizes, slot count, fill, load factor
  POST /key-write/<name>         {"keys", "redundancy", "mode": "plurality"|"consensus", "consensus"}: values
  POST /key-increment/<name>     {"keys", "redundancy"}: Count-Min estimates (minimum of the N counters)
  POST /postcarding/<name>       {"keys", "value_set"}: decoded paths
  GET  /append/<name>?list=<id>  the entries waiting in that list (all lists without `list`), oldest first,
                                 left where they are
  POST /append/<name>?list=<id>  takes them (Authorization: Bearer <the collector's token>): each entry is
                                 taken once; &follow=1 streams them as newline-delimited JSON until the client
                                 leaves
  GET  /sketch-merge/<name>      the merged sketch, matrix[column][row]
  GET  /completions?since=<n>    WRITE with Immediate completions numbered after n (the newest 4096 are kept)
  GET  /stats                    structure stats, unread Append entries and the responder's counters
  GET  /health                   {"status": "ok", "backend": ..., ...}
  GET  /metrics                  Prometheus text format: fill and load-factor gauges, responder counters

Bad requests get a 4xx status and a JSON body {"error": "..."}. Requests are bounded (MAX_BODY_BYTES,
MAX_KEYS, BODY_TIMEOUT_S, MAX_BUFFERED_BODY_BYTES, IDLE_TIMEOUT_S, MAX_CONNECTIONS). A query's body is read in
full before the query takes its turn, so a slow client holds up only itself; queries run one at a time on a
worker thread, so a big one never holds up /health; Append pollers run on the event loop and need no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import signal
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import numpy as np
import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from softdta.core.offline import OfflineCollector
from softdta.core.query import BLANK, AppendPoller, key_write_query, keyincrement_query, postcard_query
from softdta.core.regions import AppendRegion
from softdta.core.responder import CompletionLog
from softdta.core.tables import AppendLists, Structure, Tables
from softdta.spec import MAX_REDUNDANCY, PRIMITIVES, DtaOpcode
from softdta.wire.frames import ip_str
from softdta.wire.hashing import key_hashes_rows

HASHED = (DtaOpcode.KEY_WRITE, DtaOpcode.KEY_INCREMENT, DtaOpcode.POSTCARDING)
HASHED_SLUGS = {PRIMITIVES[primitive].slug for primitive in HASHED}
FOLLOW_POLL_S = 0.005
MAX_KEYS = 100_000  # per request: the answer takes some 400 bytes a key
MAX_BODY_BYTES = 4 << 20  # MAX_KEYS keys of 16 bytes in hex
BODY_TIMEOUT_S = 10.0  # to send a request's body
MAX_BUFFERED_BODY_BYTES = 16 * MAX_BODY_BYTES  # bodies read and not yet answered, all connections together
LINGER_S = 2.0  # after an answer sent before the whole body came (408, 413, 503), its rest is read and dropped
# this long, so that the client can read the answer, then the connection is closed
IDLE_TIMEOUT_S = 10.0  # a connection that sends no (complete) request is closed
MAX_CONNECTIONS = 256
log = logging.getLogger("softdta.collector.service")


class QuerySource(Protocol):
    """What the service needs from a collector backend; every view reads the current memory."""

    tables: Tables
    completion_log: CompletionLog

    def structure_region(self, primitive: DtaOpcode, collector_ip: bytes): ...

    def append_region(self, lists: AppendLists) -> AppendRegion: ...

    def append_ring_writes(self, lists: AppendLists) -> np.ndarray | None: ...  # per ring; None if not counted

    def counters(self) -> dict[str, int]: ...

    def health(self) -> dict: ...


class OfflineSource:
    """An `OfflineCollector` as a `QuerySource`."""

    def __init__(self, collector: OfflineCollector):
        self.collector = collector
        self.tables = collector.tables
        self.completion_log = collector.completion_log

    def structure_region(self, primitive: DtaOpcode, collector_ip: bytes):
        return self.collector.structure_region(primitive, collector_ip)

    def append_region(self, lists: AppendLists) -> AppendRegion:
        return AppendRegion(self.collector.region_of(lists.qp), lists)

    def append_ring_writes(self, lists: AppendLists) -> np.ndarray:
        return self.collector.append_ring_writes(lists)

    def counters(self) -> dict[str, int]:
        return self.collector.counters()

    def health(self) -> dict:
        qps = {}
        for qp in self.tables.qps:
            responder = self.collector.responders.get(qp.collector_ip)
            if responder is not None and qp.remote_qpn in responder.qps:
                state = responder.qps[qp.remote_qpn]
                qps[qp.name] = {"collector_ip": ip_str(qp.collector_ip), "qpn": qp.remote_qpn,
                                "transport": qp.transport.name.lower(), "expected_psn": state.expected_psn,
                                "error": state.error}
        return {"backend": "offline", "qps": qps}


def structure_name(structure: Structure) -> str:
    return f"{PRIMITIVES[structure.primitive].slug}@{ip_str(structure.qp.collector_ip)}"


def append_name(lists: AppendLists) -> str:
    return f"append{lists.first_list}@{ip_str(lists.qp.collector_ip)}"


# --------------------------------------------------------------------------------------------------
# Request parsing: every problem becomes a 4xx with a JSON body that says what to send instead


def _error(status: type[web.HTTPException], message: str, **details) -> web.HTTPException:
    return status(text=json.dumps({"error": message, **details}), content_type="application/json")


def _bad_request(message: str) -> web.HTTPException:
    return _error(web.HTTPBadRequest, message)


@web.middleware
async def _json_errors(request: web.Request, handler):
    """Errors raised by aiohttp itself (no such route, wrong method, body too large) as JSON too, and a bug as a
    JSON 500 with one log line, never a traceback to the client."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400 or error.content_type == "application/json":
            raise
        headers = {"Allow": error.headers["Allow"]} if "Allow" in error.headers else None
        return web.json_response({"error": f"{error.text} ({request.method} {request.path})"},
                                 status=error.status, headers=headers)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as error:
        log.exception("%s %s failed", request.method, request.path)
        return web.json_response({"error": f"internal error ({type(error).__name__}); see the collector's log"},
                                 status=500)


def _closing(error: web.HTTPException) -> web.HTTPException:
    """An answer sent before the whole body was read: the connection closes after it (LINGER_S later at most)."""
    error.force_close()
    return error


def _body_too_large(size: int) -> web.HTTPException:
    message = f"the body is over {MAX_BODY_BYTES:,} bytes ({MAX_BODY_BYTES >> 20} MiB); split the query"
    return _closing(web.HTTPRequestEntityTooLarge(MAX_BODY_BYTES, size, text=json.dumps({"error": message}),
                                                  content_type="application/json"))


def _json_object(raw: bytearray, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError, deep nesting
        reason = "it nests too deeply" if isinstance(error, RecursionError) else error
        raise _bad_request(f"body is not valid JSON: {reason}") from None
    if not isinstance(body, dict):
        raise _bad_request(f"body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(body.keys() - set(required) - set(optional))
    if unknown:
        raise _bad_request(f"unknown field(s) {unknown}; this endpoint takes {list(required + optional)}")
    missing = [field for field in required if field not in body]
    if missing:
        raise _bad_request(f"missing field(s) {missing}")
    return body


def _integer(value, field: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:  # type(), not isinstance: JSON true is no integer
        raise _bad_request(f"{field} must be an integer in {low}..{high}, got {json.dumps(value)}")
    return value


def key_rows(keys, structure: Structure, name: str) -> np.ndarray:
    """Keys as (count, key_len) uint8 rows in wire order."""
    key_len = structure.key_len
    if not isinstance(keys, list) or not keys:
        raise _bad_request("keys must be a non-empty list of hex strings (wire order) or integers")
    if len(keys) > MAX_KEYS:
        raise _bad_request(f"{len(keys):,} keys in one request; send at most {MAX_KEYS:,} at a time")
    wire = bytearray()
    for index, key in enumerate(keys):
        if isinstance(key, str):
            try:
                raw = bytes.fromhex(key)
            except ValueError:
                raise _bad_request(f"keys[{index}] {key!r} is not a hex string") from None
        elif type(key) is int and 0 <= key < 1 << 8 * key_len:
            raw = key.to_bytes(key_len, "big")
        elif type(key) is int:
            raise _bad_request(f"keys[{index}] {key} does not fit in {name}'s key_len of {key_len} bytes")
        else:
            raise _bad_request(f"keys[{index}] must be a hex string or an integer, got {json.dumps(key)}")
        if len(raw) != key_len:
            raise _bad_request(f"keys[{index}] {key!r} is {len(raw)} bytes; {name} has key_len {key_len} "
                               f"({2 * key_len} hex digits)")
        wire += raw
    return np.frombuffer(bytes(wire), dtype=np.uint8).reshape(len(keys), key_len)


def _hex_rows(raw: bytes, width: int) -> list[str]:
    text = raw.hex()
    return [text[start:start + 2 * width] for start in range(0, len(text), 2 * width)]


# --------------------------------------------------------------------------------------------------
# Statistics shared by /structures, /stats and /metrics


def _occupied(primitive: DtaOpcode, region) -> np.ndarray:
    """One bool per slot: anything written there (a Sketch-Merge slot is a column)."""
    if primitive is DtaOpcode.KEY_WRITE:
        return (region.checksums != 0) | region.data.any(axis=1)
    if primitive is DtaOpcode.KEY_INCREMENT:
        return region.counters != 0
    if primitive is DtaOpcode.POSTCARDING:
        return region.values.any(axis=1)
    return region.by_column.any(axis=1)


def _load_factor(fill: float) -> float | None:
    """Slot writes per slot that leave `fill` of the slots occupied under uniform hashing: -ln(1 - fill)."""
    return -math.log1p(-fill) if fill < 1 else None


class _AppendFeed:
    """One Append range: its poller, and entries it drained for lists that no request has taken yet.

    A poll drains every list of the range, so entries of other lists wait here; at most one ring's worth per
    list (what the ring itself would have held), older ones are dropped and counted.
    """

    def __init__(self, lists: AppendLists, region: AppendRegion, writes: np.ndarray | None):
        self.lists = lists
        self.poller = AppendPoller(region, writes)
        self.unread: dict[int, np.ndarray] = {}
        self.dropped: dict[int, int] = {}

    def take(self, list_id: int | None) -> dict[int, tuple[np.ndarray, int]]:
        """(entries, dropped) of `list_id` (every list with news if None) since the last take."""
        self.unread, self.dropped = self._merged(*self.poller.poll_counting_laps())
        wanted = [list_id] if list_id is not None else sorted(self.unread)
        return {wanted_id: (self.unread.pop(wanted_id, self._empty), self.dropped.pop(wanted_id, 0))
                for wanted_id in wanted}

    def peek(self, list_id: int | None) -> dict[int, tuple[np.ndarray, int]]:
        """What `take` would return, taking nothing."""
        unread, dropped = self._merged(*self.poller.peek())
        wanted = [list_id] if list_id is not None else sorted(unread)
        return {wanted_id: (unread.get(wanted_id, self._empty), dropped.get(wanted_id, 0)) for wanted_id in wanted}

    @property
    def _empty(self) -> np.ndarray:
        return self.poller.region.rings[0, :0]

    def _merged(self, polled: dict[int, np.ndarray], overwritten: dict[int, int]
                ) -> tuple[dict[int, np.ndarray], dict[int, int]]:
        """The unread entries with `polled` after them, each list cut to one ring (the oldest dropped), and
        the drops: those cuts, and what laps overwrote in the rings."""
        unread, dropped = dict(self.unread), dict(self.dropped)
        for list_id, lost in overwritten.items():
            dropped[list_id] = dropped.get(list_id, 0) + lost
        for polled_id, entries in polled.items():
            backlog = np.concatenate([unread[polled_id], entries]) if polled_id in unread else entries
            excess = backlog.shape[0] - self.lists.entries
            if excess > 0:
                dropped[polled_id] = dropped.get(polled_id, 0) + excess
                backlog = backlog[excess:]
            unread[polled_id] = backlog
        return unread, dropped

    def entries_json(self, entries: np.ndarray) -> list:
        """4- and 8-byte entries as integers (the reported big-endian value); other sizes as hex."""
        return entries.tolist() if entries.ndim == 1 else _hex_rows(entries.tobytes(), self.lists.data_len)


class _Metrics:
    """Prometheus collector that reads the structures at scrape time."""

    def __init__(self, service: "QueryService"):
        self.service = service

    def collect(self):
        fill = GaugeMetricFamily("softdta_structure_fill", "Fraction of slots (Append: entries) that are nonzero",
                                 labels=["structure", "primitive"])
        load = GaugeMetricFamily("softdta_structure_load_factor",
                                 "Estimated slot writes per slot of a hashed structure, -ln(1 - fill)",
                                 labels=["structure", "primitive"])
        for stats in self.service.structure_stats():
            labels = [stats["name"], stats["primitive"]]
            fill.add_metric(labels, stats["fill"])
            if stats["primitive"] in HASHED_SLUGS:
                load.add_metric(labels, math.inf if stats["load_factor"] is None else stats["load_factor"])
        unread = GaugeMetricFamily("softdta_append_unread_entries",
                                   "Entries drained from Append rings that no request has taken yet",
                                   labels=["append"])
        for name, feed in self.service.append_feeds.items():
            unread.add_metric([name], sum(entries.shape[0] for entries in feed.unread.values()))
        responder = CounterMetricFamily("softdta_responder_events", "Collector RoCE responder counters (rxe names)",
                                        labels=["counter"])
        for counter, value in sorted(self.service.source.counters().items()):
            responder.add_metric([counter], value)
        qps = GaugeMetricFamily("softdta_qp_up", "1 while a queue pair accepts requests, 0 once it is in ERROR",
                                labels=["qpn", "structure", "translator"])
        for qpn, qp in self.service.source.health().get("qps", {}).items():
            qps.add_metric([qpn, str(qp.get("structure", "")), str(qp.get("translator", ""))],
                           0 if qp.get("state") == "error" or qp.get("error") else 1)
        completions = CounterMetricFamily("softdta_completions", "WRITE with Immediate completions received")
        completions.add_metric([], self.service.source.completion_log.total)
        return [fill, load, unread, responder, qps, completions]


# --------------------------------------------------------------------------------------------------
# The service


class QueryService:
    def __init__(self, source: QuerySource, token: str | None = None):
        self.source = source
        self.token = token
        self.queries = ThreadPoolExecutor(max_workers=1, thread_name_prefix="softdta-query")
        # one query parsed and answered at a time: its memory, some 50 MB at MAX_KEYS, and the bodies read and
        # waiting for their turn (at most MAX_BUFFERED_BODY_BYTES) are the service's peak
        self.one_query = asyncio.Semaphore(1)
        self.buffered_body_bytes = 0
        self.structures = {structure_name(s): s for s in source.tables.structures}
        self.append_feeds = {append_name(lists): _AppendFeed(lists, source.append_region(lists),
                                                             source.append_ring_writes(lists))
                             for lists in source.tables.append_lists}
        self.registry = CollectorRegistry(auto_describe=False)  # names depend on the tables: no check at register
        self.registry.register(_Metrics(self))
        self.closing = asyncio.Event()  # set at shutdown, so that follow streams end

    def _structure(self, request: web.Request, primitive: DtaOpcode) -> tuple[str, Structure]:
        name = request.match_info["name"]
        structure = self.structures.get(name)
        if structure is None or structure.primitive is not primitive:
            known = [known for known, s in self.structures.items() if s.primitive is primitive]
            raise _error(web.HTTPNotFound, f"no {PRIMITIVES[primitive].slug} structure named {name!r}", known=known)
        return name, structure

    def region(self, structure: Structure):
        return self.source.structure_region(structure.primitive, structure.qp.collector_ip)

    def structure_stats(self) -> list[dict]:
        stats = []
        for name, structure in self.structures.items():
            occupied = _occupied(structure.primitive, self.region(structure))
            fill = np.count_nonzero(occupied) / occupied.size
            entry = {"name": name, "primitive": PRIMITIVES[structure.primitive].slug,
                     "collector_ip": ip_str(structure.qp.collector_ip), "region_bytes": structure.qp.length,
                     "slot_size": structure.slot_size, "slot_count": occupied.size, "fill": fill,
                     "load_factor": _load_factor(fill) if structure.primitive in HASHED else None}
            if structure.primitive is DtaOpcode.SKETCH_MERGE:
                entry.update(columns=structure.columns, rows=structure.rows, reporters=structure.reporters,
                             merge=structure.merge.name.lower())
            else:
                entry.update(key_len=structure.key_len, key_hash=structure.key_hash.name.lower())
                if structure.primitive is DtaOpcode.KEY_WRITE:
                    entry["data_len"] = structure.data_len
                if structure.primitive is DtaOpcode.POSTCARDING:
                    entry["hops"] = structure.hops
            stats.append(entry)
        for name, feed in self.append_feeds.items():
            rings = feed.poller.region.rings
            occupied = rings.reshape(rings.shape[0] * rings.shape[1], -1).any(axis=1)
            lists = feed.lists
            stats.append({"name": name, "primitive": "append", "collector_ip": ip_str(lists.qp.collector_ip),
                          "region_bytes": lists.qp.length, "slot_size": lists.data_len, "slot_count": occupied.size,
                          "fill": np.count_nonzero(occupied) / occupied.size, "load_factor": None,
                          "first_list": lists.first_list, "lists": lists.lists, "entries": lists.entries,
                          "data_len": lists.data_len, "batch": lists.batch})
        return stats

    async def list_structures(self, request: web.Request) -> web.Response:
        return web.json_response({"structures": self.structure_stats()})

    @contextlib.asynccontextmanager
    async def _received_body(self, request: web.Request) -> AsyncIterator[bytearray]:
        """The request's whole body, read within BODY_TIMEOUT_S before its query takes its turn (so a slow client
        holds up only itself), and counted in MAX_BUFFERED_BODY_BYTES until the query is answered."""
        body = bytearray()
        try:
            declared = request.content_length or 0  # none for a chunked body
            if declared > MAX_BODY_BYTES:
                raise _body_too_large(declared)
            try:
                async with asyncio.timeout(BODY_TIMEOUT_S):
                    while chunk := await request.content.readany():
                        if len(body) + len(chunk) > MAX_BODY_BYTES:
                            raise _body_too_large(len(body) + len(chunk))
                        if self.buffered_body_bytes + len(chunk) > MAX_BUFFERED_BODY_BYTES:
                            raise _closing(_error(web.HTTPServiceUnavailable, "the service holds "
                                                  f"{MAX_BUFFERED_BODY_BYTES >> 20} MiB of request bodies waiting "
                                                  "for their queries; try again in a few seconds"))
                        self.buffered_body_bytes += len(chunk)
                        body += chunk
            except TimeoutError:
                raise _closing(_error(web.HTTPRequestTimeout,
                                      f"the body did not arrive within {BODY_TIMEOUT_S:.0f} s")) from None
            yield body
        finally:
            self.buffered_body_bytes -= len(body)

    async def keywrite(self, request: web.Request) -> web.Response:
        name, structure = self._structure(request, DtaOpcode.KEY_WRITE)
        async with self._received_body(request) as raw, self.one_query:
            return await self._key_write(name, structure, raw)

    async def _key_write(self, name: str, structure: Structure, raw: bytearray) -> web.Response:
        body = _json_object(raw, ("keys", "redundancy"), ("mode", "consensus"))
        rows = key_rows(body["keys"], structure, name)
        redundancy = _integer(body["redundancy"], "redundancy", 1, MAX_REDUNDANCY)
        mode = body.get("mode", "plurality")
        if mode == "plurality":
            if "consensus" in body:
                raise _bad_request('consensus applies to mode "consensus" only')
            consensus = 1
        elif mode == "consensus":  # default: every copy must agree
            consensus = _integer(body.get("consensus", redundancy), "consensus", 1, redundancy)
        else:
            raise _bad_request(f'mode must be "plurality" or "consensus", got {json.dumps(mode)}')
        return web.json_response(await self._off_loop(self.key_write_answer, name, structure, rows, redundancy,
                                                      consensus))

    async def _off_loop(self, query, *args):
        """Run a query on the worker thread: one at a time, and never on the loop that answers /health."""
        return await asyncio.get_running_loop().run_in_executor(self.queries, query, *args)

    def key_write_answer(self, name: str, structure: Structure, rows: np.ndarray, redundancy: int,
                         consensus: int) -> dict:
        region = self.region(structure)
        answer = key_write_query(region, rows, redundancy, consensus, structure.key_hash)
        # Not found is "empty" when none of the key's slots was ever written, else "collided" (overwritten
        # by other keys, or copies that disagree): the first means not reported, the second data lost.
        _, hashes = key_hashes_rows(rows, redundancy, structure.key_hash)
        slots = hashes & np.uint32(region.slot_count - 1)
        written = ((region.checksums[slots] != 0) | region.data[slots].any(axis=-1)).any(axis=0)
        status = np.where(answer.found, "found", np.where(written, "collided", "empty"))
        values = _hex_rows(answer.values.astype(answer.values.dtype.newbyteorder(">")).tobytes(), structure.data_len)
        results = [{"key": key, "value": value if found else None, "votes": votes, "status": state}
                   for key, value, found, votes, state in zip(_hex_rows(rows.tobytes(), structure.key_len), values,
                                                              answer.found.tolist(), answer.votes.tolist(),
                                                              status.tolist())]
        counts = {state: int(np.count_nonzero(status == state)) for state in ("found", "empty", "collided")}
        return {"structure": name, "redundancy": redundancy, "consensus": consensus, **counts, "results": results}

    async def keyincrement(self, request: web.Request) -> web.Response:
        name, structure = self._structure(request, DtaOpcode.KEY_INCREMENT)
        async with self._received_body(request) as raw, self.one_query:
            return await self._keyincrement(name, structure, raw)

    async def _keyincrement(self, name: str, structure: Structure, raw: bytearray) -> web.Response:
        body = _json_object(raw, ("keys", "redundancy"))
        rows = key_rows(body["keys"], structure, name)
        redundancy = _integer(body["redundancy"], "redundancy", 1, MAX_REDUNDANCY)
        return web.json_response(await self._off_loop(self.keyincrement_answer, name, structure, rows, redundancy))

    def keyincrement_answer(self, name: str, structure: Structure, rows: np.ndarray, redundancy: int) -> dict:
        counts = keyincrement_query(self.region(structure), rows, redundancy, structure.key_hash)
        results = [{"key": key, "count": count}
                   for key, count in zip(_hex_rows(rows.tobytes(), structure.key_len), counts.tolist())]
        return {"structure": name, "redundancy": redundancy, "results": results}

    async def postcarding(self, request: web.Request) -> web.Response:
        name, structure = self._structure(request, DtaOpcode.POSTCARDING)
        async with self._received_body(request) as raw, self.one_query:
            return await self._postcarding(name, structure, raw)

    async def _postcarding(self, name: str, structure: Structure, raw: bytearray) -> web.Response:
        body = _json_object(raw, ("keys", "value_set"))
        rows = key_rows(body["keys"], structure, name)
        value_set = body["value_set"]
        if not isinstance(value_set, list) or not value_set:
            raise _bad_request("value_set must be a non-empty list of the values hops report (e.g. switch IDs)")
        for index, value in enumerate(value_set):
            _integer(value, f"value_set[{index}]", 0, 0xFFFFFFFF)
        return web.json_response(await self._off_loop(self.postcarding_answer, name, structure, rows, value_set))

    def postcarding_answer(self, name: str, structure: Structure, rows: np.ndarray, value_set: list[int]) -> dict:
        answer = postcard_query(self.region(structure), rows, value_set)
        results = [{"key": key, "path": [None if value == BLANK else value for value in path], "complete": complete}
                   for key, path, complete in zip(_hex_rows(rows.tobytes(), structure.key_len),
                                                  answer.values.tolist(), answer.complete.tolist())]
        return {"structure": name, "hops": structure.hops, "complete": int(np.count_nonzero(answer.complete)),
                "results": results}

    def _append_request(self, request: web.Request) -> tuple[str, _AppendFeed, int | None]:
        name = request.match_info["name"]
        feed = self.append_feeds.get(name)
        if feed is None:
            raise _error(web.HTTPNotFound, f"no Append range named {name!r}", known=list(self.append_feeds))
        lists = feed.lists
        list_id = None
        if "list" in request.query:
            text = request.query["list"]
            list_id = int(text) if text.isascii() and text.isdigit() and len(text) < 12 else -1
            if not lists.first_list <= list_id < lists.first_list + lists.lists:
                raise _bad_request(f"list must be a list id in {lists.first_list}.."
                                   f"{lists.first_list + lists.lists - 1}, got {text[:20]!r}"
                                   f"{'...' if len(text) > 20 else ''}")
        return name, feed, list_id

    @staticmethod
    def _append_answer(name: str, list_id: int | None, entries: dict[int, tuple[np.ndarray, int]],
                       feed: _AppendFeed) -> web.Response:
        lists = {str(taken_id): {"entries": feed.entries_json(values), "dropped": dropped}
                 for taken_id, (values, dropped) in entries.items()}
        if list_id is not None:
            return web.json_response({"append": name, "list": list_id, **lists[str(list_id)]})
        return web.json_response({"append": name, "lists": lists})

    async def append_peek(self, request: web.Request) -> web.Response:
        name, feed, list_id = self._append_request(request)
        if "follow" in request.query:
            raise _bad_request("follow takes the entries it streams: send it as a POST with the collector's token")
        return self._append_answer(name, list_id, feed.peek(list_id), feed)

    async def append_take(self, request: web.Request) -> web.StreamResponse:
        self._authorize(request, "taking Append entries")
        name, feed, list_id = self._append_request(request)
        follow = request.query.get("follow", "0")
        if follow not in ("0", "1"):
            raise _bad_request(f"follow must be 0 or 1, got {follow[:20]!r}")
        if follow == "1":
            return await self._follow(request, feed, list_id)
        return self._append_answer(name, list_id, feed.take(list_id), feed)

    def _authorize(self, request: web.Request, what: str) -> None:
        if self.token is None:
            raise _error(web.HTTPForbidden, f"{what} needs the collector's token, and this service has none "
                                            "(an offline view): read with GET instead")
        offered = request.headers.get("Authorization", "")
        scheme, _, credential = offered.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(credential.strip().encode(), self.token.encode()):
            raise _error(web.HTTPUnauthorized, f"{what} needs the header 'Authorization: Bearer <token>', with the "
                                               "token of the collector's configuration")

    async def _follow(self, request: web.Request, feed: _AppendFeed, list_id: int | None) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        try:
            while not self.closing.is_set() and request.transport is not None and not request.transport.is_closing():
                for taken_id, (entries, dropped) in feed.take(list_id).items():
                    if entries.shape[0] or dropped:
                        line = {"list": taken_id, "entries": feed.entries_json(entries), "dropped": dropped}
                        await response.write(json.dumps(line).encode() + b"\n")
                await asyncio.sleep(FOLLOW_POLL_S)
        except ConnectionResetError:
            pass  # the client left between the check and the write
        return response

    async def sketch(self, request: web.Request) -> web.Response:
        name, structure = self._structure(request, DtaOpcode.SKETCH_MERGE)
        return web.json_response({"structure": name, "columns": structure.columns, "rows": structure.rows,
                                  "merge": structure.merge.name.lower(),
                                  "matrix": self.region(structure).by_column.tolist()})

    async def completions(self, request: web.Request) -> web.Response:
        try:
            since = int(request.query.get("since", "0"))
        except ValueError:
            raise _bad_request("since must be an integer: the last completion number you saw (0 for all)") from None
        log = self.source.completion_log
        return web.json_response({"total": log.total, "completions": [
            {"seq": seq, "qpn": completion.qpn, "immediate": completion.immediate, "byte_len": completion.byte_len}
            for seq, completion in log.since(since)]})

    async def stats(self, request: web.Request) -> web.Response:
        unread = {name: {str(list_id): entries.shape[0] for list_id, entries in feed.unread.items()}
                  for name, feed in self.append_feeds.items()}
        return web.json_response({"structures": self.structure_stats(), "append_unread": unread,
                                  "responder": self.source.counters()})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", **self.source.health()})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def end_streams(self, app: web.Application) -> None:
        self.closing.set()

    async def end_queries(self, app: web.Application) -> None:
        self.queries.shutdown(wait=False, cancel_futures=True)


def make_app(source: QuerySource, token: str | None = None) -> web.Application:
    """The service's application; without a token (an offline view) Append entries can be read, not taken."""
    service = QueryService(source, token)
    app = web.Application(middlewares=[_json_errors], client_max_size=MAX_BODY_BYTES)
    app.add_routes([web.get("/structures", service.list_structures),
                    web.post("/key-write/{name}", service.keywrite),
                    web.post("/key-increment/{name}", service.keyincrement),
                    web.post("/postcarding/{name}", service.postcarding),
                    web.get("/append/{name}", service.append_peek),
                    web.post("/append/{name}", service.append_take),
                    web.get("/sketch-merge/{name}", service.sketch),
                    web.get("/completions", service.completions),
                    web.get("/stats", service.stats),
                    web.get("/health", service.health),
                    web.get("/metrics", service.metrics)])
    app.on_shutdown.append(service.end_streams)
    app.on_cleanup.append(service.end_queries)
    return app


class _LimitedSite(web.TCPSite):
    """A TCP site that closes connections beyond MAX_CONNECTIONS at once: each one costs a file descriptor, which
    the collector also needs to save its regions."""

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server

        def connection():
            if len(server.connections) >= MAX_CONNECTIONS:
                return _Refused()
            return server()

        self._server = await asyncio.get_running_loop().create_server(connection, self._host, self._port,
                                                                     reuse_address=True)
        self._bound_port = self._server.sockets[0].getsockname()[1]


class _Refused(asyncio.Protocol):
    BODY = json.dumps({"error": f"already {MAX_CONNECTIONS} connections open; try again later"}).encode()

    def connection_made(self, transport) -> None:
        log.warning("query connection refused: already %d open (MAX_CONNECTIONS)", MAX_CONNECTIONS)
        transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(self.BODY), self.BODY))
        transport.close()


async def serve(source: QuerySource, host: str = "127.0.0.1", port: int = 0,
                token: str | None = None) -> web.AppRunner:
    """Start serving on the running loop; `runner.addresses[0][1]` is the bound port, `runner.cleanup()` stops."""
    runner = web.AppRunner(make_app(source, token), keepalive_timeout=IDLE_TIMEOUT_S, lingering_time=LINGER_S)
    await runner.setup()
    await _LimitedSite(runner, host, port).start()
    return runner



def run(source: QuerySource, host: str, port: int, token: str | None = None) -> None:
    """Serve on a uvloop event loop until SIGINT or SIGTERM."""
    async def serve_until_stopped() -> None:
        runner = await serve(source, host, port, token)
        stop = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        await stop.wait()
        await runner.cleanup()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve_until_stopped())
