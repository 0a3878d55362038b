"""The reference translator: DTA report frames in, RoCEv2 frames out (sans-IO; the oracle for every engine).

`Translator.process(frame, now_ns)` takes one Ethernet frame and returns an `Output`: RoCEv2 frames for
collectors, NACK frames for reporters, a drop reason, whether the report was deferred to userspace (essential
reports while their QP cannot send), or that the frame is not ours and passes up the stack. Time is an
argument, never read from a clock, so runs are reproducible.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections import deque
from dataclasses import dataclass, field

from .codec import WireError
from .dta import Nack, Report, decode, encode_nack
from .frames import UdpEndpoints, UdpFrame, build_udp_frame, parse_udp_frame
from .hashing import key_checksum, key_slot, postcard_hop_hash, postcard_slot_hash
from .roce import aeth_kind, build_roce_frame, parse_roce, transport_payload
from .spec import (DTA_NACK_PORT, DTA_PORT, ROCE_PORT, AethKind, Counter, DtaOpcode, NackKind, NakCode,
                   Primitive, QpState, RoceOpcode, SketchMerge, Transport)
from .tables import AppendLists, QueuePair, Structure, Tables

PSN_MASK = 0xFFFFFF
_SEQ_WINDOW = 128


@dataclass
class Output:
    frames: list[bytes] = field(default_factory=list)
    to_reporter: list[bytes] = field(default_factory=list)
    drop: Counter | None = None
    deferred: bool = False
    passed: bool = False


@dataclass
class QpRuntime:
    next_psn: int
    state: QpState = QpState.ACTIVE
    grace_until_ns: int = 0
    frames_sent: int = 0
    flush_mark: int = 0  # frames_sent when the flusher last found the QP busy
    flush_mark_ns: int = 0


@dataclass
class AppendRuntime:
    head: int = 0
    pending: list[bytes] = field(default_factory=list)
    first_pending_ns: int = 0
    token: int = 0  # names this batch in the flush queue


@dataclass
class PostcardEntry:
    key: bytes
    path_length: int
    values: list[int]
    hop_mask: int = 0
    first_ns: int = 0
    token: int = 0


@dataclass
class SketchRuntime:
    aggregate: list[list[int]]
    contributors: list[set[int]]
    next_column: dict[int, int] = field(default_factory=dict)


class Translator:
    def __init__(self, tables: Tables):
        self.tables = tables
        self.counters: Tally[Counter] = Tally()
        self.qp_state = {qp.index: QpRuntime(qp.start_psn) for qp in tables.qps}
        self.append_state: dict[int, AppendRuntime] = {}
        self.postcard_cache: dict[int, dict[int, PostcardEntry]] = {}
        self.sketch_state: dict[int, SketchRuntime] = {}
        self.reporter_seqnum: dict[bytes, int] = {}
        self.flush_queue: deque[tuple[int, int, int, object]] = deque()  # (token, first ns, list id | index, structure)
        self._tokens = 0
        self._handlers = {DtaOpcode.KEY_WRITE: self._key_write, DtaOpcode.KEY_INCREMENT: self._key_increment,
                          DtaOpcode.APPEND: self._append, DtaOpcode.POSTCARDING: self._postcard,
                          DtaOpcode.SKETCH_MERGE: self._sketch}

    # ----------------------------------------------------------------------------------------------
    # entry points

    def process(self, frame: bytes, now_ns: int = 0) -> Output:
        try:
            udp = parse_udp_frame(frame)
        except WireError:
            return Output(passed=True)
        if udp.is_ipv6:
            return Output(passed=True)
        dport = udp.udp["dport"]
        if dport == DTA_PORT:
            return self._report(udp, now_ns)
        if dport == ROCE_PORT and udp.src_ip in self.tables.collector_ips:
            return self._reply(frame, udp, now_ns)
        return Output(passed=True)

    def flush_idle(self, now_ns: int, idle_ns: int = 0) -> list[bytes]:
        """Write out Append batches and Postcarding paths that have waited at least `idle_ns`, oldest first.

        This models the kernel's flush queue exactly. Entries whose batch filled or whose path completed are
        dropped; the oldest entry that is not yet due ends the pass; an entry whose QP is not idle goes to the back,
        and meeting it a second time without a write in between ends the pass.
        A QP is idle once the data path has not emitted on it for `idle_ns`, as seen by earlier flush passes: the
        kernel flushes from another CPU than the one translating, and this keeps the two from interleaving PSNs.
        """
        frames: list[bytes] = []
        pushed_back: Tally[int] = Tally()  # since the last write; the second time round ends the pass
        while self.flush_queue:
            token, first_ns, index, structure = self.flush_queue[0]
            pending = self._pending_entry(token, index, structure)
            if pending is None:
                self.flush_queue.popleft()
                continue
            if now_ns - first_ns < idle_ns or pushed_back[token] >= 2:
                break
            self.flush_queue.popleft()
            qp = structure.qp if structure else self.tables.append_range(index).qp
            if not self._qp_flushable(qp, now_ns, idle_ns):
                self.flush_queue.append((token, first_ns, index, structure))
                pushed_back[token] += 1
                continue
            if structure is None:
                lists = self.tables.append_range(index)
                pending.pending += [bytes(lists.data_len)] * (lists.batch - len(pending.pending))
                self.counters[Counter.APPEND_FLUSHES] += 1
                frames += self._append_write(lists, index, pending, None)
            else:
                del self.postcard_cache[structure.qp.index][index]
                self.counters[Counter.POSTCARD_FLUSHES] += 1
                frames += self._postcard_write(structure, pending, None)
            runtime = self.qp_state[qp.index]
            runtime.flush_mark = runtime.frames_sent  # the flush's own frames do not make the QP busy
            pushed_back.clear()
        return frames

    def _pending_entry(self, token: int, index: int, structure: Structure | None):
        """The batch or cache entry a flush-queue entry names, if it is still waiting."""
        if structure is None:
            runtime = self.append_state.get(index)
            return runtime if runtime and runtime.pending and runtime.token == token else None
        entry = self.postcard_cache.get(structure.qp.index, {}).get(index)
        return entry if entry and entry.token == token else None

    def _qp_flushable(self, qp: QueuePair, now_ns: int, idle_ns: int) -> bool:
        runtime = self.qp_state[qp.index]
        if not self._qp_ready(qp, now_ns):
            return False
        if runtime.frames_sent != runtime.flush_mark:  # the data path emitted since the last look
            runtime.flush_mark, runtime.flush_mark_ns = runtime.frames_sent, now_ns
            return False
        return now_ns - runtime.flush_mark_ns >= idle_ns

    def resync(self, qp: QueuePair, psn: int, now_ns: int) -> None:
        """Set a QP's next PSN (control plane, or a sequence-error NAK) and start its grace period."""
        runtime = self.qp_state[qp.index]
        runtime.next_psn = psn & PSN_MASK
        runtime.state = QpState.GRACE
        runtime.grace_until_ns = now_ns + self.tables.grace_ns

    def revive(self, qp: QueuePair, psn: int) -> None:
        """Bring a failed QP back after the collector re-created its end (control plane)."""
        self.qp_state[qp.index] = QpRuntime(psn & PSN_MASK)

    # ----------------------------------------------------------------------------------------------
    # reports

    def _report(self, udp: UdpFrame, now_ns: int) -> Output:
        self.counters[Counter.RX_REPORTS] += 1
        try:
            report = decode(udp.payload, self.tables.profile)
        except WireError as error:
            return self._drop(Counter[f"DROP_{error.reason}"])
        self.counters[Counter(Counter.RX_KEY_WRITE + report.opcode - 1)] += 1
        if report.retransmit:
            verdict = self._check_sequence(udp, report)
            if verdict is not None:
                return verdict
        out = self._handlers[report.opcode](udp, report, now_ns)
        self.counters[Counter.TX_FRAMES] += len(out.frames)
        self.counters[Counter.TX_NACKS] += len(out.to_reporter)
        return out

    def _drop(self, reason: Counter) -> Output:
        self.counters[reason] += 1
        return Output(drop=reason)

    def _blocked(self, qp: QueuePair, report: Report, now_ns: int) -> Output | None:
        """None if the QP may send now; otherwise the drop (or deferral of an essential report)."""
        if self._qp_ready(qp, now_ns):
            return None
        if report.essential:
            self.counters[Counter.ESSENTIAL_DEFERRED] += 1
            return Output(deferred=True)
        state = self.qp_state[qp.index].state
        return self._drop(Counter.DROP_QP_FAILED if state is QpState.FAILED else Counter.DROP_GRACE)

    def _qp_ready(self, qp: QueuePair, now_ns: int) -> bool:
        runtime = self.qp_state[qp.index]
        if runtime.state is QpState.GRACE and now_ns >= runtime.grace_until_ns:
            runtime.state = QpState.ACTIVE
        return runtime.state is QpState.ACTIVE

    def _check_sequence(self, udp: UdpFrame, report: Report) -> Output | None:
        """Go-back-N tracking per reporter IP: accept the next seqnum, NACK a gap, drop a duplicate."""
        last = self.reporter_seqnum.get(udp.src_ip)
        if last is None or report.seqnum == (last + 1) & 0xFF:
            self.reporter_seqnum[udp.src_ip] = report.seqnum
            return None
        if (last - report.seqnum) & 0xFF < _SEQ_WINDOW:
            return self._drop(Counter.DROP_DUPLICATE)
        out = self._drop(Counter.DROP_SEQUENCE_GAP)
        out.to_reporter.append(self._nack_frame(udp, Nack(NackKind.SEQUENCE, last, extended=report.extended)))
        self.counters[Counter.TX_NACKS] += 1
        return out

    def _nack_frame(self, udp: UdpFrame, nack: Nack) -> bytes:
        ends = UdpEndpoints(src_mac=self.tables.mac, dst_mac=udp.eth["src"], src_ip=udp.dst_ip,
                            dst_ip=udp.src_ip, sport=DTA_PORT, dport=DTA_NACK_PORT, dscp=self.tables.dscp,
                            ttl=self.tables.ttl)
        return build_udp_frame(ends, encode_nack(nack))

    def _structure(self, udp: UdpFrame, primitive: Primitive, report: Report) -> Structure | Output:
        structure = self.tables.structure(udp.dst_ip, primitive)
        if structure is None:
            return self._drop(Counter.DROP_UNKNOWN_COLLECTOR)
        if len(report.key) != structure.key_len or \
                (primitive is Primitive.KEY_WRITE and len(report.data) != structure.data_len):
            return self._drop(Counter.DROP_BAD_LENGTH)
        return structure

    def _key_write(self, udp: UdpFrame, report: Report, now_ns: int) -> Output:
        structure = self._structure(udp, Primitive.KEY_WRITE, report)
        if isinstance(structure, Output):
            return structure
        blocked = self._blocked(structure.qp, report, now_ns)
        if blocked:
            return blocked
        payload = key_checksum(report.key).to_bytes(4, "little") + report.data
        out = Output()
        for copy in range(report.redundancy):
            offset = key_slot(report.key, copy, structure.slot_count, structure.key_hash) * structure.slot_size
            out.frames.append(self._write(structure.qp, offset, payload, report, key_checksum(report.key)))
        return out

    def _key_increment(self, udp: UdpFrame, report: Report, now_ns: int) -> Output:
        structure = self._structure(udp, Primitive.KEY_INCREMENT, report)
        if isinstance(structure, Output):
            return structure
        blocked = self._blocked(structure.qp, report, now_ns)
        if blocked:
            return blocked
        qp = structure.qp
        out = Output()
        for copy in range(report.redundancy):
            offset = key_slot(report.key, copy, structure.slot_count, structure.key_hash) * structure.slot_size
            atomic = {"va": qp.base_va + offset, "rkey": qp.rkey, "swap_add": report.counter, "compare": 0}
            out.frames.append(self._emit(qp, RoceOpcode.RC_FETCH_ADD, {"atomic_eth": atomic}, b""))
        return out

    def _append(self, udp: UdpFrame, report: Report, now_ns: int) -> Output:
        lists = self.tables.append_range(report.list_id)
        if lists is None:
            return self._drop(Counter.DROP_UNKNOWN_LIST)
        if len(report.data) != lists.data_len:
            return self._drop(Counter.DROP_BAD_LENGTH)
        blocked = self._blocked(lists.qp, report, now_ns)
        if blocked:
            return blocked
        runtime = self.append_state.setdefault(report.list_id, AppendRuntime())
        if not runtime.pending:
            runtime.first_pending_ns = now_ns
            runtime.token = self._flush_later(now_ns, report.list_id, None)
        runtime.pending.append(_append_entry(report.data))
        if len(runtime.pending) < lists.batch:
            self.counters[Counter.APPEND_BATCHED] += 1
            return Output()
        return Output(frames=self._append_write(lists, report.list_id, runtime, report))

    def _flush_later(self, now_ns: int, index: int, structure: Structure | None) -> int:
        self._tokens += 1
        self.flush_queue.append((self._tokens, now_ns, index, structure))
        return self._tokens

    def _append_write(self, lists: AppendLists, list_id: int, runtime: AppendRuntime,
                      report: Report | None) -> list[bytes]:
        offset = lists.ring_offset(list_id) + runtime.head * lists.data_len
        payload = b"".join(runtime.pending)
        runtime.pending = []
        runtime.head = (runtime.head + lists.batch) % lists.entries
        return [self._write(lists.qp, offset, payload, report, list_id)]

    def _postcard(self, udp: UdpFrame, report: Report, now_ns: int) -> Output:
        structure = self._structure(udp, Primitive.POSTCARDING, report)
        if isinstance(structure, Output):
            return structure
        path_length = report.path_length or structure.hops
        if report.hop > path_length or path_length > structure.hops:
            return self._drop(Counter.DROP_BAD_HOP)
        blocked = self._blocked(structure.qp, report, now_ns)
        if blocked:
            return blocked
        cache = self.postcard_cache.setdefault(structure.qp.index, {})
        index = postcard_slot_hash(report.key) & (structure.cache_entries - 1)
        encoded = int.from_bytes(report.data, "big") ^ postcard_hop_hash(report.key, report.hop)
        out = Output()
        entry = cache.get(index)
        if entry is not None and entry.key != report.key:
            if path_length == 1:
                # A one-hop path is complete on arrival: write it without evicting another flow's path.
                single = PostcardEntry(report.key, 1, [0] * structure.hops, hop_mask=1)
                single.values[report.hop - 1] = encoded
                return Output(frames=self._postcard_write(structure, single, report))
            self.counters[Counter.POSTCARD_EVICTIONS] += 1
            out.frames += self._postcard_write(structure, entry, None)
            entry = None
        if entry is None:
            entry = cache[index] = PostcardEntry(report.key, path_length, [0] * structure.hops, first_ns=now_ns,
                                                 token=self._flush_later(now_ns, index, structure))
        entry.values[report.hop - 1] = encoded
        entry.hop_mask |= 1 << (report.hop - 1)
        if entry.hop_mask.bit_count() >= entry.path_length:
            del cache[index]
            out.frames += self._postcard_write(structure, entry, report)
        elif not out.frames:
            self.counters[Counter.POSTCARD_CACHED] += 1
        return out

    def _postcard_write(self, structure: Structure, entry: PostcardEntry, report: Report | None) -> list[bytes]:
        offset = (postcard_slot_hash(entry.key) & (structure.slot_count - 1)) * structure.slot_size
        payload = b"".join(v.to_bytes(4, "big") for v in entry.values)
        return [self._write(structure.qp, offset, payload, report, key_checksum(entry.key))]

    def _sketch(self, udp: UdpFrame, report: Report, now_ns: int) -> Output:
        structure = self.tables.structure(udp.dst_ip, Primitive.SKETCH_MERGE)
        if structure is None:
            return self._drop(Counter.DROP_UNKNOWN_COLLECTOR)
        if report.reporter >= structure.reporters:
            return self._drop(Counter.DROP_UNKNOWN_REPORTER)
        if len(report.counters) != structure.rows or report.column >= structure.columns:
            return self._drop(Counter.DROP_BAD_LENGTH)
        runtime = self.sketch_state.setdefault(structure.qp.index, SketchRuntime(
            [[0] * structure.rows for _ in range(structure.columns)], [set() for _ in range(structure.columns)]))
        expected = runtime.next_column.get(report.reporter, 0)
        # A reporter that wrapped into its next epoch waits (NACKed) until the column's last epoch is written.
        if report.column != expected or report.reporter in runtime.contributors[expected]:
            out = self._drop(Counter.DROP_SKETCH_GAP if report.column > expected else Counter.DROP_SKETCH_STALE)
            nack = Nack(NackKind.SKETCH_COLUMN, expected, report.reporter, extended=True)
            out.to_reporter.append(self._nack_frame(udp, nack))
            return out
        blocked = self._blocked(structure.qp, report, now_ns)
        if blocked:
            return blocked
        runtime.next_column[report.reporter] = (expected + 1) % structure.columns
        column = runtime.aggregate[report.column]
        for row, value in enumerate(report.counters):
            column[row] = max(column[row], value) if structure.merge is SketchMerge.MAX \
                else (column[row] + value) & 0xFFFFFFFF
        runtime.contributors[report.column].add(report.reporter)
        self.counters[Counter.SKETCH_MERGED] += 1
        first = report.column - report.column % structure.batch
        group = range(first, first + structure.batch)
        if any(len(runtime.contributors[c]) < structure.reporters for c in group):
            return Output()
        payload = b"".join(v.to_bytes(4, "little") for c in group for v in runtime.aggregate[c])
        for c in group:
            runtime.aggregate[c] = [0] * structure.rows
            runtime.contributors[c] = set()
        return Output(frames=[self._write(structure.qp, first * structure.slot_size, payload, report, first)])

    # ----------------------------------------------------------------------------------------------
    # frames

    def _write(self, qp: QueuePair, offset: int, payload: bytes, report: Report | None, tag: int) -> bytes:
        immediate = report is not None and report.immediate
        if qp.transport is Transport.RC:
            opcode = RoceOpcode.RC_WRITE_ONLY_IMM if immediate else RoceOpcode.RC_WRITE_ONLY
        else:
            opcode = RoceOpcode.UC_WRITE_ONLY_IMM if immediate else RoceOpcode.UC_WRITE_ONLY
        if offset + len(payload) > qp.length:
            raise AssertionError(f"write of {len(payload)} B at offset {offset} leaves region of qp {qp.name}")
        headers = {"reth": {"va": qp.base_va + offset, "rkey": qp.rkey, "dma_length": len(payload)},
                   "immdt": {"immediate": tag & 0xFFFFFFFF}}
        return self._emit(qp, opcode, headers, payload)

    def _emit(self, qp: QueuePair, opcode: RoceOpcode, headers: dict, payload: bytes) -> bytes:
        runtime = self.qp_state[qp.index]
        interval = self.tables.ack_request_interval
        runtime.frames_sent += 1
        ack_req = qp.transport is Transport.RC and interval > 0 and runtime.frames_sent % interval == 0
        transport = transport_payload(opcode, qp.remote_qpn, runtime.next_psn, headers, payload, ack_req=ack_req)
        runtime.next_psn = (runtime.next_psn + 1) & PSN_MASK
        ends = UdpEndpoints(src_mac=self.tables.mac, dst_mac=qp.collector_mac, src_ip=self.tables.ip,
                            dst_ip=qp.collector_ip, sport=self.tables.udp_sport, dport=ROCE_PORT,
                            dscp=self.tables.dscp, ttl=self.tables.ttl)
        return build_roce_frame(ends, transport)

    # ----------------------------------------------------------------------------------------------
    # RoCE replies

    def _reply(self, frame: bytes, udp: UdpFrame, now_ns: int) -> Output:
        try:
            reply = parse_roce(frame, udp)
        except WireError as error:
            return self._drop(Counter[f"DROP_{error.reason}"])
        if reply.opcode not in (RoceOpcode.RC_ACK, RoceOpcode.RC_ATOMIC_ACK):
            return Output(passed=True)  # a CM MAD or a collector's SEND: for the control plane (softdta.cm)
        if not reply.icrc_ok:
            return self._drop(Counter.DROP_BAD_ICRC)
        qp = self.tables.qp_by_local_qpn(reply.bth["dest_qp"])
        aeth = reply.headers["aeth"]
        if qp is None or qp.collector_ip != udp.src_ip:
            return self._drop(Counter.DROP_UNKNOWN_QP)
        kind, code = aeth_kind(aeth["syndrome"])
        if kind == AethKind.ACK:
            self.counters[Counter.RX_ACKS] += 1
        elif kind == AethKind.RNR_NAK:
            self.counters[Counter.RX_RNR_NAKS] += 1
        elif kind == AethKind.NAK and code == NakCode.PSN_SEQUENCE_ERROR:
            self.counters[Counter.RX_NAK_SEQUENCE] += 1
            self.resync(qp, reply.bth["psn"], now_ns)
        else:
            self.counters[Counter.RX_NAK_FATAL] += 1
            self.qp_state[qp.index].state = QpState.FAILED
        return Output()


def _append_entry(data: bytes) -> bytes:
    """Append entries of 4 or 8 bytes are integers and stored little-endian (host order); others verbatim."""
    return data[::-1] if len(data) in (4, 8) else data
