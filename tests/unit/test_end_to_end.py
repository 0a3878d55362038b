"""Reporter -> reference translator -> reference responder -> queries, for every primitive."""

import numpy as np

from softdta.core import workload
from softdta.core.offline import OfflineCollector
from softdta.core.primitives.key_increment.queries import keyincrement_query
from softdta.core.primitives.key_write.queries import key_write_query
from softdta.core.primitives.postcarding.queries import postcard_query
from softdta.core.query import BLANK
from softdta.core.translator import Translator
from softdta.spec import DtaOpcode, TranslatorCounter, Transport
from softdta.wire.hashing import keys_to_rows
from tests.common import COLLECTOR_IP, frames_of


def run(tables, frames, now_ns=0):
    translator = Translator(tables)
    collector = OfflineCollector(tables)
    for frame in frames:
        out = translator.process(frame, now_ns)
        for emitted in out.frames:
            for reply in collector.deliver(emitted):
                assert translator.process(reply, now_ns).drop is None
    return translator, collector


def test_key_write_queries_return_what_was_reported(tables, reporter):
    reports = workload.key_write(2000, seed=1, redundancy=2)
    _, collector = run(tables, frames_of(reporter, reports))
    region = collector.structure_region(DtaOpcode.KEY_WRITE, COLLECTOR_IP)
    keys = np.array([int.from_bytes(r.key, "big") for r in reports], dtype=np.uint64)
    kw = tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE)
    answer = key_write_query(region, keys, redundancy=2, key_hash=kw.key_hash)
    truth = np.array([int.from_bytes(r.data, "big") for r in reports], dtype=np.uint32)
    assert answer.found.mean() > 0.99  # 2000 keys in 131072 slots: load factor 0.015
    assert (answer.values[answer.found] == truth[answer.found]).all()
    assert not key_write_query(region, keys_to_rows(np.arange(10**6, 10**6 + 500)), 2, key_hash=kw.key_hash).found.any()


def test_key_write_rc_over_the_responder_keeps_psns_in_step(tables, reporter):
    kw = tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE)
    kw.qp.transport = Transport.RC
    tables.ack_request_interval = 16
    translator, collector = run(tables, frames_of(reporter, workload.key_write(300, seed=2, redundancy=3)))
    responder_qp = collector.responders[COLLECTOR_IP].qps[kw.qp.remote_qpn]
    assert responder_qp.expected_psn == translator.qp_state[kw.qp.index].next_psn == 900
    assert translator.counters[TranslatorCounter.RX_ACKS] == 900 // 16


def test_key_increment_counts_match_the_truth(tables, reporter):
    reports = workload.key_increment(3000, seed=3, redundancy=2, flows=50)
    translator, collector = run(tables, frames_of(reporter, reports))
    truth: dict[bytes, int] = {}
    for report in reports:
        truth[report.key] = truth.get(report.key, 0) + report.counter
    keys = list(truth)
    ki = tables.structure(COLLECTOR_IP, DtaOpcode.KEY_INCREMENT)
    region = collector.structure_region(DtaOpcode.KEY_INCREMENT, COLLECTOR_IP)
    estimate = keyincrement_query(region, keys, 2, ki.key_hash)
    assert list(estimate) == [truth[k] for k in keys]  # 50 flows in 65536 counters: no collisions
    assert collector.counters()["executed"] == 6000


def test_append_entries_are_all_recovered_in_order(tables, reporter):
    reports = workload.append(2000, seed=4, lists=16)  # about 125 per 256-entry ring: no overrun
    translator, collector = run(tables, frames_of(reporter, reports))
    poller = collector.append_pollers[0]
    seen = poller.poll()
    translator_frames = translator.flush_idle(now_ns=0)
    for frame in translator_frames:
        collector.deliver(frame)
    for list_id, entries in poller.poll().items():
        seen[list_id] = np.concatenate([seen.get(list_id, entries[:0]), entries])
    for list_id in range(16):
        sent = [int.from_bytes(r.data, "big") for r in reports if r.list_id == list_id]
        assert list(seen[list_id]) == sent
    assert poller.poll() == {}


def test_append_poller_follows_the_ring_across_wraps(tables, reporter):
    translator = Translator(tables)
    collector = OfflineCollector(tables)
    poller = collector.append_pollers[0]
    sent, received = [], []
    for round_ in range(5):  # 5 x 200 entries through a 256-entry ring, polled between rounds
        reports = workload.append(200, seed=round_, lists=1)
        sent += [int.from_bytes(r.data, "big") for r in reports]
        for frame in frames_of(reporter, reports):
            for emitted in translator.process(frame).frames:
                collector.deliver(emitted)
        received += list(poller.poll()[0])
    assert received == sent


def test_postcard_paths_decode_against_the_switch_ids(tables, reporter):
    switch_ids = list(range(1, 1025))
    reports = workload.postcards(500, seed=5, switch_ids=switch_ids)
    _, collector = run(tables, frames_of(reporter, reports))
    paths: dict[bytes, list[int]] = {}
    for report in reports:
        paths.setdefault(report.key, [0] * 5)[report.hop - 1] = int.from_bytes(report.data, "big")
    keys = list(paths)
    answer = postcard_query(collector.structure_region(DtaOpcode.POSTCARDING, COLLECTOR_IP), keys, switch_ids)
    truth = np.array([paths[k] for k in keys])
    assert answer.complete.mean() > 0.95
    assert (answer.values[answer.complete] == truth[answer.complete]).all()
    unknown = postcard_query(collector.structure_region(DtaOpcode.POSTCARDING, COLLECTOR_IP),
                             [bytes([0xEE, 0, 0, i]) for i in range(100)], switch_ids)
    assert (unknown.values == BLANK).mean() > 0.99


def test_sketch_merge_lands_as_the_merged_sketch(tables, reporter):
    sk = tables.structure(COLLECTOR_IP, DtaOpcode.SKETCH_MERGE)
    reports = workload.sketch_epoch(sk.reporters, sk.columns, sk.rows, seed=6)
    _, collector = run(tables, frames_of(reporter, reports))
    expected = np.zeros((sk.rows, sk.columns), dtype=np.uint64)
    for report in reports:
        expected[:, report.column] += np.array(report.counters, dtype=np.uint64)
    assert (collector.structure_region(DtaOpcode.SKETCH_MERGE, COLLECTOR_IP).matrix() == expected).all()
