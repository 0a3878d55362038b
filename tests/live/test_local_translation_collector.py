"""`softdta collector up --translate-locally`: the collector takes DTA reports itself, and its queries,
persistence and metrics see them as they see the translator's writes."""

import json
import os
import select
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace

import pytest

from softdta.collector.collector import Collector
from softdta.collector.config import CollectorConfig
from softdta.collector.xdp_backend import XdpBackend
from softdta.core import workload
from softdta.core.primitives.key_write.queries import key_write_query
from softdta.core.workload import ReporterAddress
from softdta.kernel.frame_sender import FrameSender
from softdta.kernel.netns import Namespace, address, cleanup_prefix, in_netns, veth_pair
from softdta.links.local import LocalLink
from softdta.spec import DtaOpcode, KeyHash
from softdta.wire import dta
from softdta.wire.frames import ip_bytes, mac_bytes
from tests.common import ROOT

pytestmark = pytest.mark.privileged

EXAMPLE_COLLECTOR = ROOT / "examples" / "collector.toml"
TOKEN = "s3cret"
PREFIX = f"sdta-lt{os.getpid() % 10000}-"


def small_config(tmp_path) -> CollectorConfig:
    config = CollectorConfig.from_toml(EXAMPLE_COLLECTOR)
    for structure in config.structures:
        if structure.primitive is not DtaOpcode.SKETCH_MERGE:
            structure.slots = 4096
    return replace(config, data_dir=tmp_path / "regions", token=TOKEN, translate_locally=True)


def test_reports_to_the_responder_land_in_memory_and_answer_queries(tmp_path):
    config = small_config(tmp_path)
    collector = Collector(config, XdpBackend.for_config(config))
    link = LocalLink(collector)
    try:
        reporter = ReporterAddress(mac_bytes("02:00:00:00:09:01"), ip_bytes("10.77.9.1"), config.mac, config.ip)
        reports = workload.key_write(300, 1, redundancy=2) + workload.key_increment(50, 2)
        for report in reports:
            assert collector.backend.responder.process(reporter.frame(report)).replies == []
        assert collector.counters()["executed"] == 2 * len(reports)
        written = [r for r in reports if r.opcode is DtaOpcode.KEY_WRITE]
        answer = key_write_query(collector.structure_region(DtaOpcode.KEY_WRITE, config.ip),
                                 [r.key for r in written], redundancy=2, key_hash=KeyHash.INDEPENDENT)
        assert answer.found.mean() > 0.97
    finally:
        link.close()
        collector.close()
    reopened = Collector(config, XdpBackend.for_config(config))
    try:
        region = reopened.regions["key-write"].view
        assert region.any() and region.tobytes() == (config.data_dir / "key-write.region").read_bytes()
    finally:
        reopened.close()


def collector_http(path: str, body: dict | None = None) -> dict:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    data = json.dumps(body).encode() if body else None
    with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:8041{path}", data=data, headers=headers),
                                timeout=10) as response:
        return json.loads(response.read())


def test_collector_up_translate_locally_takes_reports_from_the_wire_on_every_rx_queue(tmp_path):
    """From a clean subprocess, on an interface with two RX queues: reports sent from XDP on each CPU of the far
    end arrive on that CPU's queue (veth), each queue translates through its own queue pairs, and every report
    is written into the collector's memory: its /stats count each copy executed, and a Key-Write query finds
    them all."""
    cleanup_prefix(PREFIX)
    collector_ns, reporter_ns = Namespace.create(PREFIX + "c"), Namespace.create(PREFIX + "r")
    process = None
    try:
        veth_pair(reporter_ns, "r0", collector_ns, "c0", mac_b="02:5d:7a:00:01:01", queues=2)
        address(reporter_ns, "r0", "10.77.9.1/16")
        address(collector_ns, "c0", "10.77.1.1/16")
        text = EXAMPLE_COLLECTOR.read_text().replace('interface = ""', 'interface = "c0"')
        text = text.replace('data_dir = "c1-data"', 'data_dir = "regions"').replace("change-me", TOKEN)
        text = text.replace("slots = 131072", "slots = 4096").replace("slots = 65536", "slots = 4096")
        text = text.replace("slots = 32768", "slots = 4096").replace("query_port = 8040", "query_port = 8041")
        (tmp_path / "collector.toml").write_text(text)
        env = {key: value for key, value in os.environ.items() if key in ("PATH", "HOME", "PYTHONPATH")}
        process = subprocess.Popen([sys.executable, "-m", "softdta.cli", "collector", "up", "--config",
                                    str(tmp_path / "collector.toml"), "--netns", collector_ns.name,
                                    "--translate-locally"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env)
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "the collector did not come up within 30 s"
            if select.select([process.stdout], [], [], 0.2)[0] and " up: " in process.stdout.readline():
                break
            assert process.poll() is None, f"the collector exited: {process.stderr.read()}"
        reports = [dta.key_write(key.to_bytes(4, "big"), (key * 7).to_bytes(4, "big"), 2) for key in range(1, 401)]
        reporter = ReporterAddress(mac_bytes("02:00:00:00:09:01"), ip_bytes("10.77.9.1"),
                                   mac_bytes("02:5d:7a:00:01:01"), ip_bytes("10.77.1.1"))
        frames = [reporter.frame(report) for report in reports]
        assert len(os.sched_getaffinity(0)) >= 2, "a veth's XDP transmit picks the RX queue by CPU: needs two"
        for queue, part in enumerate((frames[:200], frames[200:])):
            with FrameSender("r0", reporter_ns.name, cpu=sorted(os.sched_getaffinity(0))[queue]) as sender:
                sender.send(part)
        with in_netns(collector_ns.name):
            deadline = time.monotonic() + 20
            while (stats := collector_http("/stats"))["responder"].get("executed", 0) < 2 * len(reports):
                assert time.monotonic() < deadline, f"not every copy executed within 20 s: {stats['responder']}"
                time.sleep(0.05)
            answer = collector_http("/key-write/key-write@10.77.1.1",
                                    {"keys": [r.key.hex() for r in reports], "redundancy": 2})
        assert stats["responder"]["executed"] == 2 * len(reports), stats["responder"]
        assert answer["found"] >= 0.97 * len(reports), answer
    finally:
        if process is not None and process.poll() is None:
            process.terminate()
            process.wait(20)
        cleanup_prefix(PREFIX)
