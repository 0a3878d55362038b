"""One truth for a queue pair's PSN (docs/protocol.md, "Queue-pair PSNs"): which advertised PSNs a translator
adopts, and the RC requester's reply window and its account of writes lost to NAKs."""

import dataclasses

import pytest

from softdta.core import workload
from softdta.core.control_plane import LiveQp, Slots, plan, restart_psn
from softdta.core.offline import OfflineCollector
from softdta.core.translator import Translator
from softdta.spec import (
    ACK_SYNDROME,
    DEFAULT_ACK_REQUEST_INTERVAL,
    PSN_MASK,
    DtaOpcode,
    RoceOpcode,
    TranslatorCounter,
    Transport,
)
from softdta.wire.frames import UdpEndpoints
from softdta.wire.roce import (
    NAK_REMOTE_ACCESS_SYNDROME,
    NAK_SEQUENCE_SYNDROME,
    build_roce_frame,
    parse_roce,
    transport_payload,
)
from tests.common import COLLECTOR_IP, frames_of


def _qp(tables, start_psn=100, remote_qpn=None):
    qp = tables.qps[0]
    return dataclasses.replace(qp, start_psn=start_psn, remote_qpn=qp.remote_qpn if remote_qpn is None else remote_qpn)


@pytest.mark.parametrize("live, advertised, expected", [
    (None, 100, 100),  # new to the data plane: it starts at the collector's PSN
    (LiveQp(0x200, 5, 40, 30), 100, 100),  # towards another remote QPN: a new queue pair
    (LiveQp(0x100, 100, 900, 880), 100, None),  # the same advertisement again (a reload): nothing new said
    (LiveQp(0x100, 0, 900, 880), 890, None),  # frames in flight explain the collector's PSN
    (LiveQp(0x100, 0, 900, 880), 880, None),
    (LiveQp(0x100, 0, 900, 880), 900, None),
    (LiveQp(0x100, 50, 900, 880), 0, 0),  # the collector's QP started over: adopt
    (LiveQp(0x100, 0, 900, 880), 200, 200),  # it expects older PSNs than were ever unacknowledged
    (LiveQp(0x100, 0, 900, 880), 901, 901),  # it expects PSNs never sent (a translator that forgot)
    (LiveQp(0x100, 0xFFFFF0, 3, 0xFFFFFE), 1, None),  # the window wraps at 2^24
    (LiveQp(0x100, 0xFFFFF0, 3, 0xFFFFFE), 0xFFFFFD, 0xFFFFFD),
    (LiveQp(0x100, 0), 7, 7),  # a data plane whose PSNs cannot be read back takes every new PSN
])
def test_which_advertised_psns_a_translator_adopts(tables, live, advertised, expected):
    qp = _qp(tables, advertised, remote_qpn=0x100)
    assert restart_psn(qp, live) == expected


def test_a_plan_names_the_queue_pairs_it_restarts(tables):
    first = plan(tables, Slots(), flush_idle_ns=1, egress=lambda qp: 0)
    assert {restart.qp for restart in first.restarts} == {qp.name for qp in tables.qps}
    assert all(restart.live_psn is None for restart in first.restarts)
    index = first.slots.qp[tables.qps[0].local_qpn]
    held = {first.slots.qp[qp.local_qpn]: LiveQp(qp.remote_qpn, qp.start_psn, qp.start_psn + 50, qp.start_psn + 40)
            for qp in tables.qps}
    tables.qps[0].start_psn = (tables.qps[0].start_psn + 7) & PSN_MASK  # behind every unacknowledged PSN
    again = plan(tables, first.slots, flush_idle_ns=1, egress=lambda qp: 0, installed_qps=held)
    assert [(r.qp, r.psn, r.live_psn) for r in again.restarts] == \
        [(tables.qps[0].name, tables.qps[0].start_psn, held[index].next_psn)]
    assert [entry.value["next_psn"] for entry in again.state if entry.table == "qp_state"] == \
        [tables.qps[0].start_psn]


# The RC requester's replies, through the reference responder

def _rc_key_write(tables):
    kw = tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE)
    kw.qp.transport = Transport.RC
    return kw


def _nak(tables, qp, syndrome, psn):
    ends = UdpEndpoints(qp.collector_mac, tables.mac, qp.collector_ip, tables.ip, 50000, 4791)
    return build_roce_frame(ends, transport_payload(RoceOpcode.RC_ACK, qp.local_qpn, psn,
                                                    {"aeth": {"syndrome": syndrome, "msn": 1}}))


def _deliver(translator, collector, frames, lose=()):
    """Frames through the translator to the responder and its replies back; `lose`: indexes of RoCE frames
    lost on the way to the collector."""
    sent = 0
    for frame in frames:
        for emitted in translator.process(frame, 0).frames:
            if sent not in lose:
                for reply in collector.deliver(emitted):
                    translator.process(reply, 0)
            sent += 1
    return sent


def test_the_default_tables_request_acks_so_a_stale_nak_is_refused(tables, reporter):
    """With the default AckReq interval the window [unacked, next) follows the collector, so a NAK naming a PSN
    the collector acknowledged long ago is refused, and no later write is lost to it."""
    assert tables.ack_request_interval == DEFAULT_ACK_REQUEST_INTERVAL
    kw = _rc_key_write(tables)
    translator, collector = Translator(tables), OfflineCollector(tables)
    _deliver(translator, collector, frames_of(reporter, workload.key_write(300, seed=5, redundancy=1)))
    state = translator.qp_state[kw.qp.index]
    assert state.next_psn == 300 and (state.next_psn - state.unacked_psn) % (1 << 24) < tables.ack_request_interval
    assert translator.process(_nak(tables, kw.qp, NAK_SEQUENCE_SYNDROME, 200), 0).drop is \
        TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW
    _deliver(translator, collector, frames_of(reporter, workload.key_write(300, seed=6, redundancy=1)))
    responder = collector.responders[COLLECTOR_IP].qps[kw.qp.remote_qpn]
    assert responder.expected_psn == translator.qp_state[kw.qp.index].next_psn == 600
    assert collector.counters()["executed"] == 600 and not translator.counters[TranslatorCounter.NAK_LOST_WRITES]


def test_every_write_lost_to_a_sequence_nak_is_counted(tables, reporter):
    """A frame lost on the way: the collector NAKs the gap once and drops what follows until the resync; the
    translator counts exactly the writes the collector did not execute."""
    tables.grace_ns = 0
    kw = _rc_key_write(tables)
    translator, collector = Translator(tables), OfflineCollector(tables)
    sent = _deliver(translator, collector, frames_of(reporter, workload.key_write(400, seed=7, redundancy=1)),
                    lose={37, 38, 250})
    executed = collector.counters()["executed"]
    assert sent == 400 and translator.counters[TranslatorCounter.RX_NAK_SEQUENCE] == 2
    assert executed + translator.counters[TranslatorCounter.NAK_LOST_WRITES] == sent, \
        "every write is executed or counted lost"
    assert collector.responders[COLLECTOR_IP].qps[kw.qp.remote_qpn].expected_psn == \
        translator.qp_state[kw.qp.index].next_psn


def test_a_fatal_nak_counts_the_writes_it_ends(tables, reporter):
    kw = _rc_key_write(tables)
    translator = Translator(tables)
    frames = [f for r in workload.key_write(10, seed=8, redundancy=1)
              for f in translator.process(reporter.frame(r), 0).frames]
    assert [parse_roce(f).bth["psn"] for f in frames] == list(range(10))
    assert translator.process(_nak(tables, kw.qp, NAK_REMOTE_ACCESS_SYNDROME, 6), 0).drop is None
    assert translator.counters[TranslatorCounter.NAK_LOST_WRITES] == 4
    assert translator.counters[TranslatorCounter.RX_NAK_FATAL] == 1
    assert translator.process(_nak(tables, kw.qp, ACK_SYNDROME, 2), 0).drop is None  # an ACK loses nothing
    assert translator.counters[TranslatorCounter.NAK_LOST_WRITES] == 4
