"""`softdta collector up --translate-locally`: the collector takes DTA reports itself, and its queries,
persistence and metrics see them as they see the translator's writes."""

import json
import os
import select
import socket
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
from softdta.kernel.netns import Namespace, address, cleanup_prefix, in_netns, veth_pair
from softdta.links.local import LocalLink
from softdta.spec import DTA_PORT, DtaOpcode, KeyHash
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


def test_collector_up_translate_locally_takes_reports_from_the_wire(tmp_path):
    """From a clean subprocess: reports sent over UDP to the collector's interface are written into its memory;
    its /stats count them executed and a Key-Write query finds them."""
    cleanup_prefix(PREFIX)
    collector_ns, reporter_ns = Namespace.create(PREFIX + "c"), Namespace.create(PREFIX + "r")
    process = None
    try:
        veth_pair(reporter_ns, "r0", collector_ns, "c0", mac_b="02:5d:7a:00:01:01")
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
        reports = [dta.key_write(key.to_bytes(4, "big"), (key * 7).to_bytes(4, "big"), 2) for key in range(1, 201)]
        with in_netns(reporter_ns.name):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
                for report in reports:
                    sender.sendto(dta.encode(report), ("10.77.1.1", DTA_PORT))
                    time.sleep(0.0005)
        time.sleep(0.5)
        with in_netns(collector_ns.name):
            headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
            with urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8041/stats", headers=headers),
                                        timeout=10) as response:
                stats = json.loads(response.read())
            body = json.dumps({"keys": [r.key.hex() for r in reports], "redundancy": 2}).encode()
            with urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8041/key-write/key-write@10.77.1.1",
                                                               data=body, headers=headers), timeout=10) as response:
                answer = json.loads(response.read())
        assert json.dumps(stats).count("executed"), stats
        assert answer["found"] >= 0.97 * len(reports), answer
    finally:
        if process is not None and process.poll() is None:
            process.terminate()
            process.wait(20)
        cleanup_prefix(PREFIX)
