"""The v1model program in bmv2, against the reference translator: every frame out of simple_switch_grpc equals,
byte for byte, what `softdta.core.translator` emits for the same reports, and scapy checks every iCRC.

The switch gets its pipeline and tables over P4Runtime from the same planner that fills the XDP maps
(`P4Translator`), and its registers and crc32_custom parameters over Thrift (`softdta.targets.bmv2`). Its one port is
a veth whose far end sits in a namespace this test creates, where an AF_PACKET socket sends the reports and
reads what comes back (a translator has one arm: RoCE leaves where reports came in).
"""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.l2 import Ether

from softdta.core import workload
from softdta.core.primitives import FlushRequest
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.kernel.netns import Namespace, cleanup_prefix, in_netns
from softdta.spec import (
    ACK_SYNDROME,
    DTA_PORT,
    ROCE_PORT,
    AethKind,
    DtaOpcode,
    FlushTarget,
    RoceOpcode,
    TranslatorCounter,
)
from softdta.targets.bmv2 import Bmv2, ThriftRegisters, compile_v1model
from softdta.targets.p4runtime import P4Names, P4RuntimeError, load_p4info, p4runtime_pb2
from softdta.wire import dta
from softdta.wire.frames import UdpEndpoints, build_udp_frame
from softdta.wire.roce import NAK_SEQUENCE_SYNDROME, aeth_syndrome, build_roce_frame, transport_payload
from tests.common import EXAMPLE_TABLES, bmv2_tool, p4_tool

pytestmark = [pytest.mark.privileged, pytest.mark.interop]

PREFIX = f"sdta-bm{os.getpid() % 10000}-"
SWITCH_PORT = f"sdtabm{os.getpid() % 10000}"  # the switch's end, in this namespace (bmv2 and gRPC live here)
GRPC_PORT, THRIFT_PORT = 19559 + os.getpid() % 200, 19090 + os.getpid() % 200
SOL_PACKET, PACKET_IGNORE_OUTGOING, SO_RCVBUFFORCE = 263, 23, 33
PACE_S = 0.002  # between reports: bmv2 is a software switch of some thousand packets/s
ETH_IP_UDP = 14 + 20 + 8


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    """The v1model program compiled for bmv2, with P4C and BMV2 pointing at the tools (softdta.targets.bmv2 reads
    them)."""
    saved = {name: os.environ.get(name) for name in ("P4C", "BMV2")}
    os.environ["P4C"] = str(Path(p4_tool("p4c-bm2-ss")).parent)
    os.environ["BMV2"] = str(Path(bmv2_tool("simple_switch_grpc")).parent)
    yield compile_v1model(tmp_path_factory.mktemp("bmv2"))[0]
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


class Switch:
    """simple_switch_grpc on a veth pair, loaded with the example tables; `exchange` sends reports and returns
    what leaves the switch."""

    def __init__(self, program: Path, tables: Tables | None, log_path, **translator_options):
        self.namespace = veth_to_namespace()
        self.switch: Bmv2 | None = None
        self.socket: socket.socket | None = None
        try:
            if tables is not None:  # else `softdta p4 run` runs the switch
                self.switch = Bmv2(program, {0: SWITCH_PORT}, grpc_port=GRPC_PORT, thrift_port=THRIFT_PORT,
                                   log=log_path)
                self.switch.translator(**translator_options).apply(tables)
            with in_netns(self.namespace.name):
                self.socket = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
            # nothing reads while the reports go out: room for all that comes back, none taken by our own frames
            self.socket.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
            self.socket.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            self.socket.bind(("h0", 0))
            self.socket.settimeout(0.2)
        except BaseException:  # the fixture never gets a switch to close: no process, link or namespace may stay
            self.close()
            raise

    def exchange(self, frames: list[bytes], expected: int, deadline_s: float = 60.0) -> list[bytes]:
        self.send(frames)
        return self.receive(expected, deadline_s)

    def send(self, frames: list[bytes]) -> None:
        for frame in frames:
            self.socket.send(frame)
            time.sleep(PACE_S)

    def receive(self, expected: int, deadline_s: float = 60.0) -> list[bytes]:
        received, deadline, quiet_until = [], time.monotonic() + deadline_s, None
        while time.monotonic() < deadline:
            try:
                data = self.socket.recv(4096)
            except socket.timeout:
                if len(received) >= expected:  # and nothing more for a while: no stray frame either
                    quiet_until = quiet_until or time.monotonic() + 1.0
                    if time.monotonic() > quiet_until:
                        break
                continue
            received.append(data)
        return received

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()
        if self.switch is not None:
            self.switch.close()
        subprocess.run(["ip", "link", "del", SWITCH_PORT], capture_output=True)
        cleanup_prefix(PREFIX)


def veth_to_namespace() -> Namespace:
    """SWITCH_PORT here, its peer h0 in a namespace of the test's own."""
    namespace = Namespace.create(PREFIX + "h")
    subprocess.run(["ip", "link", "add", SWITCH_PORT, "type", "veth", "peer", "name", "h0", "netns", namespace.name],
                   check=True)
    subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{SWITCH_PORT}.disable_ipv6=1"], check=True)
    subprocess.run(["ip", "link", "set", SWITCH_PORT, "up"], check=True)
    namespace.run("ip", "link", "set", "h0", "up")
    return namespace


@pytest.fixture
def switch(program, tmp_path):
    tables = Tables.from_toml(EXAMPLE_TABLES)
    started = Switch(program, tables, tmp_path / "switch.log")
    yield started, tables
    started.close()


def scapy_icrc_ok(frame: bytes) -> bool:
    packet = Ether(frame)
    packet[BTH].icrc = None  # scapy computes it again
    return bytes(packet) == frame


def psn(frame: bytes) -> int:
    return int.from_bytes(frame[ETH_IP_UDP + 9:ETH_IP_UDP + 12], "big")


def psn_and_ack_request(frame: bytes) -> tuple[int, int]:
    """A frame's PSN and AckReq bit: both follow the frame's place in its QP's sequence."""
    return psn(frame), frame[ETH_IP_UDP + 8] >> 7


def without_psn(frame: bytes) -> bytes:
    """The frame with its PSN, AckReq and iCRC blanked: what stays the same whichever PSN a copy was given."""
    return frame[:ETH_IP_UDP + 8] + bytes(4) + frame[ETH_IP_UDP + 12:-4]


def redundant(n: int, immediate: bool = False) -> list:
    return [replace(report, immediate=immediate) for report in workload.key_write(30, seed=n, redundancy=n)]


def sketch(tables: Tables) -> list:
    structure = next(s for s in tables.structures if s.primitive is DtaOpcode.SKETCH_MERGE)
    return workload.sketch_epoch(structure.reporters, structure.columns, structure.rows, seed=6)


CASES = {
    "key-write-n1": lambda tables: redundant(1),
    "key-write-n2": lambda tables: redundant(2),
    "key-write-n3-immediate": lambda tables: redundant(3, immediate=True),
    "key-write-n4": lambda tables: redundant(4),
    "key-increment": lambda tables: workload.key_increment(40, seed=3, redundancy=2),
    "append-wrapping": lambda tables: workload.append(tables.append_lists[0].entries * 2 + 8, seed=4, lists=1),
    "append-4-lists": lambda tables: workload.append(64, seed=4, lists=4),
    "postcarding": lambda tables: workload.postcards(20, seed=5, switch_ids=list(range(1, 100))),
    # every flow's first hop, then every second hop...: paths wait in the cache, and colliding flows evict
    "postcarding-evictions": lambda tables: sorted(workload.postcards(300, seed=9, switch_ids=list(range(1, 100))),
                                                   key=lambda report: report.hop),
    "sketch-merge": sketch,
}


@pytest.mark.parametrize("case", CASES)
def test_every_frame_equals_the_reference(switch, case):
    bmv2, tables = switch
    reports = CASES[case](tables)
    reference = Translator(tables)
    reporter = workload.ReporterAddress(b"\x02\x00\x00\x00\x00\x09", bytes([10, 0, 0, 9]), tables.mac,
                                        tables.qps[0].collector_ip)
    frames = [reporter.frame(report) for report in reports]
    expected = [out for frame in frames for out in reference.process(frame, 0).frames]
    if case == "postcarding-evictions":
        assert reference.counters[TranslatorCounter.POSTCARD_EVICTIONS] > 0
    got = bmv2.exchange(frames, len(expected))
    print(f"{case}: {len(reports)} reports, {len(expected)} frames compared")
    assert len(got) == len(expected), f"{case}: {len(got)} frames out of bmv2, the reference emits {len(expected)}"
    assert all(scapy_icrc_ok(frame) for frame in got), f"{case}: an iCRC scapy does not agree with"
    copies = max(report.redundancy for report in reports) if reports[0].opcode in (
        DtaOpcode.KEY_WRITE, DtaOpcode.KEY_INCREMENT) else 1
    if copies == 1:
        assert got == expected, f"{case}: frames differ"
        return
    # The packet replication engine hands a report's copies to egress in an order of its own, and egress
    # numbers them as they come: compare each report's copies as a set, and the PSNs (with AckReq) as a sequence.
    assert [psn_and_ack_request(frame) for frame in got] == [psn_and_ack_request(frame) for frame in expected]
    for start in range(0, len(expected), copies):
        assert sorted(map(without_psn, got[start:start + copies])) == \
            sorted(map(without_psn, expected[start:start + copies])), f"{case}: report {start // copies} differs"


def test_p4_run_serves_the_tables_until_it_is_told_to_stop(program, tmp_path):
    """`softdta p4 run`, as an operator runs it: up on the port, translating like the reference, and gone on
    SIGTERM with exit 0."""
    host = Switch(program, None, None)
    process = subprocess.Popen([sys.executable, "-m", "softdta.cli", "p4", "run", "--tables", str(EXAMPLE_TABLES),
                                "-i", SWITCH_PORT, "--grpc-port", str(GRPC_PORT), "--thrift-port", str(THRIFT_PORT),
                                "--log", str(tmp_path / "bmv2.log")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = process.stdout.readline()  # the first line says it is up, or why not (then the process ends)
        assert line.startswith(f"bmv2 translator up on 0@{SWITCH_PORT}"), line + process.stdout.read()
        tables = Tables.from_toml(EXAMPLE_TABLES)
        reporter = workload.ReporterAddress(b"\x02\x00\x00\x00\x00\x09", bytes([10, 0, 0, 9]), tables.mac,
                                            tables.qps[0].collector_ip)
        frames = [reporter.frame(dta.key_write(key, key * 3)) for key in range(1, 6)]
        reference = Translator(tables)
        expected = [out for frame in frames for out in reference.process(frame, 0).frames]
        assert host.exchange(frames, len(expected)) == expected
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        host.close()


def counters(cli: str, names: list[TranslatorCounter]) -> dict[str, int]:
    """The switch's translator counters (packets), read over Thrift."""
    result = subprocess.run([cli, "--thrift-port", str(THRIFT_PORT)], capture_output=True, text=True, timeout=60,
                            input="".join(f"counter_read translator_counters {int(c)}\n" for c in names))
    values = [int(v) for v in re.findall(r"\]= \(\d+ bytes, (\d+) packets\)", result.stdout)]
    assert len(values) == len(names), result.stdout[-500:]
    return {c.name.lower(): v for c, v in zip(names, values) if v}


def reply(tables: Tables, qp, syndrome: int, psn: int) -> bytes:
    ends = UdpEndpoints(src_mac=qp.collector_mac, dst_mac=tables.mac, src_ip=qp.collector_ip, dst_ip=tables.ip,
                        sport=49999, dport=ROCE_PORT)
    return build_roce_frame(ends, transport_payload(RoceOpcode.RC_ACK, qp.local_qpn, psn & 0xFFFFFF,
                                                    {"aeth": {"syndrome": syndrome, "msn": 1}}))


REPLY_COUNTERS = [TranslatorCounter[name] for name in (
    "RX_ACKS", "RX_RNR_NAKS", "RX_NAK_SEQUENCE", "RX_NAK_FATAL", "DROP_REPLY_PSN_OUTSIDE_WINDOW",
    "DROP_REPLY_ON_UC", "DROP_GRACE", "DROP_QP_FAILED", "RX_REPORTS",
)]


def test_replies_are_taken_like_the_reference(program, tmp_path):
    """Reports on an RC QP (Key-Increment) and a UC one (Key-Write), interleaved with forged and real replies:
    ACKs and RNR NAKs inside the window, behind it and beyond it, replies to the UC QP, then a sequence NAK
    that resyncs the RC QP. The grace after the resync outlasts the test, so both drop the RC QP's later
    reports; what leaves the switch and its counters equal the reference's."""
    tables = Tables.from_toml(EXAMPLE_TABLES)
    tables.grace_ns = 10**12
    bmv2 = Switch(program, tables, tmp_path / "switch.log")
    try:
        reference = Translator(tables)
        reporter = workload.ReporterAddress(b"\x02\x00\x00\x00\x00\x09", bytes([10, 0, 0, 9]), tables.mac,
                                            tables.qps[0].collector_ip)
        rc = tables.structure(reporter.collector_ip, DtaOpcode.KEY_INCREMENT).qp
        uc = tables.structure(reporter.collector_ip, DtaOpcode.KEY_WRITE).qp
        increments = workload.key_increment(12, seed=7, redundancy=1)
        writes = workload.key_write(12, seed=8, redundancy=1)
        start = rc.start_psn
        frames = [reporter.frame(r) for pair in zip(increments[:6], writes[:6]) for r in pair]
        frames += [reply(tables, rc, ACK_SYNDROME, start + 2),        # inside: acknowledges PSNs up to 2
                   reply(tables, rc, ACK_SYNDROME, start + 1),        # behind the window now
                   reply(tables, rc, ACK_SYNDROME, start + 6),        # beyond: never sent
                   reply(tables, rc, aeth_syndrome(AethKind.RNR_NAK, 3), start + 4),
                   reply(tables, uc, ACK_SYNDROME, uc.start_psn),     # UC takes no reply
                   reply(tables, uc, NAK_SEQUENCE_SYNDROME, uc.start_psn + 1),
                   reply(tables, rc, NAK_SEQUENCE_SYNDROME, start + 5 + (1 << 23)),  # far off
                   reply(tables, rc, NAK_SEQUENCE_SYNDROME, start + 4)]  # inside: resync to 4, then grace
        frames += [reporter.frame(r) for pair in zip(increments[6:], writes[6:]) for r in pair]
        expected = [out for frame in frames for out in reference.process(frame, 0).frames]
        got = bmv2.exchange(frames, len(expected))
        assert got == expected
        assert len(got) == 12 + 6  # six reports of each kind, then the UC QP's six alone
        expected_counts = {c.name.lower(): reference.counters[c] for c in REPLY_COUNTERS if reference.counters[c]}
        assert counters(bmv2_tool("simple_switch_CLI"), REPLY_COUNTERS) == expected_counts
        assert expected_counts["drop_reply_psn_outside_window"] == 3 and expected_counts["drop_reply_on_uc"] == 2
    finally:
        bmv2.close()


DROP_COUNTERS = [TranslatorCounter[name] for name in (
    "DROP_UNKNOWN_COLLECTOR", "DROP_UNKNOWN_LIST", "DROP_UNKNOWN_OPCODE", "DROP_TRUNCATED", "DROP_BAD_HOP",
    "DROP_BAD_REDUNDANCY", "RX_REPORTS", "TX_FRAMES",
)]


def cut_short(reporter: workload.ReporterAddress, report) -> bytes:
    """A well-formed UDP datagram to the DTA port whose report stops after 6 bytes."""
    ends = UdpEndpoints(src_mac=reporter.mac, dst_mac=reporter.translator_mac, src_ip=reporter.ip,
                        dst_ip=reporter.collector_ip, sport=reporter.sport, dport=DTA_PORT)
    return build_udp_frame(ends, dta.encode(report)[:6])


def test_reports_that_must_be_dropped_are_dropped_and_counted_like_the_reference(program, tmp_path):
    """A collector the tables do not know, an Append list outside every range, an opcode nobody defined, a
    report cut short, a Postcarding hop past the path, two copies asked of a structure that takes one: nothing
    leaves the switch, and each is counted as the reference counts it; a good report after them still goes out."""
    tables = Tables.from_toml(EXAMPLE_TABLES)
    tables.structure(tables.qps[0].collector_ip, DtaOpcode.KEY_WRITE).redundancy = 1
    bmv2 = Switch(program, tables, tmp_path / "switch.log")
    try:
        reference = Translator(tables)
        reporter = workload.ReporterAddress(b"\x02\x00\x00\x00\x00\x09", bytes([10, 0, 0, 9]), tables.mac,
                                            tables.qps[0].collector_ip)
        stranger = replace(reporter, collector_ip=bytes([10, 99, 99, 99]))
        good = reporter.frame(dta.key_write(7, 8))
        unknown_opcode = bytearray(good)
        unknown_opcode[ETH_IP_UDP] = 0x0F  # the dta-v1 base header's opcode byte
        frames = [stranger.frame(dta.key_write(7, 8)), reporter.frame(dta.append(60000, 5)), bytes(unknown_opcode),
                  cut_short(reporter, dta.key_write(7, 8)), reporter.frame(dta.postcard(7, 9, 1)),
                  reporter.frame(dta.key_write(7, 8, 2)), good]
        expected = [out for frame in frames for out in reference.process(frame, 0).frames]
        got = bmv2.exchange(frames, len(expected))
        assert got == expected and len(got) == 1
        expected_counts = {c.name.lower(): reference.counters[c] for c in DROP_COUNTERS if reference.counters[c]}
        assert counters(bmv2_tool("simple_switch_CLI"), DROP_COUNTERS) == expected_counts
    finally:
        bmv2.close()


def test_the_grace_after_a_resync_ends_on_time(program, tmp_path):
    """A sequence NAK resyncs the RC QP: its reports during the grace are dropped, and once the grace is over
    they go out from the NAK's PSN on, as in the reference. Time is the switch's own: the reports either
    side of the grace keep a second away from its end."""
    grace_s = 1.0
    tables = Tables.from_toml(EXAMPLE_TABLES)
    tables.grace_ns = int(grace_s * 1e9)
    bmv2 = Switch(program, tables, tmp_path / "switch.log")
    try:
        reference = Translator(tables)
        reporter = workload.ReporterAddress(b"\x02\x00\x00\x00\x00\x09", bytes([10, 0, 0, 9]), tables.mac,
                                            tables.qps[0].collector_ip)
        rc = tables.structure(reporter.collector_ip, DtaOpcode.KEY_INCREMENT).qp
        before, during, after = (
            [reporter.frame(r) for r in workload.key_increment(3, seed=seed, redundancy=1)] for seed in (1, 2, 3))
        nak = reply(tables, rc, NAK_SEQUENCE_SYNDROME, rc.start_psn + 1)
        expected = [out for frame in before for out in reference.process(frame, 0).frames]
        assert bmv2.exchange(before, len(expected)) == expected
        reference.process(nak, 0)
        assert not [out for frame in during for out in reference.process(frame, 0).frames]
        resynced = time.monotonic()
        bmv2.send([nak, *during])
        assert time.monotonic() - resynced < grace_s / 2, "the reports meant for the grace went too late to test it"
        assert bmv2.receive(0) == []
        time.sleep(max(0.0, resynced + grace_s + 1.0 - time.monotonic()))  # the grace's end, by the clock
        expected = [out for frame in after for out in reference.process(frame, int((grace_s + 1.0) * 1e9)).frames]
        assert [psn(frame) for frame in expected] == [rc.start_psn + 1 + n for n in range(3)]
        assert bmv2.exchange(after, len(expected)) == expected
        resync_counters = [TranslatorCounter.DROP_GRACE, TranslatorCounter.RX_NAK_SEQUENCE]
        assert counters(bmv2_tool("simple_switch_CLI"), resync_counters) == {"drop_grace": 3, "rx_nak_sequence": 1}
    finally:
        bmv2.close()


FLUSH_COUNTERS = [TranslatorCounter[name] for name in (
    "APPEND_FLUSHES", "POSTCARD_FLUSHES", "DROP_UNKNOWN_LIST", "DROP_BAD_FLUSH", "DROP_UNKNOWN_OPCODE",
    "RX_REPORTS", "TX_FRAMES",
)]


def test_flush_requests_write_out_what_has_waited_like_the_reference(program, tmp_path):
    """bmv2 has no timer, nor has a switch: flush requests (a packet generator's on Tofino) write out partial
    Append batches and cached Postcarding paths that have waited flush_idle_ns by the switch's clock. Asked
    too early, nothing leaves; asked after the wait, every waiting batch and path leaves as the reference
    writes it, and Append goes on after the flushed batch. Requests naming no list, no target kind or a cache
    entry past the structure are counted drops."""
    idle_s = 2.0
    tables = Tables.from_toml(EXAMPLE_TABLES)
    bmv2 = Switch(program, tables, tmp_path / "switch.log", flush_idle_ns=int(idle_s * 1e9))
    try:
        reference = Translator(tables, plugins=[FlushRequest.after(int(idle_s * 1e9))])
        reporter = workload.ReporterAddress(b"\x02\x00\x00\x00\x00\x09", bytes([10, 0, 0, 9]), tables.mac,
                                            tables.qps[0].collector_ip)
        ends = UdpEndpoints(src_mac=reporter.mac, dst_mac=tables.mac, src_ip=reporter.ip,
                            dst_ip=reporter.collector_ip, sport=reporter.sport, dport=DTA_PORT)
        # Partial batches (of 4) on four lists, list 3's after a full one (its stale words must not show), and
        # paths of 5 hops with 1..4 hops seen.
        reports = [dta.append(list_id, 100 * list_id + n) for list_id, count in ((1, 1), (2, 3), (3, 5), (7, 2))
                   for n in range(count)]
        reports += [dta.postcard(key, hop, key * 10 + hop) for key in range(1, 9) for hop in range(1, key % 4 + 2)]
        started = time.monotonic()

        def at(frames: list[bytes]) -> list[bytes]:
            now_ns = int((time.monotonic() - started) * 1e9)
            return [out for frame in frames for out in reference.process(frame, now_ns).frames]

        frames = [reporter.frame(report) for report in reports]
        expected = at(frames)
        assert len(expected) == 1  # list 3's full batch
        structure = tables.structure(reporter.collector_ip, DtaOpcode.POSTCARDING)
        cache = reference.primitive(DtaOpcode.POSTCARDING).state[structure.qp.index]
        postcard_entries = sorted(cache)
        assert len(postcard_entries) == 8
        requests = [build_udp_frame(ends, FlushRequest.request(FlushTarget.APPEND_LIST, list_id))
                    for list_id in (1, 2, 3, 7, 9)]  # 9 never had an entry
        requests += [build_udp_frame(ends, FlushRequest.request(FlushTarget.POSTCARD_ENTRY, entry))
                     for entry in postcard_entries + [(postcard_entries[0] + 1) % structure.cache_entries]]
        forged = [build_udp_frame(ends, FlushRequest.request(FlushTarget.APPEND_LIST, 60000)),
                  build_udp_frame(ends, FlushRequest.request(FlushTarget.POSTCARD_ENTRY, structure.cache_entries)),
                  build_udp_frame(ends, FlushRequest.encode({"target": 9, "index": 1}))]
        assert at(requests + forged) == []
        bmv2.send(frames + requests + forged)
        assert time.monotonic() - started < idle_s / 4, "sending took too long to ask before the wait is over"
        assert bmv2.receive(len(expected)) == expected
        while time.monotonic() - started < 2 * idle_s:  # well past the wait, by either clock
            time.sleep(0.05)
        expected = at(requests)
        assert len(expected) == 4 + 8  # lists 1, 2, 3 and 7; every cached path
        assert not cache
        assert all(not state.pending for state in reference.primitive(DtaOpcode.APPEND).state.values())
        after = [reporter.frame(dta.append(2, 7)) for _ in range(4)]  # a full batch after the flushed one
        expected += at(after)
        got = bmv2.exchange(requests + after, len(expected))
        print(f"flush requests: {len(expected)} frames compared")
        assert got == expected
        assert all(scapy_icrc_ok(frame) for frame in got)
        expected_counts = {c.name.lower(): reference.counters[c] for c in FLUSH_COUNTERS if reference.counters[c]}
        assert counters(bmv2_tool("simple_switch_CLI"), FLUSH_COUNTERS) == expected_counts
        assert expected_counts["drop_bad_flush"] == 2 and expected_counts["drop_unknown_list"] == 1
    finally:
        bmv2.close()


def test_a_register_write_bmv2_refuses_is_an_error_naming_it(switch):
    bmv2, _ = switch
    names = P4Names(load_p4info())
    registers = ThriftRegisters(bmv2_tool("simple_switch_CLI"), THRIFT_PORT, names)
    entry = p4runtime_pb2.RegisterEntry(register_id=names.registers["qp_state_next_psn"].preamble.id)
    entry.index.index = 1 << 20  # beyond the register
    entry.data.bitstring = b"\x01"
    with pytest.raises(P4RuntimeError, match=r"bmv2 runtime CLI \(Thrift port \d+\) failed: .*"):
        registers.write([entry])
