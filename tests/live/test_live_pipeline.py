"""Reporter -> XDP translator -> XDP responder collector -> query service, live over veth, as users run it.

`softdta collector up` and `softdta translator up --collector` run as processes in their own namespaces; the
translator learns the structures through the control protocol, and queries go over HTTP.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace

import pytest

from softdta.collector.xdp_backend import pin_dir_for
from softdta.core.workload import ReporterAddress
from softdta.engines.xdp import interface_index, rx_queues
from softdta.kernel.bpf import ensure_bpffs
from softdta.kernel.netns import Namespace, address, cleanup_prefix, in_netns, veth_pair
from softdta.wire import dta
from softdta.wire.frames import ip_bytes, mac_bytes
from tests.common import ROOT, wait_for_line

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-p{os.getpid()}-"
TRANSLATOR_MAC, COLLECTOR_MAC, REPORTER_MAC = "02:5d:7a:00:00:01", "02:5d:7a:00:01:01", "02:5d:7a:00:09:01"
SOFTDTA = [sys.executable, "-m", "softdta.cli"]


def http(namespace: str, path: str, body: dict | None = None) -> dict:
    with in_netns(namespace):
        request = urllib.request.Request(f"http://10.77.1.1:8040{path}",
                                         data=json.dumps(body).encode() if body else None,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())


@pytest.fixture
def topology(tmp_path, request):
    """`request.param`, when given: the RX queues of the reporters' link into the translator."""
    # memory a killed collector of the same name and IP pinned would be adopted (docs/collector.md): start clean
    shutil.rmtree(pin_dir_for("c1", ip_bytes("10.77.1.1")), ignore_errors=True)
    cleanup_prefix(PREFIX)
    reporter, translator, collector = (Namespace.create(PREFIX + n) for n in ("r", "t", "c"))
    veth_pair(reporter, "r0", translator, "t0", mac_a=REPORTER_MAC, mac_b=TRANSLATOR_MAC,
              queues=getattr(request, "param", 1))
    veth_pair(translator, "t1", collector, "c0", mac_a=TRANSLATOR_MAC, mac_b=COLLECTOR_MAC)
    address(translator, "t1", "10.77.0.1/16")
    address(collector, "c0", "10.77.1.1/16")
    yield reporter, translator, collector
    cleanup_prefix(PREFIX)


@pytest.mark.parametrize("topology", [1, 2], indirect=True, ids=["one RX queue", "two RX queues"])
def test_reports_become_queryable_data_through_both_xdp_programs(topology, tmp_path):
    """With two RX queues, the translator asks for two queue pairs per structure, each queue writes through its
    own, and the XDP responder executes every write in PSN order (no sequence NAK, no drop). There, Key-Write
    takes no redundancy, so its frames leave from XDP while Key-Increment's take the tc stage."""
    reporter_ns, translator_ns, collector_ns = topology
    with in_netns(translator_ns.name):
        queues = rx_queues(interface_index("t0"))
    copies = 1 if queues > 1 else 2  # of each Key-Write
    config = (ROOT / "examples" / "collector.toml").read_text()
    config = config.replace('hash = "independent"', f'hash = "independent"\nredundancy = {copies}')
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
        for key in keys:  # a flow per key: RSS spreads them over the RX queues
            flow = replace(reporter, sport=1024 + key)
            sender.send(flow.frame(dta.key_write(key, key * 3, copies)))
            sender.send(flow.frame(dta.key_increment(key % 10, 1, 2)))
        for value in range(9):  # one flow: one queue takes them in order
            sender.send(reporter.frame(dta.append(5, 1000 + value)))
        writes = (copies + 2) * len(keys) + 2
        wait_until(lambda: translator_stats(pin)["counters"].get("tx_frames", 0) >= writes, "every report translated")
        wait_until(lambda: http(collector_ns.name, "/stats")["responder"].get("executed", 0) >= writes,
                   "every write executed")

        found = http(collector_ns.name, "/key-write/key-write@10.77.1.1",
                     {"keys": keys, "redundancy": copies})
        values = [row["value"] for row in found["results"]]
        assert sum(value == f"{key * 3:08x}" for key, value in zip(keys, values)) >= 195
        counts = http(collector_ns.name, "/key-increment/key-increment@10.77.1.1", {"keys": list(range(10)),
                                                                                     "redundancy": 2})
        assert [row["count"] for row in counts["results"]] == [20] * 10
        appended = http(collector_ns.name, "/append/append0@10.77.1.1?list=5")
        assert appended["entries"][:8] == [1000 + value for value in range(8)]  # two full batches of 4
        health = http(collector_ns.name, "/health")
        assert health["backend"] == "xdp" and len(health["qps"]) == 5 * queues
        stats = translator_stats(pin)
        assert stats["counters"]["rx_acks"] > 0  # the XDP responder's RC ACKs, consumed by the XDP translator
        assert not [name for name in stats["counters"] if name.startswith("drop_") or "nak" in name]
        assert len([qp for qp in stats["qps"] if qp["frames_sent"]]) >= 2 * queues, "every queue translated"
        responder = http(collector_ns.name, "/stats")["responder"]
        assert responder["executed"] >= writes
        assert not {name: n for name, n in responder.items() if n and name not in ("executed", "replies_sent",
                                                                                   "completions")}
    finally:
        for process in (translator, collector):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.communicate(timeout=15)
        subprocess.run(SOFTDTA + ["translator", "down", "--pin", str(pin), "--forget"], capture_output=True)
    assert collector.returncode == 0 and translator.returncode == 0
    assert (tmp_path / "c1" / "key-write.region").stat().st_size == 16384 * 8


def translator_stats(pin) -> dict:
    return json.loads(subprocess.run(SOFTDTA + ["translator", "stats", "--pin", str(pin), "--json"],
                                     capture_output=True, text=True, check=True).stdout)


def wait_until(condition, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def test_forged_replies_lose_no_write_uncounted_and_a_failed_qp_comes_back(topology, tmp_path):
    """An attacker on the collector's side sends NAKs from the collector's IP to the translator's (predictable)
    QPNs: on UC, and on RC outside and inside the outstanding window. Only the in-window ones may act; the fatal
    one fails the QP, which the translator reports over the control protocol; the collector re-creates its end
    and writes resume. Every write that did not land is counted by one side or the other."""
    from softdta.spec import ROCE_PORT, RoceOpcode
    from softdta.wire.frames import UdpEndpoints
    from softdta.wire.roce import NAK_REMOTE_ACCESS_SYNDROME, NAK_SEQUENCE_SYNDROME, build_roce_frame, transport_payload

    reporter_ns, translator_ns, collector_ns = topology
    config = (ROOT / "examples" / "collector.toml").read_text()
    config = config.replace('interface = ""', 'interface = "c0"').replace('data_dir = "c1-data"',
                                                                          f'data_dir = "{tmp_path / "c1"}"')
    config = config.replace("slots = 131072", 'slots = 16384\ntransport = "rc"').replace("slots = 65536",
                                                                                          "slots = 8192")
    (tmp_path / "collector.toml").write_text(config)
    (tmp_path / "translator.toml").write_text(
        f'[translator]\nmac = "{TRANSLATOR_MAC}"\nip = "10.77.0.1"\nack_request_interval = 2\n'
        '[[collectors]]\nname = "c1"\nip = "10.77.1.1"\nmac = "02:5d:7a:00:01:01"\ninterface = "t1"\n')
    pin = ensure_bpffs() / f"softdta-forged-{os.getpid()}"
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
        with in_netns(collector_ns.name):
            forger = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            forger.bind(("c0", 0))
        reporter = ReporterAddress(mac_bytes(REPORTER_MAC), ip_bytes("10.77.9.1"), mac_bytes(TRANSLATOR_MAC),
                                   ip_bytes("10.77.1.1"))
        ends = UdpEndpoints(src_mac=mac_bytes(COLLECTOR_MAC), dst_mac=mac_bytes(TRANSLATOR_MAC),
                            src_ip=ip_bytes("10.77.1.1"), dst_ip=ip_bytes("10.77.0.1"), sport=49999, dport=ROCE_PORT)

        def forge(qp: dict, syndrome: int, psn: int) -> None:
            forger.send(build_roce_frame(ends, transport_payload(RoceOpcode.RC_ACK, qp["local_qpn"], psn & 0xFFFFFF,
                                                                 {"aeth": {"syndrome": syndrome, "msn": 1}})))

        health = http(collector_ns.name, "/health")
        structures = {int(qpn, 16): entry["structure"] for qpn, entry in health["qps"].items()}

        def qp_of(structure: str) -> dict:
            return next(qp for qp in translator_stats(pin)["qps"] if structures.get(qp["remote_qpn"]) == structure)

        def counters() -> dict:
            return translator_stats(pin)["counters"]

        key_write = qp_of("key-write")
        uc = next(qp for qp in translator_stats(pin)["qps"] if qp["transport"] == "UC")
        assert key_write["transport"] == "RC"

        # One write whose ACK is not requested (ack_request_interval = 2): its PSN stays outstanding.
        sender.send(reporter.frame(dta.key_write(1, 0x11, 1)))
        key_write = wait_until(lambda: (qp := qp_of("key-write"))["frames_sent"] == 1 and qp, "the first write")
        outstanding = key_write["unacked_psn"]
        assert key_write["next_psn"] == (outstanding + 1) & 0xFFFFFF

        for syndrome in (NAK_REMOTE_ACCESS_SYNDROME, NAK_SEQUENCE_SYNDROME):
            forge(uc, syndrome, uc["next_psn"] - 1)
            forge(key_write, syndrome, outstanding - 1)  # behind: already acknowledged, or never sent
            forge(key_write, syndrome, outstanding + 1)  # beyond: not sent yet
            forge(key_write, syndrome, outstanding + (1 << 23))
        wait_until(lambda: counters().get("drop_reply_on_uc") == 2
                   and counters().get("drop_reply_psn_outside_window") == 6, "the forged replies counted")
        assert qp_of("key-write")["state"] == "active" and qp_of("key-write")["next_psn"] == key_write["next_psn"]
        assert next(qp for qp in translator_stats(pin)["qps"] if qp["local_qpn"] == uc["local_qpn"])["state"] == \
            "active"

        # Inside the window a fatal NAK cannot be told from a real one: the QP fails, and comes back by itself.
        forge(key_write, NAK_REMOTE_ACCESS_SYNDROME, outstanding)
        wait_for_line(translator, "asking the collector to re-create it")
        wait_until(lambda: counters().get("rx_nak_fatal") == 1 and qp_of("key-write")["state"] == "active",
                   "the failed QP re-created and revived")
        assert all(entry["state"] == "ready" for entry in http(collector_ns.name, "/health")["qps"].values())

        keys = list(range(2, 42))
        for key in keys:
            sender.send(reporter.frame(dta.key_write(key, key * 5, 1)))

        def landed() -> list:
            found = http(collector_ns.name, "/key-write/key-write@10.77.1.1", {"keys": keys, "redundancy": 1})
            return [row["value"] == f"{key * 5:08x}" for key, row in zip(keys, found["results"])]
        wait_until(lambda: all(landed()), "the writes after the revival")
        responder = http(collector_ns.name, "/stats")["responder"]
        # The forged frames never reached the collector's memory; no write was taken for a duplicate.
        assert responder.get("duplicate_request", 0) == 0 and responder.get("out_of_seq_request", 0) == 0
        final = counters()
        assert not {name: value for name, value in final.items() if name.startswith("drop_")
                    and name not in ("drop_reply_on_uc", "drop_reply_psn_outside_window")}
    finally:
        for process in (translator, collector):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.communicate(timeout=15)
        subprocess.run(SOFTDTA + ["translator", "down", "--pin", str(pin), "--forget"], capture_output=True)
    assert collector.returncode == 0 and translator.returncode == 0
