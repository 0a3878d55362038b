"""softdta as a drop-in for the Tofino translator: rdma_cm collectors written for the original DTA.

In the QEMU guest, `softdta.lab.dta_v1_collector` listens with the kernel's rdma_cm on rxe0, one port per structure,
as the original collector.cpp does, and SENDs each region's 16-byte metadata once connected. On the host,
`CmLinks` connects to every port with CM MADs built from fields, acknowledges the metadata and makes translator
tables; the XDP program translates reports into the regions. The region files must equal the reference model's
memory byte for byte, rxe must never see a request out of sequence, and a killed and restarted collector must be
reconnected to.
"""

import base64
import json
import os
import queue
import signal
import subprocess
import sys
import time

import pytest

from softdta.collector.collector import tables_document
from softdta.core import workload
from softdta.core.cm import CmConnection, CmEndpoint, Metadata
from softdta.core.offline import OfflineCollector
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.engines.xdp import XdpTranslator
from softdta.kernel.bpf import ensure_bpffs
from softdta.kernel.netns import in_netns
from softdta.lab import rxe as rxe_lab
from softdta.links.cm import CmLinks, CmTarget
from softdta.spec import DtaOpcode, QpState, TranslatorCounter
from softdta.wire.frames import ip_bytes, mac_bytes
from tests.common import Link, wait_for_line

pytestmark = [pytest.mark.interop, pytest.mark.privileged]

KEY_WRITE_PORT, KEY_INCREMENT_PORT, FIRST_APPEND_PORT = 1337, 1342, 1338
LISTENERS = {KEY_WRITE_PORT: 256 * 8, KEY_INCREMENT_PORT: 256 * 8,
             **{FIRST_APPEND_PORT + list_id: 256 * 4 for list_id in range(4)}}
DATA_DIR = "/dev/shm/dta"


def targets(guest) -> list[CmTarget]:
    ip = guest.guest_ip
    return ([CmTarget.parse(f"{ip}:{KEY_WRITE_PORT},kind=key-write"),
             CmTarget.parse(f"{ip}:{KEY_INCREMENT_PORT},kind=key-increment")]
            + [CmTarget.parse(f"{ip}:{FIRST_APPEND_PORT + n},kind=append,list={n},batch=4") for n in range(4)])


def start_collector(guest) -> int:
    listeners = " ".join(f"{port}:{length}" for port, length in LISTENERS.items())
    status, output = guest.run(f"cd /tmp && python3 -m softdta.lab.dta_v1_collector --ip {guest.guest_ip} "
                               f"--data-dir {DATA_DIR} {listeners} > /tmp/dta_v1.log 2>&1 & echo $!")
    assert status == 0, output
    deadline = time.monotonic() + 30
    while guest.run("cat /tmp/dta_v1.log")[1].count("listening on") < len(LISTENERS):
        assert time.monotonic() < deadline, guest.run("cat /tmp/dta_v1.log")[1]
        time.sleep(0.3)
    return int(output.split()[-1])


def region(guest, port: int) -> bytes:
    status, output = guest.run(f"base64 -w0 {DATA_DIR}/{port}.region")
    assert status == 0, output
    return base64.b64decode(output)


class Rig:
    def __init__(self, guest, tables):
        self.guest, self.tables = guest, tables
        self.kernel = XdpTranslator(tables, flush_idle_ns=0)
        self.link = Link(guest)
        ip = tables.qps[0].collector_ip
        self.reporter = workload.ReporterAddress(mac_bytes("02:00:00:00:09:01"), ip_bytes("10.77.9.1"),
                                                 tables.mac, ip)

    def send(self, reports, oracle: Translator, memory: OfflineCollector) -> None:
        for report in reports:
            frame = self.reporter.frame(report)
            for emitted in self.kernel.process(frame).frames:
                self.guest.send(emitted)
                time.sleep(0.002)  # the guest is emulated (TCG): give rxe time
            for emitted in oracle.process(frame).frames:
                memory.deliver(emitted)
            for reply in self.link.collect():
                self.kernel.process(reply)
        for emitted in self.kernel.flush():
            self.guest.send(emitted)
        for emitted in oracle.flush_idle(0):
            memory.deliver(emitted)
        time.sleep(0.5)
        for reply in self.link.collect(wait=0.3):
            self.kernel.process(reply)


def reports(tables, seed: int) -> list:
    kw = workload.key_write(120, seed, 2)
    ki = workload.key_increment(100, seed + 1, 2, flows=20)
    append = workload.append(4 * 40, seed + 2, 4)  # 40 per list: batches of 4, no wrap
    return kw + ki + append


def assert_regions_match(guest, tables, memory: OfflineCollector) -> None:
    """Every structure's region in the collector equals the reference model's, byte for byte."""
    by_port = {target.port: target for target in targets(guest)}
    for qp in tables.qps:
        port = int(qp.name.split("@")[0].rsplit("-", 1)[1])
        got = region(guest, port)[:qp.length]
        assert got == bytes(memory.region_of(qp)), f"{by_port[port].kind} on port {port} differs"


def every_port_back(links: CmLinks, logged: list[str], timeout: float = 90.0):
    """The tables once every listener is connected again: the DREQs first empty them, then ports come back."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            tables = links.updates.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"not every port came back within {timeout:.0f} s; CM log: {logged}") from None
        if len(tables.qps) == len(LISTENERS):
            return tables


def test_original_collectors_are_connected_by_cm_and_written_like_the_reference(guest):
    pid = start_collector(guest)
    translator = {"mac": guest.host_mac, "ip": guest.host_ip, "ack_request_interval": 4, "grace_ms": 50.0}
    logged = []
    with in_netns(guest.namespace.name):
        links = CmLinks(translator, targets(guest), rxe_lab.TAP, log=logged.append)
        tables = links.start(timeout=60)
    rig = None
    try:
        assert len(tables.qps) == len(LISTENERS) and len(tables.append_lists) == 4
        kw = tables.structure(tables.qps[0].collector_ip, DtaOpcode.KEY_WRITE)
        assert kw.slot_count == 256 and kw.qp.start_psn == links.connections[0].send_psn
        rig = Rig(guest, tables)
        before = guest.hw_counters()
        oracle, memory = Translator(tables), OfflineCollector(tables)
        rig.send(reports(tables, 1), oracle, memory)
        counters = rig.kernel.counters()
        after = guest.hw_counters()
        assert after["out_of_seq_request"] == before["out_of_seq_request"], "no resync was needed to start"
        assert counters[TranslatorCounter.RX_NAK_SEQUENCE] == counters[TranslatorCounter.RX_NAK_FATAL] == 0
        assert counters[TranslatorCounter.RX_ACKS] > 0  # the Fetch&Adds' Atomic ACKs
        assert_regions_match(guest, tables, memory)

        guest.run(f"kill -9 {pid}")  # the kernel tears its rdma_cm IDs down: a DREQ for each connection
        pid = start_collector(guest)
        new_tables = every_port_back(links, logged)
        assert {qp.remote_qpn for qp in new_tables.qps}.isdisjoint({qp.remote_qpn for qp in tables.qps})
        assert any("disconnected (DREQ)" in line for line in logged), logged
        rig.kernel.apply(new_tables)
        before = guest.hw_counters()
        oracle, memory = Translator(new_tables), OfflineCollector(new_tables)
        rig.send(reports(new_tables, 7), oracle, memory)
        assert guest.hw_counters()["out_of_seq_request"] == before["out_of_seq_request"]
        assert_regions_match(guest, new_tables, memory)
    finally:
        if rig is not None:
            rig.kernel.close()
        links.close()
        guest.run(f"kill -9 {pid}")


GUEST_REPORTER = """
import socket, sys, time
from softdta.core import workload
from softdta.wire.frames import ip_bytes, mac_bytes
reporter = workload.ReporterAddress(mac_bytes("{guest_mac}"), ip_bytes("{guest_ip}"), mac_bytes("{translator_mac}"),
                                    ip_bytes("{guest_ip}"))
sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
sock.bind(("eth0", 0))
for report in {reports}:
    sock.send(reporter.frame(report))
    time.sleep(0.003)
"""
LIVE_REPORTS = ("workload.key_write(60, 21, 2) + workload.key_increment(60, 22, 2, flows=12) "
                "+ workload.append(64, 23, 1)")


def test_translator_up_with_collector_cm_runs_live_xdp_against_the_original_collector(guest, tmp_path):
    """`softdta translator up --collector-cm` with XDP attached on the link: the handshake passes through the XDP
    program, and reports from the guest's side of the link land in the collector's regions."""
    ports = {KEY_WRITE_PORT: "key-write", KEY_INCREMENT_PORT: "key-increment", FIRST_APPEND_PORT: "append"}
    pid = start_collector(guest)
    (tmp_path / "translator.toml").write_text(f'[translator]\nmac = "{guest.host_mac}"\nip = "{guest.host_ip}"\n'
                                              'ack_request_interval = 4\ngrace_ms = 50.0\n')
    pin = ensure_bpffs() / f"softdta-cm-{os.getpid()}"
    translator = subprocess.Popen(
        [sys.executable, "-m", "softdta.cli", "translator", "up", "--tables", str(tmp_path / "translator.toml"),
         "-i", rxe_lab.TAP, "--netns", guest.namespace.name, "--pin", str(pin), "--flush-idle-ms", "500",
         *[arg for port, kind in ports.items() for arg in ("--collector-cm", f"{guest.guest_ip}:{port},kind={kind}")]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_line(translator, "translator up on", timeout=90)
        before = guest.hw_counters()
        script = GUEST_REPORTER.format(guest_mac=rxe_lab.GUEST_MAC, guest_ip=guest.guest_ip,
                                       translator_mac=guest.host_mac, reports=LIVE_REPORTS)
        status, output = guest.run(f"python3 - <<'EOF'\n{script}\nEOF", timeout=120)
        assert status == 0, output
        time.sleep(1.5)  # the idle flush writes out what is pending
        after = guest.hw_counters()
        assert after["out_of_seq_request"] == before["out_of_seq_request"]
        assert after["rcvd_pkts"] > before["rcvd_pkts"]

        # the reference model, on tables of the same layout (addresses and keys do not change region contents)
        adverts = []
        for index, (port, kind) in enumerate(ports.items()):
            link = CmConnection(CmEndpoint(mac_bytes(guest.host_mac), ip_bytes(guest.host_ip), 0x2000 + index, 0, 0),
                                ip_bytes(guest.guest_ip), mac_bytes(rxe_lab.GUEST_MAC), port, 0, 0)
            link.remote_qpn, link.metadata = 0x100 + index, Metadata(0x10000 * (index + 1), LISTENERS[port], 1)
            adverts.append(CmTarget.parse(f"{guest.guest_ip}:{port},kind={kind}").advertisement(link))
        tables = Tables.from_dict(tables_document(
            {"mac": guest.host_mac, "ip": guest.host_ip}, {"name": "cm", "ip": guest.guest_ip,
                                                            "mac": rxe_lab.GUEST_MAC}, adverts))
        oracle, memory = Translator(tables), OfflineCollector(tables)
        reporter = workload.ReporterAddress(mac_bytes(rxe_lab.GUEST_MAC), ip_bytes(guest.guest_ip),
                                            mac_bytes(guest.host_mac), ip_bytes(guest.guest_ip))
        for report in eval(LIVE_REPORTS, {"workload": workload}):
            for frame in oracle.process(reporter.frame(report)).frames:
                memory.deliver(frame)
        for frame in oracle.flush_idle(0):
            memory.deliver(frame)
        stats = json.loads(subprocess.run([sys.executable, "-m", "softdta.cli", "translator", "stats", "--pin",
                                           str(pin), "--json"], capture_output=True, text=True, check=True).stdout)
        assert stats["counters"]["rx_acks"] > 0
        assert not [name for name in stats["counters"] if name.startswith("drop_")], stats["counters"]
        for qp in tables.qps:
            port = int(qp.name.split("@")[0].rsplit("-", 1)[1])
            assert region(guest, port) == bytes(memory.region_of(qp)), f"{ports[port]} on port {port} differs"
    finally:
        translator.send_signal(signal.SIGTERM)
        translator.communicate(timeout=20)
        subprocess.run([sys.executable, "-m", "softdta.cli", "translator", "down", "--pin", str(pin), "--forget"],
                       capture_output=True)
        guest.run(f"kill -9 {pid}")
    assert translator.returncode == 0


def test_a_failed_qp_is_disconnected_and_connected_again(guest):
    """A fatal NAK (here: a wrong R_Key, as after an operator's mistake) fails the translator's QP; the CM link
    leaves the connection with a DREQ and connects again, and the new QP takes writes."""
    pid = start_collector(guest)
    translator = {"mac": guest.host_mac, "ip": guest.host_ip, "ack_request_interval": 1, "grace_ms": 50.0}
    logged = []
    with in_netns(guest.namespace.name):
        links = CmLinks(translator, targets(guest)[:1], rxe_lab.TAP, log=logged.append)
        tables = links.start(timeout=60)
    rig = Rig(guest, tables)
    try:
        links.report_failures(lambda: {qp.local_qpn for qp in rig.kernel.tables.qps
                                       if rig.kernel.qp_state(qp)["state"] == QpState.FAILED})
        document = links.document()
        document["structures"][0]["qp"]["rkey"] ^= 0x5A5A
        rig.kernel.apply(Tables.from_dict(document))
        rig.send(workload.key_write(2, 31, 1), Translator(tables), OfflineCollector(tables))
        assert rig.kernel.counters()[TranslatorCounter.RX_NAK_FATAL] == 1
        new_tables = links.updates.get(timeout=30)
        assert any("failed; reconnecting" in line for line in logged), logged
        while not new_tables.qps:  # the failed QP leaves the tables first, then comes back
            new_tables = links.updates.get(timeout=30)
        assert new_tables.qps[0].remote_qpn != tables.qps[0].remote_qpn
        assert new_tables.qps[0].local_qpn != tables.qps[0].local_qpn  # the collector's CM remembers the old one
        rig.kernel.apply(new_tables)
        assert rig.kernel.qp_state(new_tables.qps[0])["state"] == QpState.ACTIVE
        oracle, memory = Translator(new_tables), OfflineCollector(new_tables)
        rig.send(workload.key_write(50, 32, 2), oracle, memory)
        assert_regions_match(guest, new_tables, memory)
    finally:
        rig.kernel.close()
        links.close()
        guest.run(f"kill -9 {pid}")
