"""A consumer of a collector's Append export (docs/export.md) for the demo: an ordered JetStream consumer, in a
thread of its own, that replays the stream from its first message and turns it into the answers the query
service gives to `POST /append/<range>` ({"lists": {id: {"entries": [...], "dropped": n}}}), each list in order
of its sequence numbers; a gap message, or a hole in the sequence, counts as dropped entries."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import defaultdict
from typing import Any

import nats
import nats.errors

from softdta.core.export import (
    COUNT_HEADER,
    DEFAULT_STREAM,
    DEFAULT_SUBJECT_PREFIX,
    ENTRY_BYTES_HEADER,
    KIND_HEADER,
    LIST_HEADER,
    MESSAGE_ID_HEADER,
    SEQUENCE_HEADER,
    Naming,
)
from softdta.errors import SoftdtaError
from softdta.kernel.netns import in_netns


class ExportConsumer:
    """Reads the Append entries `collector` exports to the NATS server at `url` (reached from `netns`, if given).
    With `collector` None it reads every collector's, which holds while each list is exported by one collector."""

    def __init__(self, url: str, collector: str | None, netns: str | None = None, stream: str = DEFAULT_STREAM,
                 prefix: str = DEFAULT_SUBJECT_PREFIX):
        self.url, self.netns, self.stream = url, netns, stream
        naming = Naming(collector or "any", prefix, stream)
        # their Append lists (docs/export.md)
        self.subjects = f"{naming.prefix}.append.{naming.collector if collector else '*'}.>"
        self.lock = threading.Lock()
        self.waiting: dict[int, dict[int, tuple[str, int, list[Any]]]] = defaultdict(dict)  # list -> seq -> message
        self.next_sequence: dict[int, int] = defaultdict(int)
        self.ids: set[str] = set()
        self.messages = self.entries = self.gaps = self.duplicates = self.last_stream_sequence = 0
        self.error = ""
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="softdta-export-consumer", daemon=True)

    def start(self) -> ExportConsumer:
        self.thread.start()
        return self

    def _namespace(self) -> contextlib.AbstractContextManager[None]:
        return in_netns(self.netns) if self.netns else contextlib.nullcontext()

    def _run(self) -> None:
        with self._namespace():
            try:
                asyncio.run(self._consume())
            except (OSError, nats.errors.Error, TimeoutError) as error:
                self.error = f"the export consumer of {self.url}: {type(error).__name__}: {error}"

    async def _consume(self) -> None:
        client = await nats.connect(self.url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            subscription = await client.jetstream().subscribe(self.subjects, ordered_consumer=True)
            while not self.stop.is_set():
                try:
                    message = await subscription.next_msg(timeout=0.1)
                except nats.errors.TimeoutError:
                    continue
                self._keep(message.headers or {}, message.data, message.metadata.sequence.stream)
            await subscription.unsubscribe()
        finally:
            await client.close()

    def _keep(self, headers: dict[str, str], data: bytes, stream_sequence: int) -> None:
        size = int(headers.get(ENTRY_BYTES_HEADER, "0") or 0)
        count = int(headers[COUNT_HEADER])
        entries = [int.from_bytes(data[i:i + size], "big") if size <= 8 else data[i:i + size].hex()
                   for i in range(0, len(data), size)] if size else []
        with self.lock:
            self.last_stream_sequence = stream_sequence
            self.messages += 1
            if headers[MESSAGE_ID_HEADER] in self.ids:
                self.duplicates += 1  # the stream stored one message ID twice
                return
            self.ids.add(headers[MESSAGE_ID_HEADER])
            list_id = int(headers[LIST_HEADER])
            self.waiting[list_id][int(headers[SEQUENCE_HEADER])] = (headers[KIND_HEADER], count, entries)

    def answer(self, final: bool = False) -> dict[str, Any]:
        """What arrived since the last answer, per list in sequence order; `final`: holes count as dropped."""
        lists: dict[str, dict[str, Any]] = {}
        with self.lock:
            for list_id, waiting in self.waiting.items():
                entries: list[Any] = []
                dropped = 0
                while waiting:
                    sequence = self.next_sequence[list_id]
                    if sequence not in waiting:
                        if not final:
                            break
                        hole = min(waiting) - sequence
                        dropped += hole
                        self.gaps += hole
                        self.next_sequence[list_id] += hole
                        continue
                    kind, count, values = waiting.pop(sequence)
                    if kind == "gap":
                        dropped += count
                        self.gaps += count
                    else:
                        entries += values
                        self.entries += len(values)
                    self.next_sequence[list_id] += count
                if entries or dropped:
                    lists[str(list_id)] = {"entries": entries, "dropped": dropped}
        return {"lists": lists}

    def caught_up(self, stream_last_sequence: int) -> bool:
        with self.lock:
            return self.last_stream_sequence >= stream_last_sequence

    def finish(self, within: float = 30.0) -> dict[str, Any]:
        """Once every message the stream holds now was read: the rest of the answer, and the consumer stopped."""
        last = asyncio.run(self._stream_last_sequence())
        deadline = time.monotonic() + within
        while not self.caught_up(last) and not self.error and time.monotonic() < deadline:
            time.sleep(0.02)
        self.stop.set()
        self.thread.join(10)
        if self.error:
            raise SoftdtaError(self.error)
        if not self.caught_up(last):
            raise SoftdtaError(f"the export consumer read the stream {self.stream} up to message "
                               f"{self.last_stream_sequence} of {last} within {within:.0f} s")
        return self.answer(final=True)

    async def _stream_last_sequence(self) -> int:
        with self._namespace():
            client = await nats.connect(self.url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            return int((await client.jetstream().stream_info(self.stream)).state.last_seq or 0)
        finally:
            await client.close()

    def figures(self) -> dict[str, int]:
        """messages read, entries, message IDs stored twice, entries the stream holds gaps for."""
        with self.lock:
            return {"messages": self.messages, "entries": self.entries, "duplicates_stored": self.duplicates,
                    "gaps": self.gaps}
