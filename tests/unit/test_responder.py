"""The reference responder: PSN rules per transport, access checks and replies, as rocev2.md describes rxe."""

import numpy as np
import pytest

from softdta.core.responder import Access, MemoryRegion, Responder, ResponderQp
from softdta.spec import ACK_SYNDROME, ResponderCounter, RoceOpcode, Transport
from softdta.wire.frames import UdpEndpoints, ip_bytes, mac_bytes
from softdta.wire.roce import (
    NAK_INVALID_REQUEST_SYNDROME,
    NAK_REMOTE_ACCESS_SYNDROME,
    NAK_SEQUENCE_SYNDROME,
    build_roce_frame,
    parse_roce,
    transport_payload,
)

TRANSLATOR = (mac_bytes("02:00:00:00:00:01"), ip_bytes("10.9.0.1"))
COLLECTOR = (mac_bytes("02:00:00:00:00:02"), ip_bytes("10.9.0.2"))
BASE, RKEY, QPN, PEER_QPN = 0x10000, 0xBEEF, 0x11, 0x99


def make(transport=Transport.RC, access=None, size=4096, psn=100):
    region = MemoryRegion(BASE, RKEY, bytearray(size), **({"access": access} if access is not None else {}))
    qp = ResponderQp(QPN, transport, TRANSLATOR[1], TRANSLATOR[0], region, expected_psn=psn, remote_qpn=PEER_QPN)
    return Responder(*COLLECTOR, [qp]), qp


def write(psn, offset=0, payload=b"\x01\x02\x03\x04", rkey=RKEY, transport=Transport.RC, ack_req=False,
          immediate=None, src_ip=TRANSLATOR[1], length=None):
    if transport is Transport.RC:
        opcode = RoceOpcode.RC_WRITE_ONLY_IMM if immediate is not None else RoceOpcode.RC_WRITE_ONLY
    else:
        opcode = RoceOpcode.UC_WRITE_ONLY_IMM if immediate is not None else RoceOpcode.UC_WRITE_ONLY
    headers = {"reth": {"va": BASE + offset, "rkey": rkey, "dma_length": len(payload) if length is None else length},
               "immdt": {"immediate": immediate or 0}}
    ends = UdpEndpoints(TRANSLATOR[0], COLLECTOR[0], src_ip, COLLECTOR[1], 49152, 4791)
    return build_roce_frame(ends, transport_payload(opcode, QPN, psn, headers, payload, ack_req=ack_req))


def fetch_add(psn, offset=0, add=5, rkey=RKEY):
    ends = UdpEndpoints(TRANSLATOR[0], COLLECTOR[0], TRANSLATOR[1], COLLECTOR[1], 49152, 4791)
    atomic = {"va": BASE + offset, "rkey": rkey, "swap_add": add, "compare": 0}
    return build_roce_frame(ends, transport_payload(RoceOpcode.RC_FETCH_ADD, QPN, psn, {"atomic_eth": atomic}))


def aeth(reply):
    frame = parse_roce(reply)
    assert frame.icrc_ok and frame.bth["dest_qp"] == PEER_QPN
    return frame.headers["aeth"]["syndrome"], frame.bth["psn"], frame


def test_in_order_rc_write_executes_and_acks_when_asked():
    responder, qp = make()
    out = responder.process(write(100, offset=8, ack_req=True))
    assert out.executed and bytes(qp.region.view[8:12]) == b"\x01\x02\x03\x04"
    syndrome, psn, _ = aeth(out.replies[0])
    assert (syndrome, psn) == (ACK_SYNDROME, 100)
    assert not responder.process(write(101)).replies  # no AckReq, no ACK
    assert qp.expected_psn == 102


def test_ahead_of_sequence_draws_one_nak_then_silence_until_epsn():
    responder, qp = make()
    first = responder.process(write(103, payload=b"\xff" * 4))
    syndrome, psn, _ = aeth(first.replies[0])
    assert (syndrome, psn) == (NAK_SEQUENCE_SYNDROME, 100)
    assert not first.executed and not qp.region.view.any()
    second = responder.process(write(104))
    assert not second.replies and not second.executed
    assert responder.process(write(100)).executed
    assert responder.process(write(105)).replies  # a new gap after progress draws a new NAK
    assert responder.counters[ResponderCounter.OUT_OF_SEQ_REQUEST] == 3


def test_duplicate_is_reacknowledged_not_reexecuted():
    responder, qp = make()
    responder.process(write(100, payload=b"AAAA"))
    responder.process(write(101, payload=b"BBBB", offset=4))
    out = responder.process(write(100, payload=b"ZZZZ"))
    assert not out.executed and bytes(qp.region.view[:4]) == b"AAAA"
    syndrome, psn, _ = aeth(out.replies[0])
    assert (syndrome, psn) == (ACK_SYNDROME, 101)
    assert responder.counters[ResponderCounter.DUPLICATE_REQUEST] == 1


@pytest.mark.parametrize("frame", [
    write(100, rkey=RKEY + 1),
    write(100, offset=4094),
    write(100, offset=-4),
    write(100, length=8),
])
def test_access_errors_nak_and_move_the_qp_to_error(frame):
    responder, qp = make()
    out = responder.process(frame)
    syndrome, psn, _ = aeth(out.replies[0])
    assert (syndrome, psn) == (NAK_REMOTE_ACCESS_SYNDROME, 100)
    assert qp.error and not qp.region.view.any()
    assert responder.process(write(100)).dropped is ResponderCounter.QP_IN_ERROR


def test_write_without_remote_write_access_is_refused():
    responder, qp = make(access=Access.LOCAL_WRITE | Access.REMOTE_ATOMIC)
    assert aeth(responder.process(write(100)).replies[0])[0] == NAK_REMOTE_ACCESS_SYNDROME


def test_fetch_and_add_returns_the_original_and_adds_little_endian():
    responder, qp = make()
    qp.region.view[16:24] = np.frombuffer((1000).to_bytes(8, "little"), np.uint8)
    out = responder.process(fetch_add(100, offset=16, add=(1 << 64) - 1))
    frame = parse_roce(out.replies[0])
    assert frame.opcode == RoceOpcode.RC_ATOMIC_ACK and frame.icrc_ok
    assert frame.headers["atomic_ack_eth"]["original"] == 1000
    assert int.from_bytes(bytes(qp.region.view[16:24]), "little") == 999
    again = parse_roce(responder.process(fetch_add(100, offset=16)).replies[0])
    assert again.headers["atomic_ack_eth"]["original"] == 1000  # a duplicate atomic is answered, not re-applied
    assert int.from_bytes(bytes(qp.region.view[16:24]), "little") == 999


def test_atomics_need_alignment_and_atomic_access():
    responder, _ = make()
    assert aeth(responder.process(fetch_add(100, offset=4)).replies[0])[0] == NAK_INVALID_REQUEST_SYNDROME
    responder, _ = make(access=Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    assert aeth(responder.process(fetch_add(100)).replies[0])[0] == NAK_REMOTE_ACCESS_SYNDROME


def test_uc_accepts_psn_jumps_and_never_replies():
    responder, qp = make(Transport.UC)
    out = responder.process(write(107, transport=Transport.UC))
    assert out.executed and not out.replies and qp.expected_psn == 108
    bad = responder.process(write(108, rkey=1, transport=Transport.UC))
    assert not bad.replies and not qp.error  # a bad UC write is dropped; the QP lives on
    assert responder.process(write(3, transport=Transport.UC, offset=4)).executed


def test_uc_rejects_rc_opcodes_and_atomics():
    responder, _ = make(Transport.UC)
    assert responder.process(write(100)).dropped
    assert responder.process(fetch_add(100)).dropped


def test_write_with_immediate_raises_a_completion():
    responder, _ = make()
    out = responder.process(write(100, immediate=0xCAFE))
    assert out.completions[0].immediate == 0xCAFE and out.completions[0].byte_len == 4


def test_bad_icrc_wrong_source_and_unknown_qp_are_silently_dropped():
    responder, qp = make()
    corrupted = bytearray(write(100))
    corrupted[-6] ^= 0x40
    assert responder.process(bytes(corrupted)).dropped is ResponderCounter.ICRC_ERRORS
    assert responder.process(write(100, src_ip=ip_bytes("10.9.0.66"))).dropped is ResponderCounter.SOURCE_GID_MISMATCH
    qp.qpn, responder.qps = 0x12, {0x12: qp}
    out = responder.process(write(100))
    assert out.dropped is ResponderCounter.UNKNOWN_QPN and not out.replies and not qp.region.view.any()
