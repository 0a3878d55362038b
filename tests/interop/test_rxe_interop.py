"""softdta against the Linux kernel's own soft-RoCE: the XDP translator's frames land in rdma_rxe memory.

The collector runs in the QEMU guest on the `verbs` backend (pyverbs on rxe0), started as users start it. On the
host, the translator takes its tables from that collector over the control protocol, the XDP program translates
the reports (BPF_PROG_TEST_RUN: the program's own output frames), and the frames go out of the tap to rxe. rxe's
ACKs and NAKs come back through the same XDP program. Queries over the collector's HTTP API must give exactly
what the reference model predicts.
"""

import json
import socket
import time
import urllib.request
from dataclasses import replace

import numpy as np
import pytest

from softdta.core import workload
from softdta.core.offline import OfflineCollector
from softdta.core.primitives.append.queries import AppendPoller
from softdta.core.primitives.append.region import AppendRegion
from softdta.core.primitives.key_increment.queries import keyincrement_query
from softdta.core.primitives.key_write.queries import key_write_query
from softdta.core.primitives.postcarding.queries import postcard_query
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.engines.xdp import XdpTranslator
from softdta.kernel.netns import in_netns
from softdta.lab import rxe as rxe_lab
from softdta.links.control import CollectorLinks
from softdta.spec import DtaOpcode, TranslatorCounter, Transport
from softdta.wire import dta
from softdta.wire.frames import ip_bytes, mac_bytes
from tests.common import Link

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
                   "--config /tmp/collector.toml --query-host 0.0.0.0 > /tmp/collector.log 2>&1 & "
                   "echo $! > /tmp/collector.pid")
    deadline = time.monotonic() + 60
    while "collector rxe up" not in guest.run("cat /tmp/collector.log")[1]:
        assert time.monotonic() < deadline, guest.run("cat /tmp/collector.log")[1]
        time.sleep(0.5)
    translator = {"mac": guest.host_mac, "ip": guest.host_ip.split("/")[0], "ack_request_interval": 4,
                  "grace_ms": 50.0}
    with in_netns(guest.namespace.name):  # the links' thread is created here, so it lives in the lab namespace
        links = CollectorLinks(translator, [(guest.guest_ip, 40050)], TOKEN)
        tables = links.start(timeout=30)
    # One translator for the module: its QPs' PSNs carry on from test to test, like the collector's.
    with XdpTranslator(tables, flush_idle_ns=0) as kernel:
        yield Rig(guest, links, tables, kernel, Link(guest))
    links.close()
    guest.run("kill $(cat /tmp/collector.pid); sleep 1")


class Rig:
    def __init__(self, guest, links, tables, kernel, link):
        self.guest, self.links, self.tables, self.kernel, self.link = guest, links, tables, kernel, link
        self.ip = tables.qps[0].collector_ip
        self.reporter = workload.ReporterAddress(mac_bytes("02:00:00:00:09:01"), ip_bytes("10.77.9.1"),
                                                 tables.mac, self.ip)

    def send(self, report: dta.Report, lose: int | None = None) -> int:
        """Translate one report and send its frames to rxe (all but frame `lose`); rxe's replies go back."""
        out = self.kernel.process(self.reporter.frame(report))
        for index, frame in enumerate(out.frames):
            if index != lose:
                self.guest.send(frame)
            time.sleep(0.002)  # the guest is emulated (TCG): give rxe time
        self.replies()
        return len(out.frames)

    def replies(self, wait: float = 0.0) -> None:
        for reply in self.link.collect(wait):
            self.kernel.process(reply)

    def qp_state(self, primitive: DtaOpcode) -> dict:
        return self.kernel.qp_state(self.tables.structure(self.ip, primitive).qp)


def http(guest, path: str, body: dict | None = None) -> dict:
    with in_netns(guest.namespace.name):
        request = urllib.request.Request(f"http://{guest.guest_ip}:8040{path}",
                                         data=json.dumps(body).encode() if body else None,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())


# every frame the translator emits
FRAMES_OUT = (TranslatorCounter.TX_FRAMES, TranslatorCounter.APPEND_FLUSHES, TranslatorCounter.POSTCARD_FLUSHES)
REPLIES_IN = (TranslatorCounter.RX_ACKS, TranslatorCounter.RX_NAK_SEQUENCE, TranslatorCounter.RX_NAK_FATAL)


class Balance:
    """TranslatorCounter movements since it was made, on both sides: rxe's hw_counters and the translator's counters."""

    def __init__(self, rig):
        self.rig = rig
        self.rxe, self.translator = rig.guest.hw_counters(), rig.kernel.counters()

    def since(self) -> tuple[dict[str, int], dict[TranslatorCounter, int]]:
        rxe, translator = self.rig.guest.hw_counters(), self.rig.kernel.counters()
        return ({name: rxe[name] - self.rxe.get(name, 0) for name in rxe},
                {counter: translator.get(counter, 0) - self.translator.get(counter, 0)
                 for counter in TranslatorCounter})


def emitted(translator: dict[TranslatorCounter, int]) -> int:
    return sum(translator[counter] for counter in FRAMES_OUT)


def replies_seen(translator: dict[TranslatorCounter, int]) -> int:
    return sum(translator[counter] for counter in REPLIES_IN)


def assert_psns_agree(rig) -> None:
    """Every QP: the translator's next PSN is the PSN rxe expects (rq_psn, read by the collector's backend)."""
    qps = http(rig.guest, "/health")["qps"]
    for qp in rig.tables.qps:
        assert rig.kernel.qp_state(qp)["next_psn"] == qps[f"{qp.remote_qpn:#x}"]["expected_psn"], qp.name


def reports_of_every_primitive(tables) -> list[dta.Report]:
    """Key-Write with N = 1..4 and some WRITE-with-Immediate, enough Append entries to wrap every ring (64
    entries per list), Postcarding paths, a sketch epoch."""
    lists = tables.append_lists[0]
    key_writes = [replace(report, redundancy=1 + index % 4, immediate=index % 5 == 0)
                  for index, report in enumerate(workload.key_write(150, 1, 2))]
    return (key_writes + workload.key_increment(150, 2, 2, flows=30)
            + workload.append(lists.lists * 80, 3, lists.lists, lists.first_list)
            + workload.postcards(30, 4, 5, SWITCH_IDS) + workload.sketch_epoch(1, 16, 4, 5))


def test_every_primitive_lands_in_rxe_and_answers_like_the_reference(guest, collector):
    rig = collector
    tables, kernel = rig.tables, rig.kernel
    assert {qp.transport for qp in tables.qps} == {Transport.RC, Transport.UC}
    reports = reports_of_every_primitive(tables)
    offline_translator, offline = Translator(tables), OfflineCollector(tables)
    balance = Balance(rig)
    sent = 0
    for report in reports:
        sent += rig.send(report)
        for frame in offline_translator.process(rig.reporter.frame(report)).frames:
            offline.deliver(frame)
    for frame in kernel.flush():
        guest.send(frame)
        sent += 1
    for frame in offline_translator.flush_idle(0):
        offline.deliver(frame)
    time.sleep(1.0)
    rig.replies(wait=0.5)
    rxe, translator = balance.since()
    assert sent == emitted(translator) == rxe["rcvd_pkts"], "every frame emitted reached rxe"
    assert translator[TranslatorCounter.RX_ACKS] > 0, "rxe acknowledged the RC writes and Fetch&Adds"
    assert rxe["sent_pkts"] == replies_seen(translator) == translator[TranslatorCounter.RX_ACKS], \
        "no NAK, every ACK seen"
    assert rxe["out_of_seq_request"] == rxe["duplicate_request"] == rxe["send_rnr_err"] == 0
    assert_psns_agree(rig)

    ip = rig.ip
    kw_reports = [r for r in reports if r.opcode is DtaOpcode.KEY_WRITE]
    kw = tables.structure(ip, DtaOpcode.KEY_WRITE)
    expected = key_write_query(offline.structure_region(DtaOpcode.KEY_WRITE, ip), [r.key for r in kw_reports], 4,
                              key_hash=kw.key_hash)
    answer = http(guest, f"/key-write/key-write@{guest.guest_ip}", {"keys": [r.key.hex() for r in kw_reports],
                                                                   "redundancy": 4})
    got = [row["value"] for row in answer["results"]]
    predicted = [f"{int(v):08x}" if found else None for v, found in zip(expected.values, expected.found)]
    assert got == predicted

    ki = tables.structure(ip, DtaOpcode.KEY_INCREMENT)
    flows = sorted({r.key for r in reports if r.opcode is DtaOpcode.KEY_INCREMENT})
    expected_counts = keyincrement_query(offline.structure_region(DtaOpcode.KEY_INCREMENT, ip), flows, 2, ki.key_hash)
    answer = http(guest, f"/key-increment/key-increment@{guest.guest_ip}", {"keys": [k.hex() for k in flows],
                                                                           "redundancy": 2})
    assert [row["count"] for row in answer["results"]] == expected_counts.tolist()

    lists = tables.append_lists[0]
    entries = http(guest, f"/append/append{lists.first_list}@{guest.guest_ip}")["lists"]
    # rxe counts no writes per ring, so its service reads a lapped ring as a poller without the counts does
    offline_entries = AppendPoller(AppendRegion(offline.region_of(lists.qp), lists)).poll()
    assert {int(k): v["entries"] for k, v in entries.items()} == {k: v.tolist() for k, v in offline_entries.items()}

    keys = sorted({r.key for r in reports if r.opcode is DtaOpcode.POSTCARDING})
    decoded = postcard_query(offline.structure_region(DtaOpcode.POSTCARDING, ip), keys, SWITCH_IDS)
    answer = http(guest, f"/postcarding/postcarding@{guest.guest_ip}", {"keys": [k.hex() for k in keys],
                                                                        "value_set": SWITCH_IDS})
    assert [row["complete"] for row in answer["results"]] == decoded.complete.tolist()
    assert all(decoded.complete)

    matrix = np.array(http(guest, f"/sketch-merge/sketch-merge@{guest.guest_ip}")["matrix"])
    assert (matrix == offline.structure_region(DtaOpcode.SKETCH_MERGE, ip).matrix().T).all()

    offline_completions = [(c.immediate, c.byte_len) for _, c in offline.completion_log.since(0)]
    assert len(offline_completions) == sum(r.redundancy for r in kw_reports if r.immediate) > 0
    logged = http(guest, "/completions?since=0")
    assert logged["total"] == len(offline_completions), "every WRITE with Immediate completed in rxe"
    assert sorted((c["immediate"], c["byte_len"]) for c in logged["completions"]) == sorted(offline_completions)


def fresh_keys(seed: int, count: int) -> list[bytes]:
    """Distinct 4-byte keys no other test of this module uses."""
    return [report.key for report in workload.key_write(count, seed, 1)]


def counts(rig, keys: list[bytes]) -> list[int]:
    answer = http(rig.guest, f"/key-increment/key-increment@{rig.guest.guest_ip}",
                  {"keys": [k.hex() for k in keys], "redundancy": 2})
    return [row["count"] for row in answer["results"]]


def test_a_lost_rc_frame_is_nakked_resynced_and_traffic_recovers(collector):
    rig = collector
    balance = Balance(rig)
    lost_flow = fresh_keys(41, 1)
    rig.send(dta.key_increment(lost_flow[0], 5, 2), lose=0)  # copy 0 never reaches rxe; copy 1 is out of sequence
    after_gap = fresh_keys(42, 5)
    for key in after_gap:  # rxe's NAK is back: these come in the grace period, and the translator drops them
        rig.send(dta.key_increment(key, 1, 2))
    time.sleep(0.5)
    rig.replies(wait=0.5)
    rxe, translator = balance.since()
    assert translator[TranslatorCounter.RX_NAK_SEQUENCE] == rxe["out_of_seq_request"] == 1
    assert translator[TranslatorCounter.DROP_GRACE] == len(after_gap)
    time.sleep(0.1)  # the grace period (50 ms) ends
    recovered = fresh_keys(43, 10)
    for key in recovered:
        rig.send(dta.key_increment(key, 7, 2))
    time.sleep(0.5)
    rig.replies(wait=0.5)
    assert rig.qp_state(DtaOpcode.KEY_INCREMENT)["state"] == 0  # active
    assert counts(rig, recovered) == [7] * len(recovered)
    assert counts(rig, lost_flow + after_gap) == [0] * 6

    rxe, translator = balance.since()
    reports = translator[TranslatorCounter.RX_REPORTS]
    assert reports == 1 + len(after_gap) + len(recovered) and translator[TranslatorCounter.DROP_GRACE] == len(after_gap)
    assert emitted(translator) == 2 * (reports - len(after_gap)), "N=2: two Fetch&Adds per report not dropped"
    assert rxe["rcvd_pkts"] == emitted(translator) - 1, "all but the frame our drop stage lost reached rxe"
    # rxe answered the out-of-sequence copy with one NAK and executed the rest: one Atomic ACK each
    assert rxe["sent_pkts"] == replies_seen(translator) == 1 + 2 * len(recovered) \
        == translator[TranslatorCounter.RX_ACKS] + 1
    assert rxe["duplicate_request"] == 0
    assert_psns_agree(rig)


def test_a_lost_uc_frame_loses_only_that_write(collector):
    rig = collector
    balance = Balance(rig)
    keys = fresh_keys(51, 12)
    for index, key in enumerate(keys):
        rig.send(dta.postcard(key, 1, 10 + index, path_length=1, extended=True), lose=0 if index == 3 else None)
    time.sleep(0.5)
    answer = http(rig.guest, f"/postcarding/postcarding@{rig.guest.guest_ip}",
                  {"keys": [k.hex() for k in keys], "value_set": list(range(1, 64))})
    delivered = [row["path"][0] == 10 + index for index, row in enumerate(answer["results"])]
    assert delivered == [index != 3 for index in range(len(keys))]
    rxe, translator = balance.since()
    assert emitted(translator) == 12 and rxe["rcvd_pkts"] == 11, "UC: no stall, nothing else lost"
    assert rxe["sent_pkts"] == replies_seen(translator) == 0 and rxe["out_of_seq_request"] == 0
    assert_psns_agree(rig)  # rxe's UC responder takes up the sequence at the next message


def test_a_wrong_rkey_fails_the_qp_and_the_collector_recreates_it(collector):
    rig = collector
    kw = rig.tables.structure(rig.ip, DtaOpcode.KEY_WRITE)
    balance = Balance(rig)
    rig.kernel.apply(_tables_with_rkey(rig, kw.qp.name, kw.qp.rkey ^ 0x5A5A))
    rig.send(dta.key_write(fresh_keys(61, 1)[0], 1, 2))
    time.sleep(0.5)
    rig.replies(wait=0.5)
    assert rig.qp_state(DtaOpcode.KEY_WRITE)["state"] == 2  # failed, after rxe's remote access NAK
    rxe, translator = balance.since()
    assert translator[TranslatorCounter.RX_NAK_FATAL] == 1 and rxe["sent_pkts"] == replies_seen(translator) == 1
    rig.tables = rig.links.updates.get(timeout=15)  # re-created by the collector, re-advertised
    new_qp = rig.tables.structure(rig.ip, DtaOpcode.KEY_WRITE).qp
    assert new_qp.remote_qpn != kw.qp.remote_qpn
    rig.kernel.apply(rig.tables)
    assert rig.qp_state(DtaOpcode.KEY_WRITE)["state"] == 0
    keys = fresh_keys(62, 20)
    for index, key in enumerate(keys):
        rig.send(dta.key_write(key, 1000 + index, 2))
    time.sleep(0.5)
    rig.replies(wait=0.5)
    answer = http(rig.guest, f"/key-write/key-write@{rig.guest.guest_ip}", {"keys": [k.hex() for k in keys],
                                                                           "redundancy": 2})
    assert [row["value"] for row in answer["results"]] == [f"{1000 + i:08x}" for i in range(len(keys))]
    rxe, translator = balance.since()
    # copy 1 with the wrong R_Key reached a QP already in ERROR: rxe discards it before counting it
    assert emitted(translator) == 2 + 40 and rxe["rcvd_pkts"] == 1 + 40
    assert rxe["sent_pkts"] == replies_seen(translator)
    assert_psns_agree(rig)


def _tables_with_rkey(rig, qp_name: str, rkey: int) -> Tables:
    """The tables the collector advertised, but one QP with a wrong R_Key (an operator's mistake)."""
    document = rig.links.document()
    for entry in document["structures"] + document["append"]:
        if entry["qp"]["name"] == qp_name:
            entry["qp"]["rkey"] = rkey
    return Tables.from_dict(document)


def test_two_rx_queues_write_through_their_own_queue_pairs_into_one_rxe_region(collector):
    """A translator with two RX queues asks the verbs collector for two queue pairs per structure, over the one
    region it registered: rxe takes each queue's writes in PSN order on that queue's QP. (Last in the module:
    its session shares the translator's IP with the module's links.)"""
    rig = collector
    guest = rig.guest
    translator = {"mac": guest.host_mac, "ip": guest.host_ip.split("/")[0], "ack_request_interval": 4,
                  "grace_ms": 50.0}
    with in_netns(guest.namespace.name):
        links = CollectorLinks(translator, [(guest.guest_ip, 40050)], TOKEN, first_qpn=0x8000, queues=2)
        tables = links.start(timeout=30)
        guest.namespace.run("ip", "link", "add", "mq0", "numrxqueues", "2", "numtxqueues", "2", "type", "veth",
                            "peer", "mq1")
        ifindex = socket.if_nametoindex("mq0")
    kernel = XdpTranslator(tables, flush_idle_ns=0)
    try:
        assert tables.queue_limit()[0] == 2
        for owner in tables.structures + tables.append_lists:
            first, second = owner.qps
            assert (first.rkey, first.base_va) == (second.rkey, second.base_va) and \
                first.remote_qpn != second.remote_qpn
        reference, balance = Translator(tables), Balance(rig)
        keys = fresh_keys(71, 60)
        reports = [dta.key_write(key, 2000 + index, 2) for index, key in enumerate(keys)] + \
            [dta.key_increment(key, 3, 2) for key in keys[:20]]
        sent = 0
        with in_netns(guest.namespace.name):
            for index, report in enumerate(reports):
                frame, queue = rig.reporter.frame(report), index % 2
                out = kernel.process(frame, queue=queue, ifindex=ifindex)
                assert out.frames == reference.process(frame, 0, queue).frames
                for emitted_frame in out.frames:
                    guest.send(emitted_frame)
                    sent += 1
                    time.sleep(0.002)  # the guest is emulated (TCG): give rxe time
                for reply in rig.link.collect():
                    kernel.process(reply)
        for reply in rig.link.collect(wait=0.5):
            kernel.process(reply)
        rxe = {name: count - balance.rxe.get(name, 0) for name, count in guest.hw_counters().items()}
        counters = kernel.counters()
        assert sent == counters[TranslatorCounter.TX_FRAMES] == rxe["rcvd_pkts"]
        assert rxe["out_of_seq_request"] == rxe["duplicate_request"] == 0
        assert counters[TranslatorCounter.RX_ACKS] > 0
        assert not counters[TranslatorCounter.RX_NAK_SEQUENCE] + counters[TranslatorCounter.RX_NAK_FATAL]
        kw, ki = tables.structure(rig.ip, DtaOpcode.KEY_WRITE), tables.structure(rig.ip, DtaOpcode.KEY_INCREMENT)
        assert all(kernel.qp_state(qp)["frames_sent"] for qp in kw.qps + ki.qps), "both queues wrote"
        expected = {qp.remote_qpn: kernel.qp_state(qp)["next_psn"] for qp in tables.qps}
        health = http(guest, "/health")["qps"]
        assert all(health[f"{qpn:#x}"]["expected_psn"] == psn for qpn, psn in expected.items())
        answer = http(guest, f"/key-write/key-write@{guest.guest_ip}", {"keys": [k.hex() for k in keys],
                                                                       "redundancy": 2})
        assert [row["value"] for row in answer["results"]] == [f"{2000 + i:08x}" for i in range(len(keys))]
        assert counts(rig, keys[:20]) == [3] * 20  # +3 in each of a key's two slots; a query takes the smaller
    finally:
        kernel.close()
        links.close()
        guest.namespace.run("ip", "link", "del", "mq0", check=False)
