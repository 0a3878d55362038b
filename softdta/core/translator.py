"""The reference translator: DTA report frames in, RoCEv2 frames out (sans-IO; the oracle for every engine).

`Translator.process(frame, now_ns)` takes one Ethernet frame and returns an `Output`: RoCEv2 frames for
collectors, NACK frames for reporters, a drop reason, whether the report was deferred to userspace (essential
reports while their QP cannot send), or that the frame is not ours and passes up the stack. Time is an
argument, never read from a clock, so runs are reproducible.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from softdta.core import registry
from softdta.core.primitives import Output, PluginReport, Primitive, Target
from softdta.core.tables import AppendLists, Fleet, QueuePair, Structure, Tables
from softdta.spec import (
    DTA_BASE_EXT,
    DTA_NACK_PORT,
    DTA_PORT,
    EXTENDED_MARKER,
    PRIMITIVES,
    PSN_MASK,
    ROCE_PORT,
    SEQ_WINDOW,
    AethKind,
    NackKind,
    NakCode,
    QpState,
    RoceOpcode,
    TranslatorCounter,
    Transport,
)
from softdta.wire.codec import WireError, codec
from softdta.wire.dta import Nack, Report, decode, encode_nack
from softdta.wire.frames import UdpEndpoints, UdpFrame, build_udp_frame, parse_udp_frame
from softdta.wire.roce import aeth_kind, build_roce_frame, parse_roce, transport_payload

__all__ = ["Output", "QpRuntime", "Translator"]

_BASE_EXT = codec(DTA_BASE_EXT)


@dataclass
class QpRuntime:
    next_psn: int
    state: QpState = QpState.ACTIVE
    grace_until_ns: int = 0
    frames_sent: int = 0
    flush_mark: int = 0  # frames_sent when the flusher last found the QP busy
    flush_mark_ns: int = 0
    unacked_psn: int | None = None  # oldest PSN not yet acknowledged; None: next_psn (nothing outstanding)

    def __post_init__(self) -> None:
        if self.unacked_psn is None:
            self.unacked_psn = self.next_psn

    def outstanding(self, psn: int) -> bool:
        """Whether `psn` is in [unacked_psn, next_psn), modulo 2^24: the only PSNs an RC requester takes a reply
        for (IBTA 9.7.5.1). Anything else is stale or forged."""
        unacked = cast(int, self.unacked_psn)  # set by __post_init__
        return (psn - unacked) & PSN_MASK < (self.next_psn - unacked) & PSN_MASK


class Translator:
    """Runs every registered primitive (`softdta.core.registry`) and the `plugins`, extra `primitives.Primitive`
    classes, each with an opcode no other primitive has."""

    def __init__(self, tables: Tables, plugins: tuple[type[Primitive], ...] | list[type[Primitive]] = ()):
        self.tables = tables
        self.counters: Counter[TranslatorCounter] = Counter()
        self.qp_state = {qp.index: QpRuntime(qp.start_psn) for qp in tables.qps}
        self.reporter_seqnum: dict[bytes, int] = {}
        # (token, first ns, the index the primitive gave, its target, RX queue, the primitive)
        self.flush_queue: deque[tuple[int, int, int, Target | None, int, Primitive]] = deque()
        self.queue = 0  # the RX queue of the frame being translated, or of the flush entry being written
        self._tokens = 0
        self.primitives: dict[int, Primitive] = {}
        for cls in (*registry.registered(), *plugins):
            if cls.opcode in self.primitives:
                raise ValueError(f"primitive {cls.__name__} takes opcode {cls.opcode}, which "
                                 f"{type(self.primitives[cls.opcode]).__name__} already has")
            self.primitives[cls.opcode] = cls(self)

    def primitive(self, opcode: int) -> Primitive:
        return self.primitives[opcode]

    # ----------------------------------------------------------------------------------------------
    # entry points

    def retable(self, tables: Tables) -> None:
        """Translate with `tables` from now on (a live change); each primitive adjusts its state to them."""
        old, self.tables = self.tables, tables
        for primitive in self.primitives.values():
            primitive.retabled(old)

    def process(self, frame: bytes, now_ns: int = 0, queue: int = 0) -> Output:
        """`queue`: the RX queue the frame arrived on; its reports write through that queue's QPs."""
        self.queue = queue
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

    def counts(self) -> Counter[TranslatorCounter]:
        return Counter(self.counters)

    def flush_idle(self, now_ns: int = 0, idle_ns: int = 0) -> list[bytes]:
        """Write out Append batches and Postcarding paths that have waited at least `idle_ns`, oldest first.

        This models the kernel's flush queue exactly. Entries whose batch filled or whose path completed are
        dropped; the oldest entry that is not yet due ends the pass; an entry whose QP is not idle goes to the back,
        and meeting it a second time without a write in between ends the pass.
        A QP is idle once the data path has not emitted on it for `idle_ns`, as seen by earlier flush passes: the
        kernel flushes from another CPU than the one translating, and this keeps the two from interleaving PSNs.
        """
        frames: list[bytes] = []
        pushed_back: Counter[int] = Counter()  # since the last write; the second time round ends the pass
        while self.flush_queue:
            entry = self.flush_queue[0]
            token, first_ns, index, target, queue, primitive = entry
            owner = primitive.flush_target(index, target)
            pending = None if owner is None else primitive.pending(token, index, owner)
            if owner is None or pending is None:
                self.flush_queue.popleft()
                continue
            if now_ns - first_ns < idle_ns or pushed_back[token] >= 2:
                break
            self.flush_queue.popleft()
            # written through the QP of the queue whose report started it, or queue 0's if that is gone
            self.queue = queue if owner.qp_on(queue) else 0
            qp = self.sender(owner)
            if not self._qp_flushable(qp, now_ns, idle_ns):
                self.flush_queue.append(entry)
                pushed_back[token] += 1
                continue
            frames += primitive.flush(owner, index, pending)
            runtime = self.qp_state[qp.index]
            runtime.flush_mark = runtime.frames_sent  # the flush's own frames do not make the QP busy
            pushed_back.clear()
        return frames

    def _qp_flushable(self, qp: QueuePair, now_ns: int, idle_ns: int) -> bool:
        runtime = self.qp_state[qp.index]
        if not self.qp_ready(qp, now_ns):
            return False
        if runtime.frames_sent != runtime.flush_mark:  # the data path emitted since the last look
            runtime.flush_mark, runtime.flush_mark_ns = runtime.frames_sent, now_ns
            return False
        return now_ns - runtime.flush_mark_ns >= idle_ns

    def resync(self, qp: QueuePair, psn: int, now_ns: int) -> None:
        """Set a QP's next PSN (control plane, or a sequence-error NAK) and start its grace period."""
        runtime = self.qp_state[qp.index]
        runtime.next_psn = runtime.unacked_psn = psn & PSN_MASK
        runtime.state = QpState.GRACE
        runtime.grace_until_ns = now_ns + self.tables.grace_ns

    def revive(self, qp: QueuePair, psn: int) -> None:
        """Bring a failed QP back after the collector re-created its end (control plane)."""
        self.qp_state[qp.index] = QpRuntime(psn & PSN_MASK)

    # ----------------------------------------------------------------------------------------------
    # reports

    def _report(self, udp: UdpFrame, now_ns: int) -> Output:
        self.counters[TranslatorCounter.RX_REPORTS] += 1
        try:
            report = self._decode(udp.payload)
        except WireError as error:
            return self.drop(TranslatorCounter[f"DROP_{error.reason}"])
        primitive = self.primitives[report.opcode]
        if primitive.rx_counter is not None:
            self.counters[primitive.rx_counter] += 1
        if report.retransmit:
            verdict = self._check_sequence(udp, report)
            if verdict is not None:
                return verdict
        out = primitive.translate(udp, report, now_ns)
        self.counters[TranslatorCounter.TX_FRAMES] += len(out.frames)
        self.counters[TranslatorCounter.TX_NACKS] += len(out.to_reporter)
        return out

    def _decode(self, payload: bytes) -> Report | PluginReport:
        """The spec's primitives' reports through `dta.decode` (dta-v1 and extended); extended reports of any other
        primitive through that primitive."""
        if len(payload) >= _BASE_EXT.size and payload[0] & EXTENDED_MARKER:
            base, offset = _BASE_EXT.unpack(payload)
            primitive = self.primitives.get(base["opcode"])
            if primitive is not None and base["opcode"] not in PRIMITIVES:
                return primitive.decode(base, payload, offset)
        return decode(payload, self.tables.profile)

    def drop(self, reason: TranslatorCounter) -> Output:
        self.counters[reason] += 1
        return Output(drop=reason)

    def sender(self, target: Structure | AppendLists) -> QueuePair:
        """The QP of `target` that the current RX queue writes through (checked to exist by the primitive)."""
        return cast(QueuePair, target.qp_on(self.queue))

    def blocked(self, qp: QueuePair, report: Report | PluginReport, now_ns: int) -> Output | None:
        """None if the QP may send now; otherwise the drop (or deferral of an essential report)."""
        if self.qp_ready(qp, now_ns):
            return None
        if report.essential:
            self.counters[TranslatorCounter.ESSENTIAL_DEFERRED] += 1
            return Output(deferred=True)
        state = self.qp_state[qp.index].state
        return self.drop(TranslatorCounter.DROP_QP_FAILED if state is QpState.FAILED else TranslatorCounter.DROP_GRACE)

    def gate(self, qp: QueuePair, essential: npt.NDArray[np.bool_],
             now_ns: int) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """`blocked` for many reports to one QP at once: which may go on, and which are deferred (essential);
        the rest are counted drops."""
        if self.qp_ready(qp, now_ns):
            return np.ones(len(essential), dtype=bool), np.zeros(len(essential), dtype=bool)
        self.counters[TranslatorCounter.ESSENTIAL_DEFERRED] += int(essential.sum())
        failed = self.qp_state[qp.index].state is QpState.FAILED
        reason = TranslatorCounter.DROP_QP_FAILED if failed else TranslatorCounter.DROP_GRACE
        self.counters[reason] += int((~essential).sum())
        return np.zeros(len(essential), dtype=bool), essential.copy()

    def qp_ready(self, qp: QueuePair, now_ns: int) -> bool:
        """Whether the QP may send at `now_ns`; a QP whose grace period is over becomes active."""
        runtime = self.qp_state[qp.index]
        if runtime.state is QpState.GRACE and now_ns >= runtime.grace_until_ns:
            runtime.state = QpState.ACTIVE
        return runtime.state is QpState.ACTIVE

    def _check_sequence(self, udp: UdpFrame, report: Report | PluginReport) -> Output | None:
        """Go-back-N tracking per reporter IP: accept the next seqnum, NACK a gap, drop a duplicate."""
        last = self.reporter_seqnum.get(udp.src_ip)
        if last is None or report.seqnum == (last + 1) & 0xFF:
            self.reporter_seqnum[udp.src_ip] = report.seqnum
            return None
        if (last - report.seqnum) & 0xFF < SEQ_WINDOW:
            return self.drop(TranslatorCounter.DROP_DUPLICATE)
        out = self.drop(TranslatorCounter.DROP_SEQUENCE_GAP)
        out.to_reporter.append(self.nack_frame(udp, Nack(NackKind.SEQUENCE, last, extended=report.extended)))
        self.counters[TranslatorCounter.TX_NACKS] += 1
        return out

    def nack_frame(self, udp: UdpFrame, nack: Nack) -> bytes:
        ends = UdpEndpoints(src_mac=self.tables.mac, dst_mac=udp.eth["src"], src_ip=udp.dst_ip,
                            dst_ip=udp.src_ip, sport=DTA_PORT, dport=DTA_NACK_PORT, dscp=self.tables.dscp,
                            ttl=self.tables.ttl)
        return build_udp_frame(ends, encode_nack(nack))

    def structure(self, udp: UdpFrame, kind: int, report: Report | PluginReport,
                  key: bytes | None = None) -> Structure | Output:
        """The collector structure of primitive `kind` at the report's destination (at the fleet address: the first
        of its slot's replicas that has one), or the drop when there is none or when the key (`report.key` unless
        given) does not fit it."""
        structures = self.replica_structures(udp, kind, report)
        if isinstance(structures, Output):
            return structures
        structure = structures[0]
        key = cast(Report, report).key if key is None else key  # plug-ins pass their key
        if len(key) != structure.key_len:
            return self.drop(TranslatorCounter.DROP_BAD_LENGTH)
        return structure

    def replica_structures(self, udp: UdpFrame, kind: int, report: Report | PluginReport) -> list[Structure] | Output:
        """The structures of primitive `kind` a report may go to: the one at its destination IP; at the fleet's
        address, those of the replicas of its partition key's slot that have one, in replica order."""
        fleet = self.tables.fleet
        if fleet is None or udp.dst_ip != fleet.address:
            structure = self.tables.structure(udp.dst_ip, kind)
            return [structure] if structure is not None else self.drop(TranslatorCounter.DROP_UNKNOWN_COLLECTOR)
        found = self._replicas(report, kind)
        if not found:
            return self.drop(TranslatorCounter.DROP_FLEET_UNMAPPED)
        self.counters[TranslatorCounter.FLEET_RESOLVED] += 1
        return found

    def _replicas(self, report: Report | PluginReport, kind: int) -> list[Structure]:
        """The structures of primitive `kind` at the replicas of the report's slot that have one, in order."""
        replicas = cast(Fleet, self.tables.fleet).replicas(self.primitives[kind].partition_key(report))
        return [structure for ip in replicas if (structure := self.tables.structure(ip, kind)) is not None]

    def copy_structures(self, udp: UdpFrame, kind: int, report: Report | PluginReport, target: Structure,
                        copies: int, now_ns: int) -> list[Structure | None]:
        """Where each of a report's `copies` goes: all into `target`, or, at the fleet's address with copies across
        collectors, copy n into the structure of replica n (mod the replicas). None: a copy whose queue pair may
        not send now, counted as that drop."""
        fleet = self.tables.fleet
        if fleet is None or not fleet.across or udp.dst_ip != fleet.address:
            return [target] * copies
        replicas = self._replicas(report, kind)  # counted as resolved once, when `target` was found
        placed: list[Structure | None] = []
        for copy in range(copies):
            structure = replicas[copy % len(replicas)]
            if structure is not target and not self._may_send(structure, now_ns):
                placed.append(None)
                continue
            placed.append(structure)
        return placed

    def _may_send(self, structure: Structure, now_ns: int) -> bool:
        qp = structure.qp_on(self.queue)
        if qp is None:
            self.counters[TranslatorCounter.DROP_NO_QUEUE_QP] += 1
            return False
        if not self.qp_ready(qp, now_ns):
            failed = self.qp_state[qp.index].state is QpState.FAILED
            self.counters[TranslatorCounter.DROP_QP_FAILED if failed else TranslatorCounter.DROP_GRACE] += 1
            return False
        return True

    def flush_later(self, by: Primitive, now_ns: int, index: int, target: Target | None) -> int:
        self._tokens += 1
        self.flush_queue.append((self._tokens, now_ns, index, target, self.queue, by))
        return self._tokens

    # ----------------------------------------------------------------------------------------------
    # frames

    def write(self, qp: QueuePair, offset: int, payload: bytes, report: Report | PluginReport | None,
              tag: int) -> bytes:
        immediate = report is not None and report.immediate
        if qp.transport is Transport.RC:
            opcode = RoceOpcode.RC_WRITE_ONLY_IMM if immediate else RoceOpcode.RC_WRITE_ONLY
        else:
            opcode = RoceOpcode.UC_WRITE_ONLY_IMM if immediate else RoceOpcode.UC_WRITE_ONLY
        if offset + len(payload) > qp.length:
            raise AssertionError(f"write of {len(payload)} B at offset {offset} leaves region of qp {qp.name}")
        headers = {"reth": {"va": qp.base_va + offset, "rkey": qp.rkey, "dma_length": len(payload)},
                   "immdt": {"immediate": tag & 0xFFFFFFFF}}
        return self.emit(qp, opcode, headers, payload)

    def emit(self, qp: QueuePair, opcode: RoceOpcode, headers: dict[str, dict[str, Any]], payload: bytes) -> bytes:
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
            return self.drop(TranslatorCounter[f"DROP_{error.reason}"])
        if reply.opcode not in (RoceOpcode.RC_ACK, RoceOpcode.RC_ATOMIC_ACK):
            return Output(passed=True)  # a CM MAD or a collector's SEND: for the control plane (softdta.core.cm)
        if not reply.icrc_ok:
            return self.drop(TranslatorCounter.DROP_BAD_ICRC)
        qp = self.tables.qp_by_local_qpn(reply.bth["dest_qp"])
        aeth = reply.headers["aeth"]
        if qp is None or qp.collector_ip != udp.src_ip:
            return self.drop(TranslatorCounter.DROP_UNKNOWN_QP)
        if qp.transport is Transport.UC:
            return self.drop(TranslatorCounter.DROP_REPLY_ON_UC)
        runtime, psn = self.qp_state[qp.index], reply.bth["psn"]
        if not runtime.outstanding(psn):
            return self.drop(TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW)
        kind, code = aeth_kind(aeth["syndrome"])
        if kind == AethKind.ACK:
            self.counters[TranslatorCounter.RX_ACKS] += 1
            runtime.unacked_psn = (psn + 1) & PSN_MASK  # acknowledges every PSN up to psn (coalesced ACKs)
            return Output()
        if kind == AethKind.RNR_NAK:
            self.counters[TranslatorCounter.RX_RNR_NAKS] += 1
            return Output()
        # the collector executed nothing from the NAK's PSN on: those writes are lost
        self.counters[TranslatorCounter.NAK_LOST_WRITES] += (runtime.next_psn - psn) & PSN_MASK
        if kind == AethKind.NAK and code == NakCode.PSN_SEQUENCE_ERROR:
            self.counters[TranslatorCounter.RX_NAK_SEQUENCE] += 1
            self.resync(qp, psn, now_ns)
        else:
            self.counters[TranslatorCounter.RX_NAK_FATAL] += 1
            self.qp_state[qp.index].state = QpState.FAILED
        return Output()

