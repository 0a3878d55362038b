"""softdta against the Linux kernel's own soft-RoCE: the XDP translator's frames land in rdma_rxe memory.

The collector runs in the QEMU guest on the `verbs` backend (pyverbs on rxe0), started as users start it. On the
host, the translator takes its tables from that collector over the control protocol, the XDP program translates
the reports (BPF_PROG_TEST_RUN: the program's own output frames), and the frames go out of the tap to rxe. rxe's
ACKs and NAKs come back through the same XDP program. Queries over the collector's HTTP API must give exactly
what the reference model predicts.
"""

import json
import select
import socket
import time
import urllib.request

import numpy as np
import pytest

from softdta import dta, rxe_lab, workload
from softdta.collector.control import CollectorLinks
from softdta.frames import ip_bytes, mac_bytes
from softdta.netns import in_netns
from softdta.offline import OfflineCollector
from softdta.query import keyincrement_query, keywrite_query, postcard_query
from softdta.spec import Counter, DtaOpcode, Primitive, Transport
from softdta.translator import Translator
from softdta.xdp import XdpTranslator

pytestmark = [pytest.mark.interop, pytest.mark.privileged]

TOKEN = "interop"
SWITCH_IDS = list(range(1, 257))
COLLECTOR_CONFIG = """
[collector]
name = "rxe"
ip = "{ip}"
mac = "{mac}"
backend = "verbs"
data_dir = "/dev/shm/softdta"
token = "{token}"

[[structures]]
primitive = "key-write"
slots = 4096
transport = "rc"
hash = "independent"

[[structures]]
primitive = "key-increment"
slots = 4096
hash = "independent"

[[structures]]
primitive = "postcarding"
slots = 4096
hops = 5

[[structures]]
primitive = "sketch-merge"
slots = 16
rows = 4
reporters = 1
batch = 4

[[append]]
lists = 8
entries = 64
batch = 4
"""


def checked(guest, command, timeout=60.0):
    status, output = guest.run(command, timeout)
    assert status == 0, f"{command!r} exited {status}:\n{output}"
    return output


@pytest.fixture(scope="module")
def collector(guest):
    """`softdta collector up` on the verbs backend in the guest, and the translator's links to it."""
    config = COLLECTOR_CONFIG.format(ip=guest.guest_ip, mac=rxe_lab.GUEST_MAC, token=TOKEN)
    checked(guest, f"mkdir -p /dev/shm/softdta && cat > /tmp/collector.toml <<'EOF'\n{config}\nEOF")
    checked(guest, f"cd /tmp && PYTHONPATH={rxe_lab.GUEST_PYTHONPATH} python3 -m softdta.cli collector up "
                   "--config /tmp/collector.toml --query-host 0.0.0.0 > /tmp/collector.log 2>&1 &")
    deadline = time.monotonic() + 60
    while "collector rxe up" not in guest.run("cat /tmp/collector.log")[1]:
        assert time.monotonic() < deadline, guest.run("cat /tmp/collector.log")[1]
        time.sleep(0.5)
    translator = {"mac": guest.host_mac, "ip": guest.host_ip.split("/")[0], "ack_request_interval": 4}
    with in_netns(guest.namespace.name):  # the links' thread is created here, so it lives in the lab namespace
        links = CollectorLinks(translator, [(guest.guest_ip, 40050)], TOKEN)
        tables = links.start(timeout=30)
    yield tables
    links.close()
    guest.run("pkill -f 'softdta.cli collector' ; sleep 1")


def http(guest, path: str, body: dict | None = None) -> dict:
    with in_netns(guest.namespace.name):
        request = urllib.request.Request(f"http://{guest.guest_ip}:8040{path}",
                                         data=json.dumps(body).encode() if body else None,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())


class Link:
    """The host end of the tap: frames out to rxe, rxe's replies back in."""

    def __init__(self, guest):
        self.guest = guest
        with in_netns(guest.namespace.name):
            self.replies = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
            self.replies.bind((rxe_lab.TAP, 0))

    def collect(self, wait: float = 0.0) -> list[bytes]:
        frames = []
        while select.select([self.replies], [], [], wait)[0]:
            frame = self.replies.recv(4096)
            if len(frame) > 42 and frame[36:38] == (4791).to_bytes(2, "big") and frame[0:6] == mac_bytes(
                    self.guest.host_mac):
                frames.append(frame)
            wait = 0.05
        return frames


def reports_of_every_primitive(tables) -> list[dta.Report]:
    lists = tables.append_lists[0]
    return (workload.key_write(150, 1, 2) + workload.key_increment(150, 2, 2, flows=30)
            + workload.append(120, 3, lists.lists, lists.first_list) + workload.postcards(30, 4, 5, SWITCH_IDS)
            + workload.sketch_epoch(1, 16, 4, 5))


def test_every_primitive_lands_in_rxe_and_answers_like_the_reference(guest, collector):
    tables = collector
    assert {qp.transport for qp in tables.qps} == {Transport.RC, Transport.UC}
    reporter = workload.ReporterAddress(mac_bytes("02:00:00:00:09:01"), ip_bytes("10.77.9.1"), tables.mac,
                                        tables.qps[0].collector_ip)
    reports = reports_of_every_primitive(tables)
    offline_translator, offline = Translator(tables), OfflineCollector(tables)
    link = Link(guest)
    before = guest.hw_counters()
    sent = 0
    with XdpTranslator(tables, flush_idle_ns=0) as kernel:
        for report in reports:
            frame = reporter.frame(report)
            out = kernel.process(frame)
            for emitted in out.frames:
                guest.send(emitted)
                sent += 1
                time.sleep(0.002)  # the guest is emulated (TCG): give rxe time
            for emitted in offline_translator.process(frame).frames:
                offline.deliver(emitted)
            for reply in link.collect():
                kernel.process(reply)
        for emitted in kernel.flush():
            guest.send(emitted)
            sent += 1
        for emitted in offline_translator.flush_idle(0):
            offline.deliver(emitted)
        time.sleep(1.0)
        for reply in link.collect(wait=0.5):
            kernel.process(reply)
        counters = kernel.counters()
    after = guest.hw_counters()
    assert counters[Counter.RX_ACKS] > 0, "rxe acknowledged the RC writes and Fetch&Adds"
    assert counters.get(Counter.RX_NAK_SEQUENCE, 0) == 0 and counters.get(Counter.RX_NAK_FATAL, 0) == 0
    assert after.get("out_of_seq_request", 0) == before.get("out_of_seq_request", 0)

    ip = tables.qps[0].collector_ip
    kw_reports = [r for r in reports if r.opcode is DtaOpcode.KEY_WRITE]
    kw = tables.structure(ip, Primitive.KEY_WRITE)
    expected = keywrite_query(offline.structure_region(Primitive.KEY_WRITE, ip), [r.key for r in kw_reports], 2,
                              key_hash=kw.key_hash)
    answer = http(guest, f"/keywrite/key-write@{guest.guest_ip}", {"keys": [r.key.hex() for r in kw_reports],
                                                                   "redundancy": 2})
    got = [row["value"] for row in answer["results"]]
    predicted = [f"{int(v):08x}" if found else None for v, found in zip(expected.values, expected.found)]
    assert got == predicted

    ki = tables.structure(ip, Primitive.KEY_INCREMENT)
    flows = sorted({r.key for r in reports if r.opcode is DtaOpcode.KEY_INCREMENT})
    expected_counts = keyincrement_query(offline.structure_region(Primitive.KEY_INCREMENT, ip), flows, 2, ki.key_hash)
    answer = http(guest, f"/keyincrement/key-increment@{guest.guest_ip}", {"keys": [k.hex() for k in flows],
                                                                           "redundancy": 2})
    assert [row["count"] for row in answer["results"]] == expected_counts.tolist()

    entries = http(guest, f"/append/append{tables.append_lists[0].first_list}@{guest.guest_ip}")["lists"]
    offline_entries = offline.append_pollers[0].poll()
    assert {int(k): v["entries"] for k, v in entries.items()} == {k: v.tolist() for k, v in offline_entries.items()}

    keys = sorted({r.key for r in reports if r.opcode is DtaOpcode.POSTCARDING})
    decoded = postcard_query(offline.structure_region(Primitive.POSTCARDING, ip), keys, SWITCH_IDS)
    answer = http(guest, f"/postcarding/postcarding@{guest.guest_ip}", {"keys": [k.hex() for k in keys],
                                                                        "value_set": SWITCH_IDS})
    assert [row["complete"] for row in answer["results"]] == decoded.complete.tolist()
    assert all(decoded.complete)

    matrix = np.array(http(guest, f"/sketch/sketch-merge@{guest.guest_ip}")["matrix"])
    assert (matrix == offline.structure_region(Primitive.SKETCH_MERGE, ip).matrix().T).all()
    assert after["rcvd_pkts"] - before["rcvd_pkts"] >= sent
