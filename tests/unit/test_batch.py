"""The batch translator against the oracle: the same frames per QP in PSN order, the same NACKs, deferrals,
counters and state, for random workloads of every primitive with replies, forged and malformed frames mixed in,
however the workload is cut into batches."""

import random
import tomllib
import zlib
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softdta.core import workload
from softdta.core.batch import MIN_VECTOR_BATCH, BatchTranslator
from softdta.core.primitives import Postcarding
from softdta.core.tables import AppendLists, QueuePair, Structure, Tables, with_queue_qps
from softdta.core.translator import Translator
from softdta.plugins.latency_sum import LatencySum
from softdta.spec import ACK_SYNDROME, DTA_PORT, AethKind, DtaOpcode, NakCode, RoceOpcode, TranslatorCounter, Transport
from softdta.wire import dta
from softdta.wire.columns import FrameRows
from softdta.wire.dta import Profile
from softdta.wire.frames import UdpEndpoints, build_udp_frame, ip_bytes, mac_bytes
from softdta.wire.hashing import BY_COLUMN_FROM, linear_crc_position_tables, xor_of_shares
from softdta.wire.icrc_split import linear_crc
from softdta.wire.roce import NAK_REMOTE_ACCESS_SYNDROME, aeth_syndrome, build_roce_frame, parse_roce, transport_payload
from tests.common import EXAMPLE_TABLES, hop_frames

C1, C2, NOWHERE = ip_bytes("10.77.1.1"), ip_bytes("10.77.2.1"), ip_bytes("10.77.9.9")
UDP_PAYLOAD_AT = 42  # Ethernet, IPv4 without options, UDP


def batch_tables(profile: str = "dta-v1") -> Tables:
    """The example tables, RC with ACK requests, and a second collector whose Key-Write has 8-byte keys and
    12-byte data (extended reports only) and takes up to 2 copies, whose Key-Increment uses dta-v1's hash and
    takes 1 copy, whose Append lists hold
    8-byte entries (stored little-endian) and 6-byte ones (verbatim) in short rings, and whose Postcarding has
    8-byte keys, 3 hops and a cache of 2 entries, and whose Sketch-Merge takes the MAX of 2 reporters. Caches
    are small, so that paths evict each other; sketches are narrow, so that epochs end within a workload."""
    document = tomllib.loads(EXAMPLE_TABLES.read_text())
    document["translator"].update(ack_request_interval=3, profile=profile)
    for structure in document["structures"]:
        if structure["primitive"] == "key-write":
            structure["qp"]["transport"] = "rc"
            structure["qp"]["start_psn"] = 0xFFFFF0  # wraps within a workload
    document["append"][0]["qp"].update(transport="rc", start_psn=0xFFFFFA)
    postcarding = next(entry for entry in document["structures"] if entry["primitive"] == "postcarding")
    postcarding.update(cache_entries=64)  # flows meet in the cache: evictions
    postcarding["qp"].update(transport="rc", start_psn=0xFFFFFE)
    sketch = next(entry for entry in document["structures"] if entry["primitive"] == "sketch-merge")
    sketch.update(columns=16, batch=4, reporters=3)  # epochs end, and reporters run ahead into the next
    sketch["qp"].update(transport="rc", start_psn=0xFFFFFF)
    document["append"] += [
        {"collector": "c2", "first_list": 100, "lists": 4, "entries": 6, "data_len": 8, "batch": 3,
         "qp": {"remote_qpn": 0x303, "local_qpn": 0x403, "rkey": 0x3003, "base": 0x7f0120000000, "length": 192}},
        {"collector": "c2", "first_list": 200, "lists": 2, "entries": 2, "data_len": 6, "batch": 1,
         "qp": {"remote_qpn": 0x304, "local_qpn": 0x404, "rkey": 0x3004, "base": 0x7f0130000000, "length": 24}},
    ]
    document["collectors"].append({"name": "c2", "ip": "10.77.2.1", "mac": "02:5d:7a:00:02:01"})
    document["structures"] += [
        {"primitive": "key-write", "collector": "c2", "key_len": 8, "data_len": 12, "hash": "dta-v1", "redundancy": 2,
         "qp": {"remote_qpn": 0x301, "local_qpn": 0x401, "rkey": 0x3001, "base": 0x7f0100000000, "length": 1 << 16}},
        {"primitive": "key-increment", "collector": "c2", "hash": "dta-v1", "redundancy": 1,
         "qp": {"remote_qpn": 0x302, "local_qpn": 0x402, "rkey": 0x3002, "base": 0x7f0110000000, "length": 1 << 14,
                "transport": "rc", "start_psn": 77}},
        {"primitive": "postcarding", "collector": "c2", "key_len": 8, "hops": 3, "cache_entries": 2,
         "qp": {"remote_qpn": 0x305, "local_qpn": 0x405, "rkey": 0x3005, "base": 0x7f0140000000, "length": 1 << 10}},
        {"primitive": "sketch-merge", "collector": "c2", "columns": 4, "rows": 2, "reporters": 2, "merge": "max",
         "batch": 2, "qp": {"remote_qpn": 0x306, "local_qpn": 0x406, "rkey": 0x3006, "base": 0x7f0150000000,
                            "length": 32}},
    ]
    return Tables.from_dict(document)


def reporter(collector: bytes, tables: Tables, ip: str = "10.77.9.1") -> workload.ReporterAddress:
    return workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes(ip), tables.mac, collector)


def reply(tables: Tables, collector: bytes, local_qpn: int, psn: int, syndrome: int,
          opcode: RoceOpcode = RoceOpcode.RC_ACK) -> bytes:
    qp = tables.qp_by_local_qpn(local_qpn)
    ends = UdpEndpoints(qp.collector_mac if qp else mac_bytes("02:00:00:00:00:09"), tables.mac, collector, tables.ip,
                        0xC001, 4791)
    headers = {"aeth": {"syndrome": syndrome, "msn": 1}, "atomic_ack_eth": {"original": 5}}
    return build_roce_frame(ends, transport_payload(opcode, local_qpn, psn, headers))


def random_workload(seed: int, tables: Tables, size: int) -> list[bytes]:
    """Mostly Key-Write and Key-Increment, with every other kind of frame a translator meets mixed in."""
    rng = random.Random(seed)
    profile = tables.profile
    to_c1, to_c2, astray = reporter(C1, tables), reporter(C2, tables), reporter(NOWHERE, tables)
    other = reporter(C1, tables, "10.77.9.2")
    others = [*workload.append(size // 8, seed, 8), *workload.postcards(size // 24, seed, 5)]
    kw, ki = tables.structure(C1, DtaOpcode.KEY_WRITE), tables.structure(C1, DtaOpcode.KEY_INCREMENT)
    flows = [rng.randbytes(4) for _ in range(rng.choice([3, 40]))], [rng.randbytes(8) for _ in range(5)]
    sketches = {C1: SketchReporters(tables.structure(C1, DtaOpcode.SKETCH_MERGE), rng),
                C2: SketchReporters(tables.structure(C2, DtaOpcode.SKETCH_MERGE), rng)}
    seq = 0
    frames = []
    for _ in range(size):
        roll = rng.random()
        flags = {"immediate": rng.random() < 0.3}
        if roll < 0.35:
            report = dta.key_write(rng.randbytes(4), rng.randbytes(4), rng.randint(1, 4), **flags,
                                   extended=rng.random() < 0.3)
            frames.append(to_c1.frame(report, profile))
        elif roll < 0.45:
            report = dta.key_write(rng.randbytes(8), rng.randbytes(12), rng.randint(1, 4), extended=True,
                                   essential=rng.random() < 0.2, **flags)
            frames.append(to_c2.frame(report, profile))
        elif roll < 0.60:
            target = to_c1 if rng.random() < 0.6 else to_c2
            report = dta.key_increment(rng.randbytes(4), rng.randint(0, 1 << 40), rng.randint(1, 4),
                                       extended=rng.random() < 0.3)
            frames.append(target.frame(report, profile))
        elif roll < 0.66:
            frames.append(rng.choice([to_c1, to_c2, astray]).frame(random_append(rng), profile))
        elif roll < 0.70:
            target, report = random_postcard(rng, *flows)
            frames.append({C1: to_c1, C2: to_c2}[target].frame(report, profile))
        elif roll < 0.74:
            target = C1 if rng.random() < 0.7 else C2
            frames.append({C1: to_c1, C2: to_c2}[target].frame(sketches[target].report(), profile))
        elif roll < 0.75 and others:
            frames.append(to_c1.frame(others.pop(rng.randrange(len(others))), profile))
        elif roll < 0.85:  # a reply of the collector: ACKs in and out of the window, NAKs, forged ones
            atomics = [ki.qp, tables.structure(C2, DtaOpcode.KEY_INCREMENT).qp]
            lists, postcarding = tables.append_lists[0], tables.structure(C1, DtaOpcode.POSTCARDING)
            sketch = tables.structure(C1, DtaOpcode.SKETCH_MERGE)
            qp = rng.choice([kw.qp, *atomics, lists.qp, postcarding.qp, sketch.qp])
            psn = (qp.start_psn + rng.randint(-4, 60)) & 0xFFFFFF
            syndrome = rng.choice([ACK_SYNDROME] * 6 + [aeth_syndrome(AethKind.NAK, NakCode.PSN_SEQUENCE_ERROR),
                                                        NAK_REMOTE_ACCESS_SYNDROME, aeth_syndrome(AethKind.RNR_NAK, 3)])
            opcode = RoceOpcode.RC_ATOMIC_ACK if qp in atomics and rng.random() < 0.5 else RoceOpcode.RC_ACK
            source = qp.collector_ip if rng.random() < 0.9 else NOWHERE
            frames.append(reply(tables, source, qp.local_qpn, psn, syndrome, opcode))
        else:
            frames.append(malformed(rng, tables, to_c1, astray, other, profile, seq))
            seq += 1
    return frames


def random_append(rng) -> dta.Report:
    """An Append report to one of batch_tables' lists (whatever its destination), or one the oracle drops."""
    flags = {"immediate": rng.random() < 0.3}
    choice = rng.randrange(10)
    if choice < 4:
        return dta.append(rng.randrange(6), rng.randbytes(4), **flags, extended=rng.random() < 0.3)
    if choice < 7:
        return dta.append(rng.randrange(100, 104), rng.randbytes(8), extended=True, essential=rng.random() < 0.3,
                          **flags)
    if choice < 9:
        return dta.append(rng.choice([200, 201]), rng.randbytes(6), extended=True, **flags)
    return rng.choice([dta.append(5000, 1), dta.append(1, rng.randbytes(8), extended=True),  # no such list; too long
                       dta.append(rng.randrange(6), 7, retransmit=True, seqnum=rng.randrange(256), extended=True)])


class SketchReporters:
    """Reporters of one Sketch-Merge structure sending their columns mostly in order, epoch after epoch (a fast
    one runs into the next epoch and is NACKed), with now and then a column out of order or a bad report."""

    def __init__(self, structure, rng):
        self.structure, self.rng = structure, rng
        self.next_column = [0] * structure.reporters

    def report(self) -> dta.Report:
        rng, structure = self.rng, self.structure
        reporter = rng.randrange(structure.reporters)
        column = self.next_column[reporter]
        if rng.random() < 0.9:
            self.next_column[reporter] = (column + 1) % structure.columns
        else:
            column = rng.randrange(structure.columns)  # a gap, or a stale resend
        if rng.random() < 0.03:
            return dta.sketch_column(rng.choice([reporter, structure.reporters]), column,
                                     [1] * (structure.rows + rng.choice([0, 1])))  # unknown reporter, bad rows
        counters = [rng.randrange(1 << 32) for _ in range(structure.rows)]
        return dta.sketch_column(reporter, column, counters, immediate=rng.random() < 0.3)


def random_postcard(rng, flows, long_flows) -> tuple[bytes, dta.Report]:
    """A postcard of one of a few flows (so paths complete, meet in the cache and evict each other), to C1 (5 hops,
    32-bit keys) or C2 (3 hops, 64-bit keys), or one the oracle drops."""
    flags = {"immediate": rng.random() < 0.3}
    choice = rng.randrange(10)
    if choice < 5:
        hop = rng.randint(1, 5)
        if rng.random() < 0.6:
            return C1, dta.postcard(rng.choice(flows), hop, rng.randbytes(4), **flags)
        length = rng.choice([0, 1, hop, 5]) if hop == 1 else rng.choice([0, hop, 5])
        return C1, dta.postcard(rng.choice(flows), hop, rng.randbytes(4), length, extended=True, **flags)
    if choice < 9:
        hop = rng.randint(1, 3)
        length = rng.choice([0, hop, 3, 1 if hop == 1 else 0])
        return C2, dta.postcard(rng.choice(long_flows), hop, rng.randbytes(4), length, extended=True, **flags)
    return C1, rng.choice([dta.postcard(rng.choice(flows), 6, 1, 7, extended=True),  # beyond the table's hops
                           dta.postcard(rng.randbytes(5), 1, 1, extended=True),  # the wrong key length
                           dta.postcard(rng.choice(flows), 2, 1, retransmit=True, seqnum=rng.randrange(256),
                                        extended=True)])


def malformed(rng, tables, to_c1, astray, other, profile, seq) -> bytes:
    """A report the vector path must refuse, or a frame that is not a report at all."""
    good = to_c1.frame(dta.key_write(rng.randbytes(4), 1, 2), profile)
    choice = rng.randrange(9)
    if choice == 0:
        return good[:rng.randrange(10, len(good))]  # truncated
    if choice == 1:
        bad = bytearray(good)
        bad[-9] = rng.choice([0, 5, 255])  # redundancy 0 or too many
        return bytes(bad)
    if choice == 2:
        return astray.frame(dta.key_write(rng.randbytes(4), 2, 1), profile)  # no collector there
    if choice == 3:
        return to_c1.frame(dta.key_write(rng.randbytes(5), rng.randbytes(4), 1, extended=True), profile)
    if choice == 4 and profile is Profile.DTA_V1:  # go-back-N: in order, a gap, a duplicate
        return other.frame(dta.key_write(rng.randbytes(4), 3, 1, retransmit=True, seqnum=rng.choice([seq, seq + 5])),
                           profile)
    if choice == 5:
        ends = UdpEndpoints(mac_bytes("02:00:00:00:00:07"), tables.mac, ip_bytes("fd00::7"), ip_bytes("fd00::1"),
                            40041, DTA_PORT)
        return build_udp_frame(ends, dta.encode(dta.key_write(1, 1, 1)))  # IPv6: not a report here
    if choice == 6:
        options = bytearray(good[:34] + bytes(4) + good[34:])  # IPv4 with 4 bytes of options
        options[14] = 0x46
        options[16:18] = (int.from_bytes(good[16:18], "big") + 4).to_bytes(2, "big")
        return bytes(options)
    if choice == 7:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 90)))  # noise
    return good + bytes(rng.randrange(1, 8))  # Ethernet padding after the datagram


def run_oracle(tables, frames, cuts, now_of, plugins=(), queue_of=lambda start: 0):
    oracle = Translator(tables, plugins=plugins)
    out = {"frames": [], "to_reporter": [], "deferred": []}
    start = 0
    for cut in cuts:
        now, queue = now_of(start), queue_of(start)
        for position in range(start, cut):
            result = oracle.process(frames[position], now, queue)
            out["frames"] += result.frames
            out["to_reporter"] += result.to_reporter
            if result.deferred:
                out["deferred"].append(position)
        start = cut
    settle(oracle, now_of(start))
    return oracle, out


def settle(translator, now_ns):
    """Every QP as the next report at `now_ns` finds it: one whose grace period is over is active. The batch
    translator asks a vector piece's QP at the start of its segment, the oracle at the piece's first report that
    reaches the gate (a Sketch-Merge report out of order is dropped before it): a grace period that ended in
    between ends for one of them and not yet for the other, which no frame, drop or later report can tell apart."""
    for qp in translator.tables.qps:
        translator.qp_ready(qp, now_ns)


def frame_rows(frames, seed):
    """The frames as packet I/O hands them over: rows of one array, with other bytes past each frame's end."""
    longest = max(map(len, frames), default=0)
    rows = np.frombuffer(random.Random(seed).randbytes(len(frames) * longest), dtype=np.uint8)
    rows = rows.reshape(len(frames), longest).copy()
    for row, frame in enumerate(frames):
        rows[row, :len(frame)] = np.frombuffer(frame, dtype=np.uint8)
    return FrameRows(rows, np.fromiter(map(len, frames), dtype=np.int64, count=len(frames)))


def run_batches(tables, frames, cuts, now_of, plugins=(), queue_of=lambda start: 0, as_rows=False):
    batch = BatchTranslator(Translator(tables, plugins=plugins))
    out = {"frames": [], "to_reporter": [], "deferred": []}
    start = 0
    for cut in cuts:
        given = frame_rows(frames[start:cut], start) if as_rows else frames[start:cut]
        result = batch.process_batch(given, now_of(start), queue_of(start))
        out["frames"] += result.frames
        out["to_reporter"] += result.to_reporter
        out["deferred"] += [start + position for position in result.deferred]
        start = cut
    settle(batch.oracle, now_of(start))
    return batch.oracle, out


def per_qp(frames):
    streams = defaultdict(list)
    for frame in frames:
        packet = parse_roce(frame)
        assert packet.icrc_ok
        streams[(packet.dst_ip, packet.bth["dest_qp"])].append(frame)
    return dict(streams)


def state(translator):
    states = [translator.primitive(kind).state for kind in (DtaOpcode.APPEND, DtaOpcode.POSTCARDING,
                                                                 DtaOpcode.SKETCH_MERGE)]
    # a flush-queue entry names its primitive, which each translator has its own instance of
    flush_queue = [(*entry[:-1], entry[-1].opcode) for entry in translator.flush_queue]
    return (translator.counts(), translator.qp_state, translator.reporter_seqnum, *states, flush_queue)


def cuts_from(sizes, total):
    cuts, at = [], 0
    for size in sizes:
        at = min(total, at + size)
        cuts.append(at)
        if at == total:
            return cuts
    return cuts + [total]


def assert_same(expected, got):
    (oracle, wanted), (batch, out) = expected, got
    per_qp(out["frames"])  # every frame is a RoCEv2 frame with a good iCRC
    assert out["frames"] == wanted["frames"]  # in the oracle's order, and so in PSN order per QP
    assert out["to_reporter"] == wanted["to_reporter"]
    assert out["deferred"] == wanted["deferred"]
    assert state(batch) == state(oracle)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), size=st.integers(1, 600),
       sizes=st.lists(st.integers(1, 1024), min_size=1, max_size=8),
       profile=st.sampled_from(["dta-v1", "dta-v1-short"]), as_rows=st.booleans())
def test_batches_equal_the_oracle_frame_for_frame(seed, size, sizes, profile, as_rows):
    """`as_rows`: batches as rows of one array (softdta.wire.columns.FrameRows), as AF_XDP hands them over."""
    tables = batch_tables(profile)
    frames = random_workload(seed, tables, size)
    cuts = cuts_from(sizes, len(frames))

    def now_of(position):  # time moves between batches: grace periods end within a workload
        return position * 20_000

    assert_same(run_oracle(tables, frames, cuts, now_of),
                run_batches(tables, frames, cuts, now_of, as_rows=as_rows))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), size=st.integers(1, 600),
       sizes=st.lists(st.integers(1, 400), min_size=1, max_size=8),
       queues=st.lists(st.integers(0, 2), min_size=8, max_size=8))
def test_batches_from_several_rx_queues_equal_the_oracle_frame_for_frame(seed, size, sizes, queues):
    """Each batch comes from one RX queue (2 has no QPs): its reports write through that queue's QPs, into
    batches, paths and columns the queues share."""
    tables = with_queue_qps(batch_tables(), 2)
    frames = random_workload(seed, tables, size)
    cuts = cuts_from(sizes, len(frames))
    starts = [0, *cuts]

    def queue_of(start):
        return queues[starts.index(start) % len(queues)]

    def now_of(position):
        return position * 20_000

    assert_same(run_oracle(tables, frames, cuts, now_of, queue_of=queue_of),
                run_batches(tables, frames, cuts, now_of, queue_of=queue_of))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), first=st.lists(st.integers(1, 1024), min_size=1, max_size=6),
       second=st.lists(st.integers(1, 1024), min_size=1, max_size=6))
def test_how_a_workload_is_cut_into_batches_changes_nothing(seed, first, second):
    tables = batch_tables()
    frames = random_workload(seed, tables, 500)
    one = run_batches(tables, frames, cuts_from(first, len(frames)), lambda _: 0)
    other = run_batches(tables, frames, cuts_from(second, len(frames)), lambda _: 0)
    assert_same(one, other)


def test_a_batch_of_key_writes_is_vectorized_not_sent_through_the_oracle(monkeypatch):
    tables = batch_tables()
    frames = [reporter(C1, tables).frame(report) for report in workload.key_write(256, 3, 2)]
    batch = BatchTranslator(Translator(tables))
    calls = []
    monkeypatch.setattr(batch.oracle, "process", lambda *args: calls.append(args))
    out = batch.process_batch(frames, 0)
    assert calls == [] and len(out.frames) == 512
    expected = run_oracle(tables, frames, [len(frames)], lambda _: 0)[1]["frames"]
    assert out.frames == expected  # one QP: the very order


@pytest.mark.parametrize("base_va", [0x7F000000FFF0, 0xFFFFFF00, 0xFFFFFFFFFFFFFC00, 0], ids=hex)
@pytest.mark.parametrize("transport", [Transport.UC, Transport.RC])
def test_vector_frames_equal_the_oracles_wherever_the_region_lies(monkeypatch, base_va, transport):
    """The template holds the VA bytes that every address in a region shares and each frame the rest: regions
    that cross a 64 KiB, a 4 GiB or no boundary, at the top and the bottom of the address space."""
    mac = mac_bytes("02:5d:7a:00:01:01")
    qps = [QueuePair(name, C1, mac, remote_qpn=0x111 + n, local_qpn=0x211 + n, rkey=0x1111 + n,
                     base_va=base_va + n * 512, length=512, transport=kind)
           for n, (name, kind) in enumerate((("kw", transport), ("ki", Transport.RC)))]  # Fetch&Add needs RC
    tables = Tables(mac=mac_bytes("02:5d:7a:00:00:01"), ip=ip_bytes("10.77.0.1"), qps=qps,
                    structures=[Structure(DtaOpcode.KEY_WRITE, qps[0]), Structure(DtaOpcode.KEY_INCREMENT, qps[1])],
                    ack_request_interval=3)
    rng = random.Random(base_va)
    frames = [reporter(C1, tables).frame(rng.choice([dta.key_write(rng.randbytes(4), rng.randrange(1 << 32), 2),
                                                      dta.key_increment(rng.randbytes(4), rng.randrange(9), 1)]))
              for _ in range(400)]
    expected = run_oracle(tables, frames, [400], lambda _: 0)
    calls = []
    process = Translator.process
    monkeypatch.setattr(Translator, "process", lambda self, *args: calls.append(args) or process(self, *args))
    assert_same(expected, run_batches(tables, frames, [400], lambda _: 0))
    assert calls == []


def test_templates_made_for_other_tables_are_not_reused_where_a_qp_changed():
    """Frame templates outlive their translator (a restart or new tables finds them made): a QP whose rkey,
    remote QPN, region or collector changed gets frames of its own, equal to the oracle's."""
    def tables_with(qp: dict[str, int], collector_mac: str = "02:5d:7a:00:01:01") -> Tables:
        document = tomllib.loads(EXAMPLE_TABLES.read_text())
        document["collectors"][0]["mac"] = collector_mac
        key_write = next(entry for entry in document["structures"] if entry["primitive"] == "key-write")
        key_write["qp"].update(qp, transport="rc")
        return Tables.from_dict(document)

    first = tables_with({})
    frames = [reporter(C1, first).frame(report) for report in workload.key_write(64, 3, 2)]
    for tables in (first, tables_with({"rkey": 0x1009}), tables_with({"remote_qpn": 0x109}),
                   tables_with({"base": 0x7f0200000000}), tables_with({}, collector_mac="02:5d:7a:00:0e:0e")):
        assert_same(run_oracle(tables, frames, [64], lambda _: 0), run_batches(tables, frames, [64], lambda _: 0))


def test_a_vector_write_outside_its_qps_region_is_refused():
    tables = batch_tables()
    batch = BatchTranslator(Translator(tables))
    qp = tables.qps[0]
    inside = np.array([qp.base_va, qp.base_va + qp.length - 8], dtype=np.uint64)
    assert len(batch.writes(qp, inside, np.zeros(2, dtype=bool), np.zeros(2, dtype=np.uint32),
                            np.zeros((2, 8), dtype=np.uint8))) == 2
    for va in (qp.base_va - 8, qp.base_va + qp.length - 4):
        with pytest.raises(AssertionError, match="leaves the region"):
            batch.writes(qp, np.array([va], dtype=np.uint64), np.zeros(1, dtype=bool), np.zeros(1, dtype=np.uint32),
                         np.zeros((1, 8), dtype=np.uint8))
        with pytest.raises(AssertionError, match="leaves the region"):
            batch.fetch_adds(qp, np.array([va], dtype=np.uint64), np.ones(1, dtype=np.uint64))


def test_a_batch_of_appends_is_vectorized_not_sent_through_the_oracle(monkeypatch):
    """Lists that fill several batches within one batch of reports, from batches begun in the batch before."""
    tables = batch_tables()
    frames = [reporter(C1, tables).frame(report) for report in workload.append(300, 5, 7)]
    oracle_run = run_oracle(tables, frames, [10, 300], lambda _: 0)
    batch = BatchTranslator(Translator(tables))
    first = batch.process_batch(frames[:10], 0)  # below MIN_VECTOR_BATCH: through the oracle, leaving batches begun
    assert any(runtime.pending for runtime in batch.oracle.primitive(DtaOpcode.APPEND).state.values())
    calls = []
    monkeypatch.setattr(batch.oracle, "process", lambda *args: calls.append(args))
    second = batch.process_batch(frames[10:], 0)
    assert calls == [] and len(second.frames) >= (290 - 7 * 3) // 4
    assert first.frames + second.frames == oracle_run[1]["frames"]  # one QP: the very order
    assert state(batch.oracle) == state(oracle_run[0])


def test_a_batch_of_postcards_is_vectorized_not_sent_through_the_oracle(monkeypatch):
    """Paths that complete, wait, and evict each other in a small cache, some begun in the batch before."""
    tables = batch_tables()
    frames = [reporter(C1, tables).frame(report) for report in workload.postcards(60, 6, 5)]
    oracle_run = run_oracle(tables, frames, [10, len(frames)], lambda _: 0)
    assert oracle_run[0].counts()[TranslatorCounter.POSTCARD_EVICTIONS] > 0
    batch = BatchTranslator(Translator(tables))
    first = batch.process_batch(frames[:10], 0)
    calls = []
    monkeypatch.setattr(batch.oracle, "process", lambda *args: calls.append(args))
    second = batch.process_batch(frames[10:], 0)
    assert calls == [] and len(second.frames) > 40
    assert first.frames + second.frames == oracle_run[1]["frames"]  # one QP: the very order
    assert state(batch.oracle) == state(oracle_run[0])


def test_postcards_crowding_a_cache_slot_take_a_round_each_with_acks_judged_in_place():
    """Paths of one flow, one after another on one slot, and an ACK of a path written only later in the batch,
    which is outside the window where it arrives."""
    tables = batch_tables()
    postcarding = tables.structure(C1, DtaOpcode.POSTCARDING)
    to_c1 = reporter(C1, tables)
    crowd = [to_c1.frame(dta.postcard(7, hop, hop)) for _ in range(8) for hop in range(1, 6)]
    early_ack = reply(tables, C1, postcarding.qp.local_qpn, (postcarding.qp.start_psn + 3) & 0xFFFFFF, ACK_SYNDROME)
    frames = [*crowd[:5], early_ack, *crowd[5:], *[to_c1.frame(dta.key_write(k, 1, 1)) for k in range(20)],
              early_ack]
    expected = run_oracle(tables, frames, [len(frames)], lambda _: 0)
    assert expected[0].counts()[TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW] == 1
    assert_same(expected, run_batches(tables, frames, [len(frames)], lambda _: 0))


def test_sketch_epochs_are_vectorized_not_sent_through_the_oracle(monkeypatch):
    """Three epochs in one batch, reporters interleaved, each in column order; every group of columns is
    written by its last report."""
    tables = batch_tables()
    sketch = tables.structure(C1, DtaOpcode.SKETCH_MERGE)
    epochs = [report for seed in range(3) for report in
              workload.sketch_epoch(sketch.reporters, sketch.columns, sketch.rows, seed)]
    frames = [reporter(C1, tables).frame(report) for report in epochs]
    oracle_run = run_oracle(tables, frames, [len(frames)], lambda _: 0)
    batch = BatchTranslator(Translator(tables))
    calls = []
    monkeypatch.setattr(batch.oracle, "process", lambda *args: calls.append(args))
    out = batch.process_batch(frames, 0)
    assert calls == [] and len(out.frames) == 3 * sketch.columns // sketch.batch
    assert out.frames == oracle_run[1]["frames"]
    assert state(batch.oracle) == state(oracle_run[0])


def test_a_reporter_ahead_of_the_epoch_sends_its_structure_through_the_oracle():
    """A reporter that wrapped into the next epoch before a column group was written is NACKed; the oracle
    decides that, report by report, with the structure's ACKs in their places."""
    tables = batch_tables()
    sketch = tables.structure(C1, DtaOpcode.SKETCH_MERGE)
    to_c1 = reporter(C1, tables)
    fast = [to_c1.frame(dta.sketch_column(0, column, [column] * sketch.rows)) for column in range(sketch.columns)]
    ack = reply(tables, C1, sketch.qp.local_qpn, sketch.qp.start_psn, ACK_SYNDROME)
    frames = [*fast, ack, *fast[:3],
              *[to_c1.frame(dta.sketch_column(r, column, [1] * sketch.rows)) for column in range(sketch.columns)
                for r in range(1, sketch.reporters)], *fast[:2]]
    expected = run_oracle(tables, frames, [len(frames)], lambda _: 0)
    counts = expected[0].counts()
    assert counts[TranslatorCounter.DROP_SKETCH_STALE] == 1 and counts[TranslatorCounter.DROP_SKETCH_GAP] == 2
    assert counts[TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW] == 1 and counts[TranslatorCounter.RX_ACKS] == 0
    assert_same(expected, run_batches(tables, frames, [len(frames)], lambda _: 0))


def test_the_next_epochs_first_group_is_written_after_this_epochs_last():
    """In one batch, the last group of columns of an epoch, then the first of the next: frames in the order
    their groups were completed, not in column order."""
    tables = batch_tables()
    sketch = tables.structure(C1, DtaOpcode.SKETCH_MERGE)
    to_c1 = reporter(C1, tables)

    def columns(order):
        return [to_c1.frame(dta.sketch_column(r, column, [column + r] * sketch.rows)) for column in order
                for r in range(sketch.reporters)]

    frames = columns(range(12)) + columns([12, 13, 14, 15, 0, 1, 2, 3])
    cuts = [36, len(frames)]
    expected = run_oracle(tables, frames, cuts, lambda _: 0)
    assert len(expected[1]["frames"]) == 5
    assert_same(expected, run_batches(tables, frames, cuts, lambda _: 0))


class SmallLatencySum(LatencySum):
    """A flow table of 6 paths, so that the oldest are forgotten within a workload."""

    max_flows = 6


def latency_sum_workload(seed, tables, size):
    """Latency-Sum hops of a few flows (slow and fast; a hop sent twice; essential reports while the QP is in
    grace), Key-Writes to the same QP between them, and Latency-Sum reports the oracle drops."""
    rng = random.Random(seed)
    to_c1, to_c2, astray = reporter(C1, tables), reporter(C2, tables), reporter(NOWHERE, tables)
    kw = tables.structure(C1, DtaOpcode.KEY_WRITE)
    nak = reply(tables, C1, kw.qp.local_qpn, kw.qp.start_psn, aeth_syndrome(AethKind.NAK, NakCode.PSN_SEQUENCE_ERROR))
    flows = [rng.randbytes(4) for _ in range(10)]
    frames = []
    for _ in range(size):
        roll = rng.random()
        if roll < 0.6:
            key, length = rng.choice(flows), 3
            hop = rng.randint(1, length)
            payload = LatencySum.report(key, hop, length, rng.choice([100, 600_000]), immediate=rng.random() < 0.3,
                                        essential=rng.random() < 0.3)
            ends = rng.choice([to_c1] * 6 + [to_c2, astray])  # C2's Key-Write keys are 8 bytes: a drop
        elif roll < 0.9:
            frames.append(to_c1.frame(dta.key_write(rng.randbytes(4), rng.randbytes(4), rng.randint(1, 2))))
            continue
        elif roll < 0.92:
            frames.append(nak)  # grace: drops, and the essential reports deferred
            continue
        else:
            payload = rng.choice([LatencySum.report(b"\x01\x02\x03\x04", 3, 2, 10),  # a hop beyond its path
                                  LatencySum.report(b"\x01\x02\x03\x04", 1, 1, 10)[:-1],  # truncated
                                  LatencySum.report(b"\x01\x02\x03\x04", 1, 1, 10) + b"\0",
                                  LatencySum.report(b"\x01\x02\x03\x04\x05", 1, 1, 700_000),
                                  LatencySum.report(b"\x01\x02\x03\x04", 1, 1, 10, retransmit=True)])
            ends = to_c1
        udp = UdpEndpoints(ends.mac, ends.translator_mac, ends.ip, ends.collector_ip, ends.sport, DTA_PORT)
        frames.append(build_udp_frame(udp, payload))
    return frames


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), sizes=st.lists(st.integers(1, 300), min_size=1, max_size=4))
def test_a_plug_in_with_translate_batch_equals_its_scalar_self(seed, sizes):
    tables = batch_tables()
    frames = latency_sum_workload(seed, tables, 400)
    cuts = cuts_from(sizes, len(frames))

    def now_of(position):
        return position * 20_000

    expected = run_oracle(tables, frames, cuts, now_of, [SmallLatencySum])
    got = run_batches(tables, frames, cuts, now_of, [SmallLatencySum])
    assert_same(expected, got)
    plugins = [translator.primitives[LatencySum.opcode] for translator in (expected[0], got[0])]
    assert [(p.state, p.reported, p.below_threshold, p.forgotten) for p in plugins][0] == \
        [(p.state, p.reported, p.below_threshold, p.forgotten) for p in plugins][1]


def test_a_plug_in_with_translate_batch_takes_its_reports_a_batch_at_a_time(monkeypatch):
    tables = batch_tables()
    frames = [frame for key in range(40) for frame in hop_frames(key.to_bytes(4, "big"), [700_000, 500_000])]
    batch = BatchTranslator(Translator(tables, plugins=[LatencySum]))
    calls = []
    monkeypatch.setattr(batch.oracle, "process", lambda *args: calls.append(args))
    out = batch.process_batch(frames, 0)
    assert calls == [] and len(out.frames) == 40
    oracle = Translator(tables, plugins=[LatencySum])
    assert out.frames == [emitted for frame in frames for emitted in oracle.process(frame).frames]


@pytest.mark.parametrize("plugins", [(), (LatencySum,)], ids=["built-in", "with-latency-sum"])
def test_reports_cut_short_or_padded_are_refused_like_the_oracle_refuses_them(plugins):
    """Every opcode, both formats, UDP payloads of 0 to 15 bytes, alone in their frame or in one padded to the
    Ethernet minimum with junk: a batch of them neither crashes nor differs from the oracle."""
    tables = batch_tables()
    to_c1 = reporter(C1, tables)
    ends = UdpEndpoints(to_c1.mac, to_c1.translator_mac, to_c1.ip, to_c1.collector_ip, to_c1.sport, DTA_PORT)
    rng = random.Random(3)
    frames = []
    for first in (0x01, 0x02, 0x03, 0x04, 0x05, 0x81, 0x80 | LatencySum.opcode):
        for size in range(16):
            payload = (bytes([first, first & 0x7F]) + rng.randbytes(14))[:size]
            frame = build_udp_frame(ends, payload)
            frames += [frame, frame + rng.randbytes(max(0, 60 - len(frame)))]
    rng.shuffle(frames)
    cuts = [len(frames) // 2, len(frames)]
    assert_same(run_oracle(tables, frames, cuts, lambda _: 0, plugins),
                run_batches(tables, frames, cuts, lambda _: 0, plugins))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32), sizes=st.lists(st.integers(12, 200), min_size=1, max_size=6),
       as_rows=st.booleans())
def test_frames_with_flipped_bytes_cut_or_padded_are_taken_like_the_oracle_takes_them(seed, sizes, as_rows):
    """Good frames of every kind (reports, a plug-in's, an ACK) with bytes overwritten past the Ethernet header,
    cut short or lengthened: what a fuzzer, or a damaged link, sends."""
    tables = batch_tables()
    rng = random.Random(seed)
    to_c1 = reporter(C1, tables)
    kw = tables.structure(C1, DtaOpcode.KEY_WRITE)
    frames = []
    for _ in range(300):
        frame = bytearray(rng.choice([
            reply(tables, C1, kw.qp.local_qpn, kw.qp.start_psn, ACK_SYNDROME),
            to_c1.frame(dta.key_write(rng.randbytes(4), rng.randbytes(4), 2)),
            to_c1.frame(dta.key_increment(rng.randbytes(4), 9, 1, extended=True)),
            to_c1.frame(dta.postcard(rng.randbytes(4), rng.randint(1, 5), 3)),
            to_c1.frame(dta.append(rng.randrange(64), 3)),
            to_c1.frame(dta.sketch_column(0, 0, [1, 2, 3, 4])),
            hop_frames(rng.randbytes(4), [1, 2])[0]]))
        for _ in range(rng.randint(0, 3)):
            frame[rng.randrange(14, len(frame))] = rng.randrange(256)
        if rng.random() < 0.3:
            frame = frame[:rng.randrange(14, len(frame) + 1)]
        if rng.random() < 0.3:
            frame += rng.randbytes(rng.randrange(1, 30))
        frames.append(bytes(frame))
    cuts = cuts_from(sizes, len(frames))
    assert_same(run_oracle(tables, frames, cuts, lambda position: position * 1000, [LatencySum]),
                run_batches(tables, frames, cuts, lambda position: position * 1000, [LatencySum], as_rows=as_rows))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32), count=st.integers(MIN_VECTOR_BATCH, 300), kind=st.integers(0, 8))
def test_frames_alike_in_their_layout_bytes_and_random_in_the_rest_are_taken_like_the_oracle_takes_them(
        seed, count, kind):
    """A batch whose frames share every byte that decides a report's layout is classified by its first frame.
    Every other byte (flags, redundancy, hops, lengths inside the report, keys, data, the reporter's address)
    is random here, valid or not."""
    tables = batch_tables()
    rng = random.Random(seed)
    to_c1, to_c2 = reporter(C1, tables), reporter(C2, tables)
    kw = tables.structure(C1, DtaOpcode.KEY_WRITE)
    good = [to_c1.frame(dta.key_write(1, 2, 2)), to_c2.frame(dta.key_write(bytes(8), bytes(12), 1, extended=True)),
            to_c1.frame(dta.key_increment(1, 2, 1)), to_c1.frame(dta.append(3, 4)),
            to_c1.frame(dta.append(100, bytes(8), extended=True)), to_c1.frame(dta.postcard(5, 1, 6)),
            to_c2.frame(dta.postcard(bytes(8), 1, 6, extended=True)), to_c1.frame(dta.sketch_column(0, 0, [1] * 4)),
            hop_frames(bytes(4), [1, 2])[0]][kind]
    layout = set(BatchTranslator(Translator(tables))._layout_bytes.tolist())
    free = [at for at in range(14, len(good)) if at not in layout]
    frames = []
    for _ in range(count):
        frame = bytearray(good)
        for at in rng.sample(free, rng.randint(0, len(free))):
            frame[at] = rng.randrange(256) if rng.random() < 0.3 else rng.choice([0, 1, 2, 3, 0x80, 0xC0])
        frames.append(bytes(frame))
    with_an_ack = list(frames)
    with_an_ack.insert(rng.randrange(count), reply(tables, C1, kw.qp.local_qpn, kw.qp.start_psn, ACK_SYNDROME))
    for batch in (frames, with_an_ack):
        assert_same(run_oracle(tables, batch, [len(batch)], lambda _: 0, [LatencySum]),
                    run_batches(tables, batch, [len(batch)], lambda _: 0, [LatencySum]))


def test_targets_that_share_a_qp_keep_one_psn_order(monkeypatch):
    """A QP that Key-Write, Key-Increment and Append lists share (tables built in code can do this) interleaves
    their frames in report order, so none of them is vectorized."""
    qp = QueuePair("shared", C1, mac_bytes("02:5d:7a:00:01:01"), remote_qpn=0x111, local_qpn=0x211, rkey=0x1111,
                   base_va=0x7f0000000000, length=1 << 16, transport=Transport.RC)
    tables = Tables(mac=mac_bytes("02:5d:7a:00:00:01"), ip=ip_bytes("10.77.0.1"), qps=[qp],
                    structures=[Structure(DtaOpcode.KEY_WRITE, qp), Structure(DtaOpcode.KEY_INCREMENT, qp)],
                    append_lists=[AppendLists(qp, first_list=0, lists=4, entries=16)])
    to_c1 = reporter(C1, tables)
    rng = random.Random(8)
    frames = [to_c1.frame(rng.choice([dta.key_write(rng.randbytes(4), 1, 2), dta.key_increment(rng.randbytes(4), 3, 1),
                                      dta.append(rng.randrange(4), rng.randbytes(4))])) for _ in range(200)]
    expected = run_oracle(tables, frames, [200], lambda _: 0)
    calls = []
    process = Translator.process
    monkeypatch.setattr(Translator, "process", lambda self, *args: calls.append(args) or process(self, *args))
    assert_same(expected, run_batches(tables, frames, [200], lambda _: 0))
    assert len(calls) == 200


@pytest.mark.parametrize("extended", [False, True], ids=["dta-v1", "extended"])
def test_a_primitive_without_a_vector_path_goes_through_the_oracle(monkeypatch, extended):
    """The batch translator asks each primitive for its vector path (`Primitive.vector`): Postcarding without one
    is translated like a plug-in without `translate_batch`, report by report by the oracle, in order, among the
    Key-Writes it still vectorizes."""
    monkeypatch.setattr(Postcarding, "vector", None)
    tables = batch_tables()
    to_c1 = reporter(C1, tables)
    postcards = [to_c1.frame(replace(report, extended=extended)) for report in workload.postcards(30, 6, 4)]
    frames = [frame for at, postcard in enumerate(postcards)
              for frame in (postcard, to_c1.frame(dta.key_write(at, at, 1)))]
    expected = run_oracle(tables, frames, [len(frames)], lambda _: 0)
    assert len(expected[1]["frames"]) > len(postcards)  # a frame per Key-Write, and the paths
    calls = []
    process = Translator.process
    monkeypatch.setattr(Translator, "process", lambda self, *args: calls.append(args) or process(self, *args))
    assert_same(expected, run_batches(tables, frames, [len(frames)], lambda _: 0))
    assert [args[0] for args in calls] == postcards


def test_an_ack_is_judged_by_the_psn_its_qp_had_when_it_arrived():
    """An ACK of a PSN the QP sends only later in the batch is outside the window where it arrives: dropped,
    even though by the end of the batch that PSN is outstanding."""
    tables = batch_tables()
    kw = tables.structure(C1, DtaOpcode.KEY_WRITE)
    to_c1 = reporter(C1, tables)
    early_ack = reply(tables, C1, kw.qp.local_qpn, (kw.qp.start_psn + 5) & 0xFFFFFF, ACK_SYNDROME)
    frames = [to_c1.frame(dta.key_write(1, 1, 1)), early_ack,
              *[to_c1.frame(dta.key_write(k, 1, 1)) for k in range(2, 12)], early_ack]
    assert len(frames) >= MIN_VECTOR_BATCH
    batch = BatchTranslator(Translator(tables))
    batch.process_batch(frames, 0)
    counts = batch.oracle.counts()
    assert counts[TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW] == 1 and counts[TranslatorCounter.RX_ACKS] == 1
    assert batch.oracle.qp_state[kw.qp.index].unacked_psn == (kw.qp.start_psn + 6) & 0xFFFFFF
    assert_same(run_oracle(tables, frames, [len(frames)], lambda _: 0),
                run_batches(tables, frames, [len(frames)], lambda _: 0))


def test_acks_are_taken_in_the_batch_and_those_the_oracle_drops_still_go_to_it(monkeypatch):
    """ACKs of vectorized RC QPs move their windows without the oracle. An ACK it would drop (a wrong iCRC, a pad
    count past its headers, an atomic ACK too short for its headers, an ACK on a UC QP) goes to it, and is
    dropped for the same reason."""
    tables = batch_tables()
    kw, uc = tables.structure(C1, DtaOpcode.KEY_WRITE), tables.structure(C2, DtaOpcode.KEY_WRITE)
    assert uc.qp.transport is Transport.UC
    to_c1, to_c2 = reporter(C1, tables), reporter(C2, tables)

    def ack(psn_after_start, qp=kw.qp, collector=C1):
        return reply(tables, collector, qp.local_qpn, (qp.start_psn + psn_after_start) & 0xFFFFFF, ACK_SYNDROME)

    good = [ack(2), ack(9), ack(9)]  # the second of two alike is outside the window
    bad_icrc = bytearray(ack(12))
    bad_icrc[-1] ^= 1
    padded = bytearray(ack(13))
    padded[UDP_PAYLOAD_AT + 1] |= 0x30  # pad count 3: past the AETH
    short_atomic = bytearray(ack(14))
    short_atomic[UDP_PAYLOAD_AT] = RoceOpcode.RC_ATOMIC_ACK  # no room for its AtomicAckETH
    forged = [bytes(bad_icrc), bytes(padded), bytes(short_atomic), ack(0, uc.qp, C2)]
    frames = [*[to_c1.frame(dta.key_write(k, 1, 1)) for k in range(16)],
              *[to_c2.frame(dta.key_write(bytes(8), bytes(12), 1, extended=True))], *good, *forged]
    calls = []
    process = Translator.process
    monkeypatch.setattr(Translator, "process", lambda self, *args: calls.append(args) or process(self, *args))
    batch = BatchTranslator(Translator(tables))
    batch.process_batch(frames, 0)
    assert [args[0] for args in calls] == [good[2], *forged]
    counts = batch.oracle.counts()
    assert counts[TranslatorCounter.RX_ACKS] == 2 and counts[TranslatorCounter.DROP_BAD_ICRC] == 1
    assert counts[TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW] == 1
    assert counts[TranslatorCounter.DROP_REPLY_ON_UC] == 1
    assert batch.oracle.qp_state[kw.qp.index].unacked_psn == (kw.qp.start_psn + 10) & 0xFFFFFF
    monkeypatch.setattr(Translator, "process", process)
    assert_same(run_oracle(tables, frames, [len(frames)], lambda _: 0),
                run_batches(tables, frames, [len(frames)], lambda _: 0))


@pytest.mark.parametrize("taken_all", [True, False], ids=["each-moves-the-window", "one-stale"])
def test_acks_of_a_segment_without_the_oracles_frames_are_judged_qp_by_qp(monkeypatch, taken_all):
    """ACKs among vector reports only, of two QPs whose PSNs wrap: each QP's, in order, each moving its window on
    (coalesced, so PSNs skip), are taken at once; a stale one among them (a duplicate) sends that QP's ACKs to
    `_ack`, one by one, and the duplicate to the oracle, which drops it. Either way the state is the oracle's."""
    tables = batch_tables()
    kw, append = tables.structure(C1, DtaOpcode.KEY_WRITE), tables.append_lists[0]
    to_c1 = reporter(C1, tables)

    def ack(qp, psn_after_start):
        return reply(tables, C1, qp.local_qpn, (qp.start_psn + psn_after_start) & 0xFFFFFF, ACK_SYNDROME)

    writes = [to_c1.frame(dta.key_write(k, 1, 1)) for k in range(40)]
    entries = [to_c1.frame(dta.append(append.first_list, value)) for value in range(4 * append.batch)]
    kw_acks = [ack(kw.qp, 2), ack(kw.qp, 8), ack(kw.qp, 8 if not taken_all else 17), ack(kw.qp, 30)]
    frames = [*writes[:20], kw_acks[0], *entries[:8], ack(append.qp, 0), kw_acks[1], *writes[20:], kw_acks[2],
              *entries[8:], ack(append.qp, 2), kw_acks[3]]
    calls, one_by_one = [], []
    process, judge = Translator.process, BatchTranslator._ack
    monkeypatch.setattr(Translator, "process", lambda self, *args: calls.append(args) or process(self, *args))
    monkeypatch.setattr(BatchTranslator, "_ack",
                        lambda self, frames, position, *args: one_by_one.append(frames[position]) or
                        judge(self, frames, position, *args))
    batch = BatchTranslator(Translator(tables))
    batch.process_batch(frames, 0)
    assert one_by_one == ([] if taken_all else kw_acks)
    assert [args[0] for args in calls] == ([] if taken_all else [kw_acks[2]])
    counts = batch.oracle.counts()
    assert counts[TranslatorCounter.RX_ACKS] == (6 if taken_all else 5)
    assert counts[TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW] == (0 if taken_all else 1)
    assert batch.oracle.qp_state[kw.qp.index].unacked_psn == (kw.qp.start_psn + 31) & 0xFFFFFF
    assert batch.oracle.qp_state[append.qp.index].unacked_psn == (append.qp.start_psn + 3) & 0xFFFFFF
    monkeypatch.setattr(Translator, "process", process)
    assert_same(run_oracle(tables, frames, [len(frames)], lambda _: 0),
                run_batches(tables, frames, [len(frames)], lambda _: 0))


def test_a_nak_splits_the_batch_where_it_arrives():
    """A sequence NAK puts the QP in grace: the reports after it are dropped, the ones before it were sent."""
    tables = batch_tables()
    kw = tables.structure(C1, DtaOpcode.KEY_WRITE)
    to_c1 = reporter(C1, tables)
    nak = reply(tables, C1, kw.qp.local_qpn, (kw.qp.start_psn + 1) & 0xFFFFFF,
                aeth_syndrome(AethKind.NAK, NakCode.PSN_SEQUENCE_ERROR))
    frames = [*[to_c1.frame(dta.key_write(k, 1, 1)) for k in range(4)], nak,
              *[to_c1.frame(dta.key_write(k, 1, 1)) for k in range(4, 14)]]
    assert len(frames) >= MIN_VECTOR_BATCH
    batch = BatchTranslator(Translator(tables))
    out = batch.process_batch(frames, 0)
    assert len(out.frames) == 4 and batch.oracle.counts()[TranslatorCounter.DROP_GRACE] == 10
    assert_same(run_oracle(tables, frames, [len(frames)], lambda _: 0),
                run_batches(tables, frames, [len(frames)], lambda _: 0))


def test_the_crc_shares_of_a_message_add_up_to_its_linear_crc():
    rng = random.Random(4)
    for length in (1, 4, 37, 120):
        message = rng.randbytes(length)
        shares = linear_crc_position_tables(length)
        total = np.bitwise_xor.reduce([shares[position][byte] for position, byte in enumerate(message)])
        assert int(total) == linear_crc(message)


@pytest.mark.parametrize("count", [0, 1, BY_COLUMN_FROM - 1, BY_COLUMN_FROM])
def test_shares_looked_up_all_at_once_or_a_column_at_a_time_give_each_rows_crc(count):
    """Both ways `xor_of_shares` looks shares up (below and from BY_COLUMN_FROM rows) give each row's CRC-32 of
    the bytes in the columns named, in their order."""
    rng = np.random.default_rng(count)
    rows = rng.integers(0, 256, (count, 40), dtype=np.uint8)
    columns = [int(column) for column in rng.permutation(40)[:23]]
    got = xor_of_shares(linear_crc_position_tables(len(columns)), rows, columns, zlib.crc32(bytes(len(columns))))
    assert got.dtype == np.uint32 and got.tolist() == [zlib.crc32(row[columns].tobytes()) for row in rows]


@pytest.mark.parametrize("count", [0, 1, MIN_VECTOR_BATCH - 1, MIN_VECTOR_BATCH])
def test_batches_at_the_edge_of_vectorizing(count):
    tables = batch_tables()
    frames = [reporter(C1, tables).frame(dta.key_write(key, 9, 3)) for key in range(count)]
    assert_same(run_oracle(tables, frames, [count], lambda _: 0), run_batches(tables, frames, [count], lambda _: 0))
