"""The reference RoCEv2 responder: what a collector NIC does with the translator's frames (sans-IO).

It checks frames the way rdma_rxe does (iCRC, destination QP, source GID, PSN rules per transport, R_Key,
bounds, access flags; IP packets longer than RESPONDER_IP_LIMIT are malformed), applies RDMA WRITEs and
Fetch&Adds to memory, and produces ACK, NAK and Atomic ACK frames for RC. Collector backends are tested against it.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from softdta.spec import (
    ACK_SYNDROME,
    PSN_MASK,
    PSN_WINDOW,
    RESPONDER_IP_LIMIT,
    ROCE_PORT,
    Access,
    ResponderCounter,
    RoceOpcode,
    Transport,
)
from softdta.wire.codec import WireError
from softdta.wire.frames import UdpEndpoints, parse_udp_frame
from softdta.wire.roce import (
    NAK_INVALID_REQUEST_SYNDROME,
    NAK_REMOTE_ACCESS_SYNDROME,
    NAK_SEQUENCE_SYNDROME,
    RoceFrame,
    build_roce_frame,
    parse_roce,
    transport_payload,
)

_RC_OPCODES = {RoceOpcode.RC_WRITE_ONLY, RoceOpcode.RC_WRITE_ONLY_IMM, RoceOpcode.RC_FETCH_ADD}
_UC_OPCODES = {RoceOpcode.UC_WRITE_ONLY, RoceOpcode.UC_WRITE_ONLY_IMM}


@dataclass
class MemoryRegion:
    """A registered region: `buffer` (bytearray, numpy array or mmap) seen by the peer at `base_va`."""

    base_va: int
    rkey: int
    buffer: bytearray | np.ndarray | memoryview
    access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | Access.REMOTE_ATOMIC
    ring_bytes: int = 0  # an Append region: the bytes of one list's ring
    ring_writes: np.ndarray | None = None  # then WRITEs executed per ring, counted here (uint64, one per list)

    def __post_init__(self) -> None:
        self.view = np.frombuffer(self.buffer, dtype=np.uint8)

    @property
    def length(self) -> int:
        return self.view.size

    def contains(self, va: int, length: int) -> bool:
        return self.base_va <= va and va + length <= self.base_va + self.length


@dataclass
class ResponderQp:
    qpn: int
    transport: Transport
    remote_ip: bytes
    remote_mac: bytes
    region: MemoryRegion
    expected_psn: int = 0
    remote_qpn: int = 0
    error: bool = False
    msn: int = 0
    nak_sent: bool = False
    last_atomic: tuple[int, int] | None = None  # (psn, original value) for duplicate Fetch&Adds


@dataclass
class Completion:
    qpn: int
    immediate: int
    byte_len: int


class CompletionLog:
    """The newest WRITE with Immediate completions, numbered from 1 in arrival order, so that a reader can ask
    for those after the last number it saw; older ones fall off once `keep` are held."""

    def __init__(self, keep: int = 4096):
        self.total = 0
        self.recent: deque[tuple[int, Completion]] = deque(maxlen=keep)

    def add(self, completions: list[Completion]) -> None:
        for completion in completions:
            self.total += 1
            self.recent.append((self.total, completion))

    def since(self, seq: int) -> list[tuple[int, Completion]]:
        return [(number, completion) for number, completion in self.recent if number > seq]


@dataclass
class ResponderOutput:
    replies: list[bytes] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    executed: bool = False
    dropped: ResponderCounter | None = None
    passed: bool = False  # not a RoCEv2 frame (not UDP to 4791, or broken IP/UDP headers): the host stack's


class Responder:
    """One collector port: its addresses and its queue pairs. Counters are `spec.ResponderCounter`."""

    def __init__(self, mac: bytes, ip: bytes, qps: list[ResponderQp] | None = None, udp_sport: int = 49153):
        self.mac = mac
        self.ip = ip
        self.udp_sport = udp_sport
        self.qps: dict[int, ResponderQp] = {qp.qpn: qp for qp in qps or []}
        self.counters: Counter[ResponderCounter] = Counter()

    def add_qp(self, qp: ResponderQp) -> None:
        self.qps[qp.qpn] = qp

    def process(self, frame: bytes) -> ResponderOutput:
        out = self._process(frame)
        if out.replies:
            self.counters[ResponderCounter.REPLIES_SENT] += len(out.replies)
        if out.completions:
            self.counters[ResponderCounter.COMPLETIONS] += len(out.completions)
        return out

    def _process(self, frame: bytes) -> ResponderOutput:
        try:
            udp = parse_udp_frame(frame)
        except WireError:
            return ResponderOutput(passed=True)
        if udp.udp["dport"] != ROCE_PORT:
            return ResponderOutput(passed=True)
        if udp.payload_end - udp.ip_offset > RESPONDER_IP_LIMIT:
            return self._drop(ResponderCounter.MALFORMED)
        try:
            packet = parse_roce(frame, udp)
        except WireError:
            return self._drop(ResponderCounter.MALFORMED)
        if udp.dst_ip != self.ip:
            return self._drop(ResponderCounter.NOT_FOR_THIS_PORT)
        if not packet.icrc_ok:
            return self._drop(ResponderCounter.ICRC_ERRORS)
        qp = self.qps.get(packet.bth["dest_qp"])
        if qp is None:
            return self._drop(ResponderCounter.UNKNOWN_QPN)
        if qp.remote_ip != udp.src_ip:
            return self._drop(ResponderCounter.SOURCE_GID_MISMATCH)
        if qp.error:
            return self._drop(ResponderCounter.QP_IN_ERROR)
        opcode = RoceOpcode(packet.opcode)
        allowed = _RC_OPCODES if qp.transport is Transport.RC else _UC_OPCODES
        if opcode not in allowed:
            return self._drop(ResponderCounter.OPCODE_NOT_VALID)
        if qp.transport is Transport.UC:
            return self._uc(qp, packet, opcode)
        return self._rc(qp, packet, opcode)

    def _drop(self, reason: ResponderCounter) -> ResponderOutput:
        self.counters[reason] += 1
        return ResponderOutput(dropped=reason)

    def _uc(self, qp: ResponderQp, packet: RoceFrame, opcode: RoceOpcode) -> ResponderOutput:
        # UC has no ACKs: a single-packet WRITE Only executes whatever its PSN, and a bad one is just dropped.
        qp.expected_psn = (packet.bth["psn"] + 1) & PSN_MASK
        out = ResponderOutput()
        if not self._write(qp, packet, opcode, out):
            return self._drop(ResponderCounter.UC_ACCESS_ERROR)
        return out

    def _rc(self, qp: ResponderQp, packet: RoceFrame, opcode: RoceOpcode) -> ResponderOutput:
        psn = packet.bth["psn"]
        distance = (psn - qp.expected_psn) & PSN_MASK
        out = ResponderOutput()
        if distance and distance < PSN_WINDOW:
            self.counters[ResponderCounter.OUT_OF_SEQ_REQUEST] += 1
            if not qp.nak_sent:
                qp.nak_sent = True
                out.replies.append(self._ack(qp, qp.expected_psn, NAK_SEQUENCE_SYNDROME))
            else:
                out.dropped = ResponderCounter.OUT_OF_SEQUENCE_AFTER_NAK
                self.counters[ResponderCounter.OUT_OF_SEQUENCE_AFTER_NAK] += 1
            return out
        if distance:
            self.counters[ResponderCounter.DUPLICATE_REQUEST] += 1
            if opcode is RoceOpcode.RC_FETCH_ADD and qp.last_atomic and qp.last_atomic[0] == psn:
                out.replies.append(self._atomic_ack(qp, psn, qp.last_atomic[1]))
            else:
                out.replies.append(self._ack(qp, (qp.expected_psn - 1) & PSN_MASK, ACK_SYNDROME))
            return out
        qp.nak_sent = False
        if opcode is RoceOpcode.RC_FETCH_ADD:
            atomic = packet.headers["atomic_eth"]
            if atomic["va"] % 8:
                return self._fatal(qp, out, NAK_INVALID_REQUEST_SYNDROME, ResponderCounter.MISALIGNED_ATOMIC)
            if not (qp.region.access & Access.REMOTE_ATOMIC and atomic["rkey"] == qp.region.rkey
                    and qp.region.contains(atomic["va"], 8)):
                return self._fatal(qp, out, NAK_REMOTE_ACCESS_SYNDROME, ResponderCounter.REMOTE_ACCESS_ERRORS)
            offset = atomic["va"] - qp.region.base_va
            cell = qp.region.view[offset:offset + 8]
            original = int.from_bytes(cell.tobytes(), "little")
            cell[:] = np.frombuffer(((original + atomic["swap_add"]) & (1 << 64) - 1).to_bytes(8, "little"), np.uint8)
            self._advance(qp, out)
            qp.last_atomic = (psn, original)
            out.replies.append(self._atomic_ack(qp, psn, original))
            return out
        if not self._write(qp, packet, opcode, out):
            return self._fatal(qp, out, NAK_REMOTE_ACCESS_SYNDROME, ResponderCounter.REMOTE_ACCESS_ERRORS)
        self._advance(qp, out)
        if packet.bth["ack_req"]:
            out.replies.append(self._ack(qp, psn, ACK_SYNDROME))
        return out

    def _advance(self, qp: ResponderQp, out: ResponderOutput) -> None:
        qp.expected_psn = (qp.expected_psn + 1) & PSN_MASK
        qp.msn = (qp.msn + 1) & PSN_MASK
        out.executed = True
        self.counters[ResponderCounter.EXECUTED] += 1

    def _fatal(self, qp: ResponderQp, out: ResponderOutput, syndrome: int,
               reason: ResponderCounter) -> ResponderOutput:
        """Access errors NAK once and move the QP to ERROR, as rxe does; only re-creating it helps."""
        self.counters[reason] += 1
        out.replies.append(self._ack(qp, qp.expected_psn, syndrome))
        qp.error = True
        out.dropped = reason
        return out

    def _write(self, qp: ResponderQp, packet: RoceFrame, opcode: RoceOpcode, out: ResponderOutput) -> bool:
        reth = packet.headers["reth"]
        payload = packet.payload
        if reth["dma_length"] != len(payload) or reth["rkey"] != qp.region.rkey \
                or not qp.region.access & Access.REMOTE_WRITE or not qp.region.contains(reth["va"], len(payload)):
            return False
        offset = reth["va"] - qp.region.base_va
        qp.region.view[offset:offset + len(payload)] = np.frombuffer(payload, dtype=np.uint8)
        if qp.region.ring_bytes and qp.region.ring_writes is not None:
            qp.region.ring_writes[offset // qp.region.ring_bytes] += 1
        if opcode in (RoceOpcode.RC_WRITE_ONLY_IMM, RoceOpcode.UC_WRITE_ONLY_IMM):
            out.completions.append(Completion(qp.qpn, packet.headers["immdt"]["immediate"], len(payload)))
        if qp.transport is Transport.UC:
            out.executed = True
            self.counters[ResponderCounter.EXECUTED] += 1
        return True

    def _reply_ends(self, qp: ResponderQp) -> UdpEndpoints:
        return UdpEndpoints(src_mac=self.mac, dst_mac=qp.remote_mac, src_ip=self.ip, dst_ip=qp.remote_ip,
                            sport=self.udp_sport, dport=ROCE_PORT)

    def _ack(self, qp: ResponderQp, psn: int, syndrome: int) -> bytes:
        transport = transport_payload(RoceOpcode.RC_ACK, qp.remote_qpn, psn,
                                      {"aeth": {"syndrome": syndrome, "msn": qp.msn}})
        return build_roce_frame(self._reply_ends(qp), transport)

    def _atomic_ack(self, qp: ResponderQp, psn: int, original: int) -> bytes:
        transport = transport_payload(RoceOpcode.RC_ATOMIC_ACK, qp.remote_qpn, psn,
                                      {"aeth": {"syndrome": ACK_SYNDROME, "msn": qp.msn},
                                       "atomic_ack_eth": {"original": original}})
        return build_roce_frame(self._reply_ends(qp), transport)
