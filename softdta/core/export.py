"""Telemetry export, sans-IO: what a collector publishes to NATS JetStream and how it keeps an exact account
(docs/export.md).

Every Append entry the collector takes gets a sequence number in its list (from 0, counting entries taken and
entries lost to ring overflow), and goes out in a `Message`: up to MAX_MESSAGE_ENTRIES entries of one list in
order, or a gap marker for entries lost. A message's de-duplication ID names the collector, its journal's
incarnation, the list and the first sequence number, so a message published again after a reconnect or a restart
is the same message, and JetStream keeps one.

A structure's watched keys (`[[export.watch]]`: e.g. flows whose postcard paths are decoded) go out as `state`
messages: a key's query answer each time it changes, numbered per key the same way.

The `Ledger` is the account: messages taken and not yet acknowledged (the backlog, bounded), the next sequence
number of each list, and what the bound dropped. The journal (`encode_record`, `read_journal`) makes it survive a
restart: the collector appends each message before the entries leave the ring, and each acknowledgement after
JetStream gives it; replaying the journal gives back the same ledger.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from softdta.errors import SoftdtaError

MAX_MESSAGE_ENTRIES = 4096
MAX_MESSAGE_BYTES = 256 << 10  # under nats-server's default max_payload (1 MiB)
DEFAULT_BACKLOG_ENTRIES = 4 << 20
DEFAULT_STREAM = "SOFTDTA"
DEFAULT_SUBJECT_PREFIX = "softdta"
DUPLICATE_WINDOW_S = 600  # JetStream's de-duplication window: a restart within it never publishes a message twice

# Message headers (besides JetStream's Nats-Msg-Id)
COLLECTOR_HEADER = "Softdta-Collector"
EPOCH_HEADER = "Softdta-Epoch"
KIND_HEADER = "Softdta-Kind"  # "entries", "gap" or "state"
RANGE_HEADER = "Softdta-Range"
LIST_HEADER = "Softdta-List"
STRUCTURE_HEADER = "Softdta-Structure"  # a state's structure, <primitive>@<collector ip>
KEY_HEADER = "Softdta-Key"  # a state's key, hex in wire order
SEQUENCE_HEADER = "Softdta-Seq"  # the first entry's sequence number in its list (a state's, in its key's)
COUNT_HEADER = "Softdta-Count"  # entries in the message, or entries the gap stands for
ENTRY_BYTES_HEADER = "Softdta-Entry-Bytes"
TIME_HEADER = "Softdta-Time-Ns"  # when the collector took the entries (UNIX ns)
MESSAGE_ID_HEADER = "Nats-Msg-Id"

_TOKEN = re.compile(r"[A-Za-z0-9_-]+")  # a NATS subject token, and a JetStream stream name, that needs no escaping
_PREFIX = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")


class ExportError(SoftdtaError, ValueError):
    """An export setting that cannot work; the message names it and the fix."""


class Kind(IntEnum):
    ENTRIES = 1
    GAP = 2
    ACK = 3  # journal only: the channel's messages below `sequence` are acknowledged
    STATE = 4


Channel = tuple[int, str, bytes]  # what messages are numbered in: an Append list (id, "", b""), or (0, structure, key)


@dataclass(frozen=True)
class Naming:
    """Where messages go: subjects `<prefix>.append.<collector>.<list>` and `<prefix>.<primitive>.<collector>.<key
    hex>` in stream `stream`, which takes `<prefix>.>`."""

    collector: str
    prefix: str = DEFAULT_SUBJECT_PREFIX
    stream: str = DEFAULT_STREAM

    def __post_init__(self) -> None:
        if not _TOKEN.fullmatch(self.collector):
            raise ExportError(f"collector name {self.collector!r} cannot be a NATS subject token (letters, digits, "
                              "'_' and '-' only); rename the collector to export its telemetry")
        if not _PREFIX.fullmatch(self.prefix):
            raise ExportError(f"[export] subject_prefix {self.prefix!r} is not a NATS subject: give dot-separated "
                              "tokens of letters, digits, '_' and '-' (no wildcards), e.g. \"softdta\"")
        if not _TOKEN.fullmatch(self.stream):
            raise ExportError(f"[export] stream {self.stream!r} is not a JetStream stream name: give letters, "
                              "digits, '_' and '-', e.g. \"SOFTDTA\"")

    def subject(self, message: Message) -> str:
        if message.kind is Kind.STATE or message.structure:
            return f"{self.prefix}.{message.structure}.{self.collector}.{message.key.hex()}"
        return f"{self.prefix}.append.{self.collector}.{message.list_id}"


def checked_url(url: str) -> str:
    """`url` if it is nats://HOST:PORT, else an ExportError naming the form to give."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme != "nats" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ExportError(f"{url!r} ([export] url, --export) is not a NATS server URL; give nats://HOST:PORT, e.g. "
                          "nats://127.0.0.1:4222")
    return url


@dataclass(frozen=True)
class Watch:
    """`[[export.watch]]`: the keys of the collector's structure of `primitive` whose query answers (the query
    service's, with `fields` besides the keys) are published each time they change, checked every `every_s`."""

    primitive: str
    keys: tuple[str, ...]  # hex, wire order
    fields: tuple[tuple[str, Any], ...] = ()
    every_s: float = 1.0


@dataclass(frozen=True)
class ExportSettings:
    """The `[export]` section (and `--export URL`)."""

    url: str
    stream: str = DEFAULT_STREAM
    subject_prefix: str = DEFAULT_SUBJECT_PREFIX
    backlog_entries: int = DEFAULT_BACKLOG_ENTRIES
    duplicate_window_s: int = DUPLICATE_WINDOW_S
    watches: tuple[Watch, ...] = ()

    def naming(self, collector: str) -> Naming:
        checked_url(self.url)
        if self.backlog_entries < 1:
            raise ExportError(f"[export] backlog_entries {self.backlog_entries} must be at least 1")
        return Naming(collector, self.subject_prefix, self.stream)


@dataclass
class Message:
    """One message of a list: `count` entries from `sequence` on (`payload`, `entry_bytes` each), or a gap of
    `count` entries lost; or a watched key's state (`payload`: its query answer in JSON; `count` 1), or a gap of
    states dropped. `epoch` is the fleet's epoch when they were taken (0 outside a fleet)."""

    kind: Kind
    list_id: int
    first_list: int  # of the list's Append range
    sequence: int
    count: int
    entry_bytes: int
    epoch: int
    time_ns: int
    payload: bytes = b""
    structure: str = ""  # a state's primitive (its structure at the collector's IP)
    key: bytes = b""

    @property
    def channel(self) -> Channel:
        return self.list_id, self.structure, self.key

    @property
    def carries(self) -> bool:
        """It holds data (entries or a state), which the backlog bound may drop."""
        return self.kind is Kind.ENTRIES or self.kind is Kind.STATE

    def message_id(self, collector: str, incarnation: str) -> str:
        if self.structure:
            return f"{collector}:{incarnation}:{self.structure}/{self.key.hex()}:{self.sequence}"
        return f"{collector}:{incarnation}:{self.list_id}:{self.sequence}"

    def headers(self, collector: str, incarnation: str, collector_ip: str) -> dict[str, str]:
        kind = {Kind.GAP: "gap", Kind.STATE: "state"}.get(self.kind, "entries")
        common = {MESSAGE_ID_HEADER: self.message_id(collector, incarnation), COLLECTOR_HEADER: collector,
                  EPOCH_HEADER: str(self.epoch), KIND_HEADER: kind, SEQUENCE_HEADER: str(self.sequence),
                  COUNT_HEADER: str(self.count), TIME_HEADER: str(self.time_ns)}
        if self.structure:
            return {**common, STRUCTURE_HEADER: f"{self.structure}@{collector_ip}", KEY_HEADER: self.key.hex()}
        return {**common, RANGE_HEADER: f"append{self.first_list}@{collector_ip}", LIST_HEADER: str(self.list_id),
                ENTRY_BYTES_HEADER: str(self.entry_bytes)}

    @property
    def end(self) -> int:
        return self.sequence + self.count


# --------------------------------------------------------------------------------------------------
# The journal: a header, then records; a torn last record (a crash mid-write) is ignored

JOURNAL_MAGIC = b"SDTAEXP1"
_JOURNAL_HEADER = struct.Struct("<8s16s")  # magic, incarnation (hex text of 8 random bytes)
# length, crc32, kind, structure and key lengths, entry_bytes, list, first_list, seq, count, time, epoch; then the
# structure's name, the key and the payload
_RECORD = struct.Struct("<IIBBHHIIQIqQ")


def journal_header(incarnation: str) -> bytes:
    return _JOURNAL_HEADER.pack(JOURNAL_MAGIC, incarnation.encode())


def encode_record(message: Message) -> bytes:
    structure = message.structure.encode()
    body = _RECORD.pack(0, 0, message.kind, len(structure), len(message.key), message.entry_bytes, message.list_id,
                        message.first_list, message.sequence, message.count, message.time_ns, message.epoch
                        )[8:] + structure + message.key + message.payload
    return struct.pack("<II", len(body), zlib.crc32(body)) + body


def ack_record(channel: Channel, sequence: int) -> bytes:
    list_id, structure, key = channel
    return encode_record(Message(Kind.ACK, list_id, 0, sequence, 0, 0, 0, 0, structure=structure, key=key))


@dataclass
class Journal:
    """What a journal file holds: its incarnation, every message in order, and the bytes that made sense."""

    incarnation: str
    messages: list[Message]
    valid_bytes: int


def read_journal(data: bytes) -> Journal:
    """Parse a journal; raises ExportError if it is not one. Records after a damaged one are ignored (only the
    last record can be damaged: the file is only ever appended to)."""
    if len(data) < _JOURNAL_HEADER.size or data[:8] != JOURNAL_MAGIC:
        raise ExportError("not a softdta export journal")
    incarnation = _JOURNAL_HEADER.unpack_from(data)[1].decode("ascii", "replace")
    offset, messages = _JOURNAL_HEADER.size, []
    while offset + 8 <= len(data):
        length, crc = struct.unpack_from("<II", data, offset)
        body = data[offset + 8:offset + 8 + length]
        if length < _RECORD.size - 8 or len(body) < length or zlib.crc32(body) != crc:
            break
        kind, structure_len, key_len, entry_bytes, list_id, first_list, sequence, count, time_ns, epoch = \
            _RECORD.unpack(bytes(8) + body[:_RECORD.size - 8])[2:]
        rest = bytes(body[_RECORD.size - 8:])
        messages.append(Message(Kind(kind), list_id, first_list, sequence, count, entry_bytes, epoch, time_ns,
                                rest[structure_len + key_len:], rest[:structure_len].decode(),
                                rest[structure_len:structure_len + key_len]))
        offset += 8 + length
    return Journal(incarnation, messages, offset)


# --------------------------------------------------------------------------------------------------
# The ledger


@dataclass
class Ledger:
    """The exact account of one collector's export.

    Per channel (an Append list, or a watched key), `next_sequence` is the sequence number of the next entry or
    state. `backlog` holds the messages made and not yet acknowledged, oldest first, keyed by (channel,
    sequence). Beyond `limit` entries and states in the backlog, the oldest messages not in flight give up their
    data and become gap markers (`dropped` counts what they held). `last_state` is each watched key's last state
    made, so that a state is sent only when it changes.
    """

    limit: int = DEFAULT_BACKLOG_ENTRIES
    next_sequence: dict[Channel, int] = field(default_factory=dict)
    backlog: OrderedDict[tuple[Channel, int], Message] = field(default_factory=OrderedDict)
    in_flight: set[tuple[Channel, int]] = field(default_factory=set)
    last_state: dict[Channel, bytes] = field(default_factory=dict)
    backlog_entries: int = 0  # entries and states
    taken: int = 0  # entries taken from the rings
    lost: int = 0  # entries lost to ring overflow (published as gaps)
    dropped: int = 0  # entries and states the backlog bound dropped (published as gaps)
    acknowledged: int = 0  # entries JetStream acknowledged
    states: int = 0  # states made
    states_acknowledged: int = 0

    def take(self, list_id: int, first_list: int, entries: np.ndarray, lost: int, *, epoch: int,
             now_ns: int) -> list[Message]:
        """Account for what a poll took from a list: `lost` entries overwritten before it, then `entries` (rows of
        one entry's bytes each, or a 1-D array of integer entries), oldest first. Returns the new messages, in
        order, for the journal and the broker."""
        channel: Channel = (list_id, "", b"")
        sequence = self.next_sequence.get(channel, 0)
        messages = []
        if lost:
            messages.append(Message(Kind.GAP, list_id, first_list, sequence, lost, 0, epoch, now_ns))
            sequence += lost
            self.lost += lost
        if entries.ndim == 1:  # 4- and 8-byte entries, as integers: sent in the report's (network) byte order
            entries = entries.astype(entries.dtype.newbyteorder(">")).reshape(-1, 1).view(np.uint8)
        rows = entries.reshape(entries.shape[0], -1)
        entry_bytes = rows.shape[1] if rows.shape[0] else 0
        step = max(1, min(MAX_MESSAGE_ENTRIES, MAX_MESSAGE_BYTES // max(1, entry_bytes)))
        for start in range(0, rows.shape[0], step):
            chunk = rows[start:start + step]
            messages.append(Message(Kind.ENTRIES, list_id, first_list, sequence, chunk.shape[0], entry_bytes,
                                    epoch, now_ns, chunk.tobytes()))
            sequence += chunk.shape[0]
            self.taken += chunk.shape[0]
        self.next_sequence[channel] = sequence
        for message in messages:
            self._keep(message)
        return messages

    def state(self, structure: str, key: bytes, payload: bytes, *, epoch: int, now_ns: int) -> Message | None:
        """A watched key's state now: a new message if it differs from the last one made, else None."""
        channel: Channel = (0, structure, key)
        if self.last_state.get(channel) == payload:
            return None
        sequence = self.next_sequence.get(channel, 0)
        message = Message(Kind.STATE, 0, 0, sequence, 1, 0, epoch, now_ns, payload, structure, key)
        self.next_sequence[channel] = sequence + 1
        self.last_state[channel] = payload
        self.states += 1
        self._keep(message)
        return message

    def forget(self, messages: list[Message]) -> None:
        """Undo `take` or `state` for `messages` (the latest of their channels), which the journal could not
        keep: their entries are taken again later, a state made again."""
        for message in reversed(messages):
            self.backlog.pop((message.channel, message.sequence), None)
            if message.sequence:
                self.next_sequence[message.channel] = message.sequence
            else:  # the channel's first: as if it had never been seen (nothing to journal an acknowledgement of)
                self.next_sequence.pop(message.channel, None)
            if message.carries:
                self.backlog_entries -= message.count
            if message.kind is Kind.ENTRIES:
                self.taken -= message.count
            elif message.kind is Kind.GAP:
                self.lost -= message.count
            else:
                self.states -= 1
                self.last_state.pop(message.channel, None)

    def _keep(self, message: Message) -> None:
        self.backlog[message.channel, message.sequence] = message
        if message.carries:
            self.backlog_entries += message.count

    def bounded(self) -> list[Message]:
        """Turn the oldest waiting messages into gaps until the backlog is within its limit; returns the gaps made
        (for the journal, where they supersede the messages they replace). A watched key whose state is dropped
        is sent again at its next poll."""
        gaps = []
        for key, message in list(self.backlog.items()):
            if self.backlog_entries <= self.limit:
                break
            if not message.carries or key in self.in_flight:
                continue
            gap = Message(Kind.GAP, message.list_id, message.first_list, message.sequence, message.count, 0,
                          message.epoch, message.time_ns, structure=message.structure, key=message.key)
            self.backlog[key] = gap
            self.backlog_entries -= message.count
            self.dropped += message.count
            if message.kind is Kind.STATE and self.last_state.get(message.channel) == message.payload:
                del self.last_state[message.channel]
            gaps.append(gap)
        return gaps

    def ready(self, most: int) -> list[Message]:
        """Up to `most` waiting messages that are not in flight, oldest first; they are in flight from now on."""
        chosen: list[Message] = []
        for key, message in self.backlog.items():
            if len(chosen) >= most:
                break
            if key not in self.in_flight:
                self.in_flight.add(key)
                chosen.append(message)
        return chosen

    def acknowledged_message(self, message: Message) -> None:
        key = (message.channel, message.sequence)
        self.in_flight.discard(key)
        kept = self.backlog.pop(key, None)
        if kept is not None and kept.carries:
            self.backlog_entries -= kept.count
            if kept.kind is Kind.STATE:
                self.states_acknowledged += 1
            else:
                self.acknowledged += kept.count

    def failed(self, message: Message) -> None:
        """A message the broker did not acknowledge: it waits to be sent again."""
        self.in_flight.discard((message.channel, message.sequence))

    def acknowledged_below(self) -> dict[Channel, int]:
        """Per channel, the sequence number below which every message is acknowledged (for the journal's ACKs)."""
        lowest: dict[Channel, int] = {}
        for channel, sequence in self.backlog:
            lowest.setdefault(channel, sequence)
        return {channel: lowest.get(channel, sequence) for channel, sequence in self.next_sequence.items()}

    def last_states(self) -> list[Message]:
        """Each watched key's last state made that no longer waits in the backlog (the journal keeps them across
        a rewrite, so that a restart sends a state only if it changed)."""
        waiting = {message.channel for message in self.backlog.values() if message.kind is Kind.STATE}
        return [Message(Kind.STATE, 0, 0, self.next_sequence[channel] - 1, 1, 0, 0, 0, payload, channel[1],
                        channel[2])
                for channel, payload in self.last_state.items() if channel not in waiting]

    @classmethod
    def replayed(cls, messages: list[Message], limit: int = DEFAULT_BACKLOG_ENTRIES) -> Ledger:
        """The ledger a journal's messages leave: every channel's next sequence number, its messages not yet
        acknowledged as the backlog (a later record of the same channel and sequence supersedes an earlier one),
        and every watched key's last state."""
        ledger = cls(limit)
        acked: dict[Channel, int] = {}
        for message in messages:
            channel = message.channel
            if message.kind is Kind.ACK:
                acked[channel] = max(acked.get(channel, 0), message.sequence)
            else:
                ledger.next_sequence[channel] = max(ledger.next_sequence.get(channel, 0), message.end)
            if message.kind is Kind.STATE:
                ledger.last_state[channel] = message.payload
            elif message.kind is Kind.GAP and message.structure:
                ledger.last_state.pop(channel, None)  # its state was dropped: send the state again
        for channel, sequence in acked.items():
            ledger.next_sequence[channel] = max(ledger.next_sequence.get(channel, 0), sequence)
        for message in messages:
            if message.kind is not Kind.ACK and message.sequence >= acked.get(message.channel, 0):
                previous = ledger.backlog.get((message.channel, message.sequence))
                if previous is not None and previous.carries:
                    ledger.backlog_entries -= previous.count
                ledger._keep(message)  # in the place of the one it supersedes: a channel's messages stay in order
        return ledger
