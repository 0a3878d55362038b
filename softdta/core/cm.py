"""The InfiniBand Communication Manager as rdma_cm speaks it, for connecting to collectors written for the
original DTA (sans-IO: frames in, frames out, no sockets).

Such a collector listens with rdma_cm (`rdma_listen`/`rdma_accept`) on one port per structure. After the RC
connection is established it SENDs 16 bytes {base address, length, key} (little-endian) on it, and from then on
only reads its memory. `CmConnection` is the translator's side of one such connection: a REQ built from fields,
REP/REJ/MRA handling, the RTU, the metadata SEND acknowledged with its own PSN and MSN 1, and DREQ/DREP.

PSNs, as Linux's CM sets them (drivers/infiniband/core/cm.c): the REQ's Starting PSN is the one the *active* side
expects to receive (the passive side sends from it: here, the metadata SEND), and the REP's Starting PSN is the
one the passive side expects to receive. So the translator's writes start at the REP's PSN, and its own choice,
in the REQ, numbers the collector's SEND. Starting there, no resync is needed to begin.

Message layouts follow IBTA Vol 1, chapter 12 (Linux `include/rdma/ibta_vol1_c12.h` gives the same offsets).
CM MADs travel as UD SEND Only to QP1 with the GSI Q_Key and DETH source QP 1.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, cast

from softdta.spec import ACK_SYNDROME, ROCE_PORT, Field, Header, Raw, RoceOpcode
from softdta.wire.codec import WireError, codec
from softdta.wire.frames import UdpEndpoints
from softdta.wire.roce import build_roce_frame, parse_roce, transport_payload

MAD_SIZE = 256
GSI_QP = 1
GSI_QKEY = 0x80010000
MGMT_CLASS_CM = 0x07
CM_CLASS_VERSION = 2
METHOD_SEND = 0x03
RDMA_PS_TCP_SERVICE = 0x0000000001060000  # rdma_cm's service ID for RDMA_PS_TCP; the port is the low 16 bits
CMA_VERSION = 0x00
METADATA_SIZE = 16
PATH_MTU_1024 = 3  # the IB encoding; RoCE over a 1500-byte Ethernet MTU
PERMISSIVE_LID = 0xFFFF
VENDOR_ID = 0x000000  # no OUI claimed: softdta is not a NIC vendor

MAD_HEADER = Header("mad", (
    Field("base_version", 8), Field("mgmt_class", 8), Field("class_version", 8), Field("method", 8),
    Field("status", 16), Field("class_specific", 16), Field("transaction_id", 64), Field("attribute_id", 16),
    Field("reserved", 16), Field("attribute_modifier", 32)), "MAD common header")

CM_REQ = Header("cm_req", (
    Field("local_comm_id", 32), Field("reserved1", 8), Field("vendor_id", 24), Field("service_id", 64),
    Field("local_ca_guid", 64), Field("reserved2", 32), Field("local_qkey", 32),
    Field("local_qpn", 24), Field("responder_resources", 8), Field("local_eecn", 24), Field("initiator_depth", 8),
    Field("remote_eecn", 24), Field("remote_cm_response_timeout", 5), Field("transport_service_type", 2),
    Field("end_to_end_flow_control", 1),
    Field("starting_psn", 24), Field("local_cm_response_timeout", 5), Field("retry_count", 3),
    Field("partition_key", 16), Field("path_mtu", 4), Field("rdc_exists", 1), Field("rnr_retry_count", 3),
    Field("max_cm_retries", 4), Field("srq", 1), Field("extended_transport_type", 3),
    Field("primary_local_lid", 16), Field("primary_remote_lid", 16),
    Raw("primary_local_gid", 16), Raw("primary_remote_gid", 16),
    Field("primary_flow_label", 20), Field("reserved3", 6), Field("primary_packet_rate", 6),
    Field("primary_traffic_class", 8), Field("primary_hop_limit", 8),
    Field("primary_sl", 4), Field("primary_subnet_local", 1), Field("reserved4", 3),
    Field("primary_local_ack_timeout", 5), Field("reserved5", 3),
    Raw("alternate_path", 44), Raw("private_data", 92)), "CM REQ (IBTA Vol 1, Table 106)")

CM_MRA = Header("cm_mra", (
    Field("local_comm_id", 32), Field("remote_comm_id", 32), Field("message_mraed", 2), Field("reserved1", 6),
    Field("service_timeout", 5), Field("reserved2", 3), Raw("private_data", 222)), "CM MRA (Table 107)")

CM_REJ = Header("cm_rej", (
    Field("local_comm_id", 32), Field("remote_comm_id", 32), Field("message_rejected", 2), Field("reserved1", 6),
    Field("rejected_info_length", 7), Field("reserved2", 1), Field("reason", 16), Raw("ari", 72),
    Raw("private_data", 148)), "CM REJ (Table 108)")

CM_REP = Header("cm_rep", (
    Field("local_comm_id", 32), Field("remote_comm_id", 32), Field("local_qkey", 32),
    Field("local_qpn", 24), Field("vendor_id_high", 8), Field("local_eecn", 24), Field("vendor_id_mid", 8),
    Field("starting_psn", 24), Field("vendor_id_low", 8), Field("responder_resources", 8),
    Field("initiator_depth", 8), Field("target_ack_delay", 5), Field("failover_accepted", 2),
    Field("end_to_end_flow_control", 1), Field("rnr_retry_count", 3), Field("srq", 1), Field("reserved", 4),
    Field("local_ca_guid", 64), Raw("private_data", 196)), "CM REP (Table 110)")

CM_RTU = Header("cm_rtu", (Field("local_comm_id", 32), Field("remote_comm_id", 32), Raw("private_data", 224)),
                "CM RTU (Table 111)")

CM_DREQ = Header("cm_dreq", (
    Field("local_comm_id", 32), Field("remote_comm_id", 32), Field("remote_qpn", 24), Field("reserved", 8),
    Raw("private_data", 220)), "CM DREQ (Table 112)")

CM_DREP = Header("cm_drep", (Field("local_comm_id", 32), Field("remote_comm_id", 32), Raw("private_data", 224)),
                 "CM DREP (Table 113)")

CMA_HEADER = Header("cma_hdr", (
    Field("cma_version", 8), Field("ip_version", 4), Field("reserved", 4), Field("port", 16),
    Raw("src_addr", 16), Raw("dst_addr", 16)), "rdma_cm's private-data header of a REQ (struct cma_hdr)")


class CmAttribute(enum.IntEnum):
    REQ = 0x0010
    MRA = 0x0011
    REJ = 0x0012
    REP = 0x0013
    RTU = 0x0014
    DREQ = 0x0015
    DREP = 0x0016


BODIES = {CmAttribute.REQ: CM_REQ, CmAttribute.MRA: CM_MRA, CmAttribute.REJ: CM_REJ, CmAttribute.REP: CM_REP,
          CmAttribute.RTU: CM_RTU, CmAttribute.DREQ: CM_DREQ, CmAttribute.DREP: CM_DREP}
QPN_STRIDE = 0x100  # each new attempt claims another QPN: a collector's CM remembers the last one for a while
CM_RESPONSE_TIMEOUT = 20  # the REQ's response timeouts, as rdma_cm sets them: 4.096 us * 2^20, about 4.3 s
MAX_CM_RETRIES = 15  # the REQ's Max CM Retries, as rdma_cm sets it: resends of one REQ before giving up
REJECT_REASONS = {1: "no QP", 3: "no resources", 4: "timeout",
                  8: "invalid service ID (nothing listens on that port)",
                  10: "stale connection (the collector's CM still holds our previous QP)",
                  27: "insufficient responder resources", 28: "rejected by the collector's application"}


def cm_timeout_s(exponent: int) -> float:
    """A CM timeout field's duration: 4.096 us * 2^exponent (IBTA 12.6)."""
    return 4.096e-6 * (1 << exponent)


@dataclass(frozen=True)
class CmMessage:
    attribute: CmAttribute
    transaction_id: int
    fields: dict[str, Any]


def encode_mad(attribute: CmAttribute, transaction_id: int, **fields: Any) -> bytes:
    header = codec(MAD_HEADER).pack(base_version=1, mgmt_class=MGMT_CLASS_CM, class_version=CM_CLASS_VERSION,
                                    method=METHOD_SEND, transaction_id=transaction_id, attribute_id=int(attribute))
    return header + codec(BODIES[attribute]).pack(**fields)


def decode_mad(mad: bytes) -> CmMessage:
    """A CM MAD; WireError for anything else (another management class, an attribute we do not speak)."""
    if len(mad) < MAD_SIZE:
        raise WireError("TRUNCATED", f"a MAD is {MAD_SIZE} bytes, got {len(mad)}")
    header, offset = codec(MAD_HEADER).unpack(mad)
    if header["mgmt_class"] != MGMT_CLASS_CM or header["base_version"] != 1:
        raise WireError("UNKNOWN_OPCODE", f"management class {header['mgmt_class']:#x} is not CM")
    try:
        attribute = CmAttribute(header["attribute_id"])
    except ValueError:
        raise WireError("UNKNOWN_OPCODE", f"CM attribute {header['attribute_id']:#06x} is not handled") from None
    body, _ = codec(BODIES[attribute]).unpack(mad, offset)
    return CmMessage(attribute, header["transaction_id"], body)


def ipv4_mapped_gid(ip: bytes) -> bytes:
    return bytes(10) + b"\xff\xff" + ip


def cma_private_data(src_ip: bytes, dst_ip: bytes, src_port: int) -> bytes:
    """rdma_cm's REQ private data: its header (IPv4 addresses in the last 4 bytes of each 16), zero-padded."""
    header = codec(CMA_HEADER).pack(cma_version=CMA_VERSION, ip_version=4, port=src_port,
                                    src_addr=bytes(12) + src_ip, dst_addr=bytes(12) + dst_ip)
    return header + bytes(cast(Raw, CM_REQ.fields[-1]).size - len(header))  # the private data, REQ's last field


@dataclass(frozen=True)
class Metadata:
    """What an original DTA collector SENDs after the handshake: its region, little-endian."""

    base_va: int
    length: int
    key: int

    @classmethod
    def parse(cls, payload: bytes) -> Metadata:
        if len(payload) < METADATA_SIZE:
            raise WireError("TRUNCATED", f"collector metadata is {METADATA_SIZE} bytes, got {len(payload)}")
        return cls(int.from_bytes(payload[0:8], "little"), int.from_bytes(payload[8:12], "little"),
                   int.from_bytes(payload[12:16], "little"))

    def pack(self) -> bytes:
        return self.base_va.to_bytes(8, "little") + self.length.to_bytes(4, "little") + self.key.to_bytes(4, "little")


class CmState(enum.Enum):
    IDLE = "idle"  # nothing sent yet, or waiting to try again
    REQ_SENT = "req-sent"
    AWAITING_METADATA = "awaiting-metadata"  # RTU sent: the collector's SEND comes next
    CONNECTED = "connected"


@dataclass
class CmEndpoint:
    """The translator's end: addresses, and the QP it claims. Its QPN and receive PSN (the REQ's Starting PSN,
    which the collector's SEND will carry) are its own choice."""

    mac: bytes
    ip: bytes
    qpn: int
    receive_psn: int
    ca_guid: int
    udp_sport: int = 0xC000
    traffic_class: int = 0


@dataclass
class CmConnection:
    """One rdma_cm connection to one collector port (one structure), seen from the translator.

    Feed it the RoCEv2 frames from that collector (`receive`) and call `tick` regularly; both return frames
    to send. `connected` becomes true once the metadata SEND has been acknowledged; `remote_qpn`, `send_psn`
    (where the translator's writes start) and `metadata` then describe the structure. A DREQ from the collector,
    a rejection or a `disconnect` ends it; after `retry_s` a new REQ goes out, with a new communication ID and
    the next QPN (`QPN_STRIDE` on), until a collector answers again.

    Silence is met as IBTA's CM meets it: the same REQ (same communication and transaction IDs) goes again after
    the response timeout it advertises, up to `max_retries` times, so that a slow collector's CM sees a duplicate
    and not a second connection; only then does it start over.
    """

    local: CmEndpoint
    collector_ip: bytes
    collector_mac: bytes
    port: int
    comm_id: int
    transaction_id: int
    response_timeout_s: float = cm_timeout_s(CM_RESPONSE_TIMEOUT)
    max_retries: int = MAX_CM_RETRIES
    metadata_timeout_s: float = 30.0  # the collector's application sends its region once it has accepted: seconds
    retry_s: float = 1.0
    state: CmState = CmState.IDLE
    remote_comm_id: int = 0
    remote_qpn: int = 0
    send_psn: int = 0  # the REP's Starting PSN: what the collector's QP expects first
    metadata: Metadata | None = None
    last_rejection: str = ""
    events: list[str] = field(default_factory=list)
    _deadline: float = 0.0
    _resends: int = 0
    _gsi_psn: int = 0

    @property
    def connected(self) -> bool:
        return self.state is CmState.CONNECTED

    def tick(self, now: float) -> list[bytes]:
        if self.state is CmState.IDLE and now >= self._deadline:
            return self._request(now)
        if self.state is CmState.REQ_SENT and now >= self._deadline:
            if self._resends < self.max_retries:
                self._resends += 1
                self._deadline = now + self.response_timeout_s
                return [self._req()]
            self.events.append(f"no REP from port {self.port} to {self._resends + 1} REQs; starting over")
            self._restart(now)
        if self.state is CmState.AWAITING_METADATA and now >= self._deadline:
            # both CMs hold the connection (REP, RTU), but the collector's application never sent its region
            self.events.append(f"no metadata SEND from port {self.port} in {self.metadata_timeout_s:g} s; "
                               "starting over")
            return self.disconnect(now)
        return []

    def receive(self, frame: bytes, now: float) -> list[bytes]:
        """Frames this connection answers with; frames that are not its own are ignored."""
        try:
            packet = parse_roce(frame)
        except WireError:
            return []
        if packet.src_ip != self.collector_ip or not packet.icrc_ok:
            return []
        if packet.opcode == RoceOpcode.UD_SEND_ONLY and packet.bth["dest_qp"] == GSI_QP:
            try:
                message = decode_mad(packet.payload)
            except WireError:
                return []
            return self._on_mad(message, now)
        if packet.opcode == RoceOpcode.RC_SEND_ONLY and packet.bth["dest_qp"] == self.local.qpn:
            return self._on_send(packet.bth["psn"], packet.payload)
        return []

    def disconnect(self, now: float) -> list[bytes]:
        """Leave the connection (the translator's QP failed or is going away) and start over later."""
        frames = []
        if self.state is not CmState.IDLE:
            frames.append(self._mad(CmAttribute.DREQ, local_comm_id=self.comm_id, remote_comm_id=self.remote_comm_id,
                                    remote_qpn=self.remote_qpn))
        self._restart(now)
        return frames

    # ----------------------------------------------------------------------------------------------

    def _request(self, now: float) -> list[bytes]:
        self.comm_id = (self.comm_id + 1) & 0xFFFFFFFF or 1
        self.transaction_id = (self.transaction_id + 1) & 0xFFFFFFFFFFFFFFFF
        self.state, self._deadline, self._resends = CmState.REQ_SENT, now + self.response_timeout_s, 0
        self.metadata, self.remote_qpn, self.remote_comm_id = None, 0, 0
        return [self._req()]

    def _req(self) -> bytes:
        local, remote = self.local, self.collector_ip
        return self._mad(
            CmAttribute.REQ, local_comm_id=self.comm_id, vendor_id=VENDOR_ID,
            service_id=RDMA_PS_TCP_SERVICE | self.port, local_ca_guid=local.ca_guid, local_qpn=local.qpn,
            responder_resources=0, initiator_depth=1,  # the translator issues Fetch&Adds, never serves reads
            remote_cm_response_timeout=CM_RESPONSE_TIMEOUT, transport_service_type=0, starting_psn=local.receive_psn,
            local_cm_response_timeout=CM_RESPONSE_TIMEOUT, retry_count=7, partition_key=0xFFFF,
            path_mtu=PATH_MTU_1024, rnr_retry_count=7, max_cm_retries=MAX_CM_RETRIES, primary_local_lid=PERMISSIVE_LID,
            primary_remote_lid=PERMISSIVE_LID, primary_local_gid=ipv4_mapped_gid(local.ip),
            primary_remote_gid=ipv4_mapped_gid(remote), primary_traffic_class=local.traffic_class,
            primary_hop_limit=64, primary_local_ack_timeout=14,
            private_data=cma_private_data(local.ip, remote, local.udp_sport))

    def _on_mad(self, message: CmMessage, now: float) -> list[bytes]:
        fields = message.fields
        mine = fields["remote_comm_id"] == self.comm_id if "remote_comm_id" in fields else False
        if message.attribute is CmAttribute.REP and mine and self.state in (CmState.REQ_SENT,
                                                                             CmState.AWAITING_METADATA):
            # a repeated REP means our RTU was lost: answer it again
            self.remote_comm_id, self.remote_qpn = fields["local_comm_id"], fields["local_qpn"]
            self.send_psn = fields["starting_psn"]
            self.state, self._deadline = CmState.AWAITING_METADATA, now + self.metadata_timeout_s
            return [self._mad(CmAttribute.RTU, local_comm_id=self.comm_id, remote_comm_id=self.remote_comm_id)]
        if message.attribute is CmAttribute.REJ and mine and self.state is CmState.REQ_SENT:
            reason = fields["reason"]
            self.last_rejection = REJECT_REASONS.get(reason, f"reason {reason}")
            self.events.append(f"port {self.port} rejected the connection: {self.last_rejection}")
            self._restart(now)
        elif message.attribute is CmAttribute.MRA and mine and self.state is CmState.REQ_SENT:
            # the collector needs longer: 4.096 us * 2^timeout more
            self._deadline = now + self.response_timeout_s + cm_timeout_s(fields["service_timeout"])
        elif message.attribute is CmAttribute.DREQ and mine and fields["remote_qpn"] == self.local.qpn:
            self.events.append(f"port {self.port} disconnected (DREQ)")
            drep = self._mad(CmAttribute.DREP, local_comm_id=self.comm_id, remote_comm_id=self.remote_comm_id)
            self._restart(now)
            return [drep]
        return []

    def _on_send(self, psn: int, payload: bytes) -> list[bytes]:
        if self.state not in (CmState.AWAITING_METADATA, CmState.CONNECTED):
            return []
        if self.state is CmState.AWAITING_METADATA:
            try:
                self.metadata = Metadata.parse(payload)
            except WireError as error:
                self.events.append(f"port {self.port}: {error}")
                return []
            self.state = CmState.CONNECTED
            self.events.append(f"port {self.port} connected: QPN {self.remote_qpn:#x}, {self.metadata.length} bytes "
                               f"at {self.metadata.base_va:#x}, key {self.metadata.key:#x}")
        # the ACK of the collector's one SEND on this connection: its own PSN, MSN 1 (a repeat gets the same)
        return [build_roce_frame(self._ends(), transport_payload(RoceOpcode.RC_ACK, self.remote_qpn, psn, {
            "aeth": {"syndrome": ACK_SYNDROME, "msn": 1}}))]

    def _restart(self, now: float) -> None:
        self.state, self._deadline = CmState.IDLE, now + self.retry_s
        self.metadata = None
        self.local.qpn = max((self.local.qpn + QPN_STRIDE) & 0xFFFFFF, GSI_QP + 1)

    def _mad(self, attribute: CmAttribute, **fields: Any) -> bytes:
        self._gsi_psn = (self._gsi_psn + 1) & 0xFFFFFF
        payload = encode_mad(attribute, self.transaction_id, **fields)
        return build_roce_frame(self._ends(), transport_payload(RoceOpcode.UD_SEND_ONLY, GSI_QP, self._gsi_psn, {
            "deth": {"qkey": GSI_QKEY, "src_qp": GSI_QP}}, payload))

    def _ends(self) -> UdpEndpoints:
        return UdpEndpoints(self.local.mac, self.collector_mac, self.local.ip, self.collector_ip,
                            self.local.udp_sport, ROCE_PORT, dscp=self.local.traffic_class >> 2)
