"""The batch translator: the reference translator's semantics, a batch of frames at a time, vectorized (sans-IO).

Every primitive that declares a vector path (`Primitive.vector`, a `core.vector.VectorPath` in its package: all
the built-ins) has its reports parsed with column gathers at the spec's offsets, hashed with table-driven CRCs
over the whole batch, given PSNs per QP by cumulative counts, and built from per-QP templates by scattering the
variable fields. Their iCRC is the template's constant XOR a linear CRC over the variable tail
(`wire.icrc_split`). A plug-in with `translate_batch` gets its reports of a segment at once. Every other frame
goes through the oracle itself (`core.translator.Translator`), whose state the batch translator shares.

Reports to a fleet's address are vectorized too: each path binds them for their slots' structures
(`core.vector`), and the rows it takes count as resolved (FLEET_RESOLVED) as the oracle counts them. With copies
across replicas, a Key-Write's copies go through several QPs: a QP that may not send drops its copies, counted.

Exactness: per QP, frames come out in the oracle's order with its PSNs, and state and counters end equal.
Vectorized rows touch only their QPs' PSNs and frame counts, their structures' state, counters (which commute)
and the flush queue, whose entries they add in batch order among the oracle's. A QP is vectorized only when it
belongs to one structure or Append range. So the frames the oracle handles fall in three roles:
  * independent: they cannot touch those QPs (a frame that is not IPv4 and so passes; the reports of a QP that
    cannot send, or that a vector path gives back, such as a Sketch-Merge structure's out of sequence): the
    oracle takes them in order beside the vector rows;
  * ACKs to a vectorized QP: taken in batch order with the independent frames, each judged against the PSN its
    QP had at the ACK's place in the batch;
  * barriers: anything else (NAKs, plug-ins without `translate_batch`, retransmitted or malformed reports, IPv4
    with options).
    The rows before a barrier are translated first, then the barrier, then the rest.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from softdta.core.primitives import BatchPrimitive, KeyWrites, PluginRows, Primitive
from softdta.core.tables import QueuePair, Tables
from softdta.core.translator import QpRuntime, Translator
from softdta.core.vector import (
    IP_AT,
    NEVER,
    PAYLOAD_AT,
    UDP_AT,
    Flush,
    Layout,
    Target,
    VectorPath,
    VectorPiece,
)
from softdta.spec import (
    AETH,
    AETH_KIND_SHIFT,
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
    MAX_REDUNDANCY,
    PSN_MASK,
    RETH,
    ROCE_OPCODE_HEADERS,
    ROCE_PORT,
    UDP,
    AethKind,
    Header,
    QpState,
    RoceOpcode,
    TranslatorCounter,
    Transport,
)
from softdta.wire.columns import FrameRows, Rows, frame_lengths, gather, matches, scatter, stack
from softdta.wire.frames import UdpEndpoints
from softdta.wire.hashing import linear_crc_position_tables, xor_of_shares
from softdta.wire.icrc_split import VARIABLE_FROM, constant, linear_crc
from softdta.wire.roce import build_roce_frame, icrc_of_rows, transport_payload

IPV4_SIZE, UDP_SIZE = IPV4.size, UDP.size  # Header.size sums its fields on every access
IPV4_MIN_IHL = IPV4.size // 4
ACK_OPCODES = (RoceOpcode.RC_ACK, RoceOpcode.RC_ATOMIC_ACK)
# the bytes of the headers after the BTH that each dissects
_ACK_HEADERS, _ATOMIC_ACK_HEADERS = (sum(header.size for header in ROCE_OPCODE_HEADERS[code]) for code in ACK_OPCODES)

VECTOR, INDEPENDENT, ACK, BARRIER = range(4)  # the role of a frame in its batch
# Below this many frames the oracle is faster: a vectorized batch has a fixed cost of a few hundred numpy
# calls, about ten frames' worth of the oracle (docs/primitives.md).
MIN_VECTOR_BATCH = 12
OPCODES = 256  # a DTA base header's opcode is a byte
_VA_LEN = RETH.span("va")[1] // 8  # ATOMIC_ETH's is as long
# AckReq and the PSN lie in one 32-bit BTH word: where it starts, and where each field sits in it
_SEQUENCE_WORD_AT = BTH.span("ack_req")[0] // 8
_ACK_REQ_SHIFT, _PSN_SHIFT = (32 - (BTH.span(name)[0] - 8 * _SEQUENCE_WORD_AT) - BTH.span(name)[1]
                              for name in ("ack_req", "psn"))
assert _ACK_REQ_SHIFT >= 0 and _PSN_SHIFT >= 0 and BTH.span("psn")[0] >= 8 * _SEQUENCE_WORD_AT, "one BTH word"
_ATOMIC_LEN = ATOMIC_ETH.span("swap_add")[1] // 8  # what a Fetch&Add reads and writes
COPY_ORDER = MAX_REDUNDANCY  # a frame's place in its report's order: position * COPY_ORDER + its copy


@dataclass
class BatchOutput:
    """What a batch produced: RoCEv2 frames (in the oracle's order: by the report that made them, and so in PSN
    order per QP), NACKs for reporters, and the positions of the essential reports deferred until their QP can
    send (the caller offers them again later)."""

    # the frames, in runs: a vector run as the rows of its array (FrameRows), which packet I/O takes as they are
    runs: list[Sequence[bytes]] = field(default_factory=list)
    to_reporter: list[bytes] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)
    # the place of each frame in report order (COPY_ORDER), a run per call that added frames
    made_by: list[npt.NDArray[np.int64]] = field(default_factory=list, repr=False)

    @property
    def frames(self) -> list[bytes]:
        return [frame for run in self.runs for frame in run]

    def in_report_order(self) -> BatchOutput:
        """The frames sorted by the report that made them (frames of one report keep their order)."""
        if len(self.made_by) > 1:
            order = np.argsort(np.concatenate(self.made_by), kind="stable")
            frames = stack(self.runs)
            self.runs = [FrameRows(frames.rows.take(order, axis=0), frames.lengths[order])]  # take: 1/4 the time
        self.made_by = []
        return self


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


Piece = VectorPiece | _PluginPiece


@dataclass
class _Template:
    """One QP's frame of one opcode and payload length, with zeros where each frame's own values go.

    The iCRC of a frame is `icrc_constant` XOR, for each of the `variable` byte columns, that byte's share of
    the linear CRC (`shares[j]`: column j's 256-entry table): the rest of the frame is the template's."""

    frame: Rows
    extension_at: int  # where the opcode's first extended header starts
    payload_at: int
    icrc_constant: int = 0
    variable: list[int] = field(default_factory=list)
    shares: npt.NDArray[np.uint32] = field(default_factory=lambda: np.empty((0, 256), dtype=np.uint32))


@dataclass
class _Acks:
    """A batch's ACKs of vector QPs, as columns: batch positions (ascending), the QP each acknowledges, and its
    PSN where the oracle would take it but for the PSN (-1: the oracle judges the ACK whole)."""

    positions: npt.NDArray[np.int64]
    qps: npt.NDArray[np.int64]
    psns: npt.NDArray[np.int64]

    @classmethod
    def none(cls) -> _Acks:
        return cls(*(np.empty(0, dtype=np.int64) for _ in range(3)))


@dataclass
class _ReplyQps:
    """The tables' QPs by local QPN, as columns (what `Tables.qp_by_local_qpn` finds), with a last row that stands
    for no QP: nothing vectorized, not RC."""

    local_qpns: npt.NDArray[np.uint64]  # ascending
    index: npt.NDArray[np.int64]
    vector: npt.NDArray[np.bool_]
    collector_ip: npt.NDArray[np.uint64]
    rc: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, qps: list[QueuePair], vector_qps: set[int]) -> _ReplyQps:
        by_qpn = {qp.local_qpn: qp for qp in qps}  # a later QP with the same QPN wins, as in the tables' index
        ordered = [by_qpn[qpn] for qpn in sorted(by_qpn)]
        return cls(np.array(sorted(by_qpn), dtype=np.uint64),
                   np.array([qp.index for qp in ordered] + [-1], dtype=np.int64),
                   np.array([qp.index in vector_qps for qp in ordered] + [False], dtype=bool),
                   np.array([int.from_bytes(qp.collector_ip, "big") for qp in ordered] + [0], dtype=np.uint64),
                   np.array([qp.transport is Transport.RC for qp in ordered] + [False], dtype=bool))

    def find(self, local_qpns: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """The row of each QPN's QP; the last row (-1) where no QP has it."""
        at = np.minimum(np.searchsorted(self.local_qpns, local_qpns), max(len(self.local_qpns) - 1, 0))
        found = (self.local_qpns[at] == local_qpns) if len(self.local_qpns) else np.zeros(len(local_qpns), bool)
        return np.where(found, at, -1)


class BatchTranslator:
    """Translates batches with `oracle`'s tables and state; the oracle stays usable (and in step) between
    batches, for ticks, flushes and single frames."""

    def __init__(self, oracle: Translator):
        self.oracle = oracle
        self._tables: Tables | None = None
        self._templates: dict[tuple[int, RoceOpcode, int], _Template] = {}
        self._vector_qps: set[int] = set()
        self._acks = _Acks.none()  # the batch's ACKs of vector QPs (`_classify_replies`)
        self._reply_qps = _ReplyQps.of([], set())  # the tables' QPs by local QPN, for replies
        self._resolved = np.zeros(0, dtype=bool)  # by batch position: a report at the fleet's address, vectorized
        self._fleet_address = -1  # the tables' fleet address as an integer (-1: no fleet)
        self._queue = 0  # the RX queue of the batch being translated
        # each primitive with a vector path gets it; the others are plug-ins, through `translate` or
        # `translate_batch`
        self._paths: dict[int, VectorPath[Any]] = {
            opcode: vector(primitive, self) for opcode, primitive in oracle.primitives.items()
            if (vector := type(primitive).vector) is not None}
        self._qp_path: dict[int, VectorPath[Any]] = {}  # a vectorized QP's index -> the path of its one target
        self._is_vector = np.zeros(OPCODES, dtype=bool)  # by opcode
        self._by_destination = np.zeros(OPCODES, dtype=bool)  # by opcode: a layout names its destination
        for opcode, path in self._paths.items():
            self._is_vector[opcode], self._by_destination[opcode] = True, path.by_destination
        self._plugin_opcodes = frozenset(oracle.primitives.keys() - self._paths.keys())
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
        self._acks = _Acks.none()
        self._resolved = np.zeros(count, dtype=bool)
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
        self._fleet_address = -1 if tables.fleet is None else int.from_bytes(tables.fleet.address, "big")
        targets: list[Target] = [*tables.structures, *tables.append_lists]
        owners = Counter(qp.index for target in targets for qp in target.qps)
        # a QP that two targets share keeps their reports in one PSN order: those stay with the oracle
        self._qp_path = {qp.index: path for path in self._paths.values() for target in path.targets(tables)
                         if all(owners[each.index] == 1 for each in target.qps) for qp in target.qps}
        self._vector_qps = set(self._qp_path)
        self._reply_qps = _ReplyQps.of(tables.qps, self._vector_qps)
        self._plugins_write = all(structure.qp.index in self._vector_qps for structure in tables.structures
                                  if (path := self._paths.get(structure.primitive)) is not None and path.takes_writes)

    def _classify(self, frames: Sequence[bytes]) -> tuple[npt.NDArray[np.int8], list[Piece]]:
        """Roles of the frames, and the vector pieces among them: one pass over all of them as rows as long as the
        longest (the bytes past a frame's length unspecified), whatever their lengths."""
        lengths = frame_lengths(frames)
        roles = np.full(len(frames), BARRIER, dtype=np.int8)
        pieces: list[Piece] = []
        rows = (frames if isinstance(frames, FrameRows) else stack([frames])).rows
        self._classify_rows(rows, lengths, np.arange(len(frames)), roles, pieces)
        return roles, pieces

    def _classify_rows(self, rows: Rows, lengths: npt.NDArray[np.int64], positions: npt.NDArray[np.int64],
                       roles: npt.NDArray[np.int8], pieces: list[Piece]) -> None:
        """Roles of frames whose lengths are `lengths` (rows at least as long as the longest), and the vector pieces
        among them."""
        width = rows.shape[1]
        if width < ETHERNET.size:
            roles[positions] = INDEPENDENT
            return
        if len(rows) > 1 and int(lengths[0]) >= PAYLOAD_AT + DTA_BASE_EXT.size and (lengths == lengths[0]).all():
            layout = rows[:, self._layout_bytes]
            if (layout == layout[0]).all() and self._classify_alike(rows, lengths, positions, roles, pieces):
                return
        ipv4 = _ethertype(rows) == ETH_P_IP
        # too short for a UDP payload: the oracle passes it if it is not IPv4 (or not even Ethernet), else drops it
        short = lengths < PAYLOAD_AT + 1
        roles[positions[short & (~ipv4 | (lengths < ETHERNET.size))]] = INDEPENDENT
        if width < PAYLOAD_AT + 1:
            return
        roles[positions[~short & ~ipv4]] = INDEPENDENT  # the oracle passes what is not IPv4, untouched
        shaped, payload_len = _plain_udp4(rows, lengths)
        shaped &= ~short
        dport = gather(rows, UDP_AT, UDP, "dport")
        neither = shaped & (dport != DTA_PORT) & (dport != ROCE_PORT)
        roles[positions[neither]] = INDEPENDENT
        # a report in a frame too short for the extended base header is the oracle's (a drop, or a dta-v1 base)
        reports = shaped & (dport == DTA_PORT) & (lengths >= PAYLOAD_AT + DTA_BASE_EXT.size)
        if reports.any():
            # compress and take: a fraction of the time boolean and integer indexing of rows take
            self._classify_reports(rows.compress(reports, axis=0), lengths[reports], positions[reports],
                                   payload_len[reports], roles, pieces)
        # replies too short for an ACK's headers stay barriers: the oracle's, at their places
        replies = shaped & (dport == ROCE_PORT) & (lengths >= PAYLOAD_AT + BTH.size + AETH.size)
        if replies.any():
            self._classify_replies(rows.compress(replies, axis=0), positions[replies], payload_len[replies], roles)

    def _classify_alike(self, rows: Rows, lengths: npt.NDArray[np.int64], positions: npt.NDArray[np.int64],
                        roles: npt.NDArray[np.int8], pieces: list[Piece]) -> bool:
        """Reports all as long as the first and equal to it in the bytes that decide their layout: classified by
        the first alone (False, and nothing done, if the first is not a report)."""
        shaped, payload_len = _plain_udp4(rows[:1], lengths[:1])
        if not shaped[0] or gather(rows[:1], UDP_AT, UDP, "dport")[0] != DTA_PORT:
            return False
        self._classify_reports(rows, lengths, positions, np.broadcast_to(payload_len, len(rows)), roles, pieces,
                               alike=True)
        return True

    def _classify_reports(self, rows: Rows, lengths: npt.NDArray[np.int64], positions: npt.NDArray[np.int64],
                          payload_len: npt.NDArray[np.int64], roles: npt.NDArray[np.int8], pieces: list[Piece],
                          alike: bool = False) -> None:
        """Decoders see rows of one length, `lengths` long: the rows of each (length, layout), in that order."""
        head = rows[:1] if alike else rows  # the rows to read layouts from
        extended = (head[:, PAYLOAD_AT] & EXTENDED_MARKER) != 0
        base = self.oracle.tables.profile.base_header
        opcode = np.where(extended, gather(head, PAYLOAD_AT, DTA_BASE_EXT, "opcode"),
                          gather(head, PAYLOAD_AT, base, "opcode")).astype(np.int64)
        addresses = gather(head, IP_AT, IPV4, "dst")
        # one layout per (format, opcode, destination, payload length): vectorize each; a layout names its
        # destination where a path's targets are named by it
        layout = (extended.astype(np.uint64) << np.uint64(63)) | (opcode.astype(np.uint64) << np.uint64(48)) | \
            (payload_len[:len(head)].astype(np.uint64) << np.uint64(32)) | \
            np.where(self._by_destination[opcode], addresses, 0).astype(np.uint64)
        if alike:
            extended, opcode, addresses, layout = (np.broadcast_to(column, len(rows))
                                                   for column in (extended, opcode, addresses, layout))
        vector_kind = self._is_vector[opcode]
        plugin = extended & np.isin(opcode, list(self._plugin_opcodes)) if self._plugin_opcodes \
            else np.zeros(len(opcode), dtype=bool)
        roles[positions[~vector_kind & ~plugin]] = INDEPENDENT
        if self._batch_plugins and self._plugins_write:
            # at the fleet's address, the oracle binds them (translate_batch takes structures by address)
            for length, _, primitive, members in sorted(
                    (length, number, primitive, members)
                    for number, (code, primitive) in enumerate(self._batch_plugins.items())
                    for length, members in _by_length(lengths, np.flatnonzero(
                        plugin & (opcode == code) & (addresses != self._fleet_address)))):
                taken = _decode_plugin(rows[members, :length], positions[members], primitive)
                roles[taken.positions] = VECTOR
                pieces.append(taken)
        candidates = np.flatnonzero(vector_kind)
        if not len(candidates):
            return
        layout = layout[candidates]
        if (layout == layout[0]).all():  # the common case: one layout, no sort
            unique, inverse = layout[:1], np.zeros(len(layout), dtype=np.int64)
        else:
            unique, inverse = np.unique(layout, return_inverse=True)
        groups = sorted((length, packed, members) for index, packed in enumerate(unique.tolist())
                        for length, members in _by_length(lengths, candidates if len(unique) == 1
                                                          else candidates[inverse == index]))
        for length, packed, members in groups:
            whole = len(members) == len(rows) and length == rows.shape[1]  # then taken as they are, not copied
            path = self._paths[(packed >> 48) & 0xFF]
            found = path.decode(rows if whole else rows.take(members, axis=0)[:, :length],
                                positions if whole else positions[members],
                                Layout(bool(packed >> 63), (packed >> 32) & 0xFFFF, packed & 0xFFFFFFFF, base),
                                self._writable)
            for piece in found:
                roles[piece.positions] = VECTOR
            if found and packed & 0xFFFFFFFF == self._fleet_address:
                for piece in found:
                    self._resolved[piece.positions] = True
            pieces += found

    def _writable(self, target: Target) -> bool:
        """Whether a vector path may write into `target` in this batch: its QP is vectorized, and the RX queue
        being translated has one (else its reports are the oracle's, at their places: barriers)."""
        return target.qp.index in self._vector_qps and target.qp_on(self._queue) is not None

    def _classify_replies(self, rows: Rows, positions: npt.NDArray[np.int64], payload_len: npt.NDArray[np.int64],
                          roles: npt.NDArray[np.int8]) -> None:
        """ACKs of a vector QP get their own role; replies to other QPs are independent; NAKs are barriers."""
        if rows.shape[1] < PAYLOAD_AT + BTH.size + AETH.size:
            return
        src = gather(rows, IP_AT, IPV4, "src")
        opcode = gather(rows, PAYLOAD_AT, BTH, "opcode")
        kind = gather(rows, PAYLOAD_AT + BTH.size, AETH, "syndrome") >> np.uint64(AETH_KIND_SHIFT)
        ack = np.isin(opcode, [int(code) for code in ACK_OPCODES]) & (kind == int(AethKind.ACK))
        ack &= payload_len >= BTH.size + AETH.size + ICRC_LEN
        qps = self._reply_qps.find(gather(rows, PAYLOAD_AT, BTH, "dest_qp"))
        vector_qp = self._reply_qps.vector[qps]
        from_collector = self._reply_qps.collector_ip[qps] == src
        acks = np.flatnonzero(ack & vector_qp & from_collector)
        roles[positions[acks]] = ACK
        # Of those, the ones the oracle would take: on an RC QP, its headers in front of the pad and the iCRC (the
        # lengths `parse_roce` checks), a right iCRC; `_ack` judges their PSNs in place.
        pad = gather(rows, PAYLOAD_AT, BTH, "pad_count").astype(np.int64)
        headers = np.where(opcode == int(RoceOpcode.RC_ATOMIC_ACK), _ATOMIC_ACK_HEADERS, _ACK_HEADERS)
        end = UDP_AT + UDP.size + payload_len
        taken = ack & vector_qp & from_collector & self._reply_qps.rc[qps] & \
            (payload_len - ICRC_LEN - pad >= BTH.size + headers)
        psn = np.full(len(rows), -1, dtype=np.int64)
        for packet_end in np.unique(end[taken]).tolist():  # packets of one length: in a batch, one or two
            alike = np.flatnonzero(taken & (end == packet_end))
            wire = rows[alike, packet_end - ICRC_LEN:packet_end].view("<u4").reshape(-1)
            right = alike[icrc_of_rows(rows[alike, IP_AT:packet_end - ICRC_LEN]) == wire]
            psn[right] = gather(rows[right], PAYLOAD_AT, BTH, "psn").astype(np.int64)
        self._acks = _Acks(positions[acks], self._reply_qps.index[qps[acks]], psn[acks])
        roles[positions[~vector_qp]] = INDEPENDENT

    # ----------------------------------------------------------------------------------------------
    # a segment: the rows between two barriers

    def _segment(self, frames: Sequence[bytes], roles: npt.NDArray[np.int8], pieces: list[Piece],
                 start: int, end: int, now_ns: int, out: BatchOutput) -> None:
        oracle = self.oracle
        ready: dict[int, bool] = {}
        cut = [piece.cut(*np.searchsorted(piece.positions, [start, end]).tolist()) for piece in pieces]
        plugins = [piece for piece in cut if isinstance(piece, _PluginPiece) and len(piece.positions)]
        here: list[VectorPiece] = [piece for piece in cut
                                   if not isinstance(piece, _PluginPiece) and len(piece.positions)]
        if plugins:
            here += self._run_plugins(plugins, now_ns, out)
        by_qp: dict[int, list[VectorPiece]] = {}  # a vector QP has one target: its pieces are alike
        # copies after the reports they copy: those whose target may not send go to the oracle whole
        for piece in sorted(here, key=operator.attrgetter("copied")):
            if piece.copied and roles[piece.positions[0]] != VECTOR:
                continue
            qp = oracle.sender(piece.target)
            # asked when the oracle would ask: at the QP's first report here (its readiness holds in a segment)
            if qp.index not in ready:
                ready[qp.index] = oracle.qp_ready(qp, now_ns)
            if not ready[qp.index]:
                if piece.copied:  # each copy a counted drop (`Translator.copy_structures`)
                    failed = oracle.qp_state[qp.index].state is QpState.FAILED
                    reason = TranslatorCounter.DROP_QP_FAILED if failed else TranslatorCounter.DROP_GRACE
                    oracle.counters[reason] += self._qp_path[qp.index].unsent(piece)
                else:  # dropped or deferred: by the oracle, in order
                    roles[piece.positions] = INDEPENDENT
                continue
            by_qp.setdefault(qp.index, []).append(piece)
        emitted: dict[int, npt.NDArray[np.int64]] = {}  # QP index -> the batch position of each frame it sent
        asked: list[tuple[VectorPath[Any], list[Flush]]] = []  # each emit's flush queue entries, in batch order
        for qp_index, parts in by_qp.items():
            path = self._qp_path[qp_index]
            made = path.emit(parts, now_ns)
            out.runs += made.runs
            # the frames just added, in PSN order
            out.made_by.append(made.sent * COPY_ORDER + (0 if made.copies is None else made.copies))
            emitted[qp_index] = made.sent
            if made.flushes:
                asked.append((path, sorted(made.flushes, key=operator.itemgetter(0))))
            if made.resume != NEVER:
                for piece in parts:  # from there on, the oracle takes them in order
                    roles[piece.positions[piece.positions >= made.resume]] = INDEPENDENT
        taken = roles[start:end]
        oracle.counters[TranslatorCounter.FLEET_RESOLVED] += int((self._resolved[start:end] & (taken == VECTOR)).sum())
        # in batch order: the oracle's frames, the ACKs, and the flush queue entries of the vector rows (each with
        # the number of its emit in `asked`)
        queue = list(zip(asked[0][1], itertools.repeat(0))) if len(asked) == 1 else sorted(
            itertools.chain.from_iterable(zip(flushes, itertools.repeat(number))
                                          for number, (_, flushes) in enumerate(asked)), key=_batch_position)
        tokens: list[list[int]] = [[] for _ in asked]
        flush_later, queued = self.oracle.flush_later, 0
        in_order = taken == INDEPENDENT
        if in_order.any():
            in_order |= taken == ACK
        else:  # only ACKs: none makes a frame, changes the flush queue or another QP's state
            self._acks_of_segment(frames, start, end, emitted, now_ns, out)
        for position in (np.flatnonzero(in_order) + start).tolist():
            while queued < len(queue) and queue[queued][0][0] < position:
                (_, index, target), number = queue[queued]
                tokens[number].append(flush_later(asked[number][0].primitive, now_ns, index, target))
                queued += 1
            if roles[position] == ACK:
                self._ack(frames, position, emitted, now_ns, out)
            else:
                self._through_oracle(frames, position, now_ns, out)
        if len(asked) == 1:
            primitive = asked[0][0].primitive
            tokens[0] += [flush_later(primitive, now_ns, index, target) for (_, index, target), _ in queue[queued:]]
        else:
            for (_, index, target), number in queue[queued:]:
                tokens[number].append(flush_later(asked[number][0].primitive, now_ns, index, target))
        # only the oracle's frames were translated since the emits, and those cannot touch the vector rows' state
        for (path, flushes), named in zip(asked, tokens):
            path.queued_all(flushes, named, now_ns)

    def _run_plugins(self, parts: list[_PluginPiece], now_ns: int, out: BatchOutput) -> list[VectorPiece]:
        """Each plug-in's reports in the segment, in order, through its `translate_batch`; the Key-Writes it asks
        for, as vector rows of their structures (by those structures' vector paths)."""
        made: list[VectorPiece] = []
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
                made.append(self._writes_path(writes).writes(writes, positions, rows.immediate))
        return made

    def _acks_of_segment(self, frames: Sequence[bytes], start: int, end: int,
                         emitted: dict[int, npt.NDArray[np.int64]], now_ns: int, out: BatchOutput) -> None:
        """The segment's ACKs where the oracle translates nothing between them, QP by QP. A QP's ACKs whose PSNs
        each move its window on from where the ACK before left it are taken at once; else `_ack` judges them one
        by one, in order."""
        low, high = np.searchsorted(self._acks.positions, [start, end]).tolist()
        positions, qps, psns = (column[low:high] for column in (self._acks.positions, self._acks.qps,
                                                                  self._acks.psns))
        for qp_index in np.unique(qps).tolist():
            mine = qps == qp_index
            at, psn = positions[mine], psns[mine]
            runtime = self.oracle.qp_state[qp_index]
            sent = emitted.get(qp_index)
            # the next PSN as each ACK arrived: without the vector frames sent after it
            next_psn = (runtime.next_psn - (0 if sent is None else len(sent) - np.searchsorted(sent, at))) & PSN_MASK
            unacked = np.concatenate(([cast(int, runtime.unacked_psn)], (psn[:-1] + 1) & PSN_MASK))
            if ((psn >= 0) & ((psn - unacked) & PSN_MASK < (next_psn - unacked) & PSN_MASK)).all():
                self.oracle.counters[TranslatorCounter.RX_ACKS] += len(psn)
                runtime.unacked_psn = (int(psn[-1]) + 1) & PSN_MASK
                continue
            for position in at.tolist():
                self._ack(frames, position, emitted, now_ns, out)

    def _ack(self, frames: Sequence[bytes], position: int, emitted: dict[int, npt.NDArray[np.int64]], now_ns: int,
             out: BatchOutput) -> None:
        """An ACK of a vectorized QP, judged with the next PSN its QP had when the ACK arrived: without the
        vector frames sent after it (the oracle's own frames before it are counted already)."""
        row = int(np.searchsorted(self._acks.positions, position))
        qp_index, psn = int(self._acks.qps[row]), int(self._acks.psns[row])
        runtime = self.oracle.qp_state[qp_index]
        actual, sent = runtime.next_psn, emitted.get(qp_index)
        if sent is not None:
            runtime.next_psn = (actual - (len(sent) - int(np.searchsorted(sent, position)))) & PSN_MASK
        try:
            if not self._took_ack(psn, runtime):
                self._through_oracle(frames, position, now_ns, out)
        finally:
            runtime.next_psn = actual

    def _took_ack(self, psn: int, runtime: QpRuntime) -> bool:
        """What the oracle's `_reply` does with an ACK it would take but for its PSN (`_classify_replies` checked
        the rest; -1: it did not take it), without dissecting it again: an outstanding PSN moves the window. False
        leaves any other ACK to the oracle, which counts its drop."""
        if psn < 0 or not runtime.outstanding(psn):
            return False
        self.oracle.counters[TranslatorCounter.RX_ACKS] += 1
        runtime.unacked_psn = (psn + 1) & PSN_MASK  # acknowledges every PSN up to psn, as the oracle does
        return True

    def _through_oracle(self, frames: Sequence[bytes], position: int, now_ns: int, out: BatchOutput) -> None:
        result = self.oracle.process(frames[position], now_ns, self._queue)
        if result.frames:
            out.runs.append(result.frames)
            out.made_by.append(np.full(len(result.frames), position * COPY_ORDER, dtype=np.int64))
        out.to_reporter += result.to_reporter
        if result.deferred:
            out.deferred.append(position)

    # ----------------------------------------------------------------------------------------------
    # frames

    def _writes_path(self, writes: KeyWrites) -> VectorPath[Any]:
        structure = writes.structure
        path = self._paths.get(structure.primitive)
        if path is None or not path.takes_writes:
            raise ValueError(f"translate_batch asked for Key-Writes that {structure.name} cannot take: keys "
                             f"{writes.keys.shape}, data {writes.data.shape}, redundancy {writes.redundancy}")
        return path

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

    def writes(self, qp: QueuePair, va: npt.NDArray[np.uint64], immediate: npt.NDArray[np.bool_],
               tags: npt.NDArray[np.uint32], payloads: Rows) -> Sequence[bytes]:
        """RDMA WRITE (with immediate `tags` where `immediate`) frames of `payloads` to `va`, with the QP's next
        PSNs, in PSN order (`vector.FrameMaker`)."""
        _check_region(qp, va, payloads.shape[1])
        psn, ack_req = self._sequence(qp, len(va))
        payload_len = payloads.shape[1]
        built: list[tuple[npt.NDArray[np.bool_], Rows]] = []
        for with_immediate in (False, True):
            mine = immediate == with_immediate
            if not mine.any():
                continue
            template = self._template(qp, _write_opcode(qp.transport, with_immediate), payload_len)
            psns, acks, vas, marks, rows = _where(mine, psn, ack_req, va, tags, payloads)
            frames = _stamp(template, psns, acks)
            scatter(frames, template.extension_at, RETH, "va", vas)
            if with_immediate:
                scatter(frames, template.extension_at + RETH.size, IMMDT, "immediate", marks)
            frames[:, template.payload_at:template.payload_at + payload_len] = rows
            built.append((mine, _seal(template, frames)))
        return _in_order(built, len(psn))

    def fetch_adds(self, qp: QueuePair, va: npt.NDArray[np.uint64], values: npt.NDArray[np.uint64]) -> Sequence[bytes]:
        """RDMA Fetch&Add frames adding `values` at `va`, with the QP's next PSNs, in PSN order
        (`vector.FrameMaker`)."""
        sent = len(va)
        _check_region(qp, va, _ATOMIC_LEN)
        psn, ack_req = self._sequence(qp, sent)
        template = self._template(qp, RoceOpcode.RC_FETCH_ADD, 0)
        frames = _stamp(template, psn, ack_req)
        scatter(frames, template.extension_at, ATOMIC_ETH, "va", va)
        scatter(frames, template.extension_at, ATOMIC_ETH, "swap_add", values)
        return _in_order([(np.ones(sent, dtype=bool), _seal(template, frames))], sent)

    def _template(self, qp: QueuePair, opcode: RoceOpcode, payload_len: int) -> _Template:
        key = (qp.index, opcode, payload_len)
        template = self._templates.get(key)
        if template is None:
            tables = self.oracle.tables
            ends = UdpEndpoints(src_mac=tables.mac, dst_mac=qp.collector_mac, src_ip=tables.ip,
                                dst_ip=qp.collector_ip, sport=tables.udp_sport, dport=ROCE_PORT, dscp=tables.dscp,
                                ttl=tables.ttl)
            asks_acks = qp.transport is Transport.RC and tables.ack_request_interval > 0
            template = self._templates[key] = _make_template(ends, qp.remote_qpn, qp.rkey, qp.base_va, qp.length,
                                                             asks_acks, opcode, payload_len)
        return template


# a template's shares take 1 KiB a variable byte (14 KiB for a Key-Write's, 160 KiB for a wide sketch's)
@functools.lru_cache(maxsize=256)
def _make_template(ends: UdpEndpoints, remote_qpn: int, rkey: int, base_va: int, length: int, asks_acks: bool,
                   opcode: RoceOpcode, payload_len: int) -> _Template:
    """A QP's template, made once per process for what it is made of: a new translator (a restart, new tables,
    a fleet's next epoch) finds the templates of the QPs that stayed the same made already. Templates are never
    changed once made."""
    # the leading bytes of the VA that every address in the region shares are the template's (writes and
    # Fetch&Adds are checked to lie in the region); the rest are each frame's
    shared = _shared_va_bytes(base_va, length)
    va = base_va & ~((1 << 8 * (_VA_LEN - shared)) - 1)
    headers = {ATOMIC_ETH.name: {"rkey": rkey, "va": va}} if opcode is RoceOpcode.RC_FETCH_ADD else \
        {RETH.name: {"rkey": rkey, "dma_length": payload_len, "va": va}}
    frame = build_roce_frame(ends, transport_payload(opcode, remote_qpn, 0, headers, bytes(payload_len)))
    extension_at = PAYLOAD_AT + BTH.size
    payload_at = extension_at + sum(header.size for header in ROCE_OPCODE_HEADERS[opcode])
    template = _Template(np.frombuffer(frame, dtype=np.uint8), extension_at, payload_at)
    # AckReq stays 0 but on an RC QP that asks for ACKs
    variable = [*_columns(PAYLOAD_AT, BTH, "ack_req")] if asks_acks else []
    variable += _columns(PAYLOAD_AT, BTH, "psn")
    if opcode is RoceOpcode.RC_FETCH_ADD:
        variable += [*_columns(extension_at, ATOMIC_ETH, "va")[shared:],
                     *_columns(extension_at, ATOMIC_ETH, "swap_add")]
    else:
        variable += _columns(extension_at, RETH, "va")[shared:]
        if IMMDT in ROCE_OPCODE_HEADERS[opcode]:
            variable += _columns(extension_at + RETH.size, IMMDT, "immediate")
        variable += range(payload_at, payload_at + payload_len)
    tail_at = IP_AT + VARIABLE_FROM
    tail = frame[tail_at:-ICRC_LEN]
    template.icrc_constant = constant(frame[IP_AT:-ICRC_LEN]) ^ linear_crc(tail)
    template.variable = list(variable)
    template.shares = linear_crc_position_tables(len(tail))[[column - tail_at for column in variable]]
    template.shares.flags.writeable = False
    return template


# --------------------------------------------------------------------------------------------------
# helpers over arrays

def _where(mine: npt.NDArray[np.bool_], *columns: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], ...]:
    """The columns' entries (rows) where `mine` is set: the columns themselves where it is set throughout."""
    if mine.all():
        return columns
    return tuple(column.compress(mine, axis=0) for column in columns)


def _shared_va_bytes(base_va: int, length: int) -> int:
    """How many leading bytes of a VA every address in a region has in common."""
    varying_bits = (base_va ^ (base_va + max(length, 1) - 1)).bit_length()
    return _VA_LEN - (varying_bits + 7) // 8


def _check_region(qp: QueuePair, va: npt.NDArray[np.uint64], length: int) -> None:
    """Every access of `length` bytes at `va` lies in the QP's region: the frame template's VA bytes and the
    collector's memory depend on it."""
    if len(va) and (int(va.min()) < qp.base_va or int(va.max()) + length > qp.base_va + qp.length):
        raise AssertionError(f"a {length}-byte access at VA {int(va.min()):#x}..{int(va.max()):#x} leaves the region "
                             f"of qp {qp.name} ({qp.base_va:#x} + {qp.length})")


def _ethertype(rows: Rows) -> npt.NDArray[np.uint64]:
    return gather(rows, 0, ETHERNET, "ethertype")


def _by_length(lengths: npt.NDArray[np.int64], members: npt.NDArray[np.int64]
               ) -> list[tuple[int, npt.NDArray[np.int64]]]:
    """`members` (row indices) by the length of their frames, shortest first."""
    if not len(members):
        return []
    of_members = lengths[members]
    first = int(of_members[0])
    if (of_members == first).all():
        return [(first, members)]
    return [(length, members[of_members == length]) for length in np.unique(of_members).tolist()]


def _plain_udp4(rows: Rows, lengths: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """Which rows are unfragmented IPv4 without options carrying one whole UDP datagram within the frame's
    `lengths`, and its payload length."""
    total = gather(rows, IP_AT, IPV4, "total_length").astype(np.int64)
    udp_len = gather(rows, UDP_AT, UDP, "length").astype(np.int64)
    ok = _ethertype(rows) == ETH_P_IP
    ok &= matches(rows, IP_AT, IPV4, version=IPV4_VERSION_NUMBER, ihl=IPV4_MIN_IHL, protocol=IPPROTO_UDP,
                  fragment_offset=0)
    ok &= (gather(rows, IP_AT, IPV4, "flags") & np.uint64(IPV4_FLAG_MORE_FRAGMENTS)) == 0
    ok &= (total >= IPV4_SIZE + UDP_SIZE) & (total <= lengths - IP_AT)
    ok &= (udp_len >= UDP_SIZE) & (udp_len <= total - IPV4_SIZE)
    return ok, udp_len - UDP_SIZE


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


def _batch_position(queued: tuple[Flush, int]) -> int:
    return queued[0][0]


def _write_opcode(transport: Transport, immediate: bool) -> RoceOpcode:
    if transport is Transport.RC:
        return RoceOpcode.RC_WRITE_ONLY_IMM if immediate else RoceOpcode.RC_WRITE_ONLY
    return RoceOpcode.UC_WRITE_ONLY_IMM if immediate else RoceOpcode.UC_WRITE_ONLY


def _stamp(template: _Template, psn: npt.NDArray[np.uint64], ack_req: npt.NDArray[np.bool_]) -> Rows:
    """Copies of the template with each frame's PSN and AckReq, written as the one BTH word that holds both."""
    frames = np.tile(template.frame, (len(psn), 1))
    at = PAYLOAD_AT + _SEQUENCE_WORD_AT
    kept = int.from_bytes(template.frame[at:at + 4].tobytes(), "big")  # the word's other bits (reserved: zero)
    word = psn << np.uint64(_PSN_SHIFT) | ack_req.astype(np.uint64) << np.uint64(_ACK_REQ_SHIFT) | np.uint64(kept)
    frames[:, at:at + 4] = word.astype(">u4").view(np.uint8).reshape(-1, 4)
    return frames


def _seal(template: _Template, frames: Rows) -> Rows:
    """Each frame's iCRC: the template's constant XOR the shares of the frame's variable bytes."""
    state = xor_of_shares(template.shares, frames, template.variable, template.icrc_constant)
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

