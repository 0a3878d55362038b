"""`softdta collector up` exporting to NATS JetStream, with real processes: Append reports from a raw socket go
through the XDP translator (`translator up --collector`) into the XDP responder over veth, and the collector's
exporter publishes every entry to a real nats-server; a consumer then reads the stream back.

The restart matrix: the collector stops (SIGTERM, kill -9) while the broker is down, so that entries it took wait
unacknowledged in its journal, and starts again with the same configuration, over UC and RC Append ranges. Every
entry arrives exactly once: no de-duplication ID stored twice, each list's messages tile its sequence space from 0,
and the entries are those sent, in order.
"""

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from softdta.collector.xdp_backend import pin_dir_for
from softdta.core.export import COUNT_HEADER, MESSAGE_ID_HEADER
from softdta.core.workload import ReporterAddress
from softdta.engines.python import engine_stats
from softdta.kernel.bpf import ensure_bpffs
from softdta.kernel.netns import Namespace, address, cleanup_prefix, in_netns, veth_pair
from softdta.lab.nats_server import NatsServer
from softdta.wire import dta
from softdta.wire.frames import ip_bytes, mac_bytes
from tests.common import ROOT, ExportedStream, eventually, read_exported

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-x{os.getpid()}-"
COLLECTOR = f"export{os.getpid()}"
COLLECTOR_IP, TRANSLATOR_IP, REPORTER_IP = "10.77.1.1", "10.77.0.1", "10.77.9.1"
TRANSLATOR_MAC, COLLECTOR_MAC, REPORTER_MAC = "02:5d:7a:00:00:01", "02:5d:7a:00:01:01", "02:5d:7a:00:09:01"
TOKEN = "export-token"
STREAM, SUBJECT_PREFIX = "SOFTDTA_LIVE", "telemetry"
LISTS = 64  # the [[append]] range of examples/collector.toml: lists 0..63, 256 entries each
CHUNK = 128  # reports sent before waiting for the translator to take them (its veth ring holds 256)
SOFTDTA = [sys.executable, "-m", "softdta.cli"]


class Rig:
    """Reporter, translator and collector namespaces; nats-server runs in the collector's (on its loopback)."""

    def __init__(self, tmp: Path, transport: str):
        self.tmp, self.pin = tmp, ensure_bpffs() / f"softdta-export-{os.getpid()}"
        self.reporter_ns, self.translator_ns, self.collector_ns = (Namespace.create(PREFIX + n) for n in "rtc")
        veth_pair(self.reporter_ns, "r0", self.translator_ns, "t0", mac_a=REPORTER_MAC, mac_b=TRANSLATOR_MAC)
        veth_pair(self.translator_ns, "t1", self.collector_ns, "c0", mac_a=TRANSLATOR_MAC, mac_b=COLLECTOR_MAC)
        address(self.translator_ns, "t1", f"{TRANSLATOR_IP}/16")
        address(self.collector_ns, "c0", f"{COLLECTOR_IP}/16")
        self.broker = NatsServer(tmp / "nats")
        self.processes: list[subprocess.Popen] = []
        self.collector: subprocess.Popen | None = None
        self.sent: dict[int, list[int]] = defaultdict(list)
        self.next_value = 1
        config = (ROOT / "examples" / "collector.toml").read_text()
        config = config.replace('name = "c1"', f'name = "{COLLECTOR}"').replace('token = "change-me"',
                                                                               f'token = "{TOKEN}"')
        config = config.replace('interface = ""', 'interface = "c0"').replace(
            'data_dir = "c1-data"', f'data_dir = "{tmp / "data"}"')
        config = config.replace("slots = 131072", "slots = 4096").replace("slots = 65536", "slots = 1024")
        config = config.replace("slots = 32768", "slots = 1024").replace("batch = 4", f'batch = 4\ntransport = '
                                                                                      f'"{transport}"')
        config += f'\n[export]\nurl = "{self.broker.url}"\nstream = "{STREAM}"\nsubject_prefix = "{SUBJECT_PREFIX}"\n'
        (tmp / "collector.toml").write_text(config)
        (tmp / "translator.toml").write_text(f'[translator]\nmac = "{TRANSLATOR_MAC}"\nip = "{TRANSLATOR_IP}"\n')

    # processes

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        out, err = (open(self.tmp / f"{name}.{stream}", "w") for stream in ("out", "err"))
        process = subprocess.Popen(SOFTDTA + argv, stdout=out, stderr=err, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        out.close()
        err.close()
        process.name = name  # type: ignore[attr-defined]
        self.processes.append(process)
        return process

    def output(self, process: subprocess.Popen, stream: str = "out") -> str:
        return (self.tmp / f"{process.name}.{stream}").read_text()  # type: ignore[attr-defined]

    def wait_for_line(self, process: subprocess.Popen, text: str) -> None:
        eventually(lambda: text in self.output(process) or process.poll() is not None, 60, repr(text))
        assert text in self.output(process), f"{process.args[3:5]} exited ({process.returncode}): " \
                                             f"{self.output(process, 'err')[-2000:]}"

    def collector_up(self, name: str) -> None:
        self.collector = self.spawn(name, ["collector", "up", "--config", str(self.tmp / "collector.toml"),
                                           "--netns", self.collector_ns.name, "--query-host", COLLECTOR_IP])
        self.wait_for_line(self.collector, f"collector {COLLECTOR} up")

    def translator_up(self) -> None:
        translator = self.spawn("translator", [
            "translator", "up", "--tables", str(self.tmp / "translator.toml"), "-i", "t0", "-i", "t1",
            "--pin", str(self.pin), "--netns", self.translator_ns.name, "--collector", f"{COLLECTOR_IP}:40050",
            "--token", TOKEN])
        self.wait_for_line(translator, "translator up on t0, t1")

    def broker_start(self) -> None:
        with in_netns(self.collector_ns.name):
            self.broker.start()

    def close(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
        self.broker.kill()

    # what the collector and the translator say

    def http(self, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, str]:
        with in_netns(self.collector_ns.name):
            request = urllib.request.Request(
                f"http://{COLLECTOR_IP}:8040{path}", data=json.dumps(body).encode() if body is not None else None,
                headers={"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})},
                method="POST" if token else "GET")
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    return response.status, response.read().decode()
            except urllib.error.HTTPError as error:
                return error.code, error.read().decode()

    def export(self) -> dict:
        return json.loads(self.http("/stats")[1])["export"]

    def export_when(self, condition, what: str, within: float = 30) -> dict:
        seen: list[dict] = []

        def holds():
            try:
                seen[:] = [self.export()]
            except (OSError, urllib.error.URLError, json.JSONDecodeError):
                return None  # a collector between restarts
            return seen[0] if condition(seen[0]) else None
        try:
            return eventually(holds, within, what)
        except AssertionError as error:
            raise AssertionError(f"{error}; the export's status: {seen}; {self.pipeline_counters()}") from None

    def pipeline_counters(self) -> str:
        try:
            responder = json.loads(self.http("/stats")[1])["responder"]
        except (OSError, urllib.error.URLError, json.JSONDecodeError) as error:
            responder = str(error)
        return f"responder {responder}, translator {engine_stats(self.pin)}"

    def translator_connected(self) -> bool:
        """Every queue pair the translator writes into is held by an open session at the (current) collector."""
        try:
            held = {int(qpn, 16): entry for qpn, entry in json.loads(self.http("/health")[1])["qps"].items()}
        except (OSError, urllib.error.URLError, json.JSONDecodeError):
            return False
        into = engine_stats(self.pin)["qps"]
        return bool(into) and all(qp["remote_qpn"] in held and held[qp["remote_qpn"]]["session"] == "open" and
                                  qp["state"] == "active" for qp in into)

    # reports

    def send(self, entries: int) -> None:
        """`entries` Append reports spread round-robin over the lists (values unique and never 0), paced by what
        the translator took."""
        with in_netns(self.reporter_ns.name):
            sender = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            sender.bind(("r0", 0))
        reporter = ReporterAddress(mac_bytes(REPORTER_MAC), ip_bytes(REPORTER_IP), mac_bytes(TRANSLATOR_MAC),
                                   ip_bytes(COLLECTOR_IP))
        taken_before = self.translator_counter("rx_append")
        with sender:
            for start in range(0, entries, CHUNK):
                for _ in range(min(CHUNK, entries - start)):
                    list_id, value = self.next_value % LISTS, self.next_value
                    self.next_value += 1
                    sender.send(reporter.frame(dta.append(list_id, value)))
                    self.sent[list_id].append(value)
                sent = min(start + CHUNK, entries)
                eventually(lambda: self.translator_counter("rx_append") - taken_before >= sent, 10,
                           f"the translator taking {sent} Append reports")

    def translator_counter(self, name: str) -> int:
        return engine_stats(self.pin)["counters"].get(name, 0)

    @property
    def total(self) -> int:
        return sum(map(len, self.sent.values()))


def read_stream(rig: Rig) -> ExportedStream:
    """Every message the stream holds, read by an ordered consumer from the first."""
    with in_netns(rig.collector_ns.name):
        return asyncio.run(read_exported(rig.broker.url, f"{SUBJECT_PREFIX}.>", STREAM))


def check_exactly_once(stream: ExportedStream, sent: dict[int, list[int]], gaps: int) -> None:
    """No ID stored twice; per list, the messages tile the sequence space from 0, and their entries are those
    sent, in order, but for the entries gap messages stand for (as many as the collector counted lost)."""
    assert stream.stored == len(stream.copies), f"{stream.stored - len(stream.copies)} messages stored twice"
    lists = stream.lists()
    assert set(lists) <= set(sent)
    for list_id, values in sent.items():
        received, lost = lists.get(list_id, ([], 0))
        if lost == 0:
            assert received == values, f"list {list_id}: {len(received)} entries received, {len(values)} sent"
    assert sum(lost for _, lost in lists.values()) == gaps


@pytest.fixture
def rig(tmp_path, request):
    shutil.rmtree(pin_dir_for(COLLECTOR, ip_bytes(COLLECTOR_IP)), ignore_errors=True)
    cleanup_prefix(PREFIX)
    made = Rig(tmp_path, request.param)
    try:
        yield made
    finally:
        made.close()
        cleanup_prefix(PREFIX)
        shutil.rmtree(made.pin, ignore_errors=True)
        shutil.rmtree(pin_dir_for(COLLECTOR, ip_bytes(COLLECTOR_IP)), ignore_errors=True)


@pytest.mark.parametrize("rig", ["uc", "rc"], indirect=True)
@pytest.mark.parametrize("stop", ["sigterm", "kill9"])
def test_a_collector_restart_publishes_every_entry_exactly_once(rig, stop):
    """3000 entries acknowledged; the broker killed, 2000 more taken into the journal; the collector stopped and
    started again with the same configuration, with the broker still down: it holds those 2000 as its backlog;
    the broker back, they and 1000 more entries arrive, each once."""
    rig.broker_start()
    rig.collector_up("collector")
    rig.translator_up()
    eventually(rig.translator_connected, 30, "the translator connected")

    rig.send(3000)
    first = rig.export_when(lambda s: s["acknowledged"] == 3000 and not s["backlog_entries"], "3000 acknowledged")
    assert first["connected"] and first["stream"] == STREAM and first["lost_to_overflow"] == 0
    status, metrics = rig.http("/metrics")
    assert status == 200 and 'softdta_export_entries_total{result="acknowledged"} 3000.0' in metrics
    status, body = rig.http(f"/append/append0@{COLLECTOR_IP}", {}, token=TOKEN)
    assert status == 409 and f"stream {STREAM}" in body and rig.broker.url in body

    rig.broker.kill()
    rig.send(2000)
    taken = rig.export_when(lambda s: s["taken"] == 5000 and not s["connected"],
                            "2000 more taken, the broker noticed gone")
    assert taken["backlog_entries"] == 2000 - (taken["acknowledged"] - 3000)
    waiting = taken["backlog_entries"]
    assert waiting > 0
    rig.collector.send_signal(signal.SIGTERM if stop == "sigterm" else signal.SIGKILL)
    assert rig.collector.wait(30) == (0 if stop == "sigterm" else -signal.SIGKILL)
    assert (rig.tmp / "data" / "export.journal").is_file()

    rig.collector_up("collector-2")
    restarted = rig.export_when(lambda s: not s["connected"], "the restarted collector's export status")
    assert restarted["backlog_entries"] == waiting and restarted["taken"] == 0, (waiting, restarted)  # journaled
    assert "wait for the broker's acknowledgement; sending them again" in rig.output(rig.collector, "err")
    eventually(rig.translator_connected, 60, "the translator connected to the restarted collector")
    rig.broker_start()
    rig.export_when(lambda s: s["connected"] and not s["backlog_entries"], "the backlog acknowledged")
    rig.send(1000)
    last = rig.export_when(lambda s: s["taken"] == 1000 and not s["backlog_entries"], "1000 more acknowledged")
    assert last["acknowledged"] == waiting + 1000 and last["lost_to_overflow"] == 0

    stream = read_stream(rig)
    check_exactly_once(stream, rig.sent, gaps=0)
    copies = stream.copies
    assert sum(int(headers[COUNT_HEADER]) for (headers, _), in copies.values()) == rig.total == 6000
    assert {headers[MESSAGE_ID_HEADER].split(":")[0] for (headers, _), in copies.values()} == {COLLECTOR}
    rig.collector.send_signal(signal.SIGTERM)
    assert rig.collector.wait(30) == 0
    assert "Traceback" not in rig.output(rig.collector, "err")
