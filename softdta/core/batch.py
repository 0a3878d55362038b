"""The batch translator: the reference translator's semantics, a batch of frames at a time, vectorized (sans-IO).

Reports of every built-in primitive are parsed with column gathers at the spec's offsets, hashed with
table-driven CRCs over the whole batch, given PSNs per QP by cumulative counts, and built from per-QP templates
by scattering the variable fields. Their iCRC is the template's constant XOR a linear CRC over the variable tail
(`wire.icrc_split`). An Append report finds its place in its list's batches by its rank among the segment's
reports to that list; Postcarding reports are taken in rounds, one report per cache slot each; Sketch-Merge
reports in sequence are merged at once. Every other frame goes through the oracle itself
(`core.translator.Translator`), whose state the batch translator shares.

Exactness: per QP, frames come out in the oracle's order with its PSNs, and state and counters end equal.
Vectorized rows touch only their QPs' PSNs and frame counts, their structures' state, counters (which commute)
and the flush queue, whose entries they add in batch order among the oracle's. A QP is vectorized only when it
belongs to one structure or Append range. So the frames the oracle handles fall in three roles:
  * independent: they cannot touch those QPs (a frame that is not IPv4 and so passes; the reports of a QP that
    cannot send, or of a Sketch-Merge structure out of sequence): the oracle takes them in order beside the
    vector rows;
  * ACKs to a vectorized QP: taken in batch order with the independent frames, each judged against the PSN its
    QP had at the ACK's place in the batch;
  * barriers: anything else (NAKs, plug-ins without `translate_batch`, retransmitted or malformed reports, IPv4
    with options).
    The rows before a barrier are translated first, then the barrier, then the rest.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Self, cast

import numpy as np
import numpy.typing as npt

from softdta.core.primitives import (
    Append,
    AppendRuntime,
    BatchPrimitive,
    KeyWrites,
    PluginRows,
    PostcardEntry,
    Postcarding,
    Primitive,
    SketchMerge,
    SketchRuntime,
)
from softdta.core.tables import AppendLists, QueuePair, Structure, Tables
from softdta.core.translator import Translator
from softdta.spec import (
    AETH,
    AETH_KIND_SHIFT,
    APPEND_EXT,
    APPEND_V1,
    ATOMIC_ETH,
    BTH,
    DTA_BASE_EXT,
    DTA_PORT,
    ETH_P_IP,
    ETHERNET,
    EXTENDED_FIRST_BYTE,
    EXTENDED_MARKER,
    ICRC_LEN,
    IMMDT,
    IPPROTO_UDP,
    IPV4,
    IPV4_FLAG_MORE_FRAGMENTS,
    IPV4_VERSION_NUMBER,
    KEY_CHECKSUM_LEN,
    KEY_INCREMENT_EXT,
    KEY_INCREMENT_V1,
    KEY_WRITE_EXT,
    KEY_WRITE_V1,
    MAX_DATA_LEN,
    MAX_KEY_LEN,
    MAX_POSTCARD_HOPS,
    MAX_REDUNDANCY,
    POSTCARD_EXT,
    POSTCARD_V1,
    PSN_MASK,
    RETH,
    ROCE_OPCODE_HEADERS,
    ROCE_PORT,
    SKETCH_MERGE_EXT,
    UDP,
    AethKind,
    DtaOpcode,
    Header,
    MergeFunction,
    RoceOpcode,
    TranslatorCounter,
    Transport,
)
from softdta.wire.columns import FrameRows, Rows, byte_offset, frame_lengths, gather, matches, scatter
from softdta.wire.frames import UdpEndpoints
from softdta.wire.hashing import key_hashes_rows, linear_crc_position_tables, postcard_hashes_rows
from softdta.wire.icrc_split import VARIABLE_FROM, constant, linear_crc
from softdta.wire.roce import build_roce_frame, transport_payload

IP_AT = ETHERNET.size
UDP_AT = IP_AT + IPV4.size
PAYLOAD_AT = UDP_AT + UDP.size  # the DTA report, or the BTH of a RoCEv2 frame
IPV4_SIZE, UDP_SIZE = IPV4.size, UDP.size  # Header.size sums its fields on every access
IPV4_MIN_IHL = IPV4.size // 4
VECTOR_KINDS = tuple(DtaOpcode)
ACK_OPCODES = (RoceOpcode.RC_ACK, RoceOpcode.RC_ATOMIC_ACK)

VECTOR, INDEPENDENT, ACK, BARRIER = range(4)  # the role of a frame in its batch
# Below this many frames the oracle is faster: a vectorized batch has a fixed cost of a few hundred numpy
# calls, about ten frames' worth of the oracle (docs/primitives.md).
MIN_VECTOR_BATCH = 12
_POPCOUNT = np.array([bin(mask).count("1") for mask in range(1 << MAX_POSTCARD_HOPS)], dtype=np.int64)
_IS_VECTOR_KIND = np.isin(np.arange(256), [int(kind) for kind in VECTOR_KINDS])


@dataclass
class BatchOutput:
    """What a batch produced: RoCEv2 frames (in the oracle's order: by the report that made them, and so in PSN
    order per QP), NACKs for reporters, and the positions of the essential reports deferred until their QP can
    send (the caller offers them again later)."""

    # the frames, in runs: a vector run as the rows of its array (FrameRows), which packet I/O takes as they are
    runs: list[Sequence[bytes]] = field(default_factory=list)
    to_reporter: list[bytes] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)
    # the batch position of the report behind each frame, a run per call that added frames
    made_by: list[npt.NDArray[np.int64]] = field(default_factory=list, repr=False)

    @property
    def frames(self) -> list[bytes]:
        return [frame for run in self.runs for frame in run]

    def in_report_order(self) -> BatchOutput:
        """The frames sorted by the report that made them (frames of one report keep their order)."""
        if len(self.made_by) > 1:
            order = np.argsort(np.concatenate(self.made_by), kind="stable")
            frames = self.frames
            self.runs = [[frames[index] for index in order.tolist()]]
        self.made_by = []
        return self


@dataclass
class _Piece:
    """Vector rows of one layout bound for one structure: positions in the batch (ascending) and their fields."""

    structure: Structure
    kind: DtaOpcode
    positions: npt.NDArray[np.int64]
    redundancy: npt.NDArray[np.int64]
    immediate: npt.NDArray[np.bool_]
    checksums: npt.NDArray[np.uint32]
    slot_hashes: npt.NDArray[np.uint32]  # (copies, rows): as many copies as the piece's largest redundancy
    data: Rows | None = None  # Key-Write
    counter: npt.NDArray[np.uint64] | None = None  # Key-Increment
    reports: bool = True  # False: writes a plug-in asked for, counted as its reports

    def cut(self, low: int, high: int) -> _Piece:
        return _Piece(self.structure, self.kind, self.positions[low:high], self.redundancy[low:high],
                      self.immediate[low:high], self.checksums[low:high], self.slot_hashes[:, low:high],
                      None if self.data is None else self.data[low:high],
                      None if self.counter is None else self.counter[low:high], self.reports)


@dataclass
class _AppendPiece:
    """Vector Append rows of one layout bound for one range of lists: positions (ascending), list ids, and
    each report's entry as stored (`primitives._append_entry`)."""

    lists: AppendLists
    positions: npt.NDArray[np.int64]
    list_ids: npt.NDArray[np.int64]
    immediate: npt.NDArray[np.bool_]
    entries: Rows

    def cut(self, low: int, high: int) -> _AppendPiece:
        return _AppendPiece(self.lists, self.positions[low:high], self.list_ids[low:high],
                            self.immediate[low:high], self.entries[low:high])


@dataclass
class _Columns:
    """A piece whose fields after its `structure` are per-row arrays, named by COLUMNS."""

    COLUMNS: ClassVar[tuple[str, ...]] = ()
    structure: Structure
    positions: npt.NDArray[np.int64]

    def cut(self, low: int, high: int) -> Self:
        return self.select(slice(low, high))

    def select(self, which: slice | npt.NDArray[np.int64]) -> Self:
        return replace(self, **{name: getattr(self, name)[which] for name in self.COLUMNS})

    @classmethod
    def joined(cls, parts: list[Self]) -> Self:
        """One piece of the parts' rows, in batch order."""
        columns: dict[str, Any] = {name: np.concatenate([getattr(part, name) for part in parts])
                                   for name in cls.COLUMNS}
        rows = replace(parts[0], **columns)
        return rows.select(np.argsort(rows.positions, kind="stable"))


@dataclass
class _PostcardPiece(_Columns):
    """Vector Postcarding rows of one layout bound for one structure: positions (ascending), keys, hops, path
    lengths (the table's where a report gives none), encoded values and the key's hashes."""

    COLUMNS = ("positions", "keys", "hops", "path_lengths", "encoded", "slot_hashes", "checksums", "immediate")
    keys: Rows
    hops: npt.NDArray[np.int64]
    path_lengths: npt.NDArray[np.int64]
    encoded: npt.NDArray[np.uint32]
    slot_hashes: npt.NDArray[np.uint32]
    checksums: npt.NDArray[np.uint32]
    immediate: npt.NDArray[np.bool_]


@dataclass
class _SketchPiece(_Columns):
    """Vector Sketch-Merge rows bound for one structure: positions (ascending), reporters, columns, counters."""

    COLUMNS = ("positions", "reporters", "columns", "counters", "immediate")
    reporters: npt.NDArray[np.int64]
    columns: npt.NDArray[np.int64]
    counters: npt.NDArray[np.uint32]  # (rows, the structure's rows)
    immediate: npt.NDArray[np.bool_]


@dataclass
class _PluginPiece:
    """Well-formed reports of a plug-in with `translate_batch`, of one frame length: positions (ascending)."""

    primitive: Primitive
    positions: npt.NDArray[np.int64]
    frames: Rows
    collector_ips: npt.NDArray[np.uint64]
    immediate: npt.NDArray[np.bool_]
    essential: npt.NDArray[np.bool_]

    def cut(self, low: int, high: int) -> _PluginPiece:
        return _PluginPiece(self.primitive, self.positions[low:high], self.frames[low:high],
                            self.collector_ips[low:high], self.immediate[low:high], self.essential[low:high])


Vector = _Piece | _AppendPiece | _PostcardPiece | _SketchPiece  # rows bound for one QP
Piece = Vector | _PluginPiece


@dataclass
class _Template:
    """One QP's frame of one opcode and payload length, with zeros where each frame's own values go.

    The iCRC of a frame is `icrc_constant` XOR, for each of the `variable` byte columns, that byte's share of
    the linear CRC (`shares`: column j's 256-entry table at j * 256): the rest of the frame is the template's."""

    frame: Rows
    extension_at: int  # where the opcode's first extended header starts
    payload_at: int
    icrc_constant: int = 0
    variable: npt.NDArray[np.int64] = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    shares: npt.NDArray[np.uint32] = field(default_factory=lambda: np.empty(0, dtype=np.uint32))
    share_offsets: npt.NDArray[np.int32] = field(default_factory=lambda: np.empty((0, 1), dtype=np.int32))


class BatchTranslator:
    """Translates batches with `oracle`'s tables and state; the oracle stays usable (and in step) between
    batches, for ticks, flushes and single frames."""

    def __init__(self, oracle: Translator):
        self.oracle = oracle
        self._tables: Tables | None = None
        self._templates: dict[tuple[int, RoceOpcode, int], _Template] = {}
        self._vector_qps: set[int] = set()
        self._ack_qp: dict[int, int] = {}  # batch position of an ACK of a vector QP -> that QP's index
        self._queue = 0  # the RX queue of the batch being translated
        self._plugin_opcodes: frozenset[int] = frozenset(
            opcode for opcode in oracle.primitives if opcode not in set(DtaOpcode))
        self._batch_plugins = {opcode: oracle.primitives[opcode] for opcode in self._plugin_opcodes
                               if callable(getattr(oracle.primitives[opcode], "translate_batch", None))}
        self._plugins_write = False  # whether plug-ins' Key-Writes may join their QPs' vector rows
        # the bytes that decide a report's role and layout: frames equal in them are classified by the first
        base = oracle.tables.profile.base_header
        self._layout_bytes = np.array(sorted({column for header, at, name in (
            (ETHERNET, 0, "ethertype"), (IPV4, IP_AT, "version"), (IPV4, IP_AT, "ihl"), (IPV4, IP_AT, "total_length"),
            (IPV4, IP_AT, "flags"), (IPV4, IP_AT, "fragment_offset"), (IPV4, IP_AT, "protocol"), (IPV4, IP_AT, "dst"),
            (UDP, UDP_AT, "dport"), (UDP, UDP_AT, "length"), (DTA_BASE_EXT, PAYLOAD_AT, "marker"),
            (DTA_BASE_EXT, PAYLOAD_AT, "opcode"), (base, PAYLOAD_AT, "opcode"),
        ) for column in _columns(at, header, name)}))

    def process_batch(self, frames: Sequence[bytes], now_ns: int = 0, queue: int = 0) -> BatchOutput:
        """`queue`: the RX queue the frames arrived on; their reports write through that queue's QPs."""
        self.oracle.queue = self._queue = queue
        self._follow_tables()
        out = BatchOutput()
        count = len(frames)
        if count < MIN_VECTOR_BATCH:
            for position in range(count):
                self._through_oracle(frames, position, now_ns, out)
            return out.in_report_order()
        self._ack_qp = {}
        roles, pieces = self._classify(frames)
        start = 0
        for barrier in [*np.flatnonzero(roles == BARRIER).tolist(), count]:
            if start < barrier:
                self._segment(frames, roles, pieces, start, barrier, now_ns, out)
            if barrier < count:
                self._through_oracle(frames, barrier, now_ns, out)
            start = barrier + 1
        out.deferred.sort()  # a plug-in's deferrals come with its batch
        return out.in_report_order()

    # ----------------------------------------------------------------------------------------------
    # roles

    def _follow_tables(self) -> None:
        tables = self.oracle.tables
        if tables is self._tables:
            return
        self._tables, self._templates = tables, {}
        targets: list[Structure | AppendLists] = [*tables.structures, *tables.append_lists]
        owners = Counter(qp.index for target in targets for qp in target.qps)
        # a QP that two targets share keeps their reports in one PSN order: those stay with the oracle
        self._vector_qps = {qp.index for target in targets for qp in target.qps
                            if all(owners[each.index] == 1 for each in target.qps) and
                            (isinstance(target, AppendLists) or target.primitive in VECTOR_KINDS)}
        self._plugins_write = all(structure.qp.index in self._vector_qps for structure in tables.structures
                                  if structure.primitive is DtaOpcode.KEY_WRITE)

    def _classify(self, frames: Sequence[bytes]) -> tuple[npt.NDArray[np.int8], list[Piece]]:
        lengths = frame_lengths(frames)
        roles = np.full(len(frames), BARRIER, dtype=np.int8)
        pieces: list[Piece] = []
        shortest, longest = int(lengths.min()), int(lengths.max())
        for length in [shortest] if shortest == longest else np.unique(lengths).tolist():
            positions = np.flatnonzero(lengths == length)
            if isinstance(frames, FrameRows):
                rows = frames.of_length(length, positions)
            elif len(positions) == len(frames):
                rows = np.frombuffer(b"".join(frames), dtype=np.uint8).reshape(len(frames), length)
            else:
                chosen = operator.itemgetter(*positions.tolist())(frames)
                rows = np.frombuffer(b"".join(chosen) if len(positions) > 1 else chosen, dtype=np.uint8)
                rows = rows.reshape(len(positions), length)
            self._classify_rows(rows, positions, roles, pieces)
        return roles, pieces

    def _classify_rows(self, rows: Rows, positions: npt.NDArray[np.int64], roles: npt.NDArray[np.int8],
                       pieces: list[Piece]) -> None:
        """Roles of frames of one length, and the vector pieces among them."""
        length = rows.shape[1]
        if length < PAYLOAD_AT + 1:
            roles[positions] = np.where(_ethertype(rows) != ETH_P_IP, INDEPENDENT, BARRIER) \
                if length >= ETHERNET.size else INDEPENDENT
            return
        if len(rows) > 1 and length >= PAYLOAD_AT + DTA_BASE_EXT.size:
            layout = rows[:, self._layout_bytes]
            if (layout == layout[0]).all() and self._classify_alike(rows, positions, roles, pieces):
                return
        ipv4 = _ethertype(rows) == ETH_P_IP
        shaped, payload_len = _plain_udp4(rows)
        dport = gather(rows, UDP_AT, UDP, "dport")
        roles[positions[~ipv4]] = INDEPENDENT  # the oracle passes what is not IPv4, untouched
        neither = shaped & (dport != DTA_PORT) & (dport != ROCE_PORT)
        roles[positions[neither]] = INDEPENDENT
        # a report in a frame too short for the extended base header is the oracle's (a drop, or a dta-v1 base)
        reports = shaped & (dport == DTA_PORT) & (length >= PAYLOAD_AT + DTA_BASE_EXT.size)
        if reports.any():
            self._classify_reports(rows[reports], positions[reports], payload_len[reports], roles, pieces)
        replies = shaped & (dport == ROCE_PORT)
        if replies.any():
            self._classify_replies(rows[replies], positions[replies], payload_len[replies], roles)

    def _classify_alike(self, rows: Rows, positions: npt.NDArray[np.int64], roles: npt.NDArray[np.int8],
                        pieces: list[Piece]) -> bool:
        """Reports all equal to the first in the bytes that decide their layout: classified by the first alone
        (False, and nothing done, if the first is not a report)."""
        shaped, payload_len = _plain_udp4(rows[:1])
        if not shaped[0] or gather(rows[:1], UDP_AT, UDP, "dport")[0] != DTA_PORT:
            return False
        self._classify_reports(rows, positions, np.broadcast_to(payload_len, len(rows)), roles, pieces, alike=True)
        return True

    def _classify_reports(self, rows: Rows, positions: npt.NDArray[np.int64], payload_len: npt.NDArray[np.int64],
                          roles: npt.NDArray[np.int8], pieces: list[Piece], alike: bool = False) -> None:
        head = rows[:1] if alike else rows  # the rows to read layouts from
        extended = (head[:, PAYLOAD_AT] & EXTENDED_MARKER) != 0
        base = self.oracle.tables.profile.base_header
        opcode = np.where(extended, gather(head, PAYLOAD_AT, DTA_BASE_EXT, "opcode"),
                          gather(head, PAYLOAD_AT, base, "opcode")).astype(np.int64)
        addresses = gather(head, IP_AT, IPV4, "dst")
        if alike:
            extended, opcode, addresses = (np.broadcast_to(column, len(rows))
                                           for column in (extended, opcode, addresses))
        vector_kind = _IS_VECTOR_KIND[opcode]
        plugin = extended & np.isin(opcode, list(self._plugin_opcodes)) if self._plugin_opcodes \
            else np.zeros(len(opcode), dtype=bool)
        roles[positions[~vector_kind & ~plugin]] = INDEPENDENT
        if self._batch_plugins and self._plugins_write:
            for code, primitive in self._batch_plugins.items():
                mine = plugin & (opcode == code)
                if mine.any():
                    taken = _decode_plugin(rows[mine], positions[mine], primitive)
                    roles[taken.positions] = VECTOR
                    pieces.append(taken)
        candidates = np.flatnonzero(vector_kind)
        if not len(candidates):
            return
        # an Append report's list, not its destination, names its target
        dst = np.where(opcode[candidates] == DtaOpcode.APPEND, 0, addresses[candidates])
        # one layout per (format, opcode, destination, payload length): vectorize each
        layout = (extended[candidates].astype(np.uint64) << np.uint64(63)) | \
            (opcode[candidates].astype(np.uint64) << np.uint64(48)) | \
            (payload_len[candidates].astype(np.uint64) << np.uint64(32)) | dst.astype(np.uint64)
        if (layout == layout[0]).all():  # the common case: one layout, no sort
            unique, inverse = layout[:1], np.zeros(len(layout), dtype=np.int64)
        else:
            unique, inverse = np.unique(layout, return_inverse=True)
        tables = self.oracle.tables
        for index, packed in enumerate(unique.tolist()):
            members = candidates if len(unique) == 1 else candidates[inverse == index]
            is_extended, kind = bool(packed >> 63), DtaOpcode((packed >> 48) & 0xFF)
            size, address = (packed >> 32) & 0xFFFF, packed & 0xFFFFFFFF
            found: list[Piece]
            if kind is DtaOpcode.APPEND:
                found = [*_decode_appends(rows[members], positions[members], is_extended, size, base,
                                          [lists for lists in tables.append_lists
                                           if lists.qp.index in self._vector_qps
                                           and lists.qp_on(self._queue) is not None])]
            else:
                structure = tables.structure(int(address).to_bytes(4, "big"), kind)
                if structure is None or structure.qp.index not in self._vector_qps or \
                        structure.qp_on(self._queue) is None:
                    continue  # a counted drop, or a shared QP: the oracle's, at its place (a barrier)
                decode = {DtaOpcode.POSTCARDING: _decode_postcards, DtaOpcode.SKETCH_MERGE: _decode_sketches}.get(
                    kind, _decode_piece)
                decoded = decode(rows[members], positions[members], structure, kind, is_extended, size, base)
                found = [decoded] if decoded is not None and len(decoded.positions) else []
            for piece in found:
                roles[piece.positions] = VECTOR
            pieces += found

    def _classify_replies(self, rows: Rows, positions: npt.NDArray[np.int64], payload_len: npt.NDArray[np.int64],
                          roles: npt.NDArray[np.int8]) -> None:
        """ACKs of a vector QP get their own role; replies to other QPs are independent; NAKs are barriers."""
        tables = self.oracle.tables
        if rows.shape[1] < PAYLOAD_AT + BTH.size + AETH.size:
            return
        src = gather(rows, IP_AT, IPV4, "src")
        dest_qp = gather(rows, PAYLOAD_AT, BTH, "dest_qp")
        opcode = gather(rows, PAYLOAD_AT, BTH, "opcode")
        kind = gather(rows, PAYLOAD_AT + BTH.size, AETH, "syndrome") >> np.uint64(AETH_KIND_SHIFT)
        ack = np.isin(opcode, [int(code) for code in ACK_OPCODES]) & (kind == int(AethKind.ACK))
        ack &= payload_len >= BTH.size + AETH.size + ICRC_LEN
        qps = [tables.qp_by_local_qpn(qpn) for qpn in dest_qp.tolist()]
        vector_qp = np.array([qp is not None and qp.index in self._vector_qps for qp in qps], dtype=bool)
        from_collector = np.array([qp is not None and int.from_bytes(qp.collector_ip, "big") == ip
                                   for qp, ip in zip(qps, src.tolist())], dtype=bool)
        acks = np.flatnonzero(ack & vector_qp & from_collector)
        roles[positions[acks]] = ACK
        for position, row in zip(positions[acks].tolist(), acks.tolist()):
            self._ack_qp[position] = cast(QueuePair, qps[row]).index
        roles[positions[~vector_qp]] = INDEPENDENT

    # ----------------------------------------------------------------------------------------------
    # a segment: the rows between two barriers

    def _segment(self, frames: Sequence[bytes], roles: npt.NDArray[np.int8], pieces: list[Piece],
                 start: int, end: int, now_ns: int, out: BatchOutput) -> None:
        oracle = self.oracle
        ready: dict[int, bool] = {}
        cut = [piece.cut(*np.searchsorted(piece.positions, [start, end]).tolist()) for piece in pieces]
        plugins = [piece for piece in cut if isinstance(piece, _PluginPiece) and len(piece.positions)]
        here: list[Vector] = [piece for piece in cut if not isinstance(piece, _PluginPiece) and len(piece.positions)]
        if plugins:
            here += self._run_plugins(plugins, now_ns, out)
        by_qp: dict[int, list[Vector]] = {}  # a vector QP has one target: its pieces are alike
        for piece in here:
            qp = oracle.sender(piece.lists if isinstance(piece, _AppendPiece) else piece.structure)
            if qp.index not in ready:  # asked when the oracle would ask: at the QP's first report here
                ready[qp.index] = oracle.qp_ready(qp, now_ns)
            if not ready[qp.index]:  # dropped or deferred: by the oracle, in order
                roles[piece.positions] = INDEPENDENT
                continue
            by_qp.setdefault(qp.index, []).append(piece)
        emitted: dict[int, npt.NDArray[np.int64]] = {}  # QP index -> the batch position of each frame it sent
        flushes: list[tuple[int, int, Structure | None]] = []  # the flush queue entries the vector rows add
        for qp_index, parts in by_qp.items():
            if isinstance(parts[0], _AppendPiece):
                emitted[qp_index] = self._emit_appends(cast(list[_AppendPiece], parts), out, flushes)
            elif isinstance(parts[0], _PostcardPiece):
                emitted[qp_index] = self._emit_postcards(cast(list[_PostcardPiece], parts), now_ns, out, flushes)
            elif isinstance(parts[0], _SketchPiece):
                emitted[qp_index], resume = self._emit_sketches(cast(list[_SketchPiece], parts), out)
                for piece in parts:  # from a report out of sequence on, the oracle takes them in order
                    roles[piece.positions[piece.positions >= resume]] = INDEPENDENT
            else:
                emitted[qp_index] = self._emit(cast(list[_Piece], parts), out)
            out.made_by.append(emitted[qp_index])  # the frames just added, in PSN order
        # in batch order: the oracle's frames, the ACKs, and the flush queue entries of the vector rows
        flushes.sort(key=operator.itemgetter(0))
        waiting = iter(flushes)
        upcoming = next(waiting, None)
        taken = roles[start:end]
        for position in (np.flatnonzero((taken == INDEPENDENT) | (taken == ACK)) + start).tolist():
            while upcoming is not None and upcoming[0] < position:
                self._flush_later(*upcoming[1:], now_ns)
                upcoming = next(waiting, None)
            if roles[position] == ACK:
                self._ack(frames, position, emitted, now_ns, out)
            else:
                self._through_oracle(frames, position, now_ns, out)
        while upcoming is not None:
            self._flush_later(*upcoming[1:], now_ns)
            upcoming = next(waiting, None)

    def _run_plugins(self, parts: list[_PluginPiece], now_ns: int, out: BatchOutput) -> list[Vector]:
        """Each plug-in's reports in the segment, in order, through its `translate_batch`; the Key-Writes it asks
        for, as vector rows of their structures."""
        made: list[Vector] = []
        for primitive in {id(part.primitive): part.primitive for part in parts}.values():
            mine = [part for part in parts if part.primitive is primitive]
            positions = np.concatenate([part.positions for part in mine])
            frames = np.zeros((len(positions), max(part.frames.shape[1] for part in mine)), dtype=np.uint8)
            at = 0
            for part in mine:
                frames[at:at + len(part.positions), :part.frames.shape[1]] = part.frames
                at += len(part.positions)
            order = np.argsort(positions, kind="stable")
            lengths = np.concatenate([np.full(len(part.positions), part.frames.shape[1]) for part in mine])
            rows = PluginRows(frames[order], lengths[order], PAYLOAD_AT + DTA_BASE_EXT.size,
                              *(np.concatenate([getattr(part, name) for part in mine])[order]
                                for name in ("collector_ips", "immediate", "essential")))
            positions = positions[order]
            result = cast(BatchPrimitive, primitive).translate_batch(rows, now_ns)
            self.oracle.counters[TranslatorCounter.RX_REPORTS] += len(positions)
            out.deferred += positions[result.deferred].tolist()
            for writes in result.writes:
                made.append(_plugin_writes(writes, positions, rows.immediate))
        return made

    def _ack(self, frames: Sequence[bytes], position: int, emitted: dict[int, npt.NDArray[np.int64]], now_ns: int,
             out: BatchOutput) -> None:
        """An ACK of a vectorized QP, judged with the next PSN its QP had when the ACK arrived: without the
        vector frames sent after it (the oracle's own frames before it are counted already)."""
        qp_index = self._ack_qp[position]
        sent = emitted.get(qp_index)
        if sent is None:
            self._through_oracle(frames, position, now_ns, out)
            return
        runtime = self.oracle.qp_state[qp_index]
        actual = runtime.next_psn
        runtime.next_psn = (actual - (len(sent) - int(np.searchsorted(sent, position)))) & PSN_MASK
        try:
            self._through_oracle(frames, position, now_ns, out)
        finally:
            runtime.next_psn = actual

    def _through_oracle(self, frames: Sequence[bytes], position: int, now_ns: int, out: BatchOutput) -> None:
        result = self.oracle.process(frames[position], now_ns, self._queue)
        if result.frames:
            out.runs.append(result.frames)
            out.made_by.append(np.full(len(result.frames), position, dtype=np.int64))
        out.to_reporter += result.to_reporter
        if result.deferred:
            out.deferred.append(position)

    # ----------------------------------------------------------------------------------------------
    # frames

    def _emit(self, parts: list[_Piece], out: BatchOutput) -> npt.NDArray[np.int64]:
        """The frames of one structure's vector rows in a segment, in batch order and copy order; returns the
        batch position of each frame sent."""
        structure = parts[0].structure
        qp = self.oracle.sender(structure)
        # one request per frame, in batch order and copy order: each piece's rows expanded into their copies
        requests = [_requests(piece) for piece in parts]
        positions, copies, slots, immediate, checksums, values = (
            np.concatenate(column) if len(parts) > 1 else column[0] for column in zip(*requests))
        if len(parts) > 1:  # each piece is in batch order already; interleave them
            order = np.lexsort((copies, positions))
            positions, slots, immediate, checksums, values = (
                column[order] for column in (positions, slots, immediate, checksums, values))
        sent = len(positions)
        psn, ack_req = self._sequence(qp, sent)
        slots &= np.uint32(structure.slot_count - 1)
        va = np.uint64(qp.base_va) + slots.astype(np.uint64) * np.uint64(structure.slot_size)
        if structure.primitive is DtaOpcode.KEY_INCREMENT:
            template = self._template(qp, RoceOpcode.RC_FETCH_ADD, 0, {"atomic_eth": {"rkey": qp.rkey}})
            frames = _stamp(template, psn, ack_req)
            scatter(frames, template.extension_at, ATOMIC_ETH, "va", va)
            scatter(frames, template.extension_at, ATOMIC_ETH, "swap_add", values)
            out.runs.append(_in_order([(np.ones(sent, dtype=bool), _seal(template, frames))], sent))
        else:
            payloads = np.empty((sent, KEY_CHECKSUM_LEN + structure.data_len), dtype=np.uint8)
            payloads[:, :KEY_CHECKSUM_LEN] = checksums.astype("<u4").view(np.uint8).reshape(-1, KEY_CHECKSUM_LEN)
            payloads[:, KEY_CHECKSUM_LEN:] = values
            out.runs.append(self._writes(qp, psn, ack_req, va, immediate, checksums, payloads))
        self._count(structure.primitive, sum(len(piece.positions) for piece in parts if piece.reports), sent)
        return positions

    def _emit_appends(self, parts: list[_AppendPiece], out: BatchOutput,
                      flushes: list[tuple[int, int, Structure | None]]) -> npt.NDArray[np.int64]:
        """The frames of one range's vector Append rows in a segment: a report that fills its list's batch
        writes the batch. Adds to `flushes` the reports that begin a batch; returns the batch position of each
        frame sent (ascending)."""
        lists = parts[0].lists
        positions, list_ids, immediate, entries = (
            np.concatenate(column) if len(parts) > 1 else column[0]
            for column in zip(*((p.positions, p.list_ids, p.immediate, p.entries) for p in parts)))
        # list by list, each in batch order
        by_list = np.lexsort((positions, list_ids)) if len(parts) > 1 else np.argsort(list_ids, kind="stable")
        positions, list_ids, immediate, entries = (
            column[by_list] for column in (positions, list_ids, immediate, entries))
        ids, counts = np.unique(list_ids, return_counts=True)
        state: dict[int, AppendRuntime] = self.oracle.primitive(Append.opcode).state
        runtimes = [state.setdefault(list_id, AppendRuntime()) for list_id in ids.tolist()]
        waited = np.fromiter((len(runtime.pending) for runtime in runtimes), dtype=np.int64, count=len(runtimes))
        group = np.repeat(np.arange(len(ids)), counts)
        place = waited[group] + _ranks(counts)  # each report's entry's place in its list's run of entries
        batch, width = lists.batch, lists.data_len
        fills = (place + 1) % batch == 0

        # each list's run: the entries that waited, then this segment's; whole batches of it are written
        run_length = waited + counts
        run_at = np.cumsum(run_length) - run_length
        run = np.empty((int(run_length.sum()), width), dtype=np.uint8)
        run[run_at[group] + place] = entries
        if waited.any():
            old = np.frombuffer(b"".join(b"".join(runtime.pending) for runtime in runtimes), dtype=np.uint8)
            run[np.repeat(run_at, waited) + _ranks(waited)] = old.reshape(-1, width)
        written = run_length // batch * batch
        leaves = _ranks(run_length) < np.repeat(written, run_length)

        order = np.argsort(positions[fills], kind="stable")  # the filling reports, from list order to batch order
        sent_at: npt.NDArray[np.int64] = positions[fills][order]
        filled_group = group[fills][order]
        lap = place[fills][order] // batch  # which batch of its list's run
        heads = np.fromiter((runtime.head for runtime in runtimes), dtype=np.int64, count=len(runtimes))
        head = (heads[filled_group] + lap * batch) % lists.entries
        offsets = ((ids[filled_group] - lists.first_list) * lists.entries + head) * width
        qp = self.oracle.sender(lists)
        psn, ack_req = self._sequence(qp, len(sent_at))
        payloads = run[leaves].reshape(-1, batch * width)[order]
        out.runs.append(self._writes(qp, psn, ack_req, np.uint64(qp.base_va) + offsets.astype(np.uint64),
                                     immediate[fills][order], ids[filled_group].astype(np.uint32), payloads))

        rest = run[~leaves].tobytes()
        cursor = 0
        for runtime, left, laps in zip(runtimes, (run_length - written).tolist(), (written // batch).tolist()):
            runtime.pending = [rest[at:at + width] for at in range(cursor, cursor + left * width, width)]
            runtime.head = (runtime.head + laps * batch) % lists.entries
            cursor += left * width
        begins = place % batch == 0
        flushes += ((position, list_id, None) for position, list_id in
                    zip(positions[begins].tolist(), list_ids[begins].tolist()))
        self.oracle.counters[TranslatorCounter.APPEND_BATCHED] += len(positions) - len(sent_at)
        self._count(DtaOpcode.APPEND, len(positions), len(sent_at))
        return sent_at

    def _emit_postcards(self, parts: list[_PostcardPiece], now_ns: int, out: BatchOutput,
                        flushes: list[tuple[int, int, Structure | None]]) -> npt.NDArray[np.int64]:
        """The frames of one structure's vector Postcarding rows in a segment.

        Rows are taken in rounds: round r holds each slot's r-th report, so a round's rows are all on different
        slots and are vectorized. Paths of many flows take a few rounds; reports that all crowd one slot take a
        round each, which costs about what the oracle costs per report (docs/primitives.md). A report writes
        at most one frame: the path it completes, the path it evicts (a new one then begins, and is not complete,
        having one hop of at least two), or its own one-hop path beside another flow's. Adds to `flushes` the
        reports that begin a path; returns the batch position of each frame sent (ascending)."""
        structure = parts[0].structure
        rows = _PostcardPiece.joined(parts) if len(parts) > 1 else parts[0]
        index = (rows.slot_hashes & np.uint32(structure.cache_entries - 1)).astype(np.int64)
        slots, slot_of, counts = np.unique(index, return_inverse=True, return_counts=True)
        rank = np.empty(len(index), dtype=np.int64)
        rank[np.argsort(slot_of, kind="stable")] = _ranks(counts)
        paths = _Paths.load(self._postcard_cache.setdefault(structure.qp.index, {}), slots, structure)

        written: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.uint32], npt.NDArray[np.uint32],
                            npt.NDArray[np.uint32], npt.NDArray[np.bool_]]] = []
        # ^ per round, the frames: batch position, the path's values, its key's slot hash and checksum, immediate
        evictions = cached = 0
        for round_ in range(int(counts.max())):
            at = np.flatnonzero(rank == round_)
            slot = slot_of[at]
            keys, hops, path_lengths = rows.keys[at], rows.hops[at], rows.path_lengths[at]
            other = paths.live[slot] & (paths.keys[slot] != keys).any(axis=1)
            alone = other & (path_lengths == 1)  # its own one-hop path, written beside the waiting one
            if alone.any():
                values = np.zeros((int(alone.sum()), structure.hops), dtype=np.uint32)
                values[np.arange(len(values)), hops[alone] - 1] = rows.encoded[at][alone]
                written.append((rows.positions[at][alone], values, rows.slot_hashes[at][alone],
                                rows.checksums[at][alone], rows.immediate[at][alone]))
            evict = other & ~alone
            if evict.any():
                gone = slot[evict]
                written.append((rows.positions[at][evict], paths.values[gone].copy(), paths.slot_hashes[gone],
                                paths.checksums[gone], np.zeros(len(gone), dtype=bool)))
                evictions += len(gone)
            begin = (~paths.live[slot] | evict) & ~alone
            if begin.any():
                paths.begin(slot[begin], keys[begin], path_lengths[begin], rows.slot_hashes[at][begin],
                            rows.checksums[at][begin], now_ns)
                flushes += ((position, int(slots[s]), structure) for position, s in
                            zip(rows.positions[at][begin].tolist(), slot[begin].tolist()))
            add = ~alone
            slot, hops = slot[add], hops[add]
            paths.values[slot, hops - 1] = rows.encoded[at][add]
            paths.masks[slot] |= np.int64(1) << (hops - 1)
            done = _POPCOUNT[paths.masks[slot]] >= paths.path_lengths[slot]
            if done.any():
                whole = slot[done]
                written.append((rows.positions[at][add][done], paths.values[whole].copy(), paths.slot_hashes[whole],
                                paths.checksums[whole], rows.immediate[at][add][done]))
                paths.live[whole] = False
            cached += int((~done & ~evict[add]).sum())
        paths.store(self._postcard_cache[structure.qp.index], slots)

        sent_at: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
        if written:
            positions, values, slot_hashes, checksums, immediate = (np.concatenate(column) for column in zip(*written))
            order = np.argsort(positions)
            sent_at = positions[order]
            qp = self.oracle.sender(structure)
            psn, ack_req = self._sequence(qp, len(sent_at))
            slot_in_region = (slot_hashes[order] & np.uint32(structure.slot_count - 1)).astype(np.uint64)
            out.runs.append(self._writes(qp, psn, ack_req, np.uint64(qp.base_va) + slot_in_region *
                                         np.uint64(structure.slot_size), immediate[order], checksums[order],
                                         values[order].astype(">u4").view(np.uint8).reshape(len(order), -1)))
        counters = self.oracle.counters
        counters[TranslatorCounter.POSTCARD_EVICTIONS] += evictions
        counters[TranslatorCounter.POSTCARD_CACHED] += cached
        self._count(DtaOpcode.POSTCARDING, len(rows.positions), len(sent_at))
        return sent_at

    def _emit_sketches(self, parts: list[_SketchPiece], out: BatchOutput) -> tuple[npt.NDArray[np.int64], int]:
        """The frames of one structure's vector Sketch-Merge rows in a segment, a lap of the columns at a time
        (a lap ends where a reporter starts its columns again). Returns the batch position of each frame sent
        (ascending), and the position from which the rows go through the oracle (past the end if none)."""
        structure = parts[0].structure
        rows = _SketchPiece.joined(parts) if len(parts) > 1 else parts[0]
        runtime = cast(SketchMerge, self.oracle.primitives[DtaOpcode.SKETCH_MERGE]).runtime(structure)
        by_reporter, reporters, counts, first = _reporter_runs(rows, runtime)
        restarts = ((np.repeat(first, counts) + _ranks(counts)) % structure.columns == 0) & (_ranks(counts) > 0)
        laps = np.searchsorted(rows.positions, np.unique(rows.positions[by_reporter][restarts]))
        sent: list[npt.NDArray[np.int64]] = []
        for low, high in zip([0, *laps.tolist()], [*laps.tolist(), len(rows.positions)]):
            lap = rows.select(slice(low, high))
            lap_sent = self._merge_sketch_lap(lap, runtime, out)
            if lap_sent is None:
                return np.concatenate([np.empty(0, dtype=np.int64), *sent]), int(lap.positions[0])
            sent.append(lap_sent)
        return np.concatenate([np.empty(0, dtype=np.int64), *sent]), 1 << 62

    def _merge_sketch_lap(self, rows: _SketchPiece, runtime: SketchRuntime,
                          out: BatchOutput) -> npt.NDArray[np.int64] | None:
        """Merges and writes one lap of Sketch-Merge rows, or returns None (and does nothing) unless every
        report is its reporter's next column and none repeats a column its reporter already gave.

        Then every report is accepted, whatever the order between reporters: SUM and MAX commute, and a group of
        columns written (all reporters in all its columns) gets no more reports in the lap, since each of them
        would repeat a column. The report that completes a group is its last one in the lap. Returns the batch
        position of each frame sent (ascending)."""
        structure = rows.structure
        by_reporter, reporters, counts, first = _reporter_runs(rows, runtime)
        if (counts > structure.columns).any() or (
                rows.columns[by_reporter] != (np.repeat(first, counts) + _ranks(counts)) % structure.columns).any():
            return None
        # the columns of every group the lap touches, as arrays
        batch = structure.batch
        groups = np.unique(rows.columns // batch)
        columns = (groups[:, None] * batch + np.arange(batch)).reshape(-1)
        given = np.zeros((len(columns), structure.reporters), dtype=bool)
        for row, column in enumerate(columns.tolist()):
            given[row, list(runtime.contributors[column])] = True
        at = np.searchsorted(columns, rows.columns)  # each report's row among `columns`
        if given[at, rows.reporters].any():
            return None
        given[at, rows.reporters] = True
        aggregate = np.array([runtime.aggregate[column] for column in columns.tolist()], dtype=np.int64)
        if structure.merge is MergeFunction.MAX:
            np.maximum.at(aggregate, at, rows.counters.astype(np.int64))
        else:
            np.add.at(aggregate, at, rows.counters.astype(np.int64))
            aggregate &= 0xFFFFFFFF
        complete = given.reshape(len(groups), -1).all(axis=1)
        group_of = at // batch  # each report's group among `groups`
        last = np.full(len(groups), -1, dtype=np.int64)
        np.maximum.at(last, group_of, np.arange(len(rows.positions)))
        sent: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
        if complete.any():
            done = np.flatnonzero(complete)  # ascending groups; the frames go in the order of their last reports
            order = np.argsort(rows.positions[last[done]])
            done, writer = done[order], last[done][order]
            sent = rows.positions[writer]
            qp = self.oracle.sender(structure)
            psn, ack_req = self._sequence(qp, len(done))
            first_column = groups[done] * batch
            payloads = aggregate.reshape(len(groups), -1)[done].astype("<u4").view(np.uint8).reshape(len(done), -1)
            out.runs.append(self._writes(qp, psn, ack_req, np.uint64(qp.base_va) + first_column.astype(np.uint64) *
                                         np.uint64(structure.slot_size), rows.immediate[writer],
                                         first_column.astype(np.uint32), payloads))
            wiped = (done[:, None] * batch + np.arange(batch)).reshape(-1)
            aggregate[wiped] = 0
            given[wiped] = False
        for row, column in enumerate(columns.tolist()):
            runtime.aggregate[column] = aggregate[row].tolist()
            runtime.contributors[column] = set(np.flatnonzero(given[row]).tolist())
        ends = np.cumsum(counts) - 1  # each reporter's last report, in reporter order
        for reporter, column in zip(reporters.tolist(), rows.columns[by_reporter][ends].tolist()):
            runtime.next_column[reporter] = (column + 1) % structure.columns
        self.oracle.counters[TranslatorCounter.SKETCH_MERGED] += len(rows.positions)
        self._count(DtaOpcode.SKETCH_MERGE, len(rows.positions), len(sent))
        return sent

    def _flush_later(self, index: int, structure: Structure | None, now_ns: int) -> None:
        """The flush queue entry the oracle adds when an Append list's batch or a Postcarding path begins; the
        batch or path that waits now (the last one begun there) is named by it."""
        by = self.oracle.primitive(Append.opcode if structure is None else Postcarding.opcode)
        token = self.oracle.flush_later(by, now_ns, index, structure)
        if structure is None:
            runtime = by.state[index]
            runtime.first_pending_ns, runtime.token = now_ns, token
            return
        entry = self._postcard_cache[structure.qp.index].get(index)
        if entry is not None:  # begun in this segment, since a path begins only where none waits
            entry.token = token

    @property
    def _postcard_cache(self) -> dict[int, dict[int, PostcardEntry]]:
        cache: dict[int, dict[int, PostcardEntry]] = self.oracle.primitive(Postcarding.opcode).state
        return cache

    def _sequence(self, qp: QueuePair, sent: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]:
        """PSNs and AckReq bits of the QP's next `sent` frames, which it now counts as sent."""
        runtime = self.oracle.qp_state[qp.index]
        psn = (runtime.next_psn + np.arange(sent, dtype=np.uint64)) & np.uint64(PSN_MASK)
        interval = self.oracle.tables.ack_request_interval
        numbers = runtime.frames_sent + 1 + np.arange(sent, dtype=np.uint64)
        ack_req = (numbers % np.uint64(interval) == 0) if qp.transport is Transport.RC and interval > 0 \
            else np.zeros(sent, dtype=bool)
        runtime.frames_sent += sent
        runtime.next_psn = (runtime.next_psn + sent) & PSN_MASK
        return psn, ack_req

    def _writes(self, qp: QueuePair, psn: npt.NDArray[np.uint64], ack_req: npt.NDArray[np.bool_],
                va: npt.NDArray[np.uint64], immediate: npt.NDArray[np.bool_], tags: npt.NDArray[np.uint32],
                payloads: Rows) -> Sequence[bytes]:
        """RDMA WRITE (with immediate `tags` where `immediate`) frames of `payloads` to `va`, in PSN order."""
        payload_len = payloads.shape[1]
        built: list[tuple[npt.NDArray[np.bool_], Rows]] = []
        for with_immediate in (False, True):
            mine = immediate == with_immediate
            if not mine.any():
                continue
            template = self._template(qp, _write_opcode(qp.transport, with_immediate), payload_len,
                                      {"reth": {"rkey": qp.rkey, "dma_length": payload_len}})
            frames = _stamp(template, psn[mine], ack_req[mine])
            scatter(frames, template.extension_at, RETH, "va", va[mine])
            if with_immediate:
                scatter(frames, template.extension_at + RETH.size, IMMDT, "immediate", tags[mine])
            frames[:, template.payload_at:template.payload_at + payload_len] = payloads[mine]
            built.append((mine, _seal(template, frames)))
        return _in_order(built, len(psn))

    def _count(self, kind: int, reports: int, sent: int) -> None:
        counters = self.oracle.counters
        counters[TranslatorCounter.TX_FRAMES] += sent
        counters[TranslatorCounter.RX_REPORTS] += reports
        counters[TranslatorCounter(TranslatorCounter.RX_KEY_WRITE + kind - 1)] += reports

    def _template(self, qp: QueuePair, opcode: RoceOpcode, payload_len: int,
                  headers: dict[str, dict[str, int]]) -> _Template:
        key = (qp.index, opcode, payload_len)
        template = self._templates.get(key)
        if template is None:
            tables = self.oracle.tables
            ends = UdpEndpoints(src_mac=tables.mac, dst_mac=qp.collector_mac, src_ip=tables.ip,
                                dst_ip=qp.collector_ip, sport=tables.udp_sport, dport=ROCE_PORT, dscp=tables.dscp,
                                ttl=tables.ttl)
            frame = build_roce_frame(ends, transport_payload(opcode, qp.remote_qpn, 0, headers, bytes(payload_len)))
            extension_at = PAYLOAD_AT + BTH.size
            payload_at = extension_at + sum(header.size for header in ROCE_OPCODE_HEADERS[opcode])
            template = _Template(np.frombuffer(frame, dtype=np.uint8), extension_at, payload_at)
            variable = [*_columns(PAYLOAD_AT, BTH, "ack_req"), *_columns(PAYLOAD_AT, BTH, "psn")]
            if opcode is RoceOpcode.RC_FETCH_ADD:
                variable += [*_columns(extension_at, ATOMIC_ETH, "va"), *_columns(extension_at, ATOMIC_ETH, "swap_add")]
            else:
                variable += _columns(extension_at, RETH, "va")
                if IMMDT in ROCE_OPCODE_HEADERS[opcode]:
                    variable += _columns(extension_at + RETH.size, IMMDT, "immediate")
                variable += range(payload_at, payload_at + payload_len)
            tail_at = IP_AT + VARIABLE_FROM
            tail = frame[tail_at:-ICRC_LEN]
            template.icrc_constant = constant(frame[IP_AT:-ICRC_LEN]) ^ linear_crc(tail)
            template.variable = np.array(variable, dtype=np.int64)
            shares = linear_crc_position_tables(len(tail))[[column - tail_at for column in variable]]
            template.shares = shares.reshape(-1)
            template.share_offsets = (np.arange(len(variable), dtype=np.int32) * 256)[:, None]
            self._templates[key] = template
        return template


@dataclass
class _Paths:
    """The Postcarding cache slots a segment touches, as arrays (one row per slot), loaded from and stored back
    to the oracle's cache."""

    live: npt.NDArray[np.bool_]
    keys: Rows
    path_lengths: npt.NDArray[np.int64]
    values: npt.NDArray[np.uint32]  # (slots, the structure's hops)
    masks: npt.NDArray[np.int64]
    first_ns: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int64]
    slot_hashes: npt.NDArray[np.uint32]
    checksums: npt.NDArray[np.uint32]

    @classmethod
    def load(cls, cache: dict[int, PostcardEntry], slots: npt.NDArray[np.int64], structure: Structure) -> _Paths:
        count = len(slots)
        paths = cls(np.zeros(count, dtype=bool), np.zeros((count, structure.key_len), dtype=np.uint8),
                    np.zeros(count, dtype=np.int64), np.zeros((count, structure.hops), dtype=np.uint32),
                    np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64),
                    np.zeros(count, dtype=np.uint32), np.zeros(count, dtype=np.uint32))
        waiting = [(row, entry) for row, entry in enumerate(map(cache.get, slots.tolist())) if entry is not None]
        if waiting:
            at = np.array([row for row, _ in waiting])
            entries = [entry for _, entry in waiting]
            paths.live[at] = True
            paths.keys[at] = np.frombuffer(b"".join(entry.key for entry in entries),
                                           dtype=np.uint8).reshape(len(at), -1)
            paths.path_lengths[at] = [entry.path_length for entry in entries]
            paths.values[at] = [entry.values for entry in entries]
            paths.masks[at] = [entry.hop_mask for entry in entries]
            paths.first_ns[at] = [entry.first_ns for entry in entries]
            paths.tokens[at] = [entry.token for entry in entries]
            hashes = postcard_hashes_rows(paths.keys[at], np.ones(len(at), dtype=np.int64))
            paths.slot_hashes[at], paths.checksums[at] = hashes[0], hashes[1]
        return paths

    def begin(self, slots: npt.NDArray[np.int64], keys: Rows, path_lengths: npt.NDArray[np.int64],
              slot_hashes: npt.NDArray[np.uint32], checksums: npt.NDArray[np.uint32], now_ns: int) -> None:
        """New paths in `slots` (the flush queue's token comes later, in batch order)."""
        self.live[slots] = True
        self.keys[slots] = keys
        self.path_lengths[slots] = path_lengths
        self.values[slots] = 0
        self.masks[slots] = 0
        self.first_ns[slots] = now_ns
        self.tokens[slots] = 0
        self.slot_hashes[slots] = slot_hashes
        self.checksums[slots] = checksums

    def store(self, cache: dict[int, PostcardEntry], slots: npt.NDArray[np.int64]) -> None:
        keys = self.keys.tobytes()
        width = self.keys.shape[1]
        for row, (slot, live, path_length, values, mask, first_ns, token) in enumerate(zip(
                slots.tolist(), self.live.tolist(), self.path_lengths.tolist(), self.values.tolist(),
                self.masks.tolist(), self.first_ns.tolist(), self.tokens.tolist())):
            if live:
                cache[slot] = PostcardEntry(keys[row * width:(row + 1) * width], path_length, values, mask,
                                            first_ns, token)
            else:
                cache.pop(slot, None)


# --------------------------------------------------------------------------------------------------
# helpers over arrays

def _ethertype(rows: Rows) -> npt.NDArray[np.uint64]:
    return gather(rows, 0, ETHERNET, "ethertype")


def _plain_udp4(rows: Rows) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """Which rows are unfragmented IPv4 without options carrying one whole UDP datagram, and its payload length."""
    total = gather(rows, IP_AT, IPV4, "total_length").astype(np.int64)
    udp_len = gather(rows, UDP_AT, UDP, "length").astype(np.int64)
    ok = _ethertype(rows) == ETH_P_IP
    ok &= matches(rows, IP_AT, IPV4, version=IPV4_VERSION_NUMBER, ihl=IPV4_MIN_IHL, protocol=IPPROTO_UDP,
                  fragment_offset=0)
    ok &= (gather(rows, IP_AT, IPV4, "flags") & np.uint64(IPV4_FLAG_MORE_FRAGMENTS)) == 0
    ok &= (total >= IPV4_SIZE + UDP_SIZE) & (total <= rows.shape[1] - IP_AT)
    ok &= (udp_len >= UDP_SIZE) & (udp_len <= total - IPV4_SIZE)
    return ok, udp_len - UDP_SIZE


def _decode_piece(rows: Rows, positions: npt.NDArray[np.int64], structure: Structure, kind: DtaOpcode,
                  extended: bool, size: int, base: Header) -> _Piece | None:
    """The rows of one layout that the vector path takes, with their fields; None if the layout cannot be one."""
    key_len = structure.key_len
    if not 1 <= key_len <= MAX_KEY_LEN or not 1 <= structure.data_len <= MAX_DATA_LEN:
        return None
    # the size first: a payload of another size is the oracle's drop, and gathers past it would leave the frame
    if extended:
        sub = KEY_WRITE_EXT if kind is DtaOpcode.KEY_WRITE else KEY_INCREMENT_EXT
        data_len = structure.data_len if kind is DtaOpcode.KEY_WRITE else 0
        if size != DTA_BASE_EXT.size + sub.size + key_len + data_len:
            return None
        sub_at = PAYLOAD_AT + DTA_BASE_EXT.size
        take = gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "marker") == EXTENDED_FIRST_BYTE
        take &= gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "retransmit") == 0
        take &= gather(rows, sub_at, sub, "key_len") == key_len
        if kind is DtaOpcode.KEY_WRITE:
            take &= gather(rows, sub_at, sub, "data_len") == data_len
        immediate = gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "immediate") != 0
        key_at = sub_at + sub.size
        data_at = key_at + key_len
    else:
        sub = KEY_WRITE_V1 if kind is DtaOpcode.KEY_WRITE else KEY_INCREMENT_V1
        if key_len != 4 or (kind is DtaOpcode.KEY_WRITE and structure.data_len != 4) or size != base.size + sub.size:
            return None  # dta-v1 keys and data are 32 bits: the oracle drops these (bad length)
        sub_at = PAYLOAD_AT + base.size
        take = np.ones(len(rows), dtype=bool)
        if "retransmit" in {f.name for f in base.fields}:
            take &= gather(rows, PAYLOAD_AT, base, "retransmit") == 0
        immediate = gather(rows, PAYLOAD_AT, base, "immediate") != 0
        key_at = sub_at + byte_offset(sub, "key")
        data_at = sub_at + byte_offset(sub, "data") if kind is DtaOpcode.KEY_WRITE else 0
    redundancy = gather(rows, sub_at, sub, "redundancy").astype(np.int64)
    take &= (redundancy >= 1) & (redundancy <= structure.redundancy)  # the oracle drops the others
    if not take.all():
        rows, positions, redundancy, immediate = rows[take], positions[take], redundancy[take], immediate[take]
    checksums, slot_hashes = key_hashes_rows(rows[:, key_at:key_at + key_len], int(redundancy.max(initial=1)),
                                             structure.key_hash)
    piece = _Piece(structure, kind, positions, redundancy, immediate, checksums, slot_hashes)
    if kind is DtaOpcode.KEY_WRITE:
        piece.data = rows[:, data_at:data_at + structure.data_len]
    else:
        piece.counter = gather(rows, sub_at, sub, "counter")
    return piece


def _decode_postcards(rows: Rows, positions: npt.NDArray[np.int64], structure: Structure, kind: DtaOpcode,
                      extended: bool, size: int, base: Header) -> _PostcardPiece | None:
    """The Postcarding rows of one layout that the vector path takes; None if the layout cannot be one."""
    key_len = structure.key_len
    if extended:
        sub_at = PAYLOAD_AT + DTA_BASE_EXT.size
        if size != DTA_BASE_EXT.size + POSTCARD_EXT.size + key_len:
            return None
        take = gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "marker") == EXTENDED_FIRST_BYTE
        take &= gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "retransmit") == 0
        take &= gather(rows, sub_at, POSTCARD_EXT, "key_len") == key_len
        immediate = gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "immediate") != 0
        given = gather(rows, sub_at, POSTCARD_EXT, "path_length").astype(np.int64)
        path_lengths = np.where(given == 0, structure.hops, given)
        hops = gather(rows, sub_at, POSTCARD_EXT, "hop").astype(np.int64)
        key_at, data_at = sub_at + POSTCARD_EXT.size, sub_at + byte_offset(POSTCARD_EXT, "data")
    else:
        sub_at = PAYLOAD_AT + base.size
        if key_len != 4 or size != base.size + POSTCARD_V1.size:
            return None  # dta-v1 keys are 32 bits: the oracle drops these (bad length)
        take = np.ones(len(rows), dtype=bool)
        if "retransmit" in {f.name for f in base.fields}:
            take &= gather(rows, PAYLOAD_AT, base, "retransmit") == 0
        immediate = gather(rows, PAYLOAD_AT, base, "immediate") != 0
        path_lengths = np.full(len(rows), structure.hops, dtype=np.int64)
        hops = gather(rows, sub_at, POSTCARD_V1, "hop").astype(np.int64)
        key_at, data_at = sub_at + byte_offset(POSTCARD_V1, "key"), sub_at + byte_offset(POSTCARD_V1, "data")
    take &= (hops >= 1) & (hops <= path_lengths) & (path_lengths <= structure.hops)  # else a bad-hop drop
    rows, hops = rows[take], hops[take]
    keys = np.ascontiguousarray(rows[:, key_at:key_at + key_len])
    data = np.ascontiguousarray(rows[:, data_at:data_at + 4]).view(">u4").reshape(-1).astype(np.uint32)
    slot_hashes, checksums, hop_hashes = postcard_hashes_rows(keys, hops)
    return _PostcardPiece(structure, positions[take], keys, hops, path_lengths[take], data ^ hop_hashes,
                          slot_hashes, checksums, immediate[take])


def _decode_sketches(rows: Rows, positions: npt.NDArray[np.int64], structure: Structure, kind: DtaOpcode,
                     extended: bool, size: int, base: Header) -> _SketchPiece | None:
    """The Sketch-Merge rows of one layout that the vector path takes; None if the layout cannot be one."""
    sub_at = PAYLOAD_AT + DTA_BASE_EXT.size
    if not extended or size != DTA_BASE_EXT.size + SKETCH_MERGE_EXT.size + 4 * structure.rows:
        return None  # Sketch-Merge is extended only; other sizes are the oracle's drops
    take = gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "marker") == EXTENDED_FIRST_BYTE
    take &= gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "retransmit") == 0
    take &= gather(rows, sub_at, SKETCH_MERGE_EXT, "rows") == structure.rows
    reporters = gather(rows, sub_at, SKETCH_MERGE_EXT, "reporter").astype(np.int64)
    columns = gather(rows, sub_at, SKETCH_MERGE_EXT, "column").astype(np.int64)
    take &= (reporters < structure.reporters) & (columns < structure.columns)
    rows = rows[take]
    counters_at = sub_at + SKETCH_MERGE_EXT.size
    counters = np.ascontiguousarray(rows[:, counters_at:counters_at + 4 * structure.rows]).view(">u4")
    return _SketchPiece(structure, positions[take], reporters[take], columns[take], counters.astype(np.uint32),
                        gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "immediate") != 0)


def _decode_plugin(rows: Rows, positions: npt.NDArray[np.int64], primitive: Primitive) -> _PluginPiece:
    """A plug-in's reports of one frame length that its `translate_batch` takes: extended, not retransmitted,
    and exactly as long as the sub-header's length fields say (the rest are the oracle's drops, barriers)."""
    sub_at = PAYLOAD_AT + DTA_BASE_EXT.size
    subheader = primitive.subheader
    take = gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "marker") == EXTENDED_FIRST_BYTE
    take &= gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "retransmit") == 0
    size = np.full(len(rows), sub_at + subheader.size, dtype=np.int64)
    if rows.shape[1] >= sub_at + subheader.size:
        for var in subheader.tail:
            size += gather(rows, sub_at, subheader, var.length_from).astype(np.int64) * var.unit
        take &= UDP_AT + gather(rows, UDP_AT, UDP, "length").astype(np.int64) == size
    else:
        take[:] = False
    rows = rows[take]
    return _PluginPiece(primitive, positions[take], rows, gather(rows, IP_AT, IPV4, "dst"),
                        gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "immediate") != 0,
                        gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "essential") != 0)


def _plugin_writes(writes: KeyWrites, positions: npt.NDArray[np.int64], immediate: npt.NDArray[np.bool_]) -> _Piece:
    """A plug-in's Key-Writes as vector rows of their structure, at the batch positions of its reports."""
    structure = writes.structure
    order = np.argsort(writes.rows, kind="stable")
    rows, keys, data = writes.rows[order], writes.keys[order], writes.data[order]
    if structure.primitive is not DtaOpcode.KEY_WRITE or keys.shape[1:] != (structure.key_len,) or \
            data.shape[1:] != (structure.data_len,) or not 1 <= writes.redundancy <= MAX_REDUNDANCY:
        raise ValueError(f"translate_batch asked for Key-Writes that {structure.name} cannot take: keys "
                         f"{keys.shape}, data {data.shape}, redundancy {writes.redundancy}")
    checksums, slot_hashes = key_hashes_rows(np.ascontiguousarray(keys), writes.redundancy, structure.key_hash)
    return _Piece(structure, DtaOpcode.KEY_WRITE, positions[rows], np.full(len(rows), writes.redundancy),
                  immediate[rows], checksums, slot_hashes, np.ascontiguousarray(data), reports=False)


def _reporter_runs(rows: _SketchPiece, runtime: SketchRuntime) -> tuple[npt.NDArray[np.int64], ...]:
    """The rows reporter by reporter (each in batch order), the reporters, their counts of rows, and the column
    each reporter is to send next."""
    reporters, counts = np.unique(rows.reporters, return_counts=True)
    first = np.fromiter((runtime.next_column.get(reporter, 0) for reporter in reporters.tolist()), dtype=np.int64,
                        count=len(reporters))
    return np.lexsort((rows.positions, rows.reporters)), reporters, counts, first


def _decode_appends(rows: Rows, positions: npt.NDArray[np.int64], extended: bool, size: int, base: Header,
                    ranges: list[AppendLists]) -> list[_AppendPiece]:
    """The Append rows of one layout that the vector path takes, a piece per range of lists among `ranges`."""
    if extended:
        sub_at = PAYLOAD_AT + DTA_BASE_EXT.size
        width = size - DTA_BASE_EXT.size - APPEND_EXT.size
        if width < 1:
            return []  # too short: the oracle's drop
        take = gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "marker") == EXTENDED_FIRST_BYTE
        take &= gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "retransmit") == 0
        take &= gather(rows, sub_at, APPEND_EXT, "data_len") == width
        immediate = gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "immediate") != 0
        list_ids = gather(rows, sub_at, APPEND_EXT, "list_id").astype(np.int64)
        data_at = sub_at + APPEND_EXT.size
    else:
        sub_at = PAYLOAD_AT + base.size
        width = 4  # dta-v1 data is 32 bits
        if size != base.size + APPEND_V1.size:
            return []
        take = np.ones(len(rows), dtype=bool)
        if "retransmit" in {f.name for f in base.fields}:
            take &= gather(rows, PAYLOAD_AT, base, "retransmit") == 0
        immediate = gather(rows, PAYLOAD_AT, base, "immediate") != 0
        list_ids = gather(rows, sub_at, APPEND_V1, "list_id").astype(np.int64)
        data_at = sub_at + byte_offset(APPEND_V1, "data")
    pieces = []
    for lists in ranges:
        mine = take & (list_ids >= lists.first_list) & (list_ids < lists.first_list + lists.lists)
        if lists.data_len != width or not mine.any():
            continue  # another length than the list's is the oracle's drop
        data = rows[mine, data_at:data_at + width]
        # as stored: integers of 4 or 8 bytes little-endian (primitives._append_entry)
        entries = np.ascontiguousarray(data[:, ::-1] if width in (4, 8) else data)
        pieces.append(_AppendPiece(lists, positions[mine], list_ids[mine], immediate[mine], entries))
    return pieces


def _ranks(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """0, 1, .. counts[0] - 1, 0, 1, .. counts[1] - 1, ...: each element's rank in its run."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def _requests(piece: _Piece) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint32],
                                      npt.NDArray[np.bool_], npt.NDArray[np.uint32], np.ndarray]:
    """One entry per frame of the piece's rows, copy by copy: batch position, copy, slot hash, immediate flag,
    key checksum, and the data (Key-Write) or counter (Key-Increment)."""
    if piece.redundancy.max() == 1:
        rows = np.arange(len(piece.positions))
        copies = np.zeros(len(rows), dtype=np.int64)
    else:
        rows = np.repeat(np.arange(len(piece.positions)), piece.redundancy)
        copies = _ranks(piece.redundancy)
    values = piece.data if piece.data is not None else cast(npt.NDArray[np.uint64], piece.counter)
    return (piece.positions[rows], copies, piece.slot_hashes[copies, rows], piece.immediate[rows],
            piece.checksums[rows], values[rows])


def _write_opcode(transport: Transport, immediate: bool) -> RoceOpcode:
    if transport is Transport.RC:
        return RoceOpcode.RC_WRITE_ONLY_IMM if immediate else RoceOpcode.RC_WRITE_ONLY
    return RoceOpcode.UC_WRITE_ONLY_IMM if immediate else RoceOpcode.UC_WRITE_ONLY


def _stamp(template: _Template, psn: npt.NDArray[np.uint64], ack_req: npt.NDArray[np.bool_]) -> Rows:
    """Copies of the template with each frame's PSN and AckReq."""
    frames = np.tile(template.frame, (len(psn), 1))
    scatter(frames, PAYLOAD_AT, BTH, "psn", psn)
    scatter(frames, PAYLOAD_AT, BTH, "ack_req", ack_req)
    return frames


def _seal(template: _Template, frames: Rows) -> Rows:
    """Each frame's iCRC: the template's constant XOR the shares of the frame's variable bytes."""
    # (variable bytes, frames): the XOR then runs along whole rows
    shares = template.shares.take(frames[:, template.variable].T + template.share_offsets)
    state = np.bitwise_xor.reduce(shares, axis=0) ^ np.uint32(template.icrc_constant)
    frames[:, -ICRC_LEN:] = state.astype("<u4").view(np.uint8).reshape(-1, ICRC_LEN)
    return frames


def _columns(at: int, header: Header, name: str) -> range:
    """The frame's byte columns that hold field `name` of the header at `at`."""
    start, bits = header.span(name)
    return range(at + start // 8, at + (start + bits + 7) // 8)


def _in_order(built: list[tuple[npt.NDArray[np.bool_], Rows]], sent: int) -> Sequence[bytes]:
    """The frames of one QP in PSN order, from the arrays each template built: one template's array as it is."""
    if len(built) == 1:
        rows = built[0][1]
        return FrameRows(rows, np.full(len(rows), rows.shape[1], dtype=np.int64))
    ordered: list[bytes] = [b""] * sent
    for mine, rows in built:
        blob, width = rows.tobytes(), rows.shape[1]
        for place, at in zip(np.flatnonzero(mine).tolist(), range(0, len(blob), width)):
            ordered[place] = blob[at:at + width]
    return ordered

