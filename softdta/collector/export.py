"""The collector's export to NATS JetStream (`softdta collector up --export nats://HOST:PORT`, docs/export.md).

The exporter takes every Append entry from the rings (the query service's pollers), journals it in
data_dir/export.journal before the ring is zeroed, and publishes it; it answers each watched structure's query
for its keys every `every` seconds and publishes each answer that changed (`[[export.watch]]`: e.g. the decoded
postcard paths of a set of flows). The ledger (core.export) keeps the exact account. Publishing runs on the
collector's event loop and never waits on the rings or the queries: a slow or absent broker only grows the
backlog, whose bound turns the oldest entries into gap markers, counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from softdta.broker.jetstream import BrokerUnavailable, JetStream, StreamMissing
from softdta.core import registry
from softdta.core.export import (
    ExportError,
    ExportSettings,
    Ledger,
    Message,
    Watch,
    ack_record,
    encode_record,
    journal_header,
    read_journal,
)
from softdta.core.primitives.append.queries import AppendFeed
from softdta.core.query import QueryError, StructureQuery, checked_fields
from softdta.core.regions import Region
from softdta.core.tables import Structure, Tables

JOURNAL_FILE = "export.journal"
POLL_S = 0.005
IN_FLIGHT = 64  # messages published and not yet acknowledged
RETRY_S = (0.05, 1.0)  # reconnect backoff, first and longest
ACK_JOURNAL_S = 0.05  # acknowledgements are journaled at most this often
COMPACT_BYTES = 64 << 20  # the journal is rewritten once it is this big and four times its backlog
log = logging.getLogger("softdta.collector.export")


class StructureSource(Protocol):
    """What watches read: the collector's structures."""

    tables: Tables

    def structure_region(self, primitive: int, collector_ip: bytes) -> Region: ...


@dataclass
class _Watching:
    watch: Watch
    structure: Structure
    query: StructureQuery[Any]
    due: float = 0.0


class _Unjournaled(Exception):
    """Entries the journal could not take: the poll leaves them in their ring."""


class Exporter:
    """Drains `feeds` into JetStream. `epoch()` gives the fleet epoch to stamp on what is taken now."""

    def __init__(self, settings: ExportSettings, collector: str, collector_ip: str, feeds: dict[str, AppendFeed],
                 data_dir: Path, epoch: Callable[[], int] = lambda: 0, now_ns: Callable[[], int] = time.time_ns,
                 structures: StructureSource | None = None):
        self.settings, self.naming = settings, settings.naming(collector)
        self.collector_ip, self.feeds, self.epoch, self.now_ns = collector_ip, feeds, epoch, now_ns
        self.structures = structures
        self.watching = [self._watching(watch) for watch in settings.watches]
        self.broker = JetStream(settings.url, settings.stream, [f"{settings.subject_prefix}.>"],
                                settings.duplicate_window_s)
        self.journal_path = Path(data_dir) / JOURNAL_FILE
        self.incarnation, self.ledger = self._recovered()
        self.journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND)
        self.journaled_acks = self.ledger.acknowledged_below()
        self.new_messages = asyncio.Event()
        self.connected = False
        self.events = {"connects": 0, "disconnects": 0, "stream_recreated": 0, "duplicates": 0,
                       "publish_failures": 0, "journal_failures": 0}
        self.last_error = ""
        self.journal_failing = False
        self._dropping_logged = 0

    def _watching(self, watch: Watch) -> _Watching:
        """A watch checked against the collector's structures and its primitive's query (an ExportError names
        what is wrong)."""
        where = f"[[export.watch]] {watch.primitive}"
        found = [structure for structure in (self.structures.tables.structures if self.structures else [])
                 if registry.by_opcode(structure.primitive).name == watch.primitive]
        if not found:
            raise ExportError(f"{where}: the collector hosts no {watch.primitive} structure; watch one it hosts")
        query = registry.by_opcode(found[0].primitive).query
        if query is None or "keys" not in query.required_fields:
            raise ExportError(f"{where}: its structure answers no query by keys; it cannot be watched")
        try:
            parsed = query.parse(checked_fields({"keys": list(watch.keys), **dict(watch.fields)},
                                                query.required_fields, query.optional_fields),
                                 found[0], f"{watch.primitive}@{self.collector_ip}")
        except QueryError as error:
            raise ExportError(f"{where}: {error}") from None
        return _Watching(watch, found[0], parsed)

    # ---- the journal

    def _recovered(self) -> tuple[str, Ledger]:
        """The journal's incarnation and ledger, the journal rewritten with only what is still needed; a new
        incarnation if there is no journal."""
        limit = self.settings.backlog_entries
        try:
            journal = read_journal(self.journal_path.read_bytes())
        except FileNotFoundError:
            incarnation = secrets.token_hex(8)
            self._rewrite(incarnation, Ledger(limit))
            return incarnation, Ledger(limit)
        except ExportError:
            raise ExportError(f"{self.journal_path} is not an export journal; move it away (the collector starts a "
                              "new one, and a new incarnation of its message IDs)") from None
        ledger = Ledger.replayed(journal.messages, limit)
        self._rewrite(journal.incarnation, ledger)
        if ledger.backlog:
            log.warning("export: %d entries of the journal wait for the broker's acknowledgement; sending them "
                        "again", ledger.backlog_entries)
        return journal.incarnation, ledger

    def _rewrite(self, incarnation: str, ledger: Ledger) -> None:
        """The journal as `ledger` needs it: its waiting messages and each list's acknowledged mark (atomically)."""
        records = [journal_header(incarnation)]
        records += [ack_record(channel, sequence) for channel, sequence in ledger.acknowledged_below().items()]
        records += [encode_record(message) for message in ledger.last_states() + list(ledger.backlog.values())]
        temporary = self.journal_path.with_suffix(".rewrite")
        with open(temporary, "wb") as file:
            file.write(b"".join(records))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.journal_path)

    def _journal(self, records: list[bytes]) -> bool:
        """Append `records`; False if the journal cannot take them (a full disk), said once per outage."""
        if not records:
            return True
        size = os.fstat(self.journal_fd).st_size
        try:
            data = b"".join(records)
            if os.write(self.journal_fd, data) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as error:
            with contextlib.suppress(OSError):
                os.ftruncate(self.journal_fd, size)  # a torn record would hide every record after it
            self.events["journal_failures"] += 1
            if not self.journal_failing:
                log.error("export: cannot write the export journal %s (%s); Append entries stay in their rings "
                          "(which overflow, counted as gaps) until it can", self.journal_path, error.strerror)
            self.journal_failing = True
            return False
        if self.journal_failing:
            log.warning("export: the export journal %s takes writes again", self.journal_path)
            self.journal_failing = False
        return True

    def _compact(self) -> None:
        size = os.fstat(self.journal_fd).st_size
        backlog_bytes = sum(len(message.payload) + 64 for message in self.ledger.backlog.values())
        if size > COMPACT_BYTES and size > 4 * backlog_bytes:
            os.close(self.journal_fd)
            self._rewrite(self.incarnation, self.ledger)
            self.journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND)
            self.journaled_acks = self.ledger.acknowledged_below()

    # ---- taking entries

    def poll(self) -> int:
        """Take what every ring holds now; returns the messages made."""
        made = 0
        epoch, now_ns = self.epoch(), self.now_ns()
        for feed in self.feeds.values():
            first_list = feed.lists.first_list

            def keep(new: dict[int, np.ndarray], lost: dict[int, int]) -> None:
                nonlocal made
                messages: list[Message] = []
                for list_id in sorted(set(new) | set(lost)):
                    empty = np.empty((0, feed.lists.data_len), dtype=np.uint8)
                    messages += self.ledger.take(list_id, first_list, new.get(list_id, empty), lost.get(list_id, 0),
                                                 epoch=epoch, now_ns=now_ns)
                if not self._journal([encode_record(message) for message in messages]):
                    self.ledger.forget(messages)
                    raise _Unjournaled  # the entries stay in the ring until the journal takes them
                made += len(messages)

            try:
                feed.poller.poll_counting_laps(keep)
            except _Unjournaled:
                break
        dropped_before = self.ledger.dropped
        gaps = self.ledger.bounded()
        if gaps:
            self._journal([encode_record(gap) for gap in gaps])
            if self.ledger.dropped // max(1, self.settings.backlog_entries) != self._dropping_logged:
                self._dropping_logged = self.ledger.dropped // max(1, self.settings.backlog_entries)
                log.warning("export: the backlog is full (%d entries, [export] backlog_entries): dropped the oldest "
                            "%d (%d in all), published as gaps; the broker at %s is slow or away",
                            self.settings.backlog_entries, self.ledger.dropped - dropped_before, self.ledger.dropped,
                            self.settings.url)
        if made:
            self.new_messages.set()
        return made

    def poll_watches(self, now: float) -> int:
        """Answer each watch that is due; returns the states that changed."""
        changed: list[Message] = []
        epoch, now_ns = self.epoch(), self.now_ns()
        for watching in self.watching:
            if now < watching.due or self.structures is None:
                continue
            watching.due = now + watching.watch.every_s
            region = self.structures.structure_region(watching.structure.primitive, watching.structure.qp.collector_ip)
            for result in watching.query.answer(region).json()["results"]:
                payload = json.dumps(result, sort_keys=True, separators=(",", ":")).encode()
                message = self.ledger.state(watching.watch.primitive, bytes.fromhex(result["key"]), payload,
                                            epoch=epoch, now_ns=now_ns)
                if message is not None:
                    changed.append(message)
        if not self._journal([encode_record(message) for message in changed]):
            self.ledger.forget(changed)  # made again at the next check
            return 0
        if changed:
            self.new_messages.set()
        return len(changed)

    def _publisher_behind(self) -> bool:
        """Connected, with a window's worth of messages waiting besides those in flight: what is taken now would
        only wait too. (Without a broker, entries are taken as they come: the journal keeps them, a ring may not.)"""
        return self.connected and len(self.ledger.backlog) - len(self.ledger.in_flight) >= IN_FLIGHT

    def _rings_filling(self) -> bool:
        """Some ring holds a quarter of a ring unread (or its WRITEs are not counted, so nobody can tell). While
        the publisher is behind, entries wait in the rings until then, and go out in fewer, larger messages."""
        for feed in self.feeds.values():
            poller = feed.poller
            if poller.writes is None or poller.accounted is None:
                return True
            if int((poller.writes.astype(np.int64) - poller.accounted).max(initial=0)) >= \
                    poller.batches_per_ring // 4:
                return True
        return False

    # ---- publishing

    async def run(self, stop: asyncio.Event) -> None:
        """Poll and publish until `stop`, then wait for the messages in flight (a publish times out in 2 s); the
        journal keeps what is left for the next start."""
        poller = asyncio.create_task(self._poll_until(stop))
        try:
            await self._publish_until(stop)
        finally:
            await poller
            self._journal_acks(force=True)
            os.close(self.journal_fd)
            await self.broker.close()

    async def _poll_until(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if not self._publisher_behind() or self._rings_filling():
                self.poll()
            self.poll_watches(time.monotonic())
            self._compact()
            try:
                await asyncio.wait_for(stop.wait(), POLL_S)
            except asyncio.TimeoutError:
                pass

    async def _publish_until(self, stop: asyncio.Event) -> None:
        retry = RETRY_S[0]
        pending: dict[asyncio.Task[bool], Message] = {}
        acks_journaled = time.monotonic()
        while not stop.is_set() or (self.connected and self.ledger.backlog and pending):
            if not self.connected:
                if not await self._connect():
                    try:
                        await asyncio.wait_for(stop.wait(), retry)
                    except asyncio.TimeoutError:
                        pass
                    retry = min(2 * retry, RETRY_S[1])
                    continue
                retry = RETRY_S[0]
            for message in self.ledger.ready(IN_FLIGHT - len(pending)) if not stop.is_set() else []:
                pending[asyncio.create_task(self._publish(message))] = message
            if not pending:
                if not self.broker.connected:
                    await self._recover(BrokerUnavailable(f"lost the NATS server at {self.settings.url}"), pending)
                    continue
                self._journal_acks()  # nothing in flight: the journal holds every acknowledgement while idle
                self.new_messages.clear()
                try:
                    await asyncio.wait_for(self.new_messages.wait(), 0.1)
                except asyncio.TimeoutError:
                    pass
                continue
            done, _ = await asyncio.wait(pending, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            failure: BrokerUnavailable | None = None
            for task in done:
                message = pending.pop(task)
                try:
                    if task.result():
                        self.events["duplicates"] += 1
                    self.ledger.acknowledged_message(message)
                except BrokerUnavailable as error:
                    self.ledger.failed(message)
                    self.events["publish_failures"] += 1
                    failure = failure if isinstance(failure, StreamMissing) else error
            if time.monotonic() - acks_journaled > ACK_JOURNAL_S:
                self._journal_acks()
                acks_journaled = time.monotonic()
            if failure is not None:
                await self._recover(failure, pending)
        await self._abandon(pending)

    async def _abandon(self, pending: dict[asyncio.Task[bool], Message]) -> None:
        """Stop waiting for the messages in flight: they wait to be sent again."""
        for task in pending:
            task.cancel()
        for task, message in pending.items():
            await asyncio.gather(task, return_exceptions=True)
            self.ledger.failed(message)
        pending.clear()

    async def _publish(self, message: Message) -> bool:
        return await self.broker.publish(self.naming.subject(message), message.payload,
                                         message.headers(self.naming.collector, self.incarnation, self.collector_ip))

    async def _connect(self) -> bool:
        try:
            created = await self.broker.connect()
        except BrokerUnavailable as error:
            if str(error) != self.last_error:
                log.warning("export: %s; keeping %d entries (and taking more, up to [export] backlog_entries %d) "
                            "until it answers", error, self.ledger.backlog_entries, self.settings.backlog_entries)
            self.last_error = str(error)
            return False
        self.connected = True
        self.events["connects"] += 1
        log.warning("export: publishing to stream %s at %s%s; %d entries wait to be sent", self.settings.stream,
                    self.settings.url, " (created the stream)" if created else "", self.ledger.backlog_entries)
        self.last_error = ""
        return True

    async def _recover(self, failure: BrokerUnavailable, pending: dict[asyncio.Task[bool], Message]) -> None:
        """After a failed publish: a missing stream is made again; a lost connection is dropped, its messages in
        flight wait to be sent again. What was acknowledged is journaled first: a collector killed while the broker
        is away then sends none of it again."""
        self._journal_acks()
        if isinstance(failure, StreamMissing):
            try:
                if await self.broker.ensure_stream():
                    self.events["stream_recreated"] += 1
                    log.warning("export: stream %s was deleted under the collector (what it held is gone with it); "
                                "created it again, re-sending %d entries not yet acknowledged", self.settings.stream,
                                self.ledger.backlog_entries)
                return
            except BrokerUnavailable as error:
                failure = error
        await self._abandon(pending)
        self.connected = False
        self.events["disconnects"] += 1
        self.last_error = str(failure)
        log.warning("export: %s; keeping %d entries until it is back", failure, self.ledger.backlog_entries)
        await self.broker.close()

    def _journal_acks(self, force: bool = False) -> None:
        marks = self.ledger.acknowledged_below()
        changed = {channel: sequence for channel, sequence in marks.items()
                   if self.journaled_acks.get(channel) != sequence}
        if (changed or force) and self._journal([ack_record(channel, sequence)
                                                 for channel, sequence in changed.items()]):
            self.journaled_acks = marks

    # ---- what it reports

    def status(self) -> dict[str, Any]:
        ledger = self.ledger
        return {"url": self.settings.url, "stream": self.settings.stream, "connected": self.connected,
                "incarnation": self.incarnation, "taken": ledger.taken, "acknowledged": ledger.acknowledged,
                "lost_to_overflow": ledger.lost, "dropped_from_backlog": ledger.dropped,
                "backlog_entries": ledger.backlog_entries, "backlog_limit": self.settings.backlog_entries,
                "backlog_messages": len(ledger.backlog), "states": ledger.states,
                "states_acknowledged": ledger.states_acknowledged, **self.events, "last_error": self.last_error}
