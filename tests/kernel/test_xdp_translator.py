"""The XDP translator against the reference translator, frame for frame, through BPF_PROG_TEST_RUN.

Every test loads the real object into the kernel; the reference model (softdta.core.translator) is the oracle.
"""

import os
import random
import shutil
import socket
import subprocess
import sys
import time

import pytest

from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.core.workload import ReporterAddress
from softdta.engines.xdp import XdpTranslator
from softdta.kernel.bpf import xdp_md
from softdta.kernel.netns import Namespace, in_netns
from softdta.kernel.programs import XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX
from softdta.spec import (
    ACK_SYNDROME,
    DTA_PORT,
    MAX_REDUNDANCY,
    ROCE_PORT,
    AethKind,
    DtaOpcode,
    KeyHash,
    QpState,
    RoceOpcode,
    TranslatorCounter,
)
from softdta.wire import dta
from softdta.wire.dta import Profile
from softdta.wire.frames import UdpEndpoints, build_udp_frame, ip_bytes, mac_bytes, parse_udp_frame
from softdta.wire.roce import (
    NAK_REMOTE_ACCESS_SYNDROME,
    NAK_SEQUENCE_SYNDROME,
    aeth_syndrome,
    build_roce_frame,
    parse_roce,
    transport_payload,
)
from tests.common import EXAMPLE_TABLES

pytestmark = pytest.mark.privileged

COLLECTORS = {"c1": ("10.77.1.1", "02:5d:7a:00:01:01"), "c2": ("10.77.2.1", "02:5d:7a:00:02:01")}
GRACE_MS = 60_000.0  # long enough that no grace period ends by itself during a test


def random_tables(rng: random.Random, profile: str = "dta-v1", queues: int = 1) -> dict:
    """A small random configuration: tiny stores and caches so that collisions, evictions and wraps happen.
    With `queues` > 1, every structure has a QP per RX queue, all into its one region."""
    qpn = iter(range(0x100, 0x400))

    def qp(transport: str | None = None, length: int = 4096) -> dict | list[dict]:
        region = {"rkey": rng.getrandbits(32), "base": rng.getrandbits(40) << 8, "length": length}
        if transport:
            region["transport"] = transport
        entries = []
        for _ in range(queues):
            number = next(qpn)
            entries.append({"remote_qpn": number, "local_qpn": number + 0x1000, **region,
                            "start_psn": rng.randrange(1 << 24)})
        return entries if queues > 1 else entries[0]

    structures = []
    for name, key_len, data_len in (("c1", 4, 4), ("c2", rng.randint(1, 32), rng.randint(1, 60))):
        structures.append({"primitive": "key-write", "collector": name, "key_len": key_len, "data_len": data_len,
                           "hash": rng.choice(["dta-v1", "independent"]), "redundancy": rng.choice([1, 2, 4]),
                           "qp": qp(rng.choice(["uc", "rc"]), length=rng.choice([256, 1024, 4096]))})
        structures.append({"primitive": "key-increment", "collector": name, "key_len": key_len,
                           "hash": rng.choice(["dta-v1", "independent"]), "redundancy": rng.choice([1, 2, 4]),
                           "qp": qp("rc", length=512)})
        structures.append({"primitive": "postcarding", "collector": name, "key_len": key_len,
                           "hops": rng.choice([5, 8]), "cache_entries": rng.choice([4, 16, 64]),
                           "qp": qp(rng.choice(["uc", "rc"]), length=2048)})
    rows, batch = rng.randint(1, 4), rng.choice([1, 2, 4])
    structures.append({"primitive": "sketch-merge", "collector": "c1", "columns": 8, "rows": rows,
                       "reporters": rng.randint(1, 3), "batch": batch, "merge": rng.choice(["sum", "max"]),
                       "qp": qp(rng.choice(["uc", "rc"]), length=8 * rows * 4)})
    appends = []
    first = rng.randrange(1000)
    for name in ("c1", "c2"):
        batch = rng.randint(1, 16)
        data_len = rng.choice([4, 8, 3]) if name == "c2" else 4
        batch = min(batch, 256 // data_len)
        entries = batch * rng.randint(1, 4)
        lists = rng.randint(1, 6)
        appends.append({"collector": name, "first_list": first, "lists": lists, "entries": entries, "batch": batch,
                        "data_len": data_len, "qp": qp(rng.choice(["uc", "rc"]), length=lists * entries * data_len)})
        first += lists + rng.randrange(3)
    return {
        "translator": {"profile": profile, "mac": "02:5d:7a:00:00:01", "ip": "10.77.0.1",
                       "udp_sport": rng.randrange(49152, 65536), "dscp": rng.randrange(64), "ttl": rng.randint(1, 255),
                       "grace_ms": GRACE_MS, "ack_request_interval": rng.choice([1, 3, 16])},
        "collectors": [{"name": n, "ip": ip, "mac": mac} for n, (ip, mac) in COLLECTORS.items()],
        "structures": structures, "append": appends,
    }


class Reporters:
    """A few reporters whose reports aim at both collectors, with sequence numbers that sometimes skip."""

    def __init__(self, rng: random.Random, tables: Tables):
        self.rng, self.tables = rng, tables
        self.addresses = [ReporterAddress(mac=mac_bytes(f"02:5d:7a:00:09:{i:02x}"), ip=ip_bytes(f"10.77.9.{i}"),
                                          translator_mac=tables.mac, collector_ip=ip_bytes(COLLECTORS["c1"][0]))
                          for i in range(1, 4)]
        self.seqnum = {a.ip: 0 for a in self.addresses}
        self.sketch_column: dict[int, int] = {}
        self.keys = {}

    def frame(self) -> bytes:
        rng = self.rng
        address = rng.choice(self.addresses)
        collector = rng.choice(["c1", "c2"])
        report = self.report(collector)
        ip = ip_bytes(COLLECTORS[collector][0])
        address = ReporterAddress(address.mac, address.ip, address.translator_mac, ip)
        if self.tables.profile is Profile.DTA_V1 or report.extended:
            step = rng.choices([1, 0, 2, 5, 200], [20, 1, 1, 1, 1])[0]
            self.seqnum[address.ip] = (self.seqnum[address.ip] + step) & 0xFF
            report = dta.Report(**{**report.__dict__, "seqnum": self.seqnum[address.ip],
                                   "retransmit": rng.random() < 0.3})
        return address.frame(report, self.tables.profile)

    def key(self, length: int) -> bytes:
        pool = self.keys.setdefault(length, [self.rng.randbytes(length) for _ in range(12)])
        return self.rng.choice(pool)

    def report(self, collector: str) -> dta.Report:
        rng = self.rng
        ip = ip_bytes(COLLECTORS[collector][0])
        kind = rng.choice(list(DtaOpcode))
        immediate = rng.random() < 0.3
        structure = self.tables.structure(ip, kind) if kind is not DtaOpcode.APPEND else None
        key_len = structure.key_len if structure else 4
        if rng.random() < 0.05:
            key_len = rng.randint(1, 32)
        extended = key_len != 4 or (structure is not None and structure.data_len != 4) or rng.random() < 0.2
        if kind is DtaOpcode.KEY_WRITE:
            data_len = structure.data_len if structure else 4
            return dta.key_write(self.key(key_len), rng.randbytes(data_len), rng.randint(1, 4), immediate=immediate,
                                 extended=extended)
        if kind is DtaOpcode.KEY_INCREMENT:
            return dta.key_increment(self.key(key_len), rng.getrandbits(rng.choice([8, 64])), rng.randint(1, 4),
                                     immediate=immediate, extended=extended)
        if kind is DtaOpcode.POSTCARDING:
            hops = structure.hops if structure else 5
            path_length = rng.choice([0, 0, 1, rng.randint(1, hops)]) if extended else 0
            hop = rng.randint(1, path_length or min(hops, 5))
            return dta.postcard(self.key(key_len), hop, rng.randbytes(4), path_length=path_length,
                                immediate=immediate, extended=extended or bool(path_length))
        if kind is DtaOpcode.APPEND:
            lists = rng.choice(self.tables.append_lists)
            list_id = lists.first_list + rng.randrange(lists.lists) if rng.random() < 0.95 else rng.randrange(5000)
            data_len = lists.data_len if rng.random() < 0.95 else 5
            return dta.append(list_id, rng.randbytes(data_len), immediate=immediate,
                              extended=data_len != 4 or extended)
        sketch = self.tables.structure(ip_bytes(COLLECTORS["c1"][0]), DtaOpcode.SKETCH_MERGE)
        reporter = rng.randrange(sketch.reporters + (rng.random() < 0.05))
        column = self.sketch_column.get(reporter, 0)
        if rng.random() < 0.1:
            column = rng.randrange(sketch.columns)
        else:
            self.sketch_column[reporter] = (column + 1) % sketch.columns
        counters = [rng.getrandbits(32) for _ in range(sketch.rows if rng.random() < 0.97 else sketch.rows + 1)]
        return dta.sketch_column(reporter, column, counters, immediate=immediate)


def assert_same(reference_out, kernel_out, what):
    assert kernel_out.passed == reference_out.passed, what
    assert kernel_out.to_reporter == reference_out.to_reporter, what
    assert len(kernel_out.frames) == len(reference_out.frames), what
    for index, (expected, got) in enumerate(zip(reference_out.frames, kernel_out.frames)):
        assert got == expected, f"{what}: frame {index} differs\n reference {expected.hex()}\n kernel    {got.hex()}"


def assert_same_state(reference: Translator, kernel: XdpTranslator):
    assert dict(kernel.counters()) == {k: v for k, v in reference.counters.items() if v}
    for qp in reference.tables.qps:
        expected, got = reference.qp_state[qp.index], kernel.qp_state(qp)
        assert (got["next_psn"], got["unacked_psn"], got["state"], got["frames_sent"]) == \
               (expected.next_psn, expected.unacked_psn, expected.state, expected.frames_sent), qp.name
    for list_id, runtime in reference.primitive(DtaOpcode.APPEND).state.items():
        got = kernel.read("append_state", state_index=kernel.slots.append[list_id])
        assert (got["head"], got["pending"]) == (runtime.head, len(runtime.pending)), f"list {list_id}"


def run_differential(seed: int, profile: str, reports: int, queues: int = 1,
                     ifindex: int = 0) -> tuple[Translator, XdpTranslator]:
    """`queues` > 1: reports arrive on RX queues 0..queues of interface `ifindex`; the last has no QPs."""
    rng = random.Random(seed)
    document = random_tables(rng, profile, queues)
    reference = Translator(Tables.from_dict(document))
    kernel = XdpTranslator(Tables.from_dict(document), flush_idle_ns=0)
    reporters = Reporters(rng, reference.tables)
    for index in range(reports):
        frame = reporters.frame()
        queue = rng.choices(range(queues + 1), [10] * queues + [1])[0] if queues > 1 else 0
        expected = reference.process(frame, time.monotonic_ns(), queue)
        assert_same(expected, kernel.process(frame, queue=queue, ifindex=ifindex),
                    f"seed {seed} report {index} on queue {queue}: {parse_udp_frame(frame).payload.hex()}")
    return reference, kernel


@pytest.mark.parametrize("seed", range(12))
def test_random_reports_match_the_reference_frame_for_frame(seed):
    reference, kernel = run_differential(seed, "dta-v1" if seed % 3 else "dta-v1-short", 700)
    with kernel:
        assert_same_state(reference, kernel)
        assert kernel.flush() == reference.flush_idle(time.monotonic_ns(), 0)
        assert_same_state(reference, kernel)


@pytest.mark.parametrize("seed", range(4))
def test_each_rx_queue_writes_through_its_own_qps_like_the_reference(seed):
    """Three RX queues with a QP each per structure, and a fourth without: Append batches, Postcarding paths and
    sketch columns are shared by the queues, and written through the QP of the queue that completes them."""
    namespace = Namespace.create(f"sdta-q{os.getpid()}-{seed}")
    try:
        namespace.run("ip", "link", "add", "mq0", "numrxqueues", "4", "numtxqueues", "4", "type", "veth", "peer", "mq1")
        with in_netns(namespace.name):
            reference, kernel = run_differential(seed, "dta-v1", 900, queues=3, ifindex=socket.if_nametoindex("mq0"))
            with kernel:
                assert_same_state(reference, kernel)
                assert kernel.flush() == reference.flush_idle(time.monotonic_ns(), 0)
                assert_same_state(reference, kernel)
        assert reference.counters[TranslatorCounter.DROP_NO_QUEUE_QP] > 0
        sent = {qp.name for qp in reference.tables.qps if reference.qp_state[qp.index].frames_sent}
        assert {name.rpartition("/q")[2] for name in sent if "/q" in name} == {"1", "2"}
    finally:
        namespace.delete()


def test_every_frame_the_kernel_emits_is_well_formed():
    reference, kernel = run_differential(99, "dta-v1", 1500)
    rng = random.Random(7)
    reporters = Reporters(rng, reference.tables)
    with kernel:
        for _ in range(1500):
            for frame in kernel.process(reporters.frame()).frames:
                roce = parse_roce(frame)
                assert roce.icrc_ok
                assert roce.bth["dest_qp"] in {qp.remote_qpn for qp in reference.tables.qps}


def _mutations(rng: random.Random, payload: bytes):
    for cut in range(len(payload)):
        yield payload[:cut]
    for _ in range(20):
        mutated = bytearray(payload)
        mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        yield bytes(mutated)
    yield payload + rng.randbytes(rng.randint(1, 200))
    yield rng.randbytes(rng.randint(1, 300))


def test_malformed_reports_drop_for_the_same_reason_and_nothing_malformed_leaves():
    rng = random.Random(3)
    document = random_tables(rng)
    reference = Translator(Tables.from_dict(document))
    with XdpTranslator(Tables.from_dict(document)) as kernel:
        reporters = Reporters(rng, reference.tables)
        ends = UdpEndpoints(src_mac=mac_bytes("02:00:00:00:09:01"), dst_mac=reference.tables.mac,
                            src_ip=ip_bytes("10.77.9.1"), dst_ip=ip_bytes(COLLECTORS["c1"][0]), sport=40041,
                            dport=DTA_PORT)
        payloads = [parse_udp_frame(reporters.frame()).payload for _ in range(40)]
        payloads += [bytes([opcode]) + rng.randbytes(rng.randint(0, 40)) for opcode in range(256)]
        payloads += [bytes([0x81, opcode]) + rng.randbytes(rng.randint(0, 40)) for opcode in range(256)]
        count = 0
        for payload in payloads:
            for mutated in _mutations(rng, payload):
                frame = build_udp_frame(ends, mutated)
                out = kernel.process(frame)
                assert_same(reference.process(frame, time.monotonic_ns()), out, mutated.hex())
                for emitted in out.frames:
                    assert parse_roce(emitted).icrc_ok
                count += 1
        assert count > 5000
        assert_same_state(reference, kernel)


def test_frames_that_are_not_reports_pass_untouched():
    rng = random.Random(5)
    document = random_tables(rng)
    with XdpTranslator(Tables.from_dict(document)) as kernel:
        ends = UdpEndpoints(src_mac=mac_bytes("02:00:00:00:09:01"), dst_mac=mac_bytes("02:5d:7a:00:00:01"),
                            src_ip=ip_bytes("10.77.9.1"), dst_ip=ip_bytes("10.77.0.1"), sport=5000, dport=53)
        other_udp = build_udp_frame(ends, b"dns?")
        ipv6 = build_udp_frame(UdpEndpoints(ends.src_mac, ends.dst_mac, ip_bytes("fd00::1"), ip_bytes("fd00::2"),
                                            5000, DTA_PORT), dta.encode(dta.key_write(1, 2)))
        arp = bytes(12) + b"\x08\x06" + bytes(28)
        roce_from_stranger = build_roce_frame(
            UdpEndpoints(ends.src_mac, ends.dst_mac, ip_bytes("10.77.9.9"), ip_bytes("10.77.0.1"), 1, ROCE_PORT),
            transport_payload(RoceOpcode.RC_ACK, 0x1100, 0, {"aeth": {"syndrome": ACK_SYNDROME}}))
        fragment = bytearray(build_udp_frame(UdpEndpoints(ends.src_mac, ends.dst_mac, ends.src_ip, ends.dst_ip, 5000,
                                                          DTA_PORT), dta.encode(dta.key_write(1, 2))))
        fragment[20] |= 0x20  # more fragments
        for frame in (other_udp, ipv6, arp, roce_from_stranger, bytes(fragment), b"\xff" * 14):
            out = kernel.process(frame)
            assert out.passed and not out.frames
        assert not kernel.counters()


def reply(tables, qp, opcode, syndrome, psn, corrupt=False):
    ends = UdpEndpoints(src_mac=qp.collector_mac, dst_mac=tables.mac, src_ip=qp.collector_ip, dst_ip=tables.ip,
                        sport=49999, dport=ROCE_PORT)
    headers = {"aeth": {"syndrome": syndrome, "msn": 7}, "atomic_ack_eth": {"original": 11}}
    frame = bytearray(build_roce_frame(ends, transport_payload(opcode, qp.local_qpn, psn, headers)))
    if corrupt:
        frame[-1] ^= 1
    return bytes(frame)


def test_collector_replies_resync_fail_and_are_counted_like_the_reference():
    rng = random.Random(11)
    document = random_tables(rng)
    reference = Translator(Tables.from_dict(document))
    with XdpTranslator(Tables.from_dict(document)) as kernel:
        tables = reference.tables
        reporters = Reporters(rng, tables)
        for _ in range(600):  # writes outstanding on the RC QPs, which replies must fall among
            frame = reporters.frame()
            assert_same(reference.process(frame, time.monotonic_ns()), kernel.process(frame), frame.hex())
        rc = [qp for qp in tables.qps if qp.transport.name == "RC"
              and reference.qp_state[qp.index].next_psn - reference.qp_state[qp.index].unacked_psn >= 8]
        assert len(rc) >= 2
        first, last = (reference.qp_state[qp.index].unacked_psn for qp in (rc[0], rc[-1]))
        replies = [reply(tables, rc[0], RoceOpcode.RC_ACK, ACK_SYNDROME, first + 1),
                   reply(tables, rc[0], RoceOpcode.RC_ATOMIC_ACK, ACK_SYNDROME, first + 2),
                   reply(tables, rc[0], RoceOpcode.RC_ACK, aeth_syndrome(AethKind.RNR_NAK, 3), first + 3),
                   reply(tables, rc[0], RoceOpcode.RC_ACK, NAK_SEQUENCE_SYNDROME, first + 5),
                   reply(tables, rc[-1], RoceOpcode.RC_ACK, NAK_REMOTE_ACCESS_SYNDROME, last),
                   reply(tables, rc[0], RoceOpcode.RC_ACK, ACK_SYNDROME, first + 5, corrupt=True),
                   reply(tables, rc[0], RoceOpcode.RC_WRITE_ONLY, ACK_SYNDROME, 5)]
        for frame in replies:
            assert_same(reference.process(frame, time.monotonic_ns()), kernel.process(frame), frame.hex())
        assert_same_state(reference, kernel)
        assert kernel.counters()[TranslatorCounter.DROP_BAD_ICRC] == 1
        # Not replies, so the control plane's: a CM MAD to QP1, a collector's SEND on a new QP, a stray WRITE
        ends = UdpEndpoints(rc[0].collector_mac, tables.mac, rc[0].collector_ip, tables.ip, 49999, ROCE_PORT)
        counted = kernel.counters()
        for frame in (build_roce_frame(ends, transport_payload(RoceOpcode.UD_SEND_ONLY, 1, 0, {
                          "deth": {"qkey": 0x80010000, "src_qp": 1}}, bytes(256))),
                      build_roce_frame(ends, transport_payload(RoceOpcode.RC_SEND_ONLY, 0x4321, 9, {}, bytes(16))),
                      replies[-1]):
            assert kernel.process(frame).passed and reference.process(frame).passed
        assert kernel.counters() == counted
        assert kernel.qp_state(rc[0])["state"] == QpState.GRACE
        assert kernel.qp_state(rc[0])["next_psn"] == first + 5
        assert kernel.qp_state(rc[-1])["state"] == QpState.FAILED
        # Reports to those QPs are now dropped (grace, failed) exactly as the reference drops them.
        for _ in range(300):
            frame = reporters.frame()
            assert_same(reference.process(frame, time.monotonic_ns()), kernel.process(frame), frame.hex())
        assert_same_state(reference, kernel)
        assert kernel.counters()[TranslatorCounter.DROP_GRACE] + kernel.counters()[TranslatorCounter.DROP_QP_FAILED] > 0
        kernel.revive(rc[-1], 77)
        reference.revive(rc[-1], 77)
        assert kernel.qp_state(rc[-1])["state"] == QpState.ACTIVE


@pytest.mark.parametrize("seed", range(4))
def test_forged_and_stale_replies_are_refused_like_the_reference(seed):
    """Reports and replies interleaved: ACKs, Atomic ACKs, RNR, sequence and fatal NAKs on RC and UC QPs, with
    PSNs inside the outstanding window, just behind it, just beyond it, far off and across the 2^24 wrap."""
    rng = random.Random(100 + seed)
    document = random_tables(rng)  # random start PSNs: some windows cross 2^24
    reference = Translator(Tables.from_dict(document))
    syndromes = [ACK_SYNDROME, ACK_SYNDROME, aeth_syndrome(AethKind.RNR_NAK, 1), NAK_SEQUENCE_SYNDROME,
                 NAK_REMOTE_ACCESS_SYNDROME]
    with XdpTranslator(Tables.from_dict(document)) as kernel:
        tables = reference.tables
        reporters = Reporters(rng, tables)
        for index in range(1500):
            if rng.random() < 0.7:
                frame = reporters.frame()
            else:
                qp = rng.choice(tables.qps)
                state = reference.qp_state[qp.index]
                psn = rng.choice([state.unacked_psn, state.next_psn - 1, state.unacked_psn - 1, state.next_psn,
                                  state.next_psn + rng.randrange(1 << 23), rng.randrange(1 << 24)]) & 0xFFFFFF
                opcode = rng.choice([RoceOpcode.RC_ACK, RoceOpcode.RC_ATOMIC_ACK])
                frame = reply(tables, qp, opcode, rng.choice(syndromes[:4] if rng.random() < 0.9 else syndromes), psn)
            assert_same(reference.process(frame, time.monotonic_ns()), kernel.process(frame), f"{index}: {frame.hex()}")
        assert_same_state(reference, kernel)
        counted = kernel.counters()
        assert counted[TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW] and counted[TranslatorCounter.DROP_REPLY_ON_UC]
        assert counted[TranslatorCounter.RX_ACKS] and counted[TranslatorCounter.RX_NAK_SEQUENCE]
        assert counted[TranslatorCounter.NAK_LOST_WRITES] == reference.counters[TranslatorCounter.NAK_LOST_WRITES] > 0


PATHS = {XDP_TX: "xdp", XDP_REDIRECT: "xdp", XDP_PASS: "tc", XDP_DROP: "drop"}


def test_a_structure_without_redundancy_sends_from_xdp_and_drops_redundant_reports(tables, reporter):
    """At redundancy 1, Key-Write and Key-Increment frames leave with XDP_TX, without the tc stage and its skb;
    a report that asks for more copies is dropped, as the reference drops it. At the default, every report of
    the structure goes through the tc stage, N = 1 too."""
    reports = [dta.key_write(1, 2), dta.key_increment(3, 4), dta.key_write(5, 6, 2), dta.key_increment(7, 8, 4),
               dta.key_write(9, 10)]
    verdicts = {}
    for redundancy in (1, MAX_REDUNDANCY):
        for kind in (DtaOpcode.KEY_WRITE, DtaOpcode.KEY_INCREMENT):
            tables.structure(reporter.collector_ip, kind).redundancy = redundancy
        reference = Translator(tables)
        with XdpTranslator(tables) as kernel:
            verdicts[redundancy] = []
            for report in reports:
                frame = reporter.frame(report)
                expected = reference.process(frame)
                run = kernel.xdp.test_run(frame, ctx=xdp_md())
                verdicts[redundancy].append(PATHS[run.retval])
                assert run.data == (expected.frames[0] if expected.frames else frame)
            counters = kernel.counters()
            bad_redundancy = TranslatorCounter.DROP_BAD_REDUNDANCY
            assert counters[bad_redundancy] == reference.counters[bad_redundancy]
    assert verdicts == {1: ["xdp", "xdp", "drop", "drop", "xdp"], MAX_REDUNDANCY: ["tc"] * 5}


def test_grace_ends_on_time(tables, reporter):
    tables.grace_ns = 20_000_000
    with XdpTranslator(tables) as kernel:
        kw = tables.structure(reporter.collector_ip, DtaOpcode.KEY_WRITE)
        kernel.resync(kw.qp, 500)
        assert not kernel.process(reporter.frame(dta.key_write(1, 2))).frames
        time.sleep(0.03)
        frames = kernel.process(reporter.frame(dta.key_write(1, 2))).frames
        assert [parse_roce(f).bth["psn"] for f in frames] == [500]
        assert kernel.counters()[TranslatorCounter.DROP_GRACE] == 1


def test_essential_reports_are_parked_for_userspace_while_the_qp_cannot_send(tables, reporter):
    tables.grace_ns = 10**10  # longer than any stall of a loaded test machine between the two reports
    with XdpTranslator(tables) as kernel:
        kw = tables.structure(reporter.collector_ip, DtaOpcode.KEY_WRITE)
        kernel.resync(kw.qp, 0)
        essential = reporter.frame(dta.key_write(7, 8, essential=True, extended=True))
        out = kernel.process(essential)
        assert out.deferred and not out.frames
        assert kernel.counters()[TranslatorCounter.ESSENTIAL_DEFERRED] == 1
        plain = kernel.process(reporter.frame(dta.key_write(7, 8)))
        assert not plain.deferred and kernel.counters()[TranslatorCounter.DROP_GRACE] == 1


def test_pinned_maps_keep_psns_heads_and_caches_across_a_restart(tables, reporter):
    from softdta.kernel.bpf import ensure_bpffs
    pin = ensure_bpffs() / f"softdta-test-{os.getpid()}"
    pin.mkdir(parents=True, exist_ok=True)
    try:
        reference = Translator(tables)
        reports = [dta.key_write(5, 6, 2), dta.append(3, 9), dta.postcard(4, 1, 1), dta.append(3, 10)]
        with XdpTranslator(tables, pin_dir=pin) as first:
            for report in reports:
                assert_same(reference.process(reporter.frame(report)), first.process(reporter.frame(report)), "")
        with XdpTranslator(Tables.from_toml(EXAMPLE_TABLES), pin_dir=pin) as second:
            for report in reports + [dta.postcard(4, 2, 1)]:
                assert_same(reference.process(reporter.frame(report)), second.process(reporter.frame(report)), "")
            assert_same_state(reference, second)
    finally:
        shutil.rmtree(pin, ignore_errors=True)


# Run by a process of its own on the other CPU: flips the translator's UDP source port, which the iCRC covers,
# back and forth in the pinned configuration until it is killed.
_PORT_FLIPPER = """
import os, sys
from softdta.kernel.bpf import Map
from softdta.kernel.maps import map_layout
os.sched_setaffinity(0, {int(sys.argv[2])})
config, layout = Map.from_pinned(sys.argv[1]), map_layout("translator_config")
key = layout.key.pack(index=0)
value = config.lookup(key)
fields = layout.value.unpack(value)
flipped = layout.value.pack(**{**fields, "udp_sport": fields["udp_sport"] ^ 1})
print("flipping", flush=True)
while True:
    config.update(key, flipped)
    config.update(key, value)
"""


def test_a_table_write_between_two_frames_of_a_report_leaves_each_frame_whole(tables, reporter):
    """A report's first frame takes its fixed headers from the frame cache only when it is put in the packet,
    and a later frame that finds the configuration changed rebuilds that cache entry. While another CPU flips the
    UDP source port, every frame of Key-Write N=2 reports must still carry a right iCRC; and reports whose two
    frames differ in port (a flip fell between them, the case this guards) must have happened, or the test
    proved nothing."""
    from softdta.kernel.bpf import ensure_bpffs
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: the table writes must land while a report is being translated")
    pin = ensure_bpffs() / f"softdta-test-{os.getpid()}"
    pin.mkdir(parents=True, exist_ok=True)
    os.sched_setaffinity(0, {cpus[0]})
    flipper = None
    try:
        with XdpTranslator(tables, pin_dir=pin) as kernel:
            flipper = subprocess.Popen([sys.executable, "-c", _PORT_FLIPPER, str(pin / "translator_config"),
                                        str(cpus[1])], stdout=subprocess.PIPE, text=True)
            assert flipper.stdout is not None and flipper.stdout.readline() == "flipping\n"
            frame = reporter.frame(dta.key_write(5, 6, 2))
            split, runs, deadline = 0, 0, time.monotonic() + 60
            while (split < 20 or runs < 2000) and time.monotonic() < deadline:
                frames = kernel.process(frame).frames
                assert len(frames) == 2
                assert all(parse_roce(each).icrc_ok for each in frames), f"a bad iCRC after {runs} reports"
                split += len({parse_udp_frame(each).udp["sport"] for each in frames}) == 2
                runs += 1
            assert split >= 20, f"in {runs} reports, {split} had a table write between their frames"
    finally:
        os.sched_setaffinity(0, set(cpus))
        if flipper is not None:
            flipper.kill()
            flipper.wait()
        shutil.rmtree(pin, ignore_errors=True)


def test_live_table_changes_keep_the_state_of_entries_that_stay(tables, reporter):
    reference = Translator(tables)
    with XdpTranslator(tables) as kernel:
        for report in (dta.key_write(5, 6, 2), dta.append(3, 9), dta.append(3, 9)):
            assert_same(reference.process(reporter.frame(report)), kernel.process(reporter.frame(report)), "")
        changed = Tables.from_toml(EXAMPLE_TABLES)
        changed.append_lists = changed.append_lists[:0]
        changed.qps = [qp for qp in changed.qps if qp.name.startswith(("key", "postcard", "sketch"))]
        changed.validate()
        kernel.apply(changed)
        out = kernel.process(reporter.frame(dta.append(3, 9)))
        assert not out.frames and kernel.counters()[TranslatorCounter.DROP_UNKNOWN_LIST] == 1
        kw = tables.structure(reporter.collector_ip, DtaOpcode.KEY_WRITE)
        frames = kernel.process(reporter.frame(dta.key_write(5, 6, 1))).frames
        assert parse_roce(frames[0]).bth["psn"] == (kw.qp.start_psn + 2) & 0xFFFFFF


def test_a_recreated_collector_qp_restarts_its_psns_and_append_rings(tables, reporter):
    """A collector that restarted advertises a new QP (and region): its rings are read from entry 0 again."""
    lists = tables.append_lists[0]
    with XdpTranslator(tables) as kernel:
        first = [parse_roce(frame) for report in [dta.append(lists.first_list, value) for value in range(8)]
                 for frame in kernel.process(reporter.frame(report)).frames]
        assert first and first[0].headers["reth"]["va"] == lists.qp.base_va
        recreated = Tables.from_toml(EXAMPLE_TABLES)
        for qp in recreated.qps:
            if qp.name == lists.qp.name:
                qp.remote_qpn ^= 0x40
        kernel.apply(recreated)
        again = [parse_roce(frame) for report in [dta.append(lists.first_list, value) for value in range(8)]
                 for frame in kernel.process(reporter.frame(report)).frames]
        assert [(p.headers["reth"]["va"], p.bth["psn"]) for p in again] == \
            [(p.headers["reth"]["va"], p.bth["psn"]) for p in first]
        assert {p.bth["dest_qp"] for p in again} == {lists.qp.remote_qpn ^ 0x40}


def _structures(tables: Tables, primitive: DtaOpcode) -> list:
    return [structure for structure in tables.structures if structure.primitive is primitive]


# Changes of what the kernel keeps per CPU between reports: the fixed headers of each QP's frames (frame_cache)
# and the structure translated for last (structure_find).
TABLE_CHANGES = {
    "ttl": lambda t: setattr(t, "ttl", t.ttl % 255 + 1),
    "dscp": lambda t: setattr(t, "dscp", (t.dscp + 9) % 64),
    "udp_sport": lambda t: setattr(t, "udp_sport", t.udp_sport ^ 0x0101),
    "translator ip": lambda t: setattr(t, "ip", ip_bytes("10.77.0.99")),
    "translator mac": lambda t: setattr(t, "mac", mac_bytes("02:5d:7a:00:00:99")),
    "collector mac": lambda t: [setattr(qp, "collector_mac", mac_bytes("02:5d:7a:00:0c:99")) for qp in t.qps],
    "remote qpn": lambda t: [setattr(qp, "remote_qpn", qp.remote_qpn ^ 0x40) for qp in t.qps],
    "key-write slots": lambda t: [setattr(s, "slot_count", s.slot_count // 2)
                                  for s in _structures(t, DtaOpcode.KEY_WRITE)],
    "key-increment hash": lambda t: [setattr(s, "key_hash", KeyHash(1 - s.key_hash))  # dta-v1 <-> independent
                                     for s in _structures(t, DtaOpcode.KEY_INCREMENT)],
}


def test_an_append_list_change_shows_in_the_next_report(tables, reporter):
    """Each CPU keeps a copy of the Append list it appended to last (append_list_find): reports after a table
    change must see the new list, here entries of 8 bytes where they were 4."""
    lists = tables.append_lists[0]
    changed = Tables.from_toml(EXAMPLE_TABLES)
    changed.append_lists[0].data_len = 8
    changed.append_lists[0].qp.length *= 2
    changed.validate()
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})  # the copy is per CPU
    try:
        with XdpTranslator(tables, flush_idle_ns=0) as kernel:
            before = [kernel.process(reporter.frame(dta.append(lists.first_list, value))).frames
                      for value in range(lists.batch)]
            assert [len(frames) for frames in before] == [0] * (lists.batch - 1) + [1]
            kernel.apply(changed)
            after = [kernel.process(reporter.frame(dta.append(lists.first_list, value.to_bytes(8, "big"),
                                                              extended=True))).frames
                     for value in range(lists.batch)]
            assert not [c for c, n in kernel.counters().items() if c.name.startswith("DROP_") and n]
    finally:
        os.sched_setaffinity(0, cpus)
    assert [len(frames) for frames in after] == [0] * (lists.batch - 1) + [1]
    write = parse_roce(after[-1][0])
    assert write.headers["reth"]["dma_length"] == 8 * lists.batch
    assert write.payload == b"".join(value.to_bytes(8, "little") for value in range(lists.batch))


@pytest.mark.parametrize("change", TABLE_CHANGES)
def test_frames_follow_a_table_change_of_what_a_cpu_keeps(change, reporter):
    """The kernel keeps each QP's fixed headers and their iCRC state per frame shape and CPU (frame_cache), and
    each CPU the structure it translated for last (structure_find): a table change of anything in them must show
    in the next frame, with and without immediate, N = 1 and 2. The test stays on one CPU, and the last report
    before the change is for the structure the first one after it is for, so they meet what was kept."""
    others = [dta.key_write(7, 8, 2, immediate=True), *[dta.postcard(0x0A000001, hop, hop) for hop in range(1, 6)]]
    # N = 2: the two hashes differ in copy 1 only (copy 0 of `independent` uses dta-v1's polynomial)
    first = dta.key_increment(9, 3, 2) if change == "key-increment hash" else dta.key_write(5, 6, 1)
    before, after = others + [dta.key_increment(9, 3, 1), dta.key_write(5, 6, 1), first], [first] + others
    changed = Tables.from_toml(EXAMPLE_TABLES)
    TABLE_CHANGES[change](changed)
    changed.validate()
    reference = Translator(changed)
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        with XdpTranslator(Tables.from_toml(EXAMPLE_TABLES), flush_idle_ns=0) as kernel:
            for report in before:
                kernel.process(reporter.frame(report))
                if change != "remote qpn":  # a new remote QPN is a new QP: it starts at its start PSN again
                    reference.process(reporter.frame(report))
            kernel.apply(changed)
            reporter = ReporterAddress(reporter.mac, reporter.ip, changed.mac, reporter.collector_ip)
            for report in after:
                assert_same(reference.process(reporter.frame(report)), kernel.process(reporter.frame(report)), change)
    finally:
        os.sched_setaffinity(0, cpus)
