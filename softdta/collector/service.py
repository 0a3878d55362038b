"""The collector's query service: one HTTP + JSON API over asyncio (uvloop) for every DTA structure.

It is backend-neutral: collector memory is read through a `QuerySource` (`OfflineSource` wraps the offline
collector). It is plumbing: each primitive declares its query, region and stats (`Primitive.query`, `region`,
`describe`, in its package under softdta/core/primitives/), and the service routes every registered primitive's
query to `/<primitive>/<structure>`. Structures are named "<primitive>@<collector-ip>" (key-write@10.77.1.1) and
Append ranges "append<first-list>@<collector-ip>" (append0@10.77.1.1). Keys are hex strings in wire order
("0a000001") or integers (their big-endian bytes). Endpoints (details and examples in docs/query.md):

  GET  /structures               every structure and Append range: sizes, slot count, fill, load factor
  POST /key-write/<name>         {"keys", "redundancy", "mode": "plurality"|"consensus", "consensus"}: values
  POST /key-increment/<name>     {"keys", "redundancy"}: Count-Min estimates (minimum of the N counters)
  POST /postcarding/<name>       {"keys", "value_set"}: decoded paths
                                 (Key-Write and Key-Increment also take keys as a binary body: ROWS_CONTENT_TYPE)
  GET  /sketch-merge/<name>      the merged sketch, matrix[column][row]
  POST|GET /<plug-in>/<name>     a plug-in primitive's query (`Primitive.query`)
  GET  /append/<name>?list=<id>  the entries waiting in that list (all lists without `list`), oldest first,
                                 left where they are
  POST /append/<name>?list=<id>  takes them (Authorization: Bearer <the collector's token>): each entry is
                                 taken once; &follow=1 streams them as newline-delimited JSON until the client
                                 leaves (409 when the collector exports them to NATS: docs/export.md)
  GET  /completions?since=<n>    WRITE with Immediate completions numbered after n (the newest 4096 are kept)
  GET  /stats                    structure stats, unread Append entries, the responder's counters and the export's
  GET  /health                   {"status": "ok", "backend": ..., ...}
  GET  /metrics                  Prometheus text format: fill and load-factor gauges, responder counters
  POST /snapshot                 writes a snapshot of every structure as Parquet (the collector's token; needs a
                                 snapshot directory, collector.snapshot): {"directory", "files", "rows"}

Bad requests get a 4xx status and a JSON body {"error": "..."}. Requests are bounded (MAX_BODY_BYTES,
core.query.MAX_KEYS, BODY_TIMEOUT_S, MAX_BUFFERED_BODY_BYTES, IDLE_TIMEOUT_S, MAX_CONNECTIONS). A query's body is
read in full before the query takes its turn, so a slow client holds up only itself; queries run one at a time on a
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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import numpy as np
import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from softdta.collector.snapshot import SNAPSHOT_ROWS, Snapshot, SnapshotError, Snapshots, SnapshotTable
from softdta.core import registry
from softdta.core.offline import OfflineCollector
from softdta.core.primitives import Append, Primitive
from softdta.core.primitives.append.queries import AppendFeed, append_snapshot, range_name
from softdta.core.primitives.append.region import AppendRegion
from softdta.core.query import QueryError, RowsAnswer, StructureQuery, checked_fields
from softdta.core.regions import Region
from softdta.core.responder import CompletionLog
from softdta.core.tables import AppendLists, Structure, Tables
from softdta.wire.frames import ip_str

if TYPE_CHECKING:  # nats-py is loaded only by a collector that exports (the rxe guest has none)
    from softdta.collector.export import Exporter

FOLLOW_POLL_S = 0.005
MAX_BODY_BYTES = 4 << 20  # core.query.MAX_KEYS keys of 16 bytes in hex
BODY_TIMEOUT_S = 10.0  # to send a request's body
MAX_BUFFERED_BODY_BYTES = 16 * MAX_BODY_BYTES  # bodies read and not yet answered, all connections together
LINGER_S = 2.0  # after an answer sent before the whole body came (408, 413, 503), its rest is read and dropped
# this long, so that the client can read the answer, then the connection is closed
IDLE_TIMEOUT_S = 10.0  # a connection that sends no (complete) request is closed
MAX_CONNECTIONS = 256
# The binary form of a keyed query, for batches too big for JSON: the body is the keys as rows (key_len bytes each,
# wire order), the other fields are URL parameters (each a JSON value, or else a string: ?redundancy=2&mode=plurality),
# and the answer is one row per key in order (`RowsAnswer.rows`, e.g. KeyLookupAnswer.rows), same content type.
ROWS_CONTENT_TYPE = "application/vnd.softdta.key-rows"  # its own type: no client sends it by accident
log = logging.getLogger("softdta.collector.service")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")


class QuerySource(Protocol):
    """What the service needs from a collector backend; every view reads the current memory."""

    tables: Tables
    completion_log: CompletionLog

    def structure_region(self, primitive: int, collector_ip: bytes) -> Region: ...

    def append_region(self, lists: AppendLists) -> AppendRegion: ...

    def append_ring_writes(self, lists: AppendLists) -> np.ndarray | None: ...  # per ring; None if not counted

    def counters(self) -> dict[str, int]: ...

    def health(self) -> dict[str, Any]: ...


class OfflineSource:
    """An `OfflineCollector` as a `QuerySource`."""

    def __init__(self, collector: OfflineCollector):
        self.collector = collector
        self.tables = collector.tables
        self.completion_log = collector.completion_log

    def structure_region(self, primitive: int, collector_ip: bytes) -> Region:
        return self.collector.structure_region(primitive, collector_ip)

    def append_region(self, lists: AppendLists) -> AppendRegion:
        return AppendRegion(self.collector.region_of(lists.qp), lists)

    def append_ring_writes(self, lists: AppendLists) -> np.ndarray:
        return self.collector.append_ring_writes(lists)

    def counters(self) -> dict[str, int]:
        return self.collector.counters()

    def health(self) -> dict[str, Any]:
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
    return f"{registry.by_opcode(structure.primitive).name}@{ip_str(structure.qp.collector_ip)}"


# --------------------------------------------------------------------------------------------------
# Errors: every problem becomes a 4xx with a JSON body that says what to send instead


def _error(status: type[web.HTTPException], message: str, **details: Any) -> web.HTTPException:
    return status(text=json.dumps({"error": message, **details}), content_type="application/json")


def _bad_request(message: str) -> web.HTTPException:
    return _error(web.HTTPBadRequest, message)


@contextlib.contextmanager
def _bad_requests() -> Iterator[None]:
    """A QueryError (a request the query cannot take) as a 400."""
    try:
        yield
    except QueryError as error:
        raise _bad_request(str(error)) from None


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
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


# --------------------------------------------------------------------------------------------------
# Statistics shared by /structures, /stats and /metrics


def _load_factor(fill: float) -> float | None:
    """Slot writes per slot that leave `fill` of the slots occupied under uniform hashing: -ln(1 - fill)."""
    return -math.log1p(-fill) if fill < 1 else None


class _Metrics:
    """Prometheus collector that reads the structures at scrape time."""

    def __init__(self, service: QueryService):
        self.service = service

    def collect(self) -> list[Metric]:
        fill = GaugeMetricFamily("softdta_structure_fill", "Fraction of slots (Append: entries) that are nonzero",
                                 labels=["structure", "primitive"])
        load = GaugeMetricFamily("softdta_structure_load_factor",
                                 "Estimated slot writes per slot of a hashed structure, -ln(1 - fill)",
                                 labels=["structure", "primitive"])
        for stats in self.service.structure_stats():
            labels = [stats["name"], stats["primitive"]]
            fill.add_metric(labels, stats["fill"])
            if stats["name"] in self.service.hashed:
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
        return [fill, load, unread, responder, qps, completions, *self._fleet(), *self._snapshots(),
                *self._export()]

    def _export(self) -> list[Metric]:
        """The export to NATS JetStream (softdta collector up --export), if it runs."""
        exporter = self.service.exporter
        if exporter is None:
            return []
        status = exporter.status()
        entries = CounterMetricFamily("softdta_export_entries", "Append entries by what became of them: taken from "
                                      "the rings, acknowledged by JetStream, lost to ring overflow or dropped by the "
                                      "backlog bound (both published as gaps)", labels=["result"])
        for result, key in (("taken", "taken"), ("acknowledged", "acknowledged"), ("lost_overflow", "lost_to_overflow"),
                            ("dropped_backlog", "dropped_from_backlog")):
            entries.add_metric([result], status[key])
        backlog = GaugeMetricFamily("softdta_export_backlog_entries", "Entries taken and not yet acknowledged")
        backlog.add_metric([], status["backlog_entries"])
        connected = GaugeMetricFamily("softdta_export_connected", "1 while the collector is connected to the broker")
        connected.add_metric([], int(status["connected"]))
        events = CounterMetricFamily("softdta_export_events", "Export events", labels=["event"])
        for event in ("connects", "disconnects", "stream_recreated", "duplicates", "publish_failures",
                      "journal_failures"):
            events.add_metric([event], status[event])
        return [entries, backlog, connected, events]

    def _snapshots(self) -> list[Metric]:
        snapshots = self.service.snapshots
        if snapshots is None:
            return []
        total = CounterMetricFamily("softdta_snapshots", "Snapshots written as Parquet, and those that failed",
                                    labels=["result"])
        total.add_metric(["written"], snapshots.written)
        total.add_metric(["failed"], snapshots.failed)
        return [total]

    def _fleet(self) -> list[Metric]:
        """The collector's fleet registration (softdta collector up --fleet), if it has one."""
        fleet = self.service.source.health().get("fleet")
        if fleet is None:
            return []
        registered = GaugeMetricFamily("softdta_fleet_registered", "1 while the collector's fleet membership is "
                                       "in etcd under a live lease")
        registered.add_metric([], int(fleet["registered"]))
        events = CounterMetricFamily("softdta_fleet_registration_events", "Fleet registration events",
                                     labels=["event"])
        for event in ("registrations", "lease_expiries", "etcd_failures"):
            events.add_metric([event], fleet[event])
        return [registered, events]


# --------------------------------------------------------------------------------------------------
# The service


def append_feeds(source: QuerySource) -> dict[str, AppendFeed]:
    """Each Append range's feed, by the name the service gives the range."""
    return {range_name(lists): AppendFeed(lists, source.append_region(lists), source.append_ring_writes(lists))
            for lists in source.tables.append_lists}


class QueryService:
    """With an `exporter`, the exporter takes the Append entries (from the same `feeds`); requests may read them
    while they wait, and take none."""

    def __init__(self, source: QuerySource, token: str | None = None, snapshots: Snapshots | None = None, *,
                 feeds: dict[str, AppendFeed] | None = None, exporter: Exporter | None = None):
        self.source = source
        self.token = token
        self.exporter = exporter
        self.snapshots = snapshots
        self.one_snapshot = asyncio.Lock()
        self.snapshot_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="softdta-snapshot")
        self.queries = ThreadPoolExecutor(max_workers=1, thread_name_prefix="softdta-query")
        # one query parsed and answered at a time: its memory, some 50 MB at MAX_KEYS, and the bodies read and
        # waiting for their turn (at most MAX_BUFFERED_BODY_BYTES) are the service's peak
        self.one_query = asyncio.Semaphore(1)
        self.buffered_body_bytes = 0
        self.structures = {structure_name(s): s for s in source.tables.structures}
        self.hashed = {name for name, s in self.structures.items() if registry.by_opcode(s.primitive).hashed}
        self.append_feeds = append_feeds(source) if feeds is None else feeds
        self.prometheus = CollectorRegistry(auto_describe=False)  # names depend on the tables: no check at register
        self.prometheus.register(_Metrics(self))
        self.closing = asyncio.Event()  # set at shutdown, so that follow streams end

    def routes(self) -> list[web.RouteDef]:
        """Every registered primitive's query at /<primitive>/<structure>, and Append's ranges."""
        routes = []
        for primitive in registry.registered():
            if primitive.query is not None:
                route = web.post if primitive.query.takes_body() else web.get
                routes.append(route(f"/{primitive.name}/{{name}}", self._structure_query(primitive, primitive.query)))
        return routes + [web.get(f"/{Append.name}/{{name}}", self.append_peek),
                         web.post(f"/{Append.name}/{{name}}", self.append_take)]

    def _structure(self, request: web.Request, primitive: type[Primitive]) -> tuple[str, Structure]:
        name = request.match_info["name"]
        structure = self.structures.get(name)
        if structure is None or structure.primitive != primitive.opcode:
            known = [known for known, s in self.structures.items() if s.primitive == primitive.opcode]
            raise _error(web.HTTPNotFound, f"no {primitive.name} structure named {name!r}", known=known)
        return name, structure

    def region(self, structure: Structure) -> Region:
        return self.source.structure_region(structure.primitive, structure.qp.collector_ip)

    def answer(self, structure: Structure, fields: dict[str, Any]) -> dict[str, Any]:
        """What the service answers a query of `structure` with `fields` (its JSON object), here and now."""
        query = registry.by_opcode(structure.primitive).query
        if query is None:
            raise QueryError(f"structure {structure_name(structure)} answers no query")
        return query.parse(fields, structure, structure_name(structure)).answer(self.region(structure)).json()

    def structure_stats(self) -> list[dict[str, Any]]:
        stats = []
        for name, structure in self.structures.items():
            primitive = registry.by_opcode(structure.primitive)
            occupied = self.region(structure).occupied()
            fill = np.count_nonzero(occupied) / occupied.size
            stats.append({"name": name, "primitive": primitive.name, "collector_ip": ip_str(structure.qp.collector_ip),
                          "region_bytes": structure.qp.length, "slot_size": structure.slot_size,
                          "slot_count": occupied.size, "fill": fill,
                          "load_factor": _load_factor(fill) if name in self.hashed else None,
                          **primitive.describe(structure)})
        return stats + [feed.stats(name) for name, feed in self.append_feeds.items()]

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

    def _structure_query(self, primitive: type[Primitive], query: type[StructureQuery[Any]]) -> Handler:
        """The handler of `primitive`'s query: the body (if it takes one) read, the query parsed, then answered on
        the query thread."""
        async def handle(request: web.Request) -> web.Response:
            name, structure = self._structure(request, primitive)
            if not query.takes_body():
                async with self.one_query:
                    return await self._answered(query.parse({}, structure, name), structure)
            async with self._received_body(request) as raw, self.one_query:
                if request.content_type == ROWS_CONTENT_TYPE:
                    with _bad_requests():
                        parsed = query.parse(_rows_fields(raw, request, query, structure), structure, name)
                    return await self._answered_rows(parsed, structure)
                with _bad_requests():
                    parsed = query.from_json(raw, structure, name)
                return await self._answered(parsed, structure)
        return handle

    async def _answered(self, query: StructureQuery[Any], structure: Structure) -> web.Response:
        def answer() -> dict[str, Any]:
            return query.answer(self.region(structure)).json()
        return web.json_response(await self._off_loop(answer))

    async def _answered_rows(self, query: StructureQuery[Any], structure: Structure) -> web.Response:
        def answer() -> bytes | None:
            answered = query.answer(self.region(structure))
            return answered.rows() if isinstance(answered, RowsAnswer) else None
        rows = await self._off_loop(answer)
        if rows is None:
            raise _error(web.HTTPUnsupportedMediaType, f"{structure_name(structure)} answers in JSON only; send the "
                                                       "query as a JSON object (Content-Type: application/json)")
        return web.Response(body=rows, content_type=ROWS_CONTENT_TYPE)

    async def _off_loop(self, query: Callable[[], T]) -> T:
        """Run a query on the worker thread: one at a time, and never on the loop that answers /health."""
        return await asyncio.get_running_loop().run_in_executor(self.queries, query)

    def _append_request(self, request: web.Request) -> tuple[str, AppendFeed, int | None]:
        name = request.match_info["name"]
        feed = self.append_feeds.get(name)
        if feed is None:
            raise _error(web.HTTPNotFound, f"no Append range named {name!r}", known=list(self.append_feeds))
        with _bad_requests():
            return name, feed, feed.list_id(request.query.get("list"))

    async def append_peek(self, request: web.Request) -> web.Response:
        name, feed, list_id = self._append_request(request)
        if "follow" in request.query:
            raise _bad_request("follow takes the entries it streams: send it as a POST with the collector's token")
        return web.json_response(feed.answer(name, list_id, feed.peek(list_id)))

    async def append_take(self, request: web.Request) -> web.StreamResponse:
        self._authorize(request, "taking Append entries")
        name, feed, list_id = self._append_request(request)
        if self.exporter is not None:
            raise _error(web.HTTPConflict, f"this collector exports its Append entries to {self.exporter.settings.url} "
                                           f"(stream {self.exporter.settings.stream}); consume them there "
                                           "(docs/export.md), or read them with GET while they wait")
        follow = request.query.get("follow", "0")
        if follow not in ("0", "1"):
            raise _bad_request(f"follow must be 0 or 1, got {follow[:20]!r}")
        if follow == "1":
            return await self._follow(request, feed, list_id)
        return web.json_response(feed.answer(name, list_id, feed.take(list_id)))

    def _authorize(self, request: web.Request, what: str) -> None:
        if self.token is None:
            raise _error(web.HTTPForbidden, f"{what} needs the collector's token, and this service has none "
                                            "(an offline view): read with GET instead")
        offered = request.headers.get("Authorization", "")
        scheme, _, credential = offered.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(credential.strip().encode(), self.token.encode()):
            raise _error(web.HTTPUnauthorized, f"{what} needs the header 'Authorization: Bearer <token>', with the "
                                               "token of the collector's configuration")

    async def _follow(self, request: web.Request, feed: AppendFeed, list_id: int | None) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        try:
            while not self.closing.is_set() and request.transport is not None and not request.transport.is_closing():
                for line in feed.stream_lines(feed.take(list_id)):
                    await response.write(json.dumps(line).encode() + b"\n")
                await asyncio.sleep(FOLLOW_POLL_S)
        except ConnectionResetError:
            pass  # the client left between the check and the write
        return response

    async def take_snapshot(self) -> Snapshot:
        """One snapshot of every structure and Append range (raises SnapshotError): the Append entries are read on
        the loop, where their pollers run; the structures are decoded and every file written on the snapshot thread,
        so /health and queries answer meanwhile."""
        snapshots = self.snapshots
        assert snapshots is not None  # the callers check
        async with self.one_snapshot:
            tables = []
            for name, structure in self.structures.items():
                primitive = registry.by_opcode(structure.primitive)
                parts = primitive.snapshot(self.region(structure), structure, SNAPSHOT_ROWS)
                if parts is None:
                    snapshots.skip(name, primitive.name)
                else:
                    tables.append(SnapshotTable(primitive.snapshot_table(), parts))
            if self.append_feeds:
                tables.append(SnapshotTable(Append.snapshot_table(),
                                            [append_snapshot(feed) for feed in self.append_feeds.values()]))
            return await asyncio.get_running_loop().run_in_executor(self.snapshot_writer, snapshots.write, tables)

    async def snapshot(self, request: web.Request) -> web.Response:
        self._authorize(request, "a snapshot")
        if self.snapshots is None:
            raise _error(web.HTTPConflict, "this collector has no snapshot directory: set [snapshot] dir or "
                                           "[collector] data_dir in its configuration")
        try:
            taken = await self.take_snapshot()
        except SnapshotError as error:
            raise _error(web.HTTPInsufficientStorage, error.line()) from None
        return web.json_response({"directory": str(taken.directory), "files": [str(path) for path in taken.files],
                                  "rows": taken.rows})

    async def snapshot_periodically(self, app: web.Application) -> None:
        """Every `snapshots.every` seconds, a snapshot (a failure is a line and a metric; the next one is tried)."""
        snapshots = self.snapshots
        if snapshots is None or not snapshots.every:
            return
        every = snapshots.every

        async def periodically() -> None:
            while not self.closing.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.closing.wait(), every)
                    return
                with contextlib.suppress(SnapshotError):  # said in a line and counted by Snapshots.write
                    await self.take_snapshot()
        self.periodic_snapshots = asyncio.get_running_loop().create_task(periodically())

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
        fleet = self.source.health().get("fleet")
        export = {"export": self.exporter.status()} if self.exporter is not None else {}
        return web.json_response({"structures": self.structure_stats(), "append_unread": unread,
                                  "responder": self.source.counters(), **({"fleet": fleet} if fleet else {}),
                                  **export})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", **self.source.health()})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.prometheus), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def end_streams(self, app: web.Application) -> None:
        self.closing.set()

    async def end_queries(self, app: web.Application) -> None:
        self.queries.shutdown(wait=False, cancel_futures=True)
        self.snapshot_writer.shutdown(wait=True)  # a snapshot being written is finished (or fails) cleanly


def make_app(source: QuerySource, token: str | None = None, snapshots: Snapshots | None = None, *,
             feeds: dict[str, AppendFeed] | None = None, exporter: Exporter | None = None) -> web.Application:
    """The service's application; without a token (an offline view) Append entries can be read, not taken; with
    `snapshots`, POST /snapshot (and their period) writes them."""
    service = QueryService(source, token, snapshots, feeds=feeds, exporter=exporter)
    app = web.Application(middlewares=[_json_errors], client_max_size=MAX_BODY_BYTES)
    app.add_routes([web.get("/structures", service.list_structures), *service.routes(),
                    web.get("/completions", service.completions),
                    web.get("/stats", service.stats),
                    web.get("/health", service.health),
                    web.get("/metrics", service.metrics),
                    web.post("/snapshot", service.snapshot)])
    app.on_startup.append(service.snapshot_periodically)
    app.on_shutdown.append(service.end_streams)
    app.on_cleanup.append(service.end_queries)
    return app


def _rows_fields(raw: bytearray, request: web.Request, query: type[StructureQuery[Any]],
                 structure: Structure) -> dict[str, Any]:
    """A binary request's fields: its body as the keys' rows, its URL parameters as the other fields."""
    if "keys" not in query.required_fields:
        raise QueryError(f"{structure_name(structure)} takes no keys: send its fields as a JSON object")
    if not raw or len(raw) % structure.key_len:
        raise QueryError(f"the body is {len(raw)} bytes: send whole keys of key_len {structure.key_len} "
                         f"(at least one)")
    fields: dict[str, Any] = {}
    for field, text in request.query.items():
        try:
            fields[field] = json.loads(text)
        except ValueError:
            fields[field] = text  # a bare string: mode=plurality
    if "keys" in fields:
        raise QueryError("the keys are the body of a binary request, not a URL parameter")
    fields["keys"] = np.frombuffer(bytes(raw), dtype=np.uint8).reshape(-1, structure.key_len)
    return checked_fields(fields, query.required_fields, query.optional_fields)


class _LimitedSite(web.TCPSite):
    """A TCP site that closes connections beyond MAX_CONNECTIONS at once: each one costs a file descriptor, which
    the collector also needs to save its regions."""

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None  # set up by the runner before its sites start

        def connection() -> asyncio.Protocol:
            if len(server.connections) >= MAX_CONNECTIONS:
                return _Refused()
            return server()

        self._server = await asyncio.get_running_loop().create_server(connection, self._host, self._port,
                                                                     reuse_address=True)
        self._bound_port = self._server.sockets[0].getsockname()[1]


class _Refused(asyncio.Protocol):
    BODY = json.dumps({"error": f"already {MAX_CONNECTIONS} connections open; try again later"}).encode()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        log.warning("query connection refused: already %d open (MAX_CONNECTIONS)", MAX_CONNECTIONS)
        connection = cast(asyncio.Transport, transport)  # a TCP connection's
        connection.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(self.BODY), self.BODY))
        transport.close()


async def serve(source: QuerySource, host: str = "127.0.0.1", port: int = 0,
                token: str | None = None, snapshots: Snapshots | None = None, *,
                feeds: dict[str, AppendFeed] | None = None, exporter: Exporter | None = None) -> web.AppRunner:
    """Start serving on the running loop; `runner.addresses[0][1]` is the bound port, `runner.cleanup()` stops."""
    runner = web.AppRunner(make_app(source, token, snapshots, feeds=feeds, exporter=exporter),
                           keepalive_timeout=IDLE_TIMEOUT_S, lingering_time=LINGER_S)
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
