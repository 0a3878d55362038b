"""Reporter -> XDP translator -> XDP responder collector -> query service, live over veth, as users run it.

`softdta collector up` and `softdta translator up --collector` run as processes in their own namespaces; the
translator learns the structures through the control protocol, and queries go over HTTP.
"""

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from softdta import dta
from softdta.bpf import ensure_bpffs
from softdta.frames import ip_bytes, mac_bytes
from softdta.netns import Namespace, address, cleanup_prefix, in_netns, veth_pair
from softdta.workload import ReporterAddress

from common import ROOT

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-p{os.getpid()}-"
TRANSLATOR_MAC, COLLECTOR_MAC, REPORTER_MAC = "02:5d:7a:00:00:01", "02:5d:7a:00:01:01", "02:5d:7a:00:09:01"
SOFTDTA = [sys.executable, "-m", "softdta.cli"]


def wait_for_line(process: subprocess.Popen, text: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([process.stdout], [], [], 0.2)[0]:
            line = process.stdout.readline()
            if text in line:
                return line
        if process.poll() is not None:
            raise AssertionError(f"{process.args[3:5]} exited: {process.stderr.read()}")
    raise AssertionError(f"no {text!r} from {process.args[3:5]} within {timeout} s")


def http(namespace: str, path: str, body: dict | None = None) -> dict:
    with in_netns(namespace):
        request = urllib.request.Request(f"http://10.77.1.1:8040{path}", data=json.dumps(body).encode() if body else None,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())


@pytest.fixture
def topology(tmp_path):
    cleanup_prefix(PREFIX)
    reporter, translator, collector = (Namespace.create(PREFIX + n) for n in ("r", "t", "c"))
    veth_pair(reporter, "r0", translator, "t0", mac_a=REPORTER_MAC, mac_b=TRANSLATOR_MAC)
    veth_pair(translator, "t1", collector, "c0", mac_a=TRANSLATOR_MAC, mac_b=COLLECTOR_MAC)
    address(translator, "t1", "10.77.0.1/16")
    address(collector, "c0", "10.77.1.1/16")
    yield reporter, translator, collector
    cleanup_prefix(PREFIX)


def test_reports_become_queryable_data_through_both_xdp_programs(topology, tmp_path):
    reporter_ns, translator_ns, collector_ns = topology
    config = (ROOT / "examples" / "collector.toml").read_text()
    config = config.replace('interface = ""', 'interface = "c0"').replace('data_dir = "c1-data"',
                                                                          f'data_dir = "{tmp_path / "c1"}"')
    config = config.replace("slots = 131072", "slots = 16384").replace("slots = 65536", "slots = 8192")
    (tmp_path / "collector.toml").write_text(config)
    (tmp_path / "translator.toml").write_text(
        f'[translator]\nmac = "{TRANSLATOR_MAC}"\nip = "10.77.0.1"\nack_request_interval = 2\n'
        '[[collectors]]\nname = "c1"\nip = "10.77.1.1"\nmac = "02:5d:7a:00:01:01"\ninterface = "t1"\n')
    pin = ensure_bpffs() / f"softdta-pipeline-{os.getpid()}"
    collector = subprocess.Popen(SOFTDTA + ["collector", "up", "--config", str(tmp_path / "collector.toml"),
                                            "--netns", collector_ns.name, "--query-host", "10.77.1.1"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    translator = None
    try:
        wait_for_line(collector, "collector c1 up")
        translator = subprocess.Popen(SOFTDTA + ["translator", "up", "--tables", str(tmp_path / "translator.toml"),
                                                 "-i", "t0", "-i", "t1", "--pin", str(pin), "--netns",
                                                 translator_ns.name, "--collector", "10.77.1.1:40050",
                                                 "--token", "change-me"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for_line(translator, "translator up on t0, t1")
        with in_netns(reporter_ns.name):
            sender = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            sender.bind(("r0", 0))
        reporter = ReporterAddress(mac_bytes(REPORTER_MAC), ip_bytes("10.77.9.1"), mac_bytes(TRANSLATOR_MAC),
                                   ip_bytes("10.77.1.1"))
        keys = list(range(1, 201))
        for key in keys:
            sender.send(reporter.frame(dta.key_write(key, key * 3, 2)))
            sender.send(reporter.frame(dta.key_increment(key % 10, 1, 2)))
        for value in range(9):
            sender.send(reporter.frame(dta.append(5, 1000 + value)))
        time.sleep(0.5)

        found = http(collector_ns.name, "/keywrite/key-write@10.77.1.1",
                     {"keys": keys, "redundancy": 2})
        values = [row["value"] for row in found["results"]]
        assert sum(value == f"{key * 3:08x}" for key, value in zip(keys, values)) >= 195
        counts = http(collector_ns.name, "/keyincrement/key-increment@10.77.1.1", {"keys": list(range(10)),
                                                                                     "redundancy": 2})
        assert [row["count"] for row in counts["results"]] == [20] * 10
        appended = http(collector_ns.name, "/append/append0@10.77.1.1?list=5")
        assert appended["entries"][:8] == [1000 + value for value in range(8)]  # two full batches of 4
        health = http(collector_ns.name, "/health")
        assert health["backend"] == "xdp" and len(health["qps"]) == 5
        stats = json.loads(subprocess.run(SOFTDTA + ["translator", "stats", "--pin", str(pin), "--json"],
                                          capture_output=True, text=True, check=True).stdout)
        assert stats["counters"]["rx_acks"] > 0  # the XDP responder's RC ACKs, consumed by the XDP translator
        assert not [name for name in stats["counters"] if name.startswith("drop_")]
    finally:
        for process in (translator, collector):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.communicate(timeout=15)
        subprocess.run(SOFTDTA + ["translator", "down", "--pin", str(pin), "--forget"], capture_output=True)
    assert collector.returncode == 0 and translator.returncode == 0
    assert (tmp_path / "c1" / "key-write.region").stat().st_size == 16384 * 8
