"""The reference translator: every primitive's frames, state, drops and RC feedback."""

import dataclasses

import pytest

from softdta.core.primitives import FlushRequest
from softdta.core.tables import Tables, with_queue_qps
from softdta.core.translator import Translator
from softdta.spec import (
    ACK_SYNDROME,
    DTA_NACK_PORT,
    DTA_PORT,
    MAX_REDUNDANCY,
    DtaOpcode,
    FlushTarget,
    NackKind,
    QpState,
    RoceOpcode,
    TranslatorCounter,
    Transport,
)
from softdta.wire import dta
from softdta.wire.dta import Profile, decode_nack
from softdta.wire.frames import UdpEndpoints, build_udp_frame, ip_bytes, parse_udp_frame
from softdta.wire.hashing import key_checksum, key_slot, postcard_hop_hash, postcard_slot_hash
from softdta.wire.roce import (
    NAK_REMOTE_ACCESS_SYNDROME,
    NAK_SEQUENCE_SYNDROME,
    build_roce_frame,
    parse_roce,
    transport_payload,
)
from tests.common import COLLECTOR_IP, EXAMPLE_TABLES


def structure(tables, primitive):
    return tables.structure(COLLECTOR_IP, primitive)


def send(translator, reporter, report, now_ns=0, profile=Profile.DTA_V1):
    return translator.process(reporter.frame(report, profile), now_ns)


def requests(out):
    return [parse_roce(frame) for frame in out.frames]


# -- Key-Write ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("redundancy", [1, 2, 3, 4])
def test_key_write_emits_one_write_per_copy_at_the_hashed_slot(tables, reporter, redundancy):
    translator = Translator(tables)
    kw = structure(tables, DtaOpcode.KEY_WRITE)
    key = bytes.fromhex("0a000001")
    out = send(translator, reporter, dta.key_write(key, 0xDEADBEEF, redundancy))
    frames = requests(out)
    assert len(frames) == redundancy
    for copy, frame in enumerate(frames):
        assert frame.icrc_ok
        assert frame.opcode == RoceOpcode.UC_WRITE_ONLY
        assert frame.bth["dest_qp"] == kw.qp.remote_qpn
        assert frame.bth["psn"] == (kw.qp.start_psn + copy) & 0xFFFFFF
        reth = frame.headers["reth"]
        assert reth["va"] == kw.qp.base_va + key_slot(key, copy, kw.slot_count, kw.key_hash) * 8
        assert reth["rkey"] == kw.qp.rkey and reth["dma_length"] == 8
        assert frame.payload == key_checksum(key).to_bytes(4, "little") + bytes.fromhex("deadbeef")
    assert translator.counters[TranslatorCounter.TX_FRAMES] == redundancy


def test_key_write_dta_v1_vector(tables, reporter):
    """dta-v1.md §2.1: key 1 has checksum 0x99F8B879, written as 79 B8 F8 99, at slot 173 of 256 for n = 0."""
    translator = Translator(tables)
    kw = structure(tables, DtaOpcode.KEY_WRITE)
    frame = requests(send(translator, reporter, dta.key_write(1, 42, 1)))[0]
    assert frame.payload[:4] == bytes.fromhex("79b8f899")
    assert (frame.headers["reth"]["va"] - kw.qp.base_va) // 8 % 256 == 173


def test_frame_fields_come_from_the_tables(tables, reporter):
    translator = Translator(tables)
    frame = requests(send(translator, reporter, dta.key_write(7, 7)))[0]
    udp = frame.udp_frame
    assert udp.eth["src"] == tables.mac and udp.eth["dst"] == structure(tables, DtaOpcode.KEY_WRITE).qp.collector_mac
    assert udp.src_ip == tables.ip and udp.dst_ip == COLLECTOR_IP
    assert udp.ip["dscp"] == tables.dscp and udp.ip["ttl"] == tables.ttl and udp.ip["flags"] == 0b010
    assert udp.udp["sport"] == tables.udp_sport and udp.udp["checksum"] == 0


def test_immediate_flag_becomes_write_with_immediate_carrying_the_key_checksum(tables, reporter):
    translator = Translator(tables)
    frame = requests(send(translator, reporter, dta.key_write(5, 9, 1, immediate=True)))[0]
    assert frame.opcode == RoceOpcode.UC_WRITE_ONLY_IMM
    assert frame.headers["immdt"]["immediate"] == key_checksum((5).to_bytes(4, "big"))


def test_rc_structures_use_rc_opcodes(tables, reporter):
    structure(tables, DtaOpcode.KEY_WRITE).qp.transport = Transport.RC
    frame = requests(send(Translator(tables), reporter, dta.key_write(5, 9, 1)))[0]
    assert frame.opcode == RoceOpcode.RC_WRITE_ONLY


def test_extended_key_write_with_five_tuple_key_and_path_data(reporter):
    document = _example_document()
    document["structures"][0].update(key_len=13, data_len=20)
    tables = Tables.from_dict(document)
    kw = structure(tables, DtaOpcode.KEY_WRITE)
    assert kw.slot_size == 32
    key, data = bytes(range(13)), bytes(range(100, 120))
    frames = requests(send(Translator(tables), reporter, dta.key_write(key, data, 2, extended=True)))
    assert [f.headers["reth"]["va"] - kw.qp.base_va for f in frames] == \
        [key_slot(key, n, kw.slot_count, kw.key_hash) * 32 for n in range(2)]
    assert all(f.payload == key_checksum(key).to_bytes(4, "little") + data for f in frames)


def test_report_sizes_must_match_the_structure(tables, reporter):
    translator = Translator(tables)
    out = send(translator, reporter, dta.key_write(bytes(13), 1, 1, extended=True))
    assert out.drop is TranslatorCounter.DROP_BAD_LENGTH and not out.frames


@pytest.mark.parametrize("kind", [DtaOpcode.KEY_WRITE, DtaOpcode.KEY_INCREMENT])
def test_a_structure_takes_reports_of_at_most_its_redundancy(tables, reporter, kind):
    structure = tables.structure(reporter.collector_ip, kind)
    assert structure.redundancy == MAX_REDUNDANCY  # the default takes what the original DTA takes
    structure.redundancy = 2
    translator = Translator(tables)
    report = dta.key_write if kind is DtaOpcode.KEY_WRITE else dta.key_increment
    assert [len(send(translator, reporter, report(7, 9, n)).frames) for n in (1, 2)] == [1, 2]
    for n in (3, 4):
        out = send(translator, reporter, report(7, 9, n))
        assert out.drop is TranslatorCounter.DROP_BAD_REDUNDANCY and not out.frames
    # the sizes are checked first, as every data path checks them
    assert send(translator, reporter, report(bytes(13), 9, 3, extended=True)).drop is TranslatorCounter.DROP_BAD_LENGTH
    assert translator.counters[TranslatorCounter.DROP_BAD_REDUNDANCY] == 2


# -- Key-Increment ----------------------------------------------------------------------------------------------

def test_key_increment_is_a_correct_fetch_and_add(tables, reporter):
    translator = Translator(tables)
    ki = structure(tables, DtaOpcode.KEY_INCREMENT)
    frames = requests(send(translator, reporter, dta.key_increment(3, 1500, 2)))
    assert len(frames) == 2
    for copy, frame in enumerate(frames):
        assert frame.opcode == RoceOpcode.RC_FETCH_ADD and frame.icrc_ok
        assert frame.udp_frame.ip["total_length"] == 72 and frame.udp_frame.udp["length"] == 52
        assert len(frame.udp_frame.frame) == 14 + 72 and frame.payload == b""
        atomic = frame.headers["atomic_eth"]
        assert atomic == {"va": ki.qp.base_va + key_slot((3).to_bytes(4, "big"), copy, ki.slot_count, ki.key_hash) * 8,
                          "rkey": ki.qp.rkey, "swap_add": 1500, "compare": 0}


def test_key_increment_needs_rc():
    document = _example_document()
    document["structures"][1]["qp"]["transport"] = "uc"
    with pytest.raises(ValueError, match="needs an RC queue pair"):
        Tables.from_dict(document)


# -- Append -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [1, 2, 4, 8, 16])
def test_append_batches_and_wraps_the_ring(reporter, batch):
    document = _example_document()
    document["append"][0].update(batch=batch, entries=32)
    tables = Tables.from_dict(document)
    lists = tables.append_lists[0]
    translator = Translator(tables)
    offsets = []
    values = list(range(1, 32 * 3 + 1))
    for value in values:
        out = send(translator, reporter, dta.append(2, value))
        assert len(out.frames) == (1 if value % batch == 0 else 0)
        for frame in requests(out):
            reth = frame.headers["reth"]
            assert reth["dma_length"] == 4 * batch
            offset = reth["va"] - lists.qp.base_va - lists.ring_offset(2)
            offsets.append(offset // 4)
            first = value - batch + 1
            assert frame.payload == b"".join(v.to_bytes(4, "little") for v in range(first, value + 1))
    ring_positions = [i * batch % 32 for i in range(len(values) // batch)]
    assert offsets == ring_positions  # after the wrap, slot 0 is written once, then batch, 2*batch, ...
    assert max(offsets) + batch <= 32


def test_append_idle_flush_pads_a_partial_batch(tables, reporter):
    translator = Translator(tables)
    for value in (11, 12):
        send(translator, reporter, dta.append(5, value), now_ns=1000)
    assert translator.flush_idle(now_ns=1500, idle_ns=1000) == []
    frames = [parse_roce(f) for f in translator.flush_idle(now_ns=2000, idle_ns=1000)]
    assert len(frames) == 1
    assert frames[0].payload == (11).to_bytes(4, "little") + (12).to_bytes(4, "little") + bytes(8)
    out = requests(send(translator, reporter, dta.append(5, 1)))
    assert out == []  # the next batch starts afresh
    assert translator.counters[TranslatorCounter.APPEND_FLUSHES] == 1


def test_idle_flush_waits_for_the_qp_to_be_idle_and_goes_oldest_first(tables, reporter):
    """The kernel flushes from another CPU than the one translating: a QP is flushed only after a flush pass has
    seen it without data-path emissions for the idle time, so the two never interleave PSNs on it."""
    translator = Translator(tables)
    send(translator, reporter, dta.append(7, 1), now_ns=0)
    send(translator, reporter, dta.append(6, 2), now_ns=100)
    send(translator, reporter, dta.append(5, 3), now_ns=150)
    for value in range(4):  # completes a batch on list 9 at t=900: the Append QP was just busy
        send(translator, reporter, dta.append(9, value), now_ns=900)
    assert translator.flush_idle(now_ns=1000, idle_ns=500) == []  # the batch of t=900 marks the QP busy
    assert translator.flush_idle(now_ns=1400, idle_ns=500) == []
    frames = [parse_roce(f) for f in translator.flush_idle(now_ns=1500, idle_ns=500)]
    lists = tables.append_lists[0]
    assert [(f.headers["reth"]["va"] - lists.qp.base_va) // lists.ring_offset(1) for f in frames] == [7, 6, 5]
    assert [f.payload[:4] for f in frames] == [(v).to_bytes(4, "little") for v in (1, 2, 3)]


def test_each_rx_queue_writes_through_its_own_qp_and_shares_the_batches(tables, reporter):
    """Queue 1's reports take queue 1's QPs and PSNs; an Append batch that queue 0 started and queue 1 filled is
    written by queue 1; a batch the flusher writes out goes through the QP of the queue that started it."""
    tables = with_queue_qps(tables, 2)
    translator = Translator(tables)
    kw = structure(tables, DtaOpcode.KEY_WRITE)
    frames = requests(translator.process(reporter.frame(dta.key_write(1, 2, 1)), 0, queue=1))
    assert [(f.bth["dest_qp"], f.bth["psn"]) for f in frames] == [(kw.qps[1].remote_qpn, kw.qps[1].start_psn)]
    lists = tables.append_lists[0]
    translator.process(reporter.frame(dta.append(5, 1)), 0, queue=0)
    for value in (2, 3, 4):
        frames = requests(translator.process(reporter.frame(dta.append(5, value)), 0, queue=1))
    assert [f.bth["dest_qp"] for f in frames] == [lists.qps[1].remote_qpn]
    assert frames[0].payload == b"".join(v.to_bytes(4, "little") for v in (1, 2, 3, 4))
    translator.process(reporter.frame(dta.append(6, 9)), 0, queue=1)
    translator.flush_idle(now_ns=1000, idle_ns=1000)  # marks the QP busy
    flushed = [parse_roce(f) for f in translator.flush_idle(now_ns=2000, idle_ns=1000)]
    assert [f.bth["dest_qp"] for f in flushed] == [lists.qps[1].remote_qpn]
    assert translator.qp_state[lists.qp.index].frames_sent == 0


def test_a_report_on_an_rx_queue_without_a_qp_is_dropped_and_counted(tables, reporter):
    translator = Translator(with_queue_qps(tables, 2))
    for report in (dta.key_write(1, 2, 1), dta.append(5, 1), dta.postcard(3, 1, 5)):
        assert translator.process(reporter.frame(report), 0, queue=2).drop is TranslatorCounter.DROP_NO_QUEUE_QP
    assert translator.counters[TranslatorCounter.DROP_NO_QUEUE_QP] == 3
    assert not translator.primitive(DtaOpcode.APPEND).state


def test_unknown_list_is_dropped_and_counted(tables, reporter):
    translator = Translator(tables)
    out = send(translator, reporter, dta.append(64, 1))
    assert out.drop is TranslatorCounter.DROP_UNKNOWN_LIST and not out.frames
    assert translator.counters[TranslatorCounter.DROP_UNKNOWN_LIST] == 1


# -- Postcarding ------------------------------------------------------------------------------------------------

def _path_payload(key, path, hops=5):
    values = [(path[i] ^ postcard_hop_hash(key, i + 1)) if i < len(path) else 0 for i in range(hops)]
    return b"".join(v.to_bytes(4, "big") for v in values)


def test_postcards_complete_a_path_with_one_write(tables, reporter):
    translator = Translator(tables)
    pc = structure(tables, DtaOpcode.POSTCARDING)
    key, path = (0).to_bytes(4, "big"), [11, 22, 33, 44, 55]  # key 0 is a real flow, not "empty"
    outs = [send(translator, reporter, dta.postcard(key, hop, path[hop - 1])) for hop in (3, 1, 5, 2, 4)]
    assert [len(o.frames) for o in outs] == [0, 0, 0, 0, 1]
    frame = requests(outs[-1])[0]
    assert frame.headers["reth"]["va"] == pc.qp.base_va + (postcard_slot_hash(key) & (pc.slot_count - 1)) * 32
    assert frame.headers["reth"]["dma_length"] == 20
    assert frame.payload == _path_payload(key, path)
    # State was reset: the same flow's next path needs all five hops again.
    outs = [send(translator, reporter, dta.postcard(key, hop, 7)) for hop in (1, 2, 3, 4)]
    assert all(not o.frames for o in outs)


def test_postcard_duplicate_hop_does_not_complete_the_path(tables, reporter):
    translator = Translator(tables)
    for hop in (1, 1, 2, 2, 3, 4):
        assert not send(translator, reporter, dta.postcard(9, hop, hop)).frames
    assert len(send(translator, reporter, dta.postcard(9, 5, 5)).frames) == 1


def test_postcard_collision_writes_the_evicted_flow_at_its_own_address(reporter):
    # With the region larger than the cache, cache neighbours have different collector slots.
    document = _example_document()
    document["structures"][2]["qp"]["length"] = 1 << 22
    tables = Tables.from_dict(document)
    pc = structure(tables, DtaOpcode.POSTCARDING)
    by_index = {}
    key_a = key_b = None
    for candidate in range(1, 1_000_000):
        key = candidate.to_bytes(4, "big")
        index = postcard_slot_hash(key) & (pc.cache_entries - 1)
        if index in by_index and (postcard_slot_hash(by_index[index]) ^ postcard_slot_hash(key)) & (pc.slot_count - 1):
            key_a, key_b = by_index[index], key
            break
        by_index[index] = key
    translator = Translator(tables)
    send(translator, reporter, dta.postcard(key_a, 1, 101))
    send(translator, reporter, dta.postcard(key_a, 2, 102))
    evicting = requests(send(translator, reporter, dta.postcard(key_b, 1, 201)))
    assert len(evicting) == 1
    assert evicting[0].headers["reth"]["va"] == pc.qp.base_va + (postcard_slot_hash(key_a) & (pc.slot_count - 1)) * 32
    assert evicting[0].payload == _path_payload(key_a, [101, 102])
    assert translator.counters[TranslatorCounter.POSTCARD_EVICTIONS] == 1
    # key_b's own path starts fresh after the eviction.
    outs = [send(translator, reporter, dta.postcard(key_b, hop, 200 + hop)) for hop in (2, 3, 4, 5)]
    assert [len(o.frames) for o in outs] == [0, 0, 0, 1]
    assert requests(outs[-1])[0].payload == _path_payload(key_b, [201, 202, 203, 204, 205])


def test_postcard_hop_count_from_the_report(tables, reporter):
    translator = Translator(tables)
    outs = [send(translator, reporter, dta.postcard(4, hop, hop, path_length=3, extended=True)) for hop in (1, 2, 3)]
    assert [len(o.frames) for o in outs] == [0, 0, 1]
    assert requests(outs[-1])[0].payload == _path_payload((4).to_bytes(4, "big"), [1, 2, 3])


def test_postcard_hop_beyond_the_table_is_dropped(reporter):
    document = _example_document()
    document["structures"][2]["hops"] = 4
    document["structures"][2]["qp"]["length"] = 1 << 20
    translator = Translator(Tables.from_dict(document))
    assert send(translator, reporter, dta.postcard(4, 5, 1)).drop is TranslatorCounter.DROP_BAD_HOP


def test_idle_flush_writes_incomplete_paths(tables, reporter):
    translator = Translator(tables)
    send(translator, reporter, dta.postcard(8, 2, 22), now_ns=0)
    frames = [parse_roce(f) for f in translator.flush_idle(now_ns=10, idle_ns=5)]
    assert len(frames) == 1
    hop2 = 22 ^ postcard_hop_hash((8).to_bytes(4, "big"), 2)
    assert frames[0].payload == bytes(4) + hop2.to_bytes(4, "big") + bytes(12)


def flush_request(reporter, target, index):
    ends = UdpEndpoints(src_mac=reporter.mac, dst_mac=reporter.translator_mac, src_ip=reporter.ip,
                        dst_ip=reporter.collector_ip, sport=reporter.sport, dport=DTA_PORT)
    return build_udp_frame(ends, FlushRequest.request(target, index))


def test_flush_requests_write_what_the_idle_flush_writes_once_it_is_due(tables, reporter):
    """The switch's idle flush (a flush request per list or cache entry) writes the same frames as the
    software's timer, and only what has waited the idle time; without the plug-in it is an unknown opcode."""
    timer, switch = Translator(tables), Translator(tables, plugins=[FlushRequest.after(1000)])
    for translator in (timer, switch):
        send(translator, reporter, dta.append(5, 11), now_ns=0)
        send(translator, reporter, dta.postcard(8, 2, 22), now_ns=500)
    cache = switch.primitive(DtaOpcode.POSTCARDING).state[structure(tables, DtaOpcode.POSTCARDING).qp.index]
    entry = next(iter(cache))
    ask = [flush_request(reporter, FlushTarget.APPEND_LIST, 5),
           flush_request(reporter, FlushTarget.POSTCARD_ENTRY, entry)]
    assert [switch.process(frame, 900).frames for frame in ask] == [[], []]  # neither is due
    flushed = [switch.process(frame, 1200).frames for frame in ask]
    assert flushed[0] == timer.flush_idle(now_ns=1200, idle_ns=1000) and flushed[1] == []  # the path waits on
    flushed = switch.process(ask[1], 1500).frames
    assert flushed and flushed == timer.flush_idle(now_ns=1500, idle_ns=1000)
    assert switch.counters[TranslatorCounter.APPEND_FLUSHES] == switch.counters[TranslatorCounter.POSTCARD_FLUSHES] == 1
    assert switch.process(ask[0], 5000).frames == []  # nothing waits any more
    for target, index, reason in ((FlushTarget.APPEND_LIST, 60000, TranslatorCounter.DROP_UNKNOWN_LIST),
                                  (FlushTarget.POSTCARD_ENTRY, 1 << 20, TranslatorCounter.DROP_BAD_FLUSH),
                                  (9, 0, TranslatorCounter.DROP_BAD_FLUSH)):
        assert switch.process(flush_request(reporter, target, index), 5000).drop is reason
    assert timer.process(ask[0], 5000).drop is TranslatorCounter.DROP_UNKNOWN_OPCODE


def test_one_hop_postcard_does_not_evict_another_flows_path(reporter):
    document = _example_document()
    document["structures"][2]["cache_entries"] = 1  # every flow shares the one cache slot
    tables = Tables.from_dict(document)
    translator = Translator(tables)
    assert not send(translator, reporter, dta.postcard(8, 1, 10)).frames
    single = requests(send(translator, reporter, dta.postcard(9, 1, 20, path_length=1, extended=True)))
    assert len(single) == 1
    assert single[0].payload[:4] == (20 ^ postcard_hop_hash((9).to_bytes(4, "big"), 1)).to_bytes(4, "big")
    assert translator.counters[TranslatorCounter.POSTCARD_EVICTIONS] == 0
    rest = [send(translator, reporter, dta.postcard(8, hop, 10)) for hop in range(2, 6)]
    assert [len(out.frames) for out in rest] == [0, 0, 0, 1]


# -- Sketch-Merge -----------------------------------------------------------------------------------------------

def _sketch_tables(merge, batch=2, columns=4, rows=3, reporters=2):
    document = _example_document()
    document["structures"][3].update(merge=merge, batch=batch, columns=columns, rows=rows, reporters=reporters)
    return Tables.from_dict(document)


@pytest.mark.parametrize("merge", ["sum", "max"])
def test_sketch_columns_merge_and_write_in_batches(reporter, merge):
    tables = _sketch_tables(merge)
    sk = structure(tables, DtaOpcode.SKETCH_MERGE)
    translator = Translator(tables)
    sketches = {0: [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]], 1: [[5, 1, 5], [1, 9, 1], [0, 0, 0], [2, 2, 2]]}
    emitted = []
    for column in range(4):
        for reporter_id in (0, 1):
            out = send(translator, reporter, dta.sketch_column(reporter_id, column, sketches[reporter_id][column]))
            emitted += requests(out)
    assert len(emitted) == 2
    combine = (lambda a, b: a + b) if merge == "sum" else max
    for batch_index, frame in enumerate(emitted):
        assert frame.headers["reth"]["va"] == sk.qp.base_va + batch_index * 2 * 3 * 4
        expected = [combine(a, b) for c in (2 * batch_index, 2 * batch_index + 1)
                    for a, b in zip(sketches[0][c], sketches[1][c])]
        assert frame.payload == b"".join(v.to_bytes(4, "little") for v in expected)


def test_sketch_column_gap_draws_a_nack_and_is_not_merged(reporter):
    translator = Translator(_sketch_tables("sum"))
    send(translator, reporter, dta.sketch_column(1, 0, [1, 1, 1]))
    out = send(translator, reporter, dta.sketch_column(1, 2, [1, 1, 1]))
    assert out.drop is TranslatorCounter.DROP_SKETCH_GAP and len(out.to_reporter) == 1
    nack_frame = parse_udp_frame(out.to_reporter[0])
    assert nack_frame.udp["dport"] == DTA_NACK_PORT and nack_frame.dst_ip == reporter.ip
    assert nack_frame.eth["dst"] == reporter.mac and nack_frame.src_ip == COLLECTOR_IP
    nack = decode_nack(nack_frame.payload)
    assert (nack.kind, nack.reporter, nack.value) == (NackKind.SKETCH_COLUMN, 1, 1)
    stale = send(translator, reporter, dta.sketch_column(1, 0, [1, 1, 1]))
    assert stale.drop is TranslatorCounter.DROP_SKETCH_STALE


def test_sketch_reporter_that_wraps_early_waits_for_the_others(reporter):
    tables = _sketch_tables("sum", batch=2, columns=2, rows=1, reporters=2)
    translator = Translator(tables)
    for column in (0, 1):
        assert not send(translator, reporter, dta.sketch_column(0, column, [1])).frames
    early = send(translator, reporter, dta.sketch_column(0, 0, [100]))  # reporter 0's next epoch
    assert early.drop is TranslatorCounter.DROP_SKETCH_STALE
    assert decode_nack(parse_udp_frame(early.to_reporter[0]).payload).value == 0
    send(translator, reporter, dta.sketch_column(1, 0, [2]))
    frames = requests(send(translator, reporter, dta.sketch_column(1, 1, [3])))
    assert frames[0].payload == (3).to_bytes(4, "little") + (4).to_bytes(4, "little")
    assert not send(translator, reporter, dta.sketch_column(0, 0, [100])).drop  # now accepted


def test_sketch_unknown_reporter_and_bad_rows(reporter):
    translator = Translator(_sketch_tables("sum"))
    unknown_reporter = send(translator, reporter, dta.sketch_column(2, 0, [1, 1, 1]))
    assert unknown_reporter.drop is TranslatorCounter.DROP_UNKNOWN_REPORTER
    assert send(translator, reporter, dta.sketch_column(0, 0, [1, 1])).drop is TranslatorCounter.DROP_BAD_LENGTH


# -- drops and pass-through -------------------------------------------------------------------------------------

@pytest.mark.parametrize("payload, reason", [
    (bytes([1, 0, 0, 1]), TranslatorCounter.DROP_TRUNCATED),
    (bytes([9, 0, 0]) + bytes(9), TranslatorCounter.DROP_UNKNOWN_OPCODE),
    (bytes([1, 0, 0, 0]) + bytes(8), TranslatorCounter.DROP_BAD_REDUNDANCY),
    (bytes([1, 0, 0, 5]) + bytes(8), TranslatorCounter.DROP_BAD_REDUNDANCY),
    (bytes([1, 0, 0, 1]) + bytes(9), TranslatorCounter.DROP_BAD_LENGTH),
    (bytes([0x85, 1, 0, 0]), TranslatorCounter.DROP_BAD_PROFILE),
])
def test_malformed_reports_are_dropped_by_reason(tables, reporter, payload, reason):
    translator = Translator(tables)
    ends = UdpEndpoints(reporter.mac, tables.mac, reporter.ip, COLLECTOR_IP, 40041, 40040)
    out = translator.process(build_udp_frame(ends, payload))
    assert out.drop is reason and not out.frames
    assert translator.counters[reason] == 1


def test_unknown_collector_is_dropped_and_no_psn_moves(tables, reporter):
    translator = Translator(tables)
    stranger = dataclasses.replace(reporter, collector_ip=ip_bytes("10.77.1.99"))
    for report in (dta.key_write(1, 1), dta.key_increment(1, 1), dta.postcard(1, 1, 1)):
        assert send(translator, stranger, report).drop is TranslatorCounter.DROP_UNKNOWN_COLLECTOR
    assert all(state.next_psn == qp.start_psn for qp, state in zip(tables.qps, translator.qp_state.values()))


def test_frames_that_are_not_dta_pass_up_the_stack(tables, reporter):
    translator = Translator(tables)
    ends = UdpEndpoints(reporter.mac, tables.mac, reporter.ip, COLLECTOR_IP, 40041, 53)
    assert translator.process(build_udp_frame(ends, b"dns")).passed
    assert translator.process(b"\x00" * 20).passed
    assert sum(translator.counters.values()) == 0


def test_short_profile_reports(tables, reporter):
    tables.profile = Profile.DTA_V1_SHORT
    out = send(Translator(tables), reporter, dta.key_write(1, 2, 2), profile=Profile.DTA_V1_SHORT)
    assert len(out.frames) == 2


# -- reporter sequence numbers ----------------------------------------------------------------------------------

def test_sequence_gap_draws_a_dta_v1_nack_and_duplicates_are_dropped(tables, reporter):
    translator = Translator(tables)
    report = dta.key_write(1, 1, 1, retransmit=True)
    assert send(translator, reporter, report.with_seqnum(10)).frames
    assert send(translator, reporter, report.with_seqnum(11)).frames
    gap = send(translator, reporter, report.with_seqnum(14))
    assert gap.drop is TranslatorCounter.DROP_SEQUENCE_GAP and not gap.frames
    nack = parse_udp_frame(gap.to_reporter[0])
    assert nack.udp["length"] == 8 + 2 and nack.ip["total_length"] == 20 + 10
    assert decode_nack(nack.payload).value == 11
    assert send(translator, reporter, report.with_seqnum(11)).drop is TranslatorCounter.DROP_DUPLICATE
    assert send(translator, reporter, report.with_seqnum(12)).frames  # the retransmission is accepted


def test_sequence_tracking_is_per_reporter(tables, reporter):
    translator = Translator(tables)
    other = dataclasses.replace(reporter, ip=ip_bytes("10.77.9.2"))
    report = dta.key_write(1, 1, 1, retransmit=True)
    assert send(translator, reporter, report.with_seqnum(100)).frames
    assert send(translator, other, report.with_seqnum(7)).frames
    assert send(translator, reporter, report.with_seqnum(101)).frames


# -- RC feedback ------------------------------------------------------------------------------------------------

def _reply(tables, qp, syndrome, psn):
    ends = UdpEndpoints(qp.collector_mac, tables.mac, qp.collector_ip, tables.ip, 50000, 4791)
    return build_roce_frame(ends, transport_payload(RoceOpcode.RC_ACK, qp.local_qpn, psn,
                                                    {"aeth": {"syndrome": syndrome, "msn": 1}}))


def test_positive_ack_changes_nothing(tables, reporter):
    translator = Translator(tables)
    ki = structure(tables, DtaOpcode.KEY_INCREMENT)
    send(translator, reporter, dta.key_increment(1, 1, 2))
    assert translator.process(_reply(tables, ki.qp, ACK_SYNDROME, 0), 5).drop is None
    assert translator.qp_state[ki.qp.index].next_psn == 2
    assert translator.counters[TranslatorCounter.RX_ACKS] == 1


def test_sequence_nak_resyncs_that_qp_and_starts_a_timed_grace(tables, reporter):
    translator = Translator(tables)
    ki = structure(tables, DtaOpcode.KEY_INCREMENT)
    kw = structure(tables, DtaOpcode.KEY_WRITE)
    for _ in range(5):
        send(translator, reporter, dta.key_increment(1, 1, 1))
    translator.process(_reply(tables, ki.qp, NAK_SEQUENCE_SYNDROME, 2), now_ns=1_000)
    assert translator.qp_state[ki.qp.index].next_psn == 2
    assert send(translator, reporter, dta.key_increment(1, 1, 1), now_ns=500_000).drop is TranslatorCounter.DROP_GRACE
    assert send(translator, reporter, dta.key_write(1, 1, 1), now_ns=500_000).frames  # other QPs keep going
    deferred = send(translator, reporter, dta.key_increment(1, 1, 1, extended=True, essential=True), now_ns=600_000)
    assert deferred.deferred and not deferred.frames
    frame = requests(send(translator, reporter, dta.key_increment(1, 1, 1), now_ns=1_001_000))[0]
    assert frame.bth["psn"] == 2
    assert translator.counters[TranslatorCounter.DROP_GRACE] == 1
    assert translator.counters[TranslatorCounter.ESSENTIAL_DEFERRED] == 1
    assert kw.qp.index != ki.qp.index


def test_remote_access_nak_fails_the_qp_until_revived(tables, reporter):
    translator = Translator(tables)
    ki = structure(tables, DtaOpcode.KEY_INCREMENT)
    send(translator, reporter, dta.key_increment(1, 1, 1))  # PSN 0 outstanding
    translator.process(_reply(tables, ki.qp, NAK_REMOTE_ACCESS_SYNDROME, 0), now_ns=0)
    assert translator.qp_state[ki.qp.index].state is QpState.FAILED
    failed = send(translator, reporter, dta.key_increment(1, 1, 1), now_ns=10**12)
    assert failed.drop is TranslatorCounter.DROP_QP_FAILED
    translator.revive(ki.qp, 77)
    assert requests(send(translator, reporter, dta.key_increment(1, 1, 1)))[0].bth["psn"] == 77


def _rc_and_uc_qps(tables):
    rc = structure(tables, DtaOpcode.KEY_INCREMENT).qp
    uc = next(qp for qp in tables.qps if qp.transport is Transport.UC)
    assert rc.transport is Transport.RC
    return rc, uc


@pytest.mark.parametrize("syndrome", [ACK_SYNDROME, NAK_SEQUENCE_SYNDROME, NAK_REMOTE_ACCESS_SYNDROME])
def test_a_uc_queue_pair_takes_no_reply(tables, reporter, syndrome):
    translator = Translator(tables)
    _, uc = _rc_and_uc_qps(tables)
    before = dataclasses.replace(translator.qp_state[uc.index])
    for psn in (uc.start_psn, uc.start_psn + 1, 0):
        assert translator.process(_reply(tables, uc, syndrome, psn)).drop is TranslatorCounter.DROP_REPLY_ON_UC
    assert translator.qp_state[uc.index] == before
    assert translator.counters[TranslatorCounter.DROP_REPLY_ON_UC] == 3


@pytest.mark.parametrize("syndrome", [ACK_SYNDROME, NAK_SEQUENCE_SYNDROME, NAK_REMOTE_ACCESS_SYNDROME])
def test_rc_replies_count_only_for_outstanding_psns(tables, reporter, syndrome):
    """Outstanding: [oldest unacknowledged, next to send). A forged NAK behind it (the collector would then take
    every later write for a duplicate) or beyond it (a PSN never sent) changes nothing, and is counted."""
    translator = Translator(tables)
    rc, _ = _rc_and_uc_qps(tables)
    send(translator, reporter, dta.key_increment(1, 1, 4))  # PSNs 0..3 outstanding
    translator.process(_reply(tables, rc, ACK_SYNDROME, 1), now_ns=0)  # 0 and 1 acknowledged together
    runtime = translator.qp_state[rc.index]
    assert (runtime.unacked_psn, runtime.next_psn) == (2, 4)
    before = dataclasses.replace(runtime)
    for psn in (0, 1, 4, 5, 0xFFFFFF, 1 << 23):
        outside = translator.process(_reply(tables, rc, syndrome, psn))
        assert outside.drop is TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW
    assert translator.qp_state[rc.index] == before
    assert translator.counters[TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW] == 6
    assert translator.process(_reply(tables, rc, syndrome, 3)).drop is None  # inside: taken


def test_the_reply_window_wraps_at_2_to_the_24(tables, reporter):
    rc, _ = _rc_and_uc_qps(tables)
    tables.qps[rc.index] = rc = dataclasses.replace(rc, start_psn=0xFFFFFE)
    translator = Translator(tables)
    send(translator, reporter, dta.key_increment(1, 1, 4))  # PSNs 0xFFFFFE, 0xFFFFFF, 0, 1
    assert translator.qp_state[rc.index].next_psn == 2
    assert translator.process(_reply(tables, rc, ACK_SYNDROME, 0xFFFFFD)).drop is \
        TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW
    assert translator.process(_reply(tables, rc, ACK_SYNDROME, 0)).drop is None
    assert translator.qp_state[rc.index].unacked_psn == 1
    assert translator.process(_reply(tables, rc, ACK_SYNDROME, 0xFFFFFF)).drop is \
        TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW  # already acknowledged
    assert translator.process(_reply(tables, rc, NAK_SEQUENCE_SYNDROME, 1), now_ns=0).drop is None
    assert translator.qp_state[rc.index].next_psn == 1


def test_a_repeated_sequence_nak_resyncs_once(tables, reporter):
    """rxe NAKs once per gap; a copy (or a replay) after the resync finds nothing outstanding."""
    translator = Translator(tables)
    rc, _ = _rc_and_uc_qps(tables)
    send(translator, reporter, dta.key_increment(1, 1, 4))
    assert translator.process(_reply(tables, rc, NAK_SEQUENCE_SYNDROME, 2), now_ns=0).drop is None
    assert translator.process(_reply(tables, rc, NAK_SEQUENCE_SYNDROME, 2), now_ns=1).drop is \
        TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW
    assert translator.counters[TranslatorCounter.RX_NAK_SEQUENCE] == 1


def test_replies_for_unknown_qps_or_with_bad_icrc_are_dropped(tables):
    translator = Translator(tables)
    ki = structure(tables, DtaOpcode.KEY_INCREMENT)
    unknown = dataclasses.replace(ki.qp, local_qpn=0xABCDE)
    unknown_qp = translator.process(_reply(tables, unknown, NAK_SEQUENCE_SYNDROME, 9))
    assert unknown_qp.drop is TranslatorCounter.DROP_UNKNOWN_QP
    corrupted = bytearray(_reply(tables, ki.qp, NAK_SEQUENCE_SYNDROME, 9))
    corrupted[-1] ^= 1
    assert translator.process(bytes(corrupted)).drop is TranslatorCounter.DROP_BAD_ICRC
    assert translator.qp_state[ki.qp.index].next_psn == ki.qp.start_psn


def test_ack_request_interval(tables, reporter):
    tables.ack_request_interval = 2
    translator = Translator(tables)
    frames = requests(send(translator, reporter, dta.key_increment(1, 1, 4)))
    assert [f.bth["ack_req"] for f in frames] == [0, 1, 0, 1]


def _example_document():
    import tomllib
    with open(EXAMPLE_TABLES, "rb") as handle:
        return tomllib.load(handle)
