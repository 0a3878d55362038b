"""The batch translator: the reference translator's semantics, a batch of frames at a time, vectorized (sans-IO).

Key-Write (N = 1..4, immediate, dta-v1 and extended) and Key-Increment reports, the bulk of telemetry, are
parsed with column gathers at the spec's offsets, hashed with table-driven CRCs over the whole batch, given
PSNs per QP by cumulative counts, and built from per-QP templates by scattering the variable fields. Their
iCRC is the template's constant XOR a linear CRC over the variable tail (`wire.icrc_split`). Every other
frame goes through the oracle itself (`core.translator.Translator`), whose state the batch translator shares.

Exactness: per QP, frames come out in the oracle's order with its PSNs, and state and counters end equal.
Vectorized rows touch only their QPs' PSNs and frame counts, and counters (which commute). So the frames the
oracle handles fall in three roles:
  * independent: they cannot touch those QPs (another built-in primitive's report, whose structure has its
    own QP; a frame that is not IPv4 and so passes): the oracle takes them in order beside the vector rows;
  * ACKs to a vectorized QP: taken after the vector rows, each judged against the PSN its QP had at the
    ACK's place in the batch;
  * barriers: anything else (NAKs, plug-ins, retransmitted or malformed Key-Write reports, IPv4 with options).
    The rows before a barrier are translated first, then the barrier, then the rest.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import numpy.typing as npt

from softdta.core.tables import QueuePair, Structure, Tables
from softdta.core.translator import Translator
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
    KEY_CHECKSUM_LEN,
    KEY_INCREMENT_EXT,
    KEY_INCREMENT_V1,
    KEY_WRITE_EXT,
    KEY_WRITE_V1,
    MAX_DATA_LEN,
    MAX_KEY_LEN,
    MAX_REDUNDANCY,
    PSN_MASK,
    RETH,
    ROCE_OPCODE_HEADERS,
    ROCE_PORT,
    UDP,
    AethKind,
    Counter,
    DtaOpcode,
    Header,
    RoceOpcode,
    Transport,
)
from softdta.wire.columns import Rows, byte_offset, gather, matches, scatter
from softdta.wire.frames import UdpEndpoints
from softdta.wire.hashing import key_hashes_rows, linear_crc_position_tables
from softdta.wire.icrc_split import VARIABLE_FROM, constant, linear_crc
from softdta.wire.roce import build_roce_frame, transport_payload

IP_AT = ETHERNET.size
UDP_AT = IP_AT + IPV4.size
PAYLOAD_AT = UDP_AT + UDP.size  # the DTA report, or the BTH of a RoCEv2 frame
IPV4_SIZE, UDP_SIZE = IPV4.size, UDP.size  # Header.size sums its fields on every access
IPV4_MIN_IHL = IPV4.size // 4
VECTOR_KINDS = (DtaOpcode.KEY_WRITE, DtaOpcode.KEY_INCREMENT)
ACK_OPCODES = (RoceOpcode.RC_ACK, RoceOpcode.RC_ATOMIC_ACK)

VECTOR, INDEPENDENT, ACK, BARRIER = range(4)  # the role of a frame in its batch
# Below this many frames the oracle is faster: a vectorized batch has a fixed cost of a few hundred numpy
# calls, about ten frames' worth of the oracle (docs/primitives.md).
MIN_VECTOR_BATCH = 12


@dataclass
class BatchOutput:
    """What a batch produced: RoCEv2 frames (in PSN order per QP), NACKs for reporters, and the positions of
    the essential reports deferred until their QP can send (the caller offers them again later)."""

    frames: list[bytes] = field(default_factory=list)
    to_reporter: list[bytes] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)


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


@dataclass
class _Template:
    """One QP's frame of one opcode and payload length, with zeros where each frame's own values go.

    The iCRC of a frame is `icrc_constant` XOR, for each of the `variable` byte columns, that byte's share of
    the linear CRC (`shares`, one 256-entry table per column): the rest of the frame is the template's."""

    frame: Rows
    extension_at: int  # where the opcode's first extended header starts
    payload_at: int
    icrc_constant: int = 0
    variable: list[int] = field(default_factory=list)
    shares: npt.NDArray[np.uint32] = field(default_factory=lambda: np.empty((0, 256), dtype=np.uint32))
    share_rows: npt.NDArray[np.int64] = field(default_factory=lambda: np.empty(0, dtype=np.int64))


class BatchTranslator:
    """Translates batches with `oracle`'s tables and state; the oracle stays usable (and in step) between
    batches, for ticks, flushes and single frames."""

    def __init__(self, oracle: Translator):
        self.oracle = oracle
        self._tables: Tables | None = None
        self._templates: dict[tuple[int, RoceOpcode, int], _Template] = {}
        self._vector_qps: set[int] = set()
        self._exclusive = True
        self._ack_qp: dict[int, int] = {}  # batch position of an ACK of a vector QP -> that QP's index
        self._plugin_opcodes: frozenset[int] = frozenset(
            opcode for opcode in oracle.primitives if opcode not in set(DtaOpcode))

    def process_batch(self, frames: Sequence[bytes], now_ns: int = 0) -> BatchOutput:
        self._follow_tables()
        out = BatchOutput()
        count = len(frames)
        if count < MIN_VECTOR_BATCH:
            for position in range(count):
                self._through_oracle(frames, position, now_ns, out)
            return out
        self._ack_qp = {}
        roles, pieces = self._classify(frames)
        start = 0
        for barrier in [*np.flatnonzero(roles == BARRIER).tolist(), count]:
            if start < barrier:
                self._segment(frames, roles, pieces, start, barrier, now_ns, out)
            if barrier < count:
                self._through_oracle(frames, barrier, now_ns, out)
            start = barrier + 1
        return out

    # ----------------------------------------------------------------------------------------------
    # roles

    def _follow_tables(self) -> None:
        tables = self.oracle.tables
        if tables is self._tables:
            return
        self._tables, self._templates = tables, {}
        vector = {s.qp.index for s in tables.structures if s.primitive in VECTOR_KINDS}
        others = {s.qp.index for s in tables.structures if s.primitive not in VECTOR_KINDS}
        others |= {lists.qp.index for lists in tables.append_lists}
        self._vector_qps, self._exclusive = vector, not vector & others

    def _classify(self, frames: Sequence[bytes]) -> tuple[npt.NDArray[np.int8], list[_Piece]]:
        lengths = np.fromiter(map(len, frames), dtype=np.int64, count=len(frames))
        roles = np.full(len(frames), BARRIER, dtype=np.int8)
        pieces: list[_Piece] = []
        shortest, longest = int(lengths.min()), int(lengths.max())
        for length in [shortest] if shortest == longest else np.unique(lengths).tolist():
            positions = np.flatnonzero(lengths == length)
            if len(positions) == len(frames):
                rows = np.frombuffer(b"".join(frames), dtype=np.uint8).reshape(len(frames), length)
            else:
                chosen = operator.itemgetter(*positions.tolist())(frames)
                rows = np.frombuffer(b"".join(chosen) if len(positions) > 1 else chosen, dtype=np.uint8)
                rows = rows.reshape(len(positions), length)
            self._classify_rows(rows, positions, roles, pieces)
        return roles, pieces

    def _classify_rows(self, rows: Rows, positions: npt.NDArray[np.int64], roles: npt.NDArray[np.int8],
                       pieces: list[_Piece]) -> None:
        """Roles of frames of one length, and the vector pieces among them."""
        length = rows.shape[1]
        if length < PAYLOAD_AT + 1:
            roles[positions] = np.where(_ethertype(rows) != ETH_P_IP, INDEPENDENT, BARRIER) \
                if length >= ETHERNET.size else INDEPENDENT
            return
        ipv4 = _ethertype(rows) == ETH_P_IP
        shaped, payload_len = _plain_udp4(rows)
        dport = gather(rows, UDP_AT, UDP, "dport")
        roles[positions[~ipv4]] = INDEPENDENT  # the oracle passes what is not IPv4, untouched
        neither = shaped & (dport != DTA_PORT) & (dport != ROCE_PORT)
        roles[positions[neither]] = INDEPENDENT
        reports = shaped & (dport == DTA_PORT)
        if reports.any():
            self._classify_reports(rows[reports], positions[reports], payload_len[reports], roles, pieces)
        replies = shaped & (dport == ROCE_PORT)
        if replies.any():
            self._classify_replies(rows[replies], positions[replies], payload_len[replies], roles)

    def _classify_reports(self, rows: Rows, positions: npt.NDArray[np.int64], payload_len: npt.NDArray[np.int64],
                          roles: npt.NDArray[np.int8], pieces: list[_Piece]) -> None:
        extended = (rows[:, PAYLOAD_AT] & EXTENDED_MARKER) != 0
        base = self.oracle.tables.profile.base_header
        opcode = np.where(extended, gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "opcode"),
                          gather(rows, PAYLOAD_AT, base, "opcode")).astype(np.int64)
        vector_kind = np.logical_or.reduce([opcode == kind for kind in VECTOR_KINDS])
        plugin = extended & np.isin(opcode, list(self._plugin_opcodes)) if self._plugin_opcodes \
            else np.zeros(len(opcode), dtype=bool)
        if self._exclusive:
            roles[positions[~vector_kind & ~plugin]] = INDEPENDENT
        dst = gather(rows, IP_AT, IPV4, "dst")
        candidates = np.flatnonzero(vector_kind)
        if not len(candidates):
            return
        # one layout per (format, opcode, destination, payload length): vectorize each
        layout = (extended[candidates].astype(np.uint64) << np.uint64(63)) | \
            (opcode[candidates].astype(np.uint64) << np.uint64(48)) | \
            (payload_len[candidates].astype(np.uint64) << np.uint64(32)) | dst[candidates]
        if (layout == layout[0]).all():  # the common case: one layout, no sort
            unique, inverse = layout[:1], np.zeros(len(layout), dtype=np.int64)
        else:
            unique, inverse = np.unique(layout, return_inverse=True)
        for index, packed in enumerate(unique.tolist()):
            members = candidates if len(unique) == 1 else candidates[inverse == index]
            is_extended, kind = packed >> 63, (packed >> 48) & 0xFF
            size, address = (packed >> 32) & 0xFFFF, packed & 0xFFFFFFFF
            structure = self.oracle.tables.structure(int(address).to_bytes(4, "big"), DtaOpcode(kind))
            if structure is None:
                continue  # a counted drop: the oracle's, at its place (a barrier)
            piece = _decode_piece(rows[members], positions[members], structure, DtaOpcode(kind), bool(is_extended),
                                  int(size), base)
            if piece is not None and len(piece.positions):
                roles[piece.positions] = VECTOR
                pieces.append(piece)

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
        if self._exclusive:
            roles[positions[~vector_qp]] = INDEPENDENT

    # ----------------------------------------------------------------------------------------------
    # a segment: the rows between two barriers

    def _segment(self, frames: Sequence[bytes], roles: npt.NDArray[np.int8], pieces: list[_Piece], start: int,
                 end: int, now_ns: int, out: BatchOutput) -> None:
        oracle = self.oracle
        ready: dict[int, bool] = {}
        by_structure: dict[int, list[_Piece]] = {}
        for piece in pieces:
            low, high = np.searchsorted(piece.positions, [start, end])
            if low == high:
                continue
            qp = piece.structure.qp
            if qp.index not in ready:  # asked when the oracle would ask: at the QP's first report here
                ready[qp.index] = oracle.qp_ready(qp, now_ns)
            if not ready[qp.index]:  # dropped or deferred: by the oracle, in order
                roles[piece.positions[low:high]] = INDEPENDENT
                continue
            by_structure.setdefault(piece.structure.qp.index, []).append(_slice(piece, low, high))
        emitted: dict[int, npt.NDArray[np.int64]] = {}  # QP index -> the batch position of each frame it sent
        first_psn: dict[int, int] = {}
        for qp_index, parts in by_structure.items():
            first_psn[qp_index] = oracle.qp_state[qp_index].next_psn
            emitted[qp_index] = self._emit(parts, out)
        for position in np.flatnonzero(roles[start:end] == INDEPENDENT).tolist():
            self._through_oracle(frames, start + position, now_ns, out)
        for position in np.flatnonzero(roles[start:end] == ACK).tolist():
            self._ack(frames, start + position, emitted, first_psn, now_ns, out)

    def _ack(self, frames: Sequence[bytes], position: int, emitted: dict[int, npt.NDArray[np.int64]],
             first_psn: dict[int, int], now_ns: int, out: BatchOutput) -> None:
        """An ACK of a vector QP, judged with the next PSN its QP had when the ACK arrived."""
        qp_index = self._ack_qp[position]
        if qp_index not in emitted:
            self._through_oracle(frames, position, now_ns, out)
            return
        runtime = self.oracle.qp_state[qp_index]
        sent_before = int(np.searchsorted(emitted[qp_index], position))
        after = runtime.next_psn
        runtime.next_psn = (first_psn[qp_index] + sent_before) & PSN_MASK
        try:
            self._through_oracle(frames, position, now_ns, out)
        finally:
            runtime.next_psn = after

    def _through_oracle(self, frames: Sequence[bytes], position: int, now_ns: int, out: BatchOutput) -> None:
        result = self.oracle.process(frames[position], now_ns)
        out.frames += result.frames
        out.to_reporter += result.to_reporter
        if result.deferred:
            out.deferred.append(position)

    # ----------------------------------------------------------------------------------------------
    # frames

    def _emit(self, parts: list[_Piece], out: BatchOutput) -> npt.NDArray[np.int64]:
        """The frames of one structure's vector rows in a segment, in batch order and copy order; returns the
        batch position of each frame sent."""
        structure = parts[0].structure
        qp = structure.qp
        oracle = self.oracle
        # one request per frame, in batch order and copy order: each piece's rows expanded into their copies
        requests = [_requests(piece) for piece in parts]
        positions, copies, slots, immediate, checksums, values = (
            np.concatenate(column) if len(parts) > 1 else column[0] for column in zip(*requests))
        if len(parts) > 1:  # each piece is in batch order already; interleave them
            order = np.lexsort((copies, positions))
            positions, slots, immediate, checksums, values = (
                column[order] for column in (positions, slots, immediate, checksums, values))
        sent = len(positions)
        runtime = oracle.qp_state[qp.index]
        psn = (runtime.next_psn + np.arange(sent, dtype=np.uint64)) & np.uint64(PSN_MASK)
        interval = oracle.tables.ack_request_interval
        numbers = runtime.frames_sent + 1 + np.arange(sent, dtype=np.uint64)
        ack_req = (numbers % np.uint64(interval) == 0) if qp.transport is Transport.RC and interval > 0 \
            else np.zeros(sent, dtype=bool)
        runtime.frames_sent += sent
        runtime.next_psn = (runtime.next_psn + sent) & PSN_MASK
        slots &= np.uint32(structure.slot_count - 1)
        va = np.uint64(qp.base_va) + slots.astype(np.uint64) * np.uint64(structure.slot_size)

        built: list[tuple[npt.NDArray[np.bool_], Rows]] = []
        if structure.primitive is DtaOpcode.KEY_INCREMENT:
            template = self._template(qp, RoceOpcode.RC_FETCH_ADD, 0, {"atomic_eth": {"rkey": qp.rkey}})
            frames = _stamp(template, psn, ack_req)
            scatter(frames, template.extension_at, ATOMIC_ETH, "va", va)
            scatter(frames, template.extension_at, ATOMIC_ETH, "swap_add", values)
            built.append((np.ones(sent, dtype=bool), _seal(template, frames)))
        else:
            payload_len = KEY_CHECKSUM_LEN + structure.data_len
            for with_immediate in (False, True):
                mine = immediate == with_immediate
                if not mine.any():
                    continue
                opcode = _write_opcode(qp.transport, with_immediate)
                template = self._template(qp, opcode, payload_len, {"reth": {"rkey": qp.rkey,
                                                                             "dma_length": payload_len}})
                frames = _stamp(template, psn[mine], ack_req[mine])
                scatter(frames, template.extension_at, RETH, "va", va[mine])
                if with_immediate:
                    scatter(frames, template.extension_at + RETH.size, IMMDT, "immediate", checksums[mine])
                payload = template.payload_at
                frames[:, payload:payload + KEY_CHECKSUM_LEN] = \
                    checksums[mine].astype("<u4").view(np.uint8).reshape(-1, KEY_CHECKSUM_LEN)
                frames[:, payload + KEY_CHECKSUM_LEN:payload + payload_len] = values[mine]
                built.append((mine, _seal(template, frames)))
        out.frames += _in_order(built, sent)
        counters_tally = oracle.counters
        counters_tally[Counter.TX_FRAMES] += sent
        reports = sum(len(piece.positions) for piece in parts)
        counters_tally[Counter.RX_REPORTS] += reports
        counters_tally[Counter(Counter.RX_KEY_WRITE + structure.primitive - 1)] += reports
        return positions

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
            template.variable = variable
            template.shares = linear_crc_position_tables(len(tail))[[column - tail_at for column in variable]]
            template.share_rows = np.arange(len(variable))
            self._templates[key] = template
        return template


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
    if extended:
        sub = KEY_WRITE_EXT if kind is DtaOpcode.KEY_WRITE else KEY_INCREMENT_EXT
        sub_at = PAYLOAD_AT + DTA_BASE_EXT.size
        take = gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "marker") == EXTENDED_FIRST_BYTE
        take &= gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "retransmit") == 0
        take &= gather(rows, sub_at, sub, "key_len") == key_len
        immediate = gather(rows, PAYLOAD_AT, DTA_BASE_EXT, "immediate") != 0
        key_at = sub_at + sub.size
        data_at = key_at + key_len
        expected = DTA_BASE_EXT.size + sub.size + key_len
        if kind is DtaOpcode.KEY_WRITE:
            take &= gather(rows, sub_at, sub, "data_len") == structure.data_len
            expected += structure.data_len
    else:
        sub = KEY_WRITE_V1 if kind is DtaOpcode.KEY_WRITE else KEY_INCREMENT_V1
        sub_at = PAYLOAD_AT + base.size
        if key_len != 4 or (kind is DtaOpcode.KEY_WRITE and structure.data_len != 4):
            return None  # dta-v1 keys and data are 32 bits: the oracle drops these (bad length)
        take = np.ones(len(rows), dtype=bool)
        if "retransmit" in {f.name for f in base.fields}:
            take &= gather(rows, PAYLOAD_AT, base, "retransmit") == 0
        immediate = gather(rows, PAYLOAD_AT, base, "immediate") != 0
        key_at = sub_at + byte_offset(sub, "key")
        data_at = sub_at + byte_offset(sub, "data") if kind is DtaOpcode.KEY_WRITE else 0
        expected = base.size + sub.size
    if size != expected:
        return None
    redundancy = gather(rows, sub_at, sub, "redundancy").astype(np.int64)
    take &= (redundancy >= 1) & (redundancy <= MAX_REDUNDANCY)
    rows, positions, redundancy, immediate = rows[take], positions[take], redundancy[take], immediate[take]
    keys = np.ascontiguousarray(rows[:, key_at:key_at + key_len])
    checksums, slot_hashes = key_hashes_rows(keys, int(redundancy.max(initial=1)), structure.key_hash)
    piece = _Piece(structure, kind, positions, redundancy, immediate, checksums, slot_hashes)
    if kind is DtaOpcode.KEY_WRITE:
        piece.data = rows[:, data_at:data_at + structure.data_len]
    else:
        piece.counter = gather(rows, sub_at, sub, "counter")
    return piece


def _requests(piece: _Piece) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint32],
                                      npt.NDArray[np.bool_], npt.NDArray[np.uint32], np.ndarray]:
    """One entry per frame of the piece's rows, copy by copy: batch position, copy, slot hash, immediate flag,
    key checksum, and the data (Key-Write) or counter (Key-Increment)."""
    if piece.redundancy.max() == 1:
        rows = np.arange(len(piece.positions))
        copies = np.zeros(len(rows), dtype=np.int64)
    else:
        rows = np.repeat(np.arange(len(piece.positions)), piece.redundancy)
        copies = np.arange(len(rows)) - np.repeat(np.cumsum(piece.redundancy) - piece.redundancy, piece.redundancy)
    values = piece.data if piece.data is not None else cast(npt.NDArray[np.uint64], piece.counter)
    return (piece.positions[rows], copies, piece.slot_hashes[copies, rows], piece.immediate[rows],
            piece.checksums[rows], values[rows])


def _slice(piece: _Piece, low: int, high: int) -> _Piece:
    return _Piece(piece.structure, piece.kind, piece.positions[low:high], piece.redundancy[low:high],
                  piece.immediate[low:high], piece.checksums[low:high], piece.slot_hashes[:, low:high],
                  None if piece.data is None else piece.data[low:high],
                  None if piece.counter is None else piece.counter[low:high])


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
    shares = template.shares[template.share_rows, frames[:, template.variable]]  # (frames, variable bytes)
    state = np.bitwise_xor.reduce(shares, axis=1) ^ np.uint32(template.icrc_constant)
    frames[:, -ICRC_LEN:] = state.astype("<u4").view(np.uint8).reshape(-1, ICRC_LEN)
    return frames


def _columns(at: int, header: Header, name: str) -> range:
    """The frame's byte columns that hold field `name` of the header at `at`."""
    start, bits = header.span(name)
    return range(at + start // 8, at + (start + bits + 7) // 8)


def _in_order(built: list[tuple[npt.NDArray[np.bool_], Rows]], sent: int) -> list[bytes]:
    """The frames of one QP as bytes, in PSN order, from the arrays each template built."""
    if len(built) == 1:
        rows = built[0][1]
        blob, width = rows.tobytes(), rows.shape[1]
        return [blob[at:at + width] for at in range(0, len(blob), width)]
    ordered: list[bytes] = [b""] * sent
    for mine, rows in built:
        blob, width = rows.tobytes(), rows.shape[1]
        for place, at in zip(np.flatnonzero(mine).tolist(), range(0, len(blob), width)):
            ordered[place] = blob[at:at + width]
    return ordered

