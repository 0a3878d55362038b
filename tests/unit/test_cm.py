"""The rdma_cm client core (sans-IO): CM message layouts against IBTA offsets and tshark, and the connection
state machine against a scripted collector side built from the same layouts. Real rdma_cm in the kernel is in
tests/interop/test_rdma_cm_interop.py."""

import os

import pytest

from softdta.core.cm import (
    BODIES,
    CM_REP,
    CM_REQ,
    GSI_QKEY,
    GSI_QP,
    MAD_HEADER,
    MAD_SIZE,
    QPN_STRIDE,
    RDMA_PS_TCP_SERVICE,
    CmAttribute,
    CmConnection,
    CmEndpoint,
    CmState,
    Metadata,
    cm_timeout_s,
    decode_mad,
    encode_mad,
)
from softdta.links.cm import CmError, CmTarget
from softdta.spec import MAX_REDUNDANCY, ROCE_PORT, RoceOpcode
from softdta.wire.codec import WireError
from softdta.wire.frames import UdpEndpoints, ip_bytes, mac_bytes
from softdta.wire.roce import build_roce_frame, parse_roce, transport_payload
from tests.common import needs_tshark, num, run_tshark

TRANSLATOR_MAC, TRANSLATOR_IP = mac_bytes("02:00:00:00:00:01"), ip_bytes("10.77.2.1")
COLLECTOR_MAC, COLLECTOR_IP = mac_bytes("52:54:00:12:34:56"), ip_bytes("10.77.2.2")
COLLECTOR_QPN, COLLECTOR_PSN, LOCAL_QPN, RECEIVE_PSN = 0x11, 0xABCDEF, 0x2000, 0x123456


def connection(**options) -> CmConnection:
    local = CmEndpoint(TRANSLATOR_MAC, TRANSLATOR_IP, LOCAL_QPN, receive_psn=RECEIVE_PSN, ca_guid=0x0200000000000001,
                       udp_sport=0xC123, traffic_class=26 << 2)
    return CmConnection(local, COLLECTOR_IP, COLLECTOR_MAC, 1337, comm_id=0x1000, transaction_id=7, **options)


def from_collector(opcode: RoceOpcode, dest_qp: int, psn: int, headers: dict, payload: bytes) -> bytes:
    ends = UdpEndpoints(COLLECTOR_MAC, TRANSLATOR_MAC, COLLECTOR_IP, TRANSLATOR_IP, 0xD000, ROCE_PORT)
    return build_roce_frame(ends, transport_payload(opcode, dest_qp, psn, headers, payload))


def mad_from_collector(attribute: CmAttribute, **fields) -> bytes:
    return from_collector(RoceOpcode.UD_SEND_ONLY, GSI_QP, 3, {"deth": {"qkey": GSI_QKEY, "src_qp": GSI_QP}},
                          encode_mad(attribute, 7, **fields))


def sent_mad(frame: bytes):
    packet = parse_roce(frame)
    assert packet.icrc_ok and packet.opcode == RoceOpcode.UD_SEND_ONLY and packet.bth["dest_qp"] == GSI_QP
    assert packet.headers["deth"] == {"qkey": GSI_QKEY, "reserved": 0, "src_qp": GSI_QP}
    assert (packet.src_ip, packet.dst_ip) == (TRANSLATOR_IP, COLLECTOR_IP)
    return decode_mad(packet.payload)


def rep_for(req, **overrides) -> bytes:
    fields = {"local_comm_id": 0x5000, "remote_comm_id": req.fields["local_comm_id"], "local_qpn": COLLECTOR_QPN,
              "starting_psn": COLLECTOR_PSN, "responder_resources": 1, **overrides}
    return mad_from_collector(CmAttribute.REP, **fields)


def metadata_send(psn: int = RECEIVE_PSN) -> bytes:
    return from_collector(RoceOpcode.RC_SEND_ONLY, LOCAL_QPN, psn, {}, Metadata(0x7F0000001000, 2048, 0x229).pack())


# --------------------------------------------------------------------------------------------------
# Layouts


def test_every_cm_message_fills_a_256_byte_mad():
    assert MAD_HEADER.size == 24
    assert {attribute: body.size for attribute, body in BODIES.items()} == {attribute: 232 for attribute in BODIES}
    for attribute in CmAttribute:
        assert len(encode_mad(attribute, 1)) == MAD_SIZE


def test_fields_sit_at_the_ibta_offsets():
    """Byte offsets of IBTA Vol 1 Tables 106 and 110 (as in Linux's ibta_vol1_c12.h), from the MAD's start."""
    req = encode_mad(CmAttribute.REQ, 0x0102030405060708, local_comm_id=0xA1A2A3A4,
                     service_id=RDMA_PS_TCP_SERVICE | 1337,
                     local_qpn=0xB1B2B3, starting_psn=0xC1C2C3, partition_key=0xFFFF, path_mtu=3,
                     primary_local_gid=bytes(range(16)), private_data=bytes([0xEE]) * 92)
    assert req[0:4] == bytes([1, 7, 2, 3]) and req[8:16] == bytes(range(1, 9)) and req[16:18] == b"\x00\x10"
    body = req[24:]
    assert body[0:4] == bytes.fromhex("a1a2a3a4")
    assert body[8:16] == (RDMA_PS_TCP_SERVICE | 1337).to_bytes(8, "big")
    assert body[32:35] == bytes.fromhex("b1b2b3") and body[44:47] == bytes.fromhex("c1c2c3")
    assert body[48:50] == b"\xff\xff" and body[50] >> 4 == 3
    assert body[56:72] == bytes(range(16)) and body[140:] == bytes([0xEE]) * 92
    rep = encode_mad(CmAttribute.REP, 1, local_qpn=0xD1D2D3, starting_psn=0xE1E2E3)
    assert rep[24 + 12:24 + 15] == bytes.fromhex("d1d2d3") and rep[24 + 20:24 + 23] == bytes.fromhex("e1e2e3")
    assert CM_REQ.fields[-1].name == "private_data" and CM_REP.fields[-1].size == 196


def test_decoding_refuses_what_is_not_cm():
    with pytest.raises(WireError):
        decode_mad(bytes(100))
    not_cm = bytearray(encode_mad(CmAttribute.REQ, 1))
    not_cm[1] = 0x04  # performance management
    with pytest.raises(WireError, match="not CM"):
        decode_mad(bytes(not_cm))
    unknown = bytearray(encode_mad(CmAttribute.REQ, 1))
    unknown[16:18] = b"\x00\x19"  # SIDR_REQ
    with pytest.raises(WireError, match="not handled"):
        decode_mad(bytes(unknown))


@pytest.mark.interop
@needs_tshark
def test_tshark_dissects_our_req_as_rdma_cm_would_send_it(tmp_path):
    req_frame = connection().tick(0.0)[0]
    cm = run_tshark([req_frame], tmp_path)[0]["infiniband"]
    flat = {}

    def walk(node):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value)
            else:
                flat[key] = value
    walk(cm)
    assert num(flat["infiniband.mad.mgmtclass"]) == 7 and num(flat["infiniband.mad.attributeid"]) == 0x10
    assert num(flat["infiniband.cm.req.serviceid.dport"]) == 1337
    assert num(flat["infiniband.cm.req.serviceid.protocol"]) == 6  # TCP port space
    assert num(flat["infiniband.cm.req.localqpn"]) == LOCAL_QPN
    assert num(flat["infiniband.cm.req.startpsn"]) == RECEIVE_PSN
    assert num(flat["infiniband.cm.req.initdepth"]) == 1 and num(flat["infiniband.cm.req.pkey"]) == 0xFFFF
    assert flat["infiniband.cm.req.prim_localgid_ipv4"] == "10.77.2.1"
    assert flat["infiniband.cm.req.prim_remotegid_ipv4"] == "10.77.2.2"


# --------------------------------------------------------------------------------------------------
# The connection


def test_req_rep_rtu_and_the_metadata_send_make_a_connection():
    link = connection()
    req = sent_mad(link.tick(0.0)[0])
    assert req.attribute is CmAttribute.REQ and link.state is CmState.REQ_SENT
    fields = req.fields
    assert fields["service_id"] == RDMA_PS_TCP_SERVICE | 1337 and fields["local_qpn"] == LOCAL_QPN
    assert fields["starting_psn"] == RECEIVE_PSN and fields["primary_traffic_class"] == 26 << 2
    private = fields["private_data"]
    assert private[1] >> 4 == 4 and int.from_bytes(private[2:4], "big") == 0xC123  # IPv4, the source port
    assert private[16:20] == TRANSLATOR_IP and private[32:36] == COLLECTOR_IP
    assert link.tick(0.5) == []  # waiting for the REP

    rtu = sent_mad(link.receive(rep_for(req), 0.6)[0])
    assert rtu.attribute is CmAttribute.RTU and rtu.transaction_id == req.transaction_id
    assert (rtu.fields["local_comm_id"], rtu.fields["remote_comm_id"]) == (fields["local_comm_id"], 0x5000)
    assert link.state is CmState.AWAITING_METADATA and not link.connected

    ack = parse_roce(link.receive(metadata_send(), 0.7)[0])
    assert ack.icrc_ok and ack.opcode == RoceOpcode.RC_ACK and ack.bth["dest_qp"] == COLLECTOR_QPN
    assert ack.bth["psn"] == RECEIVE_PSN and ack.headers["aeth"]["msn"] == 1  # its own PSN, MSN 1 (§7.5)
    assert link.connected and link.metadata == Metadata(0x7F0000001000, 2048, 0x229)
    assert (link.remote_qpn, link.send_psn) == (COLLECTOR_QPN, COLLECTOR_PSN)
    again = parse_roce(link.receive(metadata_send(), 0.8)[0])  # our ACK was lost: the SEND comes again
    assert again.bth["psn"] == RECEIVE_PSN and link.connected
    assert link.tick(60.0) == []  # a connection needs no keepalive


def test_frames_that_are_not_its_own_are_ignored():
    link = connection()
    req = sent_mad(link.tick(0.0)[0])
    stranger = bytearray(rep_for(req))
    stranger[26:30] = bytes([10, 77, 2, 99])  # another source IP (the iCRC no longer matches either)
    wrong_comm = rep_for(req, remote_comm_id=req.fields["local_comm_id"] ^ 1)
    corrupt = bytearray(rep_for(req))
    corrupt[-1] ^= 1
    for frame in (bytes(stranger), wrong_comm, bytes(corrupt), metadata_send(), b"\x00" * 60):
        assert link.receive(frame, 0.1) == []
    assert link.state is CmState.REQ_SENT


def test_a_rejection_waits_and_tries_again_with_a_new_communication_id():
    link = connection(retry_s=2.0)
    req = sent_mad(link.tick(0.0)[0])
    assert link.receive(mad_from_collector(CmAttribute.REJ, local_comm_id=0x5000,
                                           remote_comm_id=req.fields["local_comm_id"], reason=8), 0.1) == []
    assert link.state is CmState.IDLE and "invalid service ID" in link.last_rejection
    assert link.tick(1.0) == []
    retry = sent_mad(link.tick(2.2)[0])
    assert retry.attribute is CmAttribute.REQ and retry.fields["local_comm_id"] != req.fields["local_comm_id"]
    assert retry.transaction_id != req.transaction_id
    # the collector's CM may still hold the QPN of a connection it lost: every attempt claims a new one
    assert retry.fields["local_qpn"] == LOCAL_QPN + QPN_STRIDE
    link.receive(mad_from_collector(CmAttribute.REJ, local_comm_id=0x5001, remote_comm_id=retry.fields["local_comm_id"],
                                    reason=10), 2.3)
    assert "stale connection" in link.last_rejection


def test_silence_resends_the_same_req_after_the_advertised_timeout_and_an_mra_buys_time():
    link = connection()
    req = sent_mad(link.tick(0.0)[0])
    timeout = cm_timeout_s(req.fields["remote_cm_response_timeout"])  # 4.096 us * 2^20: what we told the collector
    assert link.response_timeout_s == timeout and 4.0 < timeout < 4.5
    assert link.tick(timeout - 0.1) == []
    again = sent_mad(link.tick(timeout)[0])
    # a duplicate to the collector's CM (same IDs), never a second connection for it to block on
    assert again.attribute is CmAttribute.REQ and again.transaction_id == req.transaction_id
    assert again.fields == req.fields
    link.receive(mad_from_collector(CmAttribute.MRA, local_comm_id=0x5000, remote_comm_id=req.fields["local_comm_id"],
                                    service_timeout=22), timeout + 0.1)  # 4.096 us * 2^22: about 17 s more
    assert link.tick(2 * timeout + 1) == []
    assert sent_mad(link.tick(timeout + 0.1 + timeout + 17.2)[0]).fields == req.fields


def test_a_collector_slower_than_one_timeout_still_gets_its_connection():
    """Its REP answers the first REQ after the REQ went again: the answer is ours, and the connection completes
    (starting over here left the collector's synchronous accept waiting for an RTU that never came)."""
    link = connection()
    req = sent_mad(link.tick(0.0)[0])
    sent_mad(link.tick(link.response_timeout_s)[0])
    rtu = sent_mad(link.receive(rep_for(req), link.response_timeout_s + 2)[0])
    assert rtu.attribute is CmAttribute.RTU and rtu.fields["local_comm_id"] == req.fields["local_comm_id"]
    link.receive(metadata_send(), link.response_timeout_s + 3)
    assert link.connected and not any("starting over" in event for event in link.events)


def test_a_collector_that_never_answers_is_tried_again_from_scratch():
    link = connection(max_retries=2, retry_s=1.0)
    req = sent_mad(link.tick(0.0)[0])
    timeout = link.response_timeout_s
    resent = [sent_mad(link.tick(timeout)[0]), sent_mad(link.tick(2 * timeout)[0])]
    assert all(message.fields == req.fields for message in resent)
    assert link.tick(3 * timeout) == [] and link.state is CmState.IDLE
    assert "no REP from port 1337 to 3 REQs" in link.events[-1]
    fresh = sent_mad(link.tick(3 * timeout + 1.0)[0])
    assert fresh.fields["local_comm_id"] != req.fields["local_comm_id"]
    assert fresh.fields["local_qpn"] == LOCAL_QPN + QPN_STRIDE


def test_a_collector_that_accepts_but_never_sends_its_region_is_left_with_a_dreq():
    link = connection(metadata_timeout_s=30.0, retry_s=1.0)
    req = sent_mad(link.tick(0.0)[0])
    link.receive(rep_for(req), 0.1)
    assert link.tick(30.0) == [] and link.state is CmState.AWAITING_METADATA
    dreq = sent_mad(link.tick(30.2)[0])
    assert dreq.attribute is CmAttribute.DREQ and dreq.fields["remote_qpn"] == COLLECTOR_QPN
    assert link.state is CmState.IDLE and "no metadata SEND" in link.events[-1]


def test_a_dreq_is_answered_and_the_connection_starts_over():
    link = connection(retry_s=1.0)
    req = sent_mad(link.tick(0.0)[0])
    link.receive(rep_for(req), 0.1)
    link.receive(metadata_send(), 0.2)
    assert link.connected
    drep = sent_mad(link.receive(mad_from_collector(CmAttribute.DREQ, local_comm_id=0x5000,
                                                    remote_comm_id=req.fields["local_comm_id"],
                                                    remote_qpn=LOCAL_QPN), 5.0)[0])
    assert drep.attribute is CmAttribute.DREP and drep.fields["remote_comm_id"] == 0x5000
    assert not link.connected and link.metadata is None
    assert sent_mad(link.tick(6.1)[0]).attribute is CmAttribute.REQ


def test_the_translator_leaves_with_a_dreq():
    link = connection()
    req = sent_mad(link.tick(0.0)[0])
    link.receive(rep_for(req), 0.1)
    link.receive(metadata_send(), 0.2)
    dreq = sent_mad(link.disconnect(1.0)[0])
    assert dreq.attribute is CmAttribute.DREQ and dreq.fields["remote_qpn"] == COLLECTOR_QPN
    assert link.state is CmState.IDLE and connection().disconnect(0.0) == []  # nothing to leave


# --------------------------------------------------------------------------------------------------
# Targets


def test_targets_parse_and_size_their_structures_from_the_region():
    key_write = CmTarget.parse("10.0.0.51:1337,kind=key-write")
    append = CmTarget.parse("10.0.0.51:1338,kind=append,list=3,batch=8")
    assert (key_write.ip, key_write.port, key_write.kind) == (ip_bytes("10.0.0.51"), 1337, "key-write")
    assert (append.list_id, append.batch) == (3, 8)
    link = connection()
    link.remote_qpn, link.send_psn, link.metadata = COLLECTOR_QPN, COLLECTOR_PSN, Metadata(0x1000, 3000, 0x22)
    advert = key_write.advertisement(link)
    assert advert["qp"]["length"] == 256 * 8  # 375 slots fit: the hash is masked, so 256 are used
    assert advert["qp"]["start_psn"] == COLLECTOR_PSN and advert["qp"]["rkey"] == 0x22
    ring = append.advertisement(link)
    assert (ring["first_list"], ring["lists"], ring["entries"], ring["batch"]) == (3, 1, 744, 8)  # 750 down to B
    assert advert["redundancy"] == MAX_REDUNDANCY  # the original's: reports may ask for up to 4 copies
    assert CmTarget.parse("10.0.0.51:1337,kind=key-write,redundancy=1").advertisement(link)["redundancy"] == 1


@pytest.mark.parametrize("text,problem", [
    ("10.0.0.51,kind=key-write", "rdma_cm port"), ("nope:1337,kind=key-write", "not an IP address"),
    ("10.0.0.51:1337", "kind must be one of"), ("10.0.0.51:1337,kind=key-write,size=3", "unknown option"),
    ("10.0.0.51:1337,kind=append,list=x", "integers"),
    ("10.0.0.51:1337,kind=key-write,redundancy=5", "redundancy must be 1..4")])
def test_bad_targets_name_the_problem_and_show_an_example(text, problem):
    with pytest.raises(CmError, match=problem) as error:
        CmTarget.parse(text)
    assert "for example" in str(error.value)


@pytest.mark.privileged
def test_a_failing_connection_thread_is_said_at_start_not_hidden_behind_a_timeout(monkeypatch):
    """Whatever stops the rdma_cm thread (here a bug, raised on purpose) is what `start` reports."""
    from softdta.kernel.netns import Namespace, address, cleanup_prefix, in_netns, neighbour, veth_pair
    from softdta.links.cm import CmLinks

    prefix = f"sdta-cm{os.getpid() % 10000}-"
    cleanup_prefix(prefix)
    ours, theirs = Namespace.create(prefix + "t"), Namespace.create(prefix + "c")
    try:
        veth_pair(ours, "t0", theirs, "c0")
        address(ours, "t0", "10.77.3.1/24")
        neighbour(ours, "t0", "10.77.3.2", "02:00:00:00:03:02")

        def broken(self):
            raise RuntimeError("boom")

        monkeypatch.setattr(CmLinks, "_serve", broken)
        logged = []
        with in_netns(ours.name):
            links = CmLinks({"mac": "02:00:00:00:03:01", "ip": "10.77.3.1"},
                            [CmTarget.parse("10.77.3.2:1337,kind=key-write")], "t0", log=logged.append)
            with pytest.raises(CmError, match="the rdma_cm connections stopped: RuntimeError: boom"):
                links.start(timeout=2)
        assert logged == ["softdta: error: the rdma_cm connections stopped: RuntimeError: boom"]
    finally:
        cleanup_prefix(prefix)
