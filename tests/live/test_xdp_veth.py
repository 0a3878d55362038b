"""The XDP translator live on veth pairs: reporter namespace -> translator namespace -> collector namespace.

Frames are captured in the collector namespace and checked by scapy (iCRC) and against the reference model.
"""

import os
import select
import shutil
import socket
import sys
import time
import zlib
from collections import defaultdict
from dataclasses import replace

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.l2 import Ether

from softdta.core.tables import Tables, with_queue_qps
from softdta.core.translator import Translator
from softdta.core.workload import ReporterAddress
from softdta.engines.xdp import EngineError, XdpTranslator
from softdta.kernel.bpf import BpfObject, attach_xdp, enable_run_stats, ensure_bpffs, run_stats, xdp_md
from softdta.kernel.netns import Namespace, cleanup_prefix, in_netns, veth_pair
from softdta.kernel.programs import VETH_PEER_SOURCE, XDP_REDIRECT, build_object
from softdta.spec import DTA_NACK_PORT, ROCE_PORT, DtaOpcode, QpState, RoceOpcode, TranslatorCounter
from softdta.wire import dta
from softdta.wire.frames import UdpEndpoints, ip_bytes, mac_bytes, mac_str
from softdta.wire.roce import NAK_SEQUENCE_SYNDROME, build_roce_frame, parse_roce, transport_payload
from tests.common import (
    COLLECTOR_IP,
    EXAMPLE_TABLES,
    SO_RCVBUFFORCE,
    assert_every_queue_wrote_in_psn_order,
    eventually,
    processes,
)

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-t{os.getpid()}-"
REPORTER_MAC = "02:5d:7a:00:09:01"
ETH_P_ALL = 0x0003


class Lab:
    """Three namespaces: reporter (r0) - translator (t0, t1) - collector (c0)."""

    def __init__(self, tables: Tables, queues: int = 1):
        cleanup_prefix(PREFIX)
        self.reporter, self.translator, self.collector = (Namespace.create(PREFIX + n) for n in ("r", "t", "c"))
        veth_pair(self.reporter, "r0", self.translator, "t0", mac_a=REPORTER_MAC, mac_b=mac_str(tables.mac),
                  queues=queues)
        veth_pair(self.translator, "t1", self.collector, "c0", mac_a=mac_str(tables.mac),
                  mac_b=mac_str(tables.qps[0].collector_mac))
        for qp in tables.qps:
            qp.interface = "t1"
        self.tables = tables

    def socket(self, namespace: Namespace, ifname: str) -> socket.socket:
        with in_netns(namespace.name):
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            # a frame from XDP arrives in a page of its own: the default buffer holds about 50 of them
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 25)
            sock.bind((ifname, 0))
        sock.setblocking(False)
        return sock

    def start(self, pin_dir=None, mode="native", **options) -> XdpTranslator:
        """In generic mode the peers run no XDP, like docker's bridge ports, where frames sent as live frames would
        be dropped: what the translator sends must go through the stack."""
        with in_netns(self.translator.name):
            kernel = XdpTranslator(self.tables, pin_dir=pin_dir, **options)
            kernel.attach(["t0", "t1"], mode=mode)
        if mode == "generic":
            return kernel
        with BpfObject(build_object(VETH_PEER_SOURCE)) as peer:
            for namespace, ifname in ((self.reporter, "r0"), (self.collector, "c0")):
                with in_netns(namespace.name):
                    attach_xdp(socket.if_nametoindex(ifname), peer.programs["softdta_pass"].fd)
        return kernel

    def close(self) -> None:
        cleanup_prefix(PREFIX)


@pytest.fixture
def lab(tables):
    lab = Lab(tables)
    yield lab
    lab.close()
    assert not [name for name in os.listdir("/run/netns") if name.startswith(PREFIX)]


def receive(sock: socket.socket, want: int, timeout: float = 2.0, keep=lambda frame: True) -> list[bytes]:
    frames, deadline = [], time.monotonic() + timeout
    while len(frames) < want and time.monotonic() < deadline:
        if select.select([sock], [], [], 0.05)[0]:
            frame = sock.recv(4096)
            if keep(frame):
                frames.append(frame)
    return frames


def is_roce(frame: bytes) -> bool:
    return len(frame) > 38 and frame[12:14] == b"\x08\x00" and frame[36:38] == ROCE_PORT.to_bytes(2, "big")


def scapy_icrc_ok(frame: bytes) -> bool:
    packet = Ether(frame)
    packet[BTH].icrc = None
    return bytes(packet) == frame


def by_qp(frames: list[bytes]) -> dict[int, list[bytes]]:
    groups = defaultdict(list)
    for frame in frames:
        groups[parse_roce(frame).bth["dest_qp"]].append(frame)
    return groups


def reporter_address(tables) -> ReporterAddress:
    return ReporterAddress(mac=mac_bytes(REPORTER_MAC), ip=ip_bytes("10.77.9.1"), translator_mac=tables.mac,
                           collector_ip=COLLECTOR_IP)


# N = 1 and N > 1 alternate on the same QPs: their frames must still arrive in PSN order.
MIXED = ([dta.key_write(k, k * 3, 1 + k % 2) for k in range(1, 40)] + [dta.key_write(k, 9, 4) for k in range(40, 50)]
         + [dta.key_increment(k, 5, 1 + k % 2) for k in range(1, 20)] + [dta.append(k % 8, k) for k in range(64)]
         + [dta.postcard(k, hop, hop * 100) for k in range(1, 12) for hop in range(1, 6)]
         + [dta.sketch_column(r, c, [c, r, 1, 2]) for c in range(16) for r in range(2)])


@pytest.mark.parametrize("mode", ["native", "generic"])
def test_reports_cross_the_translator_as_frames_equal_to_the_reference(lab, mode):
    """Natively the copies of a redundant report leave by a devmap broadcast, in generic XDP through tc."""
    reference = Translator(Tables.from_toml(EXAMPLE_TABLES))
    reporter = reporter_address(lab.tables)
    kernel = lab.start(mode=mode)
    stats = enable_run_stats()
    try:
        sender, capture = lab.socket(lab.reporter, "r0"), lab.socket(lab.collector, "c0")
        expected, keyed = [], 0
        for report in MIXED:
            frame = reporter.frame(report)
            expected += reference.process(frame).frames
            keyed += report.opcode in (DtaOpcode.KEY_WRITE, DtaOpcode.KEY_INCREMENT)
            sender.send(frame)
        got = receive(capture, len(expected), keep=is_roce)
        # natively every frame to the collector's interface passes softdta_copy and none the tc stage; in generic
        # XDP each keyed report goes up to the tc stage
        copy_runs, tc_runs = run_stats(kernel.copy.fd)[1], run_stats(kernel.fanout.fd)[1]
        assert (copy_runs, tc_runs) == ((len(expected), 0) if mode == "native" else (0, keyed))
        assert len(got) == len(expected)
        for frame in got:
            assert parse_roce(frame).icrc_ok and scapy_icrc_ok(frame)
        # Each QP's frames arrive in PSN order and equal the reference byte for byte. Key-Write and Key-Increment
        # (copies) interleave differently with the rest, which is fine: PSNs are per QP.
        assert by_qp(got) == by_qp(expected)
        with in_netns(lab.translator.name):
            counters = kernel.counters()
        assert counters[TranslatorCounter.RX_REPORTS] == len(MIXED)
        assert counters[TranslatorCounter.TX_FRAMES] == len(expected)
        assert not [c for c in counters if c.name.startswith("DROP_")]
    finally:
        os.close(stats)
        kernel.close()


def test_a_test_run_gives_the_frames_a_broadcast_sends(lab):
    """`process` on an attached translator: a redundant report's run redirects to `copies`, and the frames it
    names (the packet, then the parked ones) are the reference's."""
    reference = Translator(Tables.from_toml(EXAMPLE_TABLES))
    reporter = reporter_address(lab.tables)
    kernel = lab.start()
    try:
        with in_netns(lab.translator.name):
            ingress = socket.if_nametoindex("t0")
            for report in [dta.key_write(k, k * 3, 1 + k % 4) for k in range(1, 9)] + \
                    [dta.key_increment(k, 5, 1 + k % 2) for k in range(1, 5)]:
                frame = reporter.frame(report)
                assert kernel.process(frame, ifindex=ingress).frames == reference.process(frame).frames
            run = kernel.xdp.test_run(reporter.frame(dta.key_write(9, 9, 2)), ctx=xdp_md(ingress_ifindex=ingress))
            assert run.retval == XDP_REDIRECT  # to `copies`, not up to tc
    finally:
        kernel.close()


# Sends length-prefixed frames from a file out of an interface, as a real-time task on one CPU: a threaded NAPI
# on that CPU cannot run before the last is sent, and then takes them all in one poll.
BATCH_SENDER = """
import os, socket, sys
os.sched_setaffinity(0, {int(sys.argv[3])})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
data, frames, at = open(sys.argv[1], "rb").read(), [], 0
while at < len(data):
    length = int.from_bytes(data[at:at + 2], "big")
    frames.append(data[at + 2:at + 2 + length])
    at += 2 + length
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
sock.bind((sys.argv[2], 0))
for frame in frames:
    sock.send(frame)
"""


def test_the_copies_of_a_report_survive_a_napi_poll_that_a_redirect_opened(lab, tmp_path):
    """The devmap bulk queue of a NAPI poll runs the egress program of the frame that opened it: a plain redirect
    first must not leave the broadcast clones after it uncut (every copy would be frame 1)."""
    reference = Translator(Tables.from_toml(EXAMPLE_TABLES))
    reporter = reporter_address(lab.tables)
    kernel = lab.start()
    try:
        lab.translator.run("sh", "-c", "echo 1 > /sys/class/net/t0/threaded")
        # a test run beside this one may have a threaded t0 of its own: both pin theirs to the same CPU
        napi = [pid for pid, comm in processes().items() if comm.startswith("napi/t0-")]
        assert napi
        cpu = min(os.sched_getaffinity(0))
        for pid in napi:
            try:
                os.sched_setaffinity(pid, {cpu})
            except ProcessLookupError:
                continue  # the other run's, gone with its namespace
        # each completed path leaves with a plain redirect, then a Key-Write's two copies with a broadcast
        reports = [r for k in range(1, 12) for r in [dta.postcard(k, hop, hop * 100) for hop in range(1, 6)]
                   + [dta.key_write(k, k * 3, 2)]]
        frames = [reporter.frame(report) for report in reports]
        expected = [out for frame in frames for out in reference.process(frame).frames]
        batch = tmp_path / "frames"
        batch.write_bytes(b"".join(len(frame).to_bytes(2, "big") + frame for frame in frames))
        capture = lab.socket(lab.collector, "c0")
        lab.reporter.run(sys.executable, "-c", BATCH_SENDER, str(batch), "r0", str(cpu))
        got = receive(capture, len(expected), keep=is_roce)
        assert by_qp(got) == by_qp(expected)
        with in_netns(lab.translator.name):
            assert not [c for c in kernel.counters() if c.name.startswith("DROP_")]
    finally:
        kernel.close()


def test_a_single_copy_before_a_cpus_first_broadcast_leaves_the_copies_in_psn_order(lab):
    """A redundant structure's N = 1 report goes through `copies` as well, with a meta that parks nothing; it must
    not count as a copy of the first report the CPU parks (sequence 0), or that report's clone 0 would become its
    frame 2 and leave before frame 1."""
    reference = Translator(Tables.from_toml(EXAMPLE_TABLES))
    reporter = reporter_address(lab.tables)
    frames = [reporter.frame(dta.key_write(2, 6, 1)), reporter.frame(dta.key_write(1, 3, 2))]
    expected = [out for frame in frames for out in reference.process(frame).frames]
    kernel = lab.start()
    affinity = os.sched_getaffinity(0)
    try:
        capture = lab.socket(lab.collector, "c0")
        os.sched_setaffinity(0, {min(affinity)})  # both runs on one CPU, whose scratch this translator made new
        with in_netns(lab.translator.name):
            for frame in frames:
                kernel.xdp.test_run_live(frame, ifindex=socket.if_nametoindex("t0"))
        got = receive(capture, len(expected), keep=is_roce)
        assert [parse_roce(f).bth["psn"] for f in got] == [parse_roce(f).bth["psn"] for f in expected]
        assert got == expected
    finally:
        os.sched_setaffinity(0, affinity)
        kernel.close()

def test_sequence_gap_nack_goes_back_to_the_reporter(lab):
    reporter = reporter_address(lab.tables)
    kernel = lab.start()
    try:
        sender = lab.socket(lab.reporter, "r0")
        for seqnum in (0, 1, 5):
            sender.send(reporter.frame(dta.key_write(1, 2, retransmit=True, seqnum=seqnum)))
        nacks = receive(sender, 1, keep=lambda f: f[36:38] == DTA_NACK_PORT.to_bytes(2, "big"))
        assert len(nacks) == 1
        assert dta.decode_nack(nacks[0][42:]).value == 1
    finally:
        kernel.close()


def nak(tables, qp, psn: int) -> bytes:
    ends = UdpEndpoints(src_mac=qp.collector_mac, dst_mac=tables.mac, src_ip=qp.collector_ip, dst_ip=tables.ip,
                        sport=49999, dport=ROCE_PORT)
    return build_roce_frame(ends, transport_payload(RoceOpcode.RC_ACK, qp.local_qpn, psn,
                                                    {"aeth": {"syndrome": NAK_SEQUENCE_SYNDROME, "msn": 1}}))


def test_sequence_nak_from_the_collector_resyncs_and_starts_the_grace_period(lab):
    lab.tables.grace_ns = 200_000_000
    reporter = reporter_address(lab.tables)
    ki = lab.tables.structure(COLLECTOR_IP, DtaOpcode.KEY_INCREMENT)
    start = ki.qp.start_psn
    kernel = lab.start()
    try:
        sender, collector = lab.socket(lab.reporter, "r0"), lab.socket(lab.collector, "c0")
        sender.send(reporter.frame(dta.key_increment(1, 1, 3)))  # PSNs start..start+2, outstanding
        assert len(receive(collector, 3, keep=is_roce)) == 3
        collector.send(nak(lab.tables, ki.qp, start + 1))  # the collector lost start+1
        with in_netns(lab.translator.name):
            state = eventually(lambda: (s := kernel.qp_state(ki.qp))["state"] == QpState.GRACE and s)
            assert state["next_psn"] == start + 1
        sender.send(reporter.frame(dta.key_increment(1, 1)))
        assert not receive(collector, 1, timeout=0.2, keep=is_roce)
        time.sleep(0.25)
        sender.send(reporter.frame(dta.key_increment(1, 1)))
        frames = receive(collector, 1, keep=is_roce)
        assert [parse_roce(f).bth["psn"] for f in frames] == [start + 1]
        with in_netns(lab.translator.name):
            counters = kernel.counters()
        assert counters[TranslatorCounter.RX_NAK_SEQUENCE] == 1 and counters[TranslatorCounter.DROP_GRACE] == 1
    finally:
        kernel.close()


@pytest.mark.parametrize("mode", ["native", "generic"])
def test_idle_batches_are_flushed_by_the_control_plane(lab, mode):
    reporter = reporter_address(lab.tables)
    kernel = lab.start(flush_idle_ns=5_000_000, mode=mode)
    try:
        sender, collector = lab.socket(lab.reporter, "r0"), lab.socket(lab.collector, "c0")
        sender.send(reporter.frame(dta.append(2, 77)))
        sender.send(reporter.frame(dta.postcard(9, 1, 5)))
        assert not receive(collector, 1, timeout=0.1, keep=is_roce)
        time.sleep(0.01)
        with in_netns(lab.translator.name):
            kernel.tick()
        frames = receive(collector, 2, keep=is_roce)
        payloads = sorted(parse_roce(f).payload for f in frames)
        assert len(frames) == 2 and all(parse_roce(f).icrc_ok for f in frames)
        assert (77).to_bytes(4, "little") + bytes(12) in payloads
    finally:
        kernel.close()


def test_translator_restart_continues_psns_from_pinned_maps(lab):
    pin = ensure_bpffs() / f"softdta-veth-{os.getpid()}"
    pin.mkdir(parents=True, exist_ok=True)
    reporter = reporter_address(lab.tables)
    kw = lab.tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE)
    try:
        collector = lab.socket(lab.collector, "c0")
        psns = []
        for _ in range(2):
            kernel = lab.start(pin_dir=pin)
            try:
                lab.socket(lab.reporter, "r0").send(reporter.frame(dta.key_write(3, 4, 2)))
                psns += [parse_roce(f).bth["psn"] for f in receive(collector, 2, keep=is_roce)]
            finally:
                kernel.close()
        assert psns == [(kw.qp.start_psn + i) & 0xFFFFFF for i in range(4)]
    finally:
        shutil.rmtree(pin, ignore_errors=True)


def test_translator_cli_up_stats_and_down(lab, tmp_path):
    import json
    import signal
    import subprocess
    import sys

    tables_file = tmp_path / "tables.toml"
    text = EXAMPLE_TABLES.read_text().replace('mac = "02:5d:7a:00:01:01"',
                                              'mac = "02:5d:7a:00:01:01"\ninterface = "t1"')
    tables_file.write_text(text)
    pin = ensure_bpffs() / f"softdta-cli-{os.getpid()}"
    softdta = [sys.executable, "-m", "softdta.cli"]
    process = subprocess.Popen(softdta + ["translator", "up", "--tables", str(tables_file), "-i", "t0", "-i", "t1",
                                          "--pin", str(pin), "--netns", lab.translator.name],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "translator up on t0, t1" in process.stdout.readline()
        with in_netns(lab.collector.name), BpfObject(build_object(VETH_PEER_SOURCE)) as peer:
            attach_xdp(socket.if_nametoindex("c0"), peer.programs["softdta_pass"].fd)
        capture = lab.socket(lab.collector, "c0")
        sender = lab.socket(lab.reporter, "r0")
        reporter = reporter_address(lab.tables)
        for key in range(5):
            sender.send(reporter.frame(dta.key_write(key, key, 2)))
        sender.send(reporter.frame(dta.append(1, 5)))
        assert len(receive(capture, 11, keep=is_roce)) == 11  # 10 writes, then the idle flush of the batch
        stats = json.loads(subprocess.run(softdta + ["translator", "stats", "--pin", str(pin), "--json"],
                                          capture_output=True, text=True, check=True).stdout)
        assert stats["counters"]["rx_reports"] == 6 and stats["counters"]["tx_frames"] == 10
        assert stats["counters"]["append_flushes"] == 1
        kw = next(q for q in stats["qps"] if q["remote_qpn"] == 0x101)
        assert kw["next_psn"] == 10 and kw["state"] == "active"

        def remote_qpns() -> set[int]:
            shown = subprocess.run(softdta + ["translator", "stats", "--pin", str(pin), "--json"],
                                   capture_output=True, text=True, check=True).stdout
            return {qp["remote_qpn"] for qp in json.loads(shown)["qps"]}

        # SIGHUP: new tables from the file, applied by the running loop; a broken file leaves the running ones
        tables_file.write_text(text.replace("remote_qpn = 0x101", "remote_qpn = 0x111"))
        process.send_signal(signal.SIGHUP)
        assert "tables reloaded" in process.stdout.readline()
        eventually(lambda: 0x111 in remote_qpns() and 0x101 not in remote_qpns())
        tables_file.write_text(text.replace("remote_qpn = 0x101", "remote_qpn = 1"))
        process.send_signal(signal.SIGHUP)
        assert "reload refused, the running tables stay" in process.stderr.readline()
        tables_file.unlink()
        process.send_signal(signal.SIGHUP)
        assert "No such file" in process.stderr.readline()
        assert 0x111 in remote_qpns() and process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    assert "translator down" in out
    assert "xdp" not in lab.translator.run("ip", "link", "show", "t0").stdout
    result = subprocess.run(softdta + ["translator", "down", "--pin", str(pin), "--forget"], capture_output=True,
                            text=True)
    assert result.returncode == 0 and not pin.exists()
    missing = subprocess.run(softdta + ["translator", "stats", "--pin", str(pin)], capture_output=True, text=True)
    assert missing.returncode == 2 and "no translator state pinned" in missing.stderr


@pytest.mark.parametrize("mode", ["native", "generic"])
def test_essential_reports_wait_out_the_grace_period_and_are_reinjected(lab, mode):
    lab.tables.grace_ns = 100_000_000
    reporter = reporter_address(lab.tables)
    ki = lab.tables.structure(COLLECTOR_IP, DtaOpcode.KEY_INCREMENT)
    kernel = lab.start(flush_idle_ns=5_000_000, mode=mode)
    try:
        sender, collector = lab.socket(lab.reporter, "r0"), lab.socket(lab.collector, "c0")
        start = ki.qp.start_psn
        sender.send(reporter.frame(dta.key_increment(6, 1, 2)))  # PSNs start and start+1, outstanding
        assert len(receive(collector, 2, keep=is_roce)) == 2
        collector.send(nak(lab.tables, ki.qp, start))
        with in_netns(lab.translator.name):
            eventually(lambda: kernel.qp_state(ki.qp)["state"] == QpState.GRACE)
        sender.send(reporter.frame(dta.key_increment(7, 3, 2, essential=True, extended=True)))
        sender.send(reporter.frame(dta.key_increment(8, 1, 1)))  # not essential: dropped in grace
        assert not receive(collector, 1, timeout=0.05, keep=is_roce)
        with in_netns(lab.translator.name):
            kernel.tick()  # still in grace: the report stays parked
            assert kernel.reinjected == 0
            time.sleep(0.12)
            kernel.tick()
            assert kernel.reinjected == 1
            counters = kernel.counters()
        frames = [parse_roce(f) for f in receive(collector, 2, keep=is_roce)]
        assert [(f.opcode, f.bth["psn"], f.headers["atomic_eth"]["swap_add"]) for f in frames] == \
               [(RoceOpcode.RC_FETCH_ADD, start, 3), (RoceOpcode.RC_FETCH_ADD, start + 1, 3)]
        assert counters[TranslatorCounter.ESSENTIAL_DEFERRED] == 1 and counters[TranslatorCounter.DROP_GRACE] == 1
    finally:
        kernel.close()


def test_multi_queue_interfaces_need_a_qp_per_queue_in_every_structure(lab, tables):
    lab.translator.run("ip", "link", "add", "mq0", "numrxqueues", "2", "type", "veth", "peer", "name", "mq1")
    with in_netns(lab.translator.name), XdpTranslator(tables) as kernel:
        with pytest.raises(EngineError, match="mq0 has 2 RX queues, and structure .* has a QP for 1"):
            kernel.attach(["mq0"])
        assert "xdp" not in lab.translator.run("ip", "link", "show", "mq0").stdout
        kernel.apply(with_queue_qps(tables, 2))
        kernel.attach(["mq0"])
        assert "xdp" in lab.translator.run("ip", "link", "show", "mq0").stdout
        with pytest.raises(EngineError, match="mq0 has 2 RX queues"):
            kernel.apply(tables)  # a reload that takes queue 1's QPs away is refused


def _unit_of(report: dta.Report) -> bytes:
    """What a report shares state with: its key, Append list or sketch reporter. Reports of one unit travel in
    one flow, so one RX queue takes them in order, as a reporter's flow would be."""
    if report.opcode is DtaOpcode.APPEND:
        return report.list_id.to_bytes(4, "big")
    if report.opcode is DtaOpcode.SKETCH_MERGE:
        return report.reporter.to_bytes(4, "big")
    return report.key


def test_every_rx_queue_translates_through_its_own_qps_in_psn_order(tables):
    tables = with_queue_qps(tables, 2)
    lab = Lab(tables, queues=2)
    reference = Translator(with_queue_qps(Tables.from_toml(EXAMPLE_TABLES), 2))
    reporter = reporter_address(tables)
    try:
        kernel = lab.start()
        sender, capture = lab.socket(lab.reporter, "r0"), lab.socket(lab.collector, "c0")
        expected = []
        for report in MIXED:
            frame = replace(reporter, sport=1024 + zlib.crc32(_unit_of(report)) % 4096).frame(report)
            expected += reference.process(frame).frames
            sender.send(frame)
        got = receive(capture, len(expected), keep=is_roce)
        with in_netns(lab.translator.name):
            counters = kernel.counters()
            kernel.close()
        assert len(got) == len(expected) and not [c for c in counters if c.name.startswith("DROP_")]
        assert_every_queue_wrote_in_psn_order(tables, got, expected)
    finally:
        lab.close()
