"""The collector: configuration, the xdp backend with its region files, advertisements that become translator
tables, and the control protocol over loopback with a real client."""

import asyncio
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import replace

import numpy as np
import pytest

from softdta.collector import service
from softdta.collector.backend import BackendError, Peer
from softdta.collector.collector import RELEASE_GRACE_S, Collector, tables_document
from softdta.collector.config import CollectorConfig
from softdta.collector.control import ControlError, ControlServer, cancel_tasks, fetch_advertisements, receive, send
from softdta.collector.xdp_backend import XdpBackend, pin_dir_for
from softdta.core import workload
from softdta.core.primitives.key_increment.queries import keyincrement_query
from softdta.core.primitives.key_write.queries import key_write_query
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.core.workload import ReporterAddress
from softdta.engines.python import STEER_SOURCE
from softdta.engines.xdp import build_object
from softdta.kernel.bpf import BpfObject, attach_xdp, ensure_bpffs
from softdta.kernel.netns import Namespace, address, cleanup_prefix, in_netns, veth_pair
from softdta.links.control import CollectorLinks, secrets_file_for
from softdta.spec import ACK_SYNDROME, MAX_REDUNDANCY, ROCE_PORT, DtaOpcode, KeyHash, ResponderCounter, RoceOpcode
from softdta.wire import dta
from softdta.wire.codec import WireError
from softdta.wire.frames import UdpEndpoints, ip_bytes, ip_str, mac_bytes
from softdta.wire.roce import build_roce_frame, parse_roce, transport_payload
from tests.common import ROOT

pytestmark = pytest.mark.privileged

EXAMPLE_COLLECTOR = ROOT / "examples" / "collector.toml"
TRANSLATOR = {"mac": "02:5d:7a:00:00:01", "ip": "10.77.0.1", "profile": "dta-v1", "grace_ms": 1.0}
TOKEN = "s3cret"


def small_config(tmp_path, **changes) -> CollectorConfig:
    config = CollectorConfig.from_toml(EXAMPLE_COLLECTOR)
    config.data_dir = tmp_path / "regions"
    config.token = TOKEN
    for structure in config.structures:
        if structure.primitive is not DtaOpcode.SKETCH_MERGE:
            structure.slots = 4096
    return replace(config, **changes)


def open_collector(config: CollectorConfig) -> Collector:
    return Collector(config, XdpBackend.for_config(config))


def test_translator_frames_land_in_collector_memory_and_answer_queries(tmp_path):
    config = small_config(tmp_path)
    collector = open_collector(config)
    try:
        translator_ip = ip_bytes(TRANSLATOR["ip"])
        adverts = [collector.connect(name, Peer(translator_ip, mac_bytes(TRANSLATOR["mac"]), 0x1000 + i, 77 * i))
                   for i, name in enumerate(sorted(collector.specs))]
        tables = Tables.from_dict(tables_document(TRANSLATOR, {"name": "c1", "ip": "10.77.1.1",
                                                               "mac": "02:5d:7a:00:01:01"}, adverts))
        translator = Translator(tables)
        reporter = ReporterAddress(mac_bytes("02:00:00:00:09:01"), ip_bytes("10.77.9.1"), tables.mac, config.ip)
        responder = collector.backend.responder
        reports = workload.key_write(300, 1, redundancy=2) + workload.key_increment(100, 2, flows=20)
        for report in reports:
            for frame in translator.process(reporter.frame(report)).frames:
                for reply in responder.process(frame).replies:
                    translator.process(reply)
        assert collector.counters()["executed"] == 2 * len(reports)
        written = [r for r in reports if r.opcode is dta.DtaOpcode.KEY_WRITE]
        answer = key_write_query(collector.structure_region(DtaOpcode.KEY_WRITE, config.ip),
                                [r.key for r in written], redundancy=2, key_hash=KeyHash.INDEPENDENT)
        assert answer.found.mean() > 0.97
        counts = keyincrement_query(collector.structure_region(DtaOpcode.KEY_INCREMENT, config.ip),
                                    [r.key for r in reports[300:]], redundancy=2)
        assert (counts >= np.array([r.counter for r in reports[300:]])).all()
    finally:
        collector.close()
    reopened = open_collector(config)
    try:
        region = reopened.regions["key-write"].view
        assert region.any(), "the region file restores the data after a restart"
        assert region.tobytes() == (config.data_dir / "key-write.region").read_bytes()
    finally:
        reopened.close()


class ServerThread:
    """The collector's control server on its own event loop, as `softdta collector up` runs it."""

    def __init__(self, collector: Collector, keepalive_s: float = 0.5, tls=None):
        self.loop = asyncio.new_event_loop()
        self.control = ControlServer(collector, TOKEN, keepalive_s, tls=tls)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self.control.start("127.0.0.1", 0), self.loop).result(5)
        self.port = self.server.sockets[0].getsockname()[1]

    def drop_connections(self) -> None:
        async def drop():
            for writer in list(self.control.sessions.values()):
                writer.close()
        asyncio.run_coroutine_threadsafe(drop(), self.loop).result(5)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(cancel_tasks(), self.loop).result(5)
        self.server.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def test_control_protocol_connects_repairs_and_reconnects(tmp_path):
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)
    links = CollectorLinks(TRANSLATOR, [("127.0.0.1", server.port)], TOKEN, keepalive_s=0.5)
    try:
        tables = links.start(timeout=5)
        assert {s.primitive for s in tables.structures} == set(DtaOpcode) - {DtaOpcode.APPEND}
        assert [a.lists for a in tables.append_lists] == [64]
        ki = tables.structure(ip_bytes("10.77.1.1"), DtaOpcode.KEY_INCREMENT)
        assert ki.qp.remote_qpn in collector.connections
        # A request with a wrong R_Key puts the QP into ERROR; the collector re-creates it and re-advertises.
        responder = collector.backend.responder
        bad = _fetch_add_with_wrong_key(tables, ki)
        assert responder.process(bad).replies and responder.counters()[ResponderCounter.REMOTE_ACCESS_ERRORS] == 1
        updated = links.updates.get(timeout=5)
        ki_after = updated.structure(ip_bytes("10.77.1.1"), DtaOpcode.KEY_INCREMENT)
        assert (ki_after.qp.remote_qpn, ki_after.qp.start_psn) == (ki.qp.remote_qpn, ki.qp.start_psn)
        assert not collector.backend.failed()
        # The connection drops: the translator reconnects and gets the same queue pairs back.
        server.drop_connections()
        again = links.updates.get(timeout=10)
        assert [qp.remote_qpn for qp in again.qps] == [qp.remote_qpn for qp in tables.qps]
    finally:
        links.close()
        server.close()
        collector.close()


def test_new_queue_pairs_start_at_the_translators_psn_and_advertisements_carry_the_expected_psn(tmp_path):
    """One truth for PSNs (docs/protocol.md, 7.3): a queue pair made for a translator expects the PSN that
    translator sends next, and every advertisement, a re-creation's too, says what the queue pair expects now."""
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)
    links = CollectorLinks(TRANSLATOR, [("127.0.0.1", server.port)], TOKEN, keepalive_s=0.5)
    links.report_psns(lambda: {qpn: 1000 + qpn % 0x100 for qpn in range(0x1000, 0x1010)})
    try:
        tables = links.start(timeout=5)
        for qp in tables.qps:
            assert qp.start_psn == 1000 + qp.local_qpn % 0x100 == collector.backend.expected_psn(qp.remote_qpn)
        ki = tables.structure(ip_bytes("10.77.1.1"), DtaOpcode.KEY_INCREMENT)
        responder = collector.backend.responder
        translator = Translator(tables)
        reporter = ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac,
                                   ki.qp.collector_ip)
        for frame in translator.process(reporter.frame(dta.key_increment(7, 1, 2)), 0).frames:
            assert responder.process(frame).replies  # executed and acknowledged
        assert responder.process(_fetch_add_with_wrong_key(tables, ki, sent=2)).replies  # the QP goes to ERROR
        updated = links.updates.get(timeout=5).structure(ip_bytes("10.77.1.1"), DtaOpcode.KEY_INCREMENT)
        assert updated.qp.start_psn == ki.qp.start_psn + 2 == collector.backend.expected_psn(ki.qp.remote_qpn)
    finally:
        links.close()
        server.close()
        collector.close()


def test_a_translator_with_several_rx_queues_gets_a_queue_pair_per_queue_into_each_region(tmp_path):
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)
    links = CollectorLinks(TRANSLATOR, [("127.0.0.1", server.port)], TOKEN, keepalive_s=0.5, queues=3)
    try:
        tables = links.start(timeout=5)
        assert tables.queue_limit()[0] == 3
        for owner in tables.structures + tables.append_lists:
            qps = owner.qps
            assert len({qp.remote_qpn for qp in qps}) == len({qp.local_qpn for qp in qps}) == 3
            assert len({(qp.rkey, qp.base_va, qp.length) for qp in qps}) == 1, "one region, registered once"
            assert all(qp.remote_qpn in collector.connections for qp in qps)
        # queue 2's Key-Increment QP falls into ERROR: the collector re-creates it, and it stays queue 2's
        ki = tables.structure(ip_bytes("10.77.1.1"), DtaOpcode.KEY_INCREMENT)
        bad = _fetch_add_with_wrong_key(tables, ki, queue=2)
        assert collector.backend.responder.process(bad).replies and collector.backend.failed() == [ki.qps[2].remote_qpn]
        updated = links.updates.get(timeout=5)
        assert [qp.local_qpn for qp in updated.qps] == [qp.local_qpn for qp in tables.qps]
        assert not collector.backend.failed()
        # the translator reports queue 1's QP failed: the collector re-creates that one, named by our QPN
        recreated = []
        recreate = collector.recreate
        collector.recreate = lambda session, structure, qpn=None: recreated.append((structure, qpn)) or \
            recreate(session, structure, qpn)
        links.report_failures(lambda: {ki.qps[1].local_qpn})
        updated = links.updates.get(timeout=5)
        assert recreated == [("key-increment", ki.qps[1].local_qpn)]
        assert [qp.local_qpn for qp in updated.qps] == [qp.local_qpn for qp in tables.qps]
        # a reconnect gets every queue's queue pair back, each for its own queue
        links.report_failures(set)
        server.drop_connections()
        again = links.updates.get(timeout=10)
        assert [(qp.local_qpn, qp.remote_qpn) for qp in again.qps] == \
               [(qp.local_qpn, qp.remote_qpn) for qp in updated.qps]
    finally:
        links.close()
        server.close()
        collector.close()


def _fetch_add_with_wrong_key(tables, structure, queue: int = 0, sent: int = 0):
    """A Fetch&Add after `sent` others, with a wrong R_Key: the collector's queue pair goes to ERROR."""
    qp = structure.qps[queue]
    ends = UdpEndpoints(tables.mac, qp.collector_mac, tables.ip, qp.collector_ip, 49152, ROCE_PORT)
    atomic = {"atomic_eth": {"va": qp.base_va, "rkey": qp.rkey ^ 1, "swap_add": 1}}
    return build_roce_frame(ends, transport_payload(RoceOpcode.RC_FETCH_ADD, qp.remote_qpn, qp.start_psn + sent,
                                                    atomic))


def test_wrong_token_and_missing_collector_are_clear_errors(tmp_path):
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)
    try:
        with pytest.raises(ControlError, match="wrong token"):
            CollectorLinks(TRANSLATOR, [("127.0.0.1", server.port)], "guess").start(timeout=5)
    finally:
        server.close()
        collector.close()
    with pytest.raises(ControlError, match="cannot reach collector 127.0.0.1:1.*collector up"):
        CollectorLinks(TRANSLATOR, [("127.0.0.1", 1)], TOKEN).start(timeout=2)


@pytest.fixture
def pki(tmp_path_factory):
    """A CA, a collector certificate for 127.0.0.1, a translator certificate, and a stranger's CA (openssl)."""
    where = tmp_path_factory.mktemp("pki")

    def run(*argv):
        subprocess.run(["openssl", *argv], cwd=where, check=True, capture_output=True)

    for ca in ("ca", "stranger"):
        run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{ca}.key",
            "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN={ca}")
    for name, extension in (("collector", "subjectAltName=IP:127.0.0.1"),
                            ("translator", "extendedKeyUsage=clientAuth")):
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={name}")
        (where / f"{name}.ext").write_text(extension + "\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return where


class RecordingProxy:
    """A TCP relay between translator and collector that keeps every byte it passes: what an on-path
    attacker sees."""

    def __init__(self, port: int):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.seen = bytearray()
        self.target = port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._relay, args=(a, b), daemon=True).start()

    def _relay(self, source, sink):
        try:
            while data := source.recv(65536):
                self.seen += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()


@pytest.mark.parametrize("tls", [False, True])
def test_tls_keeps_the_token_and_the_keys_from_the_wire(tmp_path, pki, tls):
    from softdta.collector.control import client_tls, server_tls
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector, tls=server_tls(str(pki / "collector.pem"), str(pki / "collector.key"))
                          if tls else None)
    proxy = RecordingProxy(server.port)
    links = CollectorLinks(TRANSLATOR, [("127.0.0.1", proxy.port)], TOKEN,
                           tls=client_tls(str(pki / "ca.pem")) if tls else None)
    try:
        tables = links.start(timeout=5)
        secrets = [TOKEN.encode(), b'"rkey"', str(tables.qps[0].rkey).encode(), str(tables.qps[0].base_va).encode()]
        assert all(secret in proxy.seen for secret in secrets) is not tls
        assert any(secret in proxy.seen for secret in secrets) is not tls
    finally:
        links.close()
        proxy.close()
        server.close()
        collector.close()


def test_tls_refuses_strangers_on_both_sides(tmp_path, pki):
    from softdta.collector.control import client_tls, server_tls
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector, tls=server_tls(str(pki / "collector.pem"), str(pki / "collector.key"),
                                                    client_ca=str(pki / "ca.pem")))
    address = [("127.0.0.1", server.port)]
    try:
        with pytest.raises(ControlError, match="TLS with collector 127.0.0.1:.* failed: CERTIFICATE_VERIFY_FAILED"):
            CollectorLinks(TRANSLATOR, address, TOKEN, tls=client_tls(str(pki / "stranger.pem"))).start(timeout=5)
        with pytest.raises(ControlError, match="sent no welcome.*does the collector require TLS"):
            CollectorLinks(TRANSLATOR, address, TOKEN).start(timeout=5)
        with pytest.raises(ControlError, match="TLS with collector|sent no welcome.*translator certificate"):
            CollectorLinks(TRANSLATOR, address, TOKEN, tls=client_tls(str(pki / "ca.pem"))).start(timeout=5)
        tls = client_tls(str(pki / "ca.pem"), str(pki / "translator.pem"), str(pki / "translator.key"))
        links = CollectorLinks(TRANSLATOR, address, TOKEN, tls=tls)
        try:
            assert links.start(timeout=5).qps
        finally:
            links.close()
    finally:
        server.close()
        collector.close()


def test_reports_roundtrip_through_advertised_tables_and_parse(tmp_path):
    """The advertised tables drive the reference translator, whose frames the collector executes verbatim."""
    collector = open_collector(small_config(tmp_path))
    try:
        advert = collector.connect("append0", Peer(ip_bytes("10.77.0.1"), mac_bytes("02:5d:7a:00:00:01"), 0x99, 5))
        tables = Tables.from_dict(tables_document(TRANSLATOR, {"name": "c1", "ip": "10.77.1.1",
                                                               "mac": "02:5d:7a:00:01:01"}, [advert]))
        translator = Translator(tables)
        reporter = ReporterAddress(mac_bytes("02:00:00:00:09:01"), ip_bytes("10.77.9.1"), tables.mac,
                                   ip_bytes("10.77.1.1"))
        frames = [f for value in range(8) for f in translator.process(reporter.frame(dta.append(3, value))).frames]
        assert [parse_roce(f).bth["psn"] for f in frames] == [5, 6]
        for frame in frames:
            collector.backend.responder.process(frame)
        assert collector.append_region(tables.append_lists[0]).ring(3)[:8].tolist() == list(range(8))
    finally:
        collector.close()


def test_a_structures_redundancy_reaches_the_translator_tables(tmp_path):
    config = small_config(tmp_path)
    next(s for s in config.structures if s.primitive is DtaOpcode.KEY_WRITE).redundancy = 1
    collector = open_collector(config)
    try:
        adverts = [collector.connect(name, Peer(ip_bytes("10.77.0.1"), mac_bytes("02:5d:7a:00:00:01"), qpn, 5))
                   for qpn, name in ((0x99, "key-write"), (0x9a, "key-increment"))]
        tables = Tables.from_dict(tables_document(TRANSLATOR, {"name": "c1", "ip": "10.77.1.1",
                                                               "mac": "02:5d:7a:00:01:01"}, adverts))
        assert [(s.primitive, s.redundancy) for s in tables.structures] == \
            [(DtaOpcode.KEY_WRITE, 1), (DtaOpcode.KEY_INCREMENT, MAX_REDUNDANCY)]
    finally:
        collector.close()


def test_bad_control_messages_get_clear_errors(tmp_path):
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)

    async def converse(lines: list[bytes]) -> list[dict]:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        replies = []
        for line in lines:
            writer.write(line + b"\n")
            await writer.drain()
            reply = await asyncio.wait_for(reader.readline(), 5)
            replies.append(json.loads(reply) if reply else None)
        writer.close()
        return replies

    hello = json.dumps({"type": "hello", "version": 1, "token": TOKEN,
                        "translator": {"ip": "10.77.0.1", "mac": "02:5d:7a:00:00:01"}}).encode()
    try:
        assert asyncio.run(converse([b"not json"]))[0]["error"].startswith("not JSON")
        assert "say hello first" in asyncio.run(converse([b'{"type": "connect"}']))[0]["error"]
        assert "version" in asyncio.run(converse([hello.replace(b'"version": 1', b'"version": 9')]))[0]["error"]
        replies = asyncio.run(converse([
            hello, b'{"type": "dance"}', b'{"type": "connect", "structure": "key-write"}',
            b'{"type": "connect", "structure": "nope", "qpn": 5, "psn": 0}',
            b'{"type": "connect", "structure": "key-write", "qpn": 0, "psn": 0}', b'{"type": "ping"}']))
        assert replies[0]["type"] == "welcome"
        assert "unknown message type 'dance'" in replies[1]["error"]
        assert "needs structure, qpn and psn" in replies[2]["error"]
        assert "no structure 'nope'" in replies[3]["error"] and "key-write" in replies[3]["error"]
        assert "24-bit" in replies[4]["error"]
        assert replies[5] == {"type": "pong"}
    finally:
        server.close()
        collector.close()


def _hello(**translator) -> bytes:
    return json.dumps({"type": "hello", "version": 1, "token": TOKEN,
                       "translator": {"ip": "10.77.0.1", "mac": "02:5d:7a:00:00:01", **translator}}).encode()


def _no_queue_pairs(collector: Collector) -> bool:
    return not collector.connections and not collector.backend.qps and not collector.backend.responder.qp_entries()


CONNECT_KEY_WRITE = b'{"type": "connect", "structure": "key-write", '


@pytest.mark.parametrize("lines, words", [
    ([_hello(mac=5)], "both strings"),
    ([_hello(mac=[2, 93, 122, 0, 0, 1])], "both strings"),
    ([_hello(mac="02:5d:7a:00:00:1ff")], "is not a MAC address; give six hex bytes"),
    ([_hello(ip=167772161)], "both strings"),
    ([_hello(ip="fd00::1")], "is IPv6; softdta's data path is IPv4: give the translator's IPv4 address"),
    ([_hello(), CONNECT_KEY_WRITE + b'"qpn": 1e400, "psn": 0}'], "24-bit whole numbers (qpn not 0), not Infinity"),
    ([_hello(), CONNECT_KEY_WRITE + b'"qpn": 4096, "psn": -1e999}'], "24-bit whole numbers (qpn not 0), not 4096 and "
                                                                     "-Infinity"),
    ([_hello(), CONNECT_KEY_WRITE + b'"qpn": 4096.5, "psn": 0}'], "24-bit whole numbers"),
], ids=["mac-number", "mac-list", "mac-too-big", "ip-number", "ipv6", "qpn-overflow", "psn-overflow", "qpn-fraction"])
def test_bad_translator_addresses_and_numbers_get_one_line_errors_and_leave_no_queue_pair(tmp_path, lines, words,
                                                                                         capfd):
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)

    async def converse() -> tuple[list[dict], bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        replies = []
        for line in lines:
            writer.write(line + b"\n")
            replies.append(json.loads(await asyncio.wait_for(reader.readline(), 5)))
        if replies[-1]["type"] == "error" and replies[0]["type"] == "welcome":  # a refused connect: still answered
            writer.write(b'{"type": "ping"}\n')
        after = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        return replies, after

    try:
        replies, after = asyncio.run(converse())
        assert replies[-1]["type"] == "error" and words in replies[-1]["error"]
        if len(lines) > 1:
            assert json.loads(after) == {"type": "pong"}, "a refused connect leaves the session open"
        else:
            assert after == b"", "a refused hello closes the connection"
        assert _no_queue_pairs(collector)
        # the collector serves the next translator as before
        _, adverts, _, writer, _ = asyncio.run_coroutine_threadsafe(fetch_advertisements(
            "127.0.0.1", server.port, TOKEN, TRANSLATOR, {"key-write": (0x1000, 0)}, timeout=5), server.loop).result(10)
        asyncio.run_coroutine_threadsafe(_close(writer), server.loop).result(5)
        assert set(collector.connections) == {adverts[0]["qp"]["remote_qpn"]}
    finally:
        server.close()
        collector.close()
    err = capfd.readouterr().err
    assert len([line for line in err.splitlines() if words in line]) == 1 and "Traceback" not in err


def test_a_connect_the_backend_cannot_bring_up_leaves_no_queue_pair_behind(tmp_path):
    collector = open_collector(small_config(tmp_path))
    try:
        ipv6 = Peer(ip_bytes("fd00::1"), mac_bytes(TRANSLATOR["mac"]), 0x1000, 0)
        for _ in range(collector.config.max_qps + 1):
            with pytest.raises(BackendError, match="IPv4 translators only"):
                collector.connect("key-write", ipv6)
        assert _no_queue_pairs(collector)
        collector.connect("key-write", Peer(ip_bytes(TRANSLATOR["ip"]), mac_bytes(TRANSLATOR["mac"]), 0x1000, 0))
        assert len(collector.backend.qps) == 1
    finally:
        collector.close()


def _wait_released(collector: Collector, qpns: set[int]) -> None:
    deadline = time.monotonic() + 10
    while not qpns <= set(collector.released) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert qpns <= set(collector.released)


def test_a_client_claiming_a_live_translators_ip_cannot_release_repair_or_take_its_queue_pairs(tmp_path):
    """With the token, anyone can say hello with a translator's IP. Such a session gets queue pairs of its own:
    its end, its reports of failure and the repair loop leave the real translator's alone."""
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)

    def on_loop(coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, server.loop).result(15)

    wanted = {"key-write": (0x1000, 0), "key-increment": (0x1001, 0)}
    try:
        real = on_loop(fetch_advertisements("127.0.0.1", server.port, TOKEN, TRANSLATOR, wanted, timeout=5))
        real_qpns = {advert["qp"]["remote_qpn"] for advert in real[1]}
        impostor = on_loop(fetch_advertisements("127.0.0.1", server.port, TOKEN, TRANSLATOR,
                                                {"key-write": (0x1000, 0)}, timeout=5))
        impostor_qpn = impostor[1][0]["qp"]["remote_qpn"]
        assert impostor_qpn not in real_qpns, "the same IP and QPN without the secret: a queue pair of its own"
        on_loop(send(impostor[3], {"type": "failed", "structure": "key-increment", "qpn": 0x1001}))
        assert "holds no queue pair into 'key-increment'" in on_loop(receive(impostor[2], 5))["error"]
        # the real translator's Key-Increment QP falls into ERROR: its re-advertisement goes to its session only
        ki = next(advert for advert in real[1] if advert["structure"] == "key-increment")
        assert collector.backend.responder.process(
            _fetch_add_to(collector.config, TRANSLATOR, ki["qp"], rkey_flip=1)).replies
        readvertised = on_loop(receive(real[2], 10))
        assert (readvertised["type"], readvertised["qp"]["remote_qpn"]) == ("advertise", ki["qp"]["remote_qpn"])
        on_loop(send(impostor[3], {"type": "ping"}))
        assert on_loop(receive(impostor[2], 5)) == {"type": "pong"}
        # the impostor leaves: its queue pair goes after the grace period, the real translator's stay
        on_loop(_close(impostor[3]))
        _wait_released(collector, {impostor_qpn})
        collector.repair(now=collector.released[impostor_qpn] + RELEASE_GRACE_S + 1)
        assert set(collector.connections) == real_qpns and not collector.released
        assert set(collector.backend.responder.qp_entries()) == real_qpns
        on_loop(_close(real[3]))
    finally:
        server.close()
        collector.close()


def test_a_translator_reclaims_its_queue_pairs_with_its_secret_and_only_with_it(tmp_path):
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)

    def ask(secret=None):
        asking = fetch_advertisements("127.0.0.1", server.port, TOKEN, TRANSLATOR, {"*": (0x1000, 0)}, timeout=5,
                                      secret=secret)
        return asyncio.run_coroutine_threadsafe(asking, server.loop).result(15)

    def qpns(session) -> set[int]:
        return {advert["qp"]["remote_qpn"] for advert in session.adverts}

    try:
        first = ask()
        asyncio.run_coroutine_threadsafe(_close(first.writer), server.loop).result(5)
        _wait_released(collector, qpns(first))
        guessing = ask(secret="a guess")
        assert guessing.secret not in (first.secret, "a guess") and not qpns(guessing) & qpns(first)
        asyncio.run_coroutine_threadsafe(_close(guessing.writer), server.loop).result(5)
        _wait_released(collector, qpns(guessing))
        again = ask(secret=first.secret)
        assert again.secret == first.secret and again.adverts == first.adverts
        # a second session with the secret takes the queue pairs over; the first one's end then releases none
        taking_over = ask(secret=first.secret)
        assert taking_over.adverts == first.adverts
        asyncio.run_coroutine_threadsafe(_close(again.writer), server.loop).result(5)
        deadline = time.monotonic() + 10
        while len(server.control.sessions) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server.control.sessions) == 1, "the first session ended"
        collector.repair(now=time.monotonic() + RELEASE_GRACE_S + 1)
        assert set(collector.connections) == qpns(first), "the stranger's went after the grace period"
        assert not set(collector.released) & qpns(first)
        asyncio.run_coroutine_threadsafe(_close(taking_over.writer), server.loop).result(5)
    finally:
        server.close()
        collector.close()


def test_the_same_translator_on_another_connection_may_report_a_failure_and_the_holder_hears_of_it(tmp_path):
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)

    def on_loop(coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, server.loop).result(15)

    async def report_failed(secret: str) -> dict:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        await send(writer, {**json.loads(_hello()), "secret": secret})
        assert (await receive(reader, 5))["type"] == "welcome"
        await send(writer, {"type": "failed", "structure": "key-write", "qpn": 0x1000})
        reply = await receive(reader, 5)
        writer.close()
        return reply

    try:
        holder = on_loop(fetch_advertisements("127.0.0.1", server.port, TOKEN, TRANSLATOR,
                                              {"key-write": (0x1000, 0)}, timeout=5))
        assert "holds no queue pair into 'key-write'" in on_loop(report_failed("a guess"))["error"]
        reply = on_loop(report_failed(holder.secret))
        assert reply["type"] == "advertise" and reply["qp"] == holder.adverts[0]["qp"]
        assert on_loop(receive(holder.reader, 5)) == reply, "the session holding the queue pair hears of it"
        deadline = time.monotonic() + 10
        while len(server.control.sessions) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server.control.sessions) == 1 and not collector.released, "the holder still holds it"
        on_loop(_close(holder.writer))
    finally:
        server.close()
        collector.close()


def test_an_unwritable_owners_file_refuses_new_queue_pairs_in_one_line_and_the_repair_loop_carries_on(tmp_path,
                                                                                                       capfd):
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)
    blocker = collector.config.data_dir / "queue-pairs.partial"  # a directory where the owners file is written

    def on_loop(coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, server.loop).result(15)

    def ask(translator: dict, qpn: int):
        return on_loop(fetch_advertisements("127.0.0.1", server.port, TOKEN, translator,
                                            {"key-increment": (qpn, 0)}, timeout=5))

    try:
        first = ask(_translator(1), 0x1000)
        blocker.mkdir()
        with pytest.raises(ControlError, match="cannot save the queue pairs' owners to .*make data_dir writable"):
            ask(_translator(2), 0x2000)
        assert set(collector.backend.qps) == {first.adverts[0]["qp"]["remote_qpn"]}, "the refused one is undone"
        # the first translator leaves and its grace period is over: freeing it cannot be saved, and is logged
        on_loop(_close(first.writer))
        _wait_released(collector, set(collector.backend.qps))
        for qpn in collector.released:
            collector.released[qpn] -= RELEASE_GRACE_S
        deadline = time.monotonic() + 10
        while collector.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not collector.connections
        # the repair loop still runs: a queue pair put into ERROR is re-created and advertised
        blocker.rmdir()
        second = ask(_translator(2), 0x2000)
        assert collector.backend.responder.process(
            _fetch_add_to(collector.config, _translator(2), second.adverts[0]["qp"], rkey_flip=1)).replies
        assert on_loop(receive(second.reader, 10))["type"] == "advertise"
        on_loop(_close(second.writer))
    finally:
        server.close()
        collector.close()
    err = capfd.readouterr().err
    assert "softdta: repair: cannot save the queue pairs' owners" in err and "Traceback" not in err


def test_a_restarted_translator_reclaims_its_queue_pairs_with_the_secrets_it_kept(tmp_path):
    """`translator up` keeps its sessions' secrets beside its pinned state: the next process reclaims the queue
    pairs; one without them gets new ones, and `translator down --forget` drops them with the state."""
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)
    pin = tmp_path / "pins"
    kept = secrets_file_for(pin)
    collectors = [("127.0.0.1", server.port)]
    try:
        first = CollectorLinks(TRANSLATOR, collectors, TOKEN, keepalive_s=0.5, secrets_file=kept)
        qpns = [qp.remote_qpn for qp in first.start(timeout=5).qps]
        first.close()
        assert kept.stat().st_mode & 0o777 == 0o600
        restarted = CollectorLinks(TRANSLATOR, collectors, TOKEN, keepalive_s=0.5, secrets_file=kept)
        assert [qp.remote_qpn for qp in restarted.start(timeout=5).qps] == qpns
        restarted.close()
        forgetful = CollectorLinks(TRANSLATOR, collectors, TOKEN, keepalive_s=0.5)
        assert not {qp.remote_qpn for qp in forgetful.start(timeout=5).qps} & set(qpns)
        forgetful.close()
        down = subprocess.run([sys.executable, "-m", "softdta.cli", "translator", "down", "--pin", str(pin),
                               "--forget"], capture_output=True, text=True, timeout=60)
        assert down.returncode == 0, down.stderr
        assert not kept.exists()
    finally:
        kept.unlink(missing_ok=True)
        server.close()
        collector.close()


@pytest.mark.parametrize("line, words", [(b"\xff\xfe", "not UTF-8"), (b"[" * 30_000, "nested too deeply"),
                                         (b'{"type": "hello", "version": Infinity}', "NaN or Infinity"),
                                         (b'{"type": NaN}', "NaN or Infinity")],
                         ids=["not-utf8", "deep-nesting", "infinity", "nan"])
def test_malformed_bytes_before_authentication_get_a_clear_error(tmp_path, line, words, capfd):
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)

    async def converse() -> dict:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, limit=1 << 20)
        writer.write(line + b"\n")
        await writer.drain()
        reply = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
        return json.loads(reply)

    try:
        assert words in asyncio.run(converse())["error"]
    finally:
        server.close()
        collector.close()
    logged = [text for text in capfd.readouterr().err.splitlines() if "control connection" in text]
    assert len(logged) == 1 and words in logged[0] and "Traceback" not in capfd.readouterr().err


def test_idle_connections_are_bounded_and_a_translator_still_connects(tmp_path):
    """A flood of silent connections from one host: beyond the per-host limit they are closed at once, the silent
    ones are dropped after the hello timeout, and a real translator connects throughout."""
    from softdta.collector import control
    collector = open_collector(small_config(tmp_path))
    server = ServerThread(collector)

    async def flood_then_connect() -> tuple[list[bytes], list[dict]]:
        idle = [await asyncio.open_connection("127.0.0.1", server.port, local_addr=("127.0.0.2", 0))
                for _ in range(3 * control.MAX_CONNECTIONS_PER_HOST)]
        _, adverts, _, writer, _ = await control.fetch_advertisements("127.0.0.1", server.port, TOKEN,
                                                                      _translator(1), {"key-write": (0x1000, 0)})
        writer.close()
        ends = [await asyncio.wait_for(reader.read(), control.HELLO_TIMEOUT_S + 10) for reader, _ in idle]
        for _, idle_writer in idle:
            idle_writer.close()
        return ends, adverts

    try:
        ends, adverts = asyncio.run(flood_then_connect())
        assert adverts[0]["structure"] == "key-write"
        refused = [end for end in ends if end == b""]
        timed_out = [json.loads(end)["error"] for end in ends if end]
        assert len(refused) == 2 * control.MAX_CONNECTIONS_PER_HOST
        assert len(timed_out) == control.MAX_CONNECTIONS_PER_HOST and all("no message" in e for e in timed_out)
        assert asyncio.run_coroutine_threadsafe(_open_count(server.control), server.loop).result(5) == 0
    finally:
        server.close()
        collector.close()


async def _open_count(control_server) -> int:
    return sum(control_server.open_per_host.values())


def _translator(n: int) -> dict:
    return {"ip": f"10.77.0.{n}", "mac": f"02:5d:7a:00:00:{n:02x}"}


def test_a_full_qp_table_refuses_clearly_keeps_every_loop_alive_and_frees_what_translators_leave(tmp_path):
    """Three queue pairs for everyone: a first translator takes them all, a second is refused with the reason while
    the repair loop, /health and /metrics carry on; once the first one's session ends, the second gets its queue
    pair at once (a full table frees released ones), and released queue pairs go after the grace period."""
    collector = open_collector(small_config(tmp_path, max_qps=3))
    server = ServerThread(collector)
    query = asyncio.run_coroutine_threadsafe(service.serve(collector, "127.0.0.1", 0), server.loop).result(5)
    query_url = f"http://127.0.0.1:{query.addresses[0][1]}"
    structures = sorted(collector.specs)

    def ask(translator: dict, wanted: dict):
        asking = fetch_advertisements("127.0.0.1", server.port, TOKEN, translator, wanted, timeout=5)
        return asyncio.run_coroutine_threadsafe(asking, server.loop).result(10)

    try:
        _, adverts, first_reader, first, _ = ask(_translator(1),
                                              {name: (0x1000 + i, 0) for i, name in enumerate(structures[:3])})
        assert len(collector.connections) == 3
        with pytest.raises(ControlError, match=r"collector c1 is full: all 3 queue pairs .* max_qps"):
            ask(_translator(2), {structures[3]: (0x2000, 0)})
        # the repair loop still runs: a QP put into ERROR comes back
        ki = next(a for a in adverts if a["structure"] == "key-increment")
        assert collector.backend.responder.process(
            _fetch_add_to(collector.config, _translator(1), ki["qp"], rkey_flip=1)).replies
        readvertised = asyncio.run_coroutine_threadsafe(receive(first_reader, 10), server.loop).result(15)
        assert (readvertised["type"], readvertised["structure"]) == ("advertise", "key-increment")
        for path in ("/health", "/metrics"):
            with urllib.request.urlopen(query_url + path, timeout=5) as reply:
                assert reply.status == 200
        assert len(json.loads(urllib.request.urlopen(query_url + "/health", timeout=5).read())["qps"]) == 3
        # the first translator goes: its queue pairs are released, and the full table frees them for the second
        asyncio.run_coroutine_threadsafe(_close(first), server.loop).result(5)
        deadline = time.monotonic() + 10
        while len(collector.released) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(collector.released) == 3
        _, second, _, writer, _ = ask(_translator(2), {structures[3]: (0x2000, 0)})
        assert len(collector.connections) == 1
        qpn = second[0]["qp"]["remote_qpn"]
        assert set(collector.backend.responder.qp_entries()) == {qpn}, "the first translator's QPs are gone"
        assert collector.backend.responder.qp_state(ki["qp"]["remote_qpn"]) is None
        # a released queue pair stays for the grace period (a reconnect finds it), and goes after it
        asyncio.run_coroutine_threadsafe(_close(writer), server.loop).result(5)
        deadline = time.monotonic() + 10
        while not collector.released and time.monotonic() < deadline:
            time.sleep(0.05)
        released_at = collector.released[qpn]
        assert collector.repair(now=released_at + RELEASE_GRACE_S - 1) == [] and qpn in collector.connections
        collector.repair(now=released_at + RELEASE_GRACE_S)
        assert not collector.connections and not collector.backend.responder.qp_entries()
    finally:
        asyncio.run_coroutine_threadsafe(query.cleanup(), server.loop).result(5)
        server.close()
        collector.close()


async def _close(writer) -> None:
    writer.close()


def _fetch_add_to(config, translator: dict, qp: dict, rkey_flip: int = 0) -> bytes:
    ends = UdpEndpoints(mac_bytes(translator["mac"]), config.mac, ip_bytes(translator["ip"]), config.ip, 49152,
                        ROCE_PORT)
    atomic = {"atomic_eth": {"va": qp["base"], "rkey": qp["rkey"] ^ rkey_flip, "swap_add": 1}}
    return build_roce_frame(ends, transport_payload(RoceOpcode.RC_FETCH_ADD, qp["remote_qpn"], qp["start_psn"], atomic))


KILL_PREFIX = f"sdta-k{os.getpid()}-"
KILL_TRANSLATOR = {"ip": "10.77.0.1", "mac": "02:5d:7a:00:00:01"}


class RcWriter:
    """A translator's RC queue pair in miniature: RDMA WRITEs with AckReq from a raw socket, and the ACKs that come
    back (an XDP program on its interface lets the collector's XDP_TX frames in)."""

    def __init__(self, namespace: str, interface: str, config: CollectorConfig):
        self.namespace, self.config = namespace, config
        with in_netns(namespace):
            self.socket = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
            self.socket.bind((interface, 0))
            self.socket.settimeout(0.2)
        self.psn = 0
        self.secret = None  # the control session's: presented again, it reclaims the queue pair
        self.sent: list[int] = []
        self.acknowledged: dict[int, bytes] = {}  # arena-relative offset -> payload, for every ACKed write

    def connect(self) -> dict:
        async def ask():
            _, adverts, _, writer, self.secret = await fetch_advertisements(
                ip_str(self.config.ip), self.config.control_port, TOKEN, KILL_TRANSLATOR, {"key-write": (0x1000, 0)},
                timeout=10, secret=self.secret)
            writer.close()
            return adverts[0]["qp"]
        with in_netns(self.namespace):
            return asyncio.run(ask())

    def write(self, qp: dict, count: int, wait_s: float) -> int:
        """Sends `count` WRITEs; returns how many were acknowledged within `wait_s` each."""
        acknowledged = 0
        for _ in range(count):
            offset, payload = 64 * len(self.sent), os.urandom(48)
            self.sent.append(offset)
            ends = UdpEndpoints(mac_bytes(KILL_TRANSLATOR["mac"]), self.config.mac, ip_bytes(KILL_TRANSLATOR["ip"]),
                                self.config.ip, 49152, ROCE_PORT)
            reth = {"reth": {"va": qp["base"] + offset, "rkey": qp["rkey"], "dma_length": len(payload)}}
            self.socket.send(build_roce_frame(ends, transport_payload(
                RoceOpcode.RC_WRITE_ONLY, qp["remote_qpn"], self.psn, reth, payload, ack_req=True)))
            if self._acked(self.psn, time.monotonic() + wait_s):
                self.acknowledged[offset] = payload
                acknowledged += 1
            self.psn += 1
        return acknowledged

    def _acked(self, psn: int, deadline: float) -> bool:
        while time.monotonic() < deadline:
            try:
                frame = self.socket.recv(2048)
            except TimeoutError:
                continue
            try:
                reply = parse_roce(frame)
            except WireError:
                continue
            if reply.opcode == RoceOpcode.RC_ACK and reply.bth["psn"] == psn:
                return reply.headers["aeth"]["syndrome"] == ACK_SYNDROME
        return False


def _start_collector(config_path, namespace: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "softdta.cli", "collector", "up", "--config", str(config_path),
                                "--netns", namespace], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if select.select([process.stdout], [], [], 0.2)[0] and " up: " in process.stdout.readline():
            return process
        if process.poll() is not None:
            raise AssertionError(f"the collector exited: {process.stderr.read()}")
    raise AssertionError("the collector did not come up within 30 s")


def rc_collector_link(prefix: str, name: str) -> tuple[Namespace, Namespace, str]:
    """Collector and translator namespaces joined by a veth pair (c0, t0), and the configuration of a collector
    `name` on c0 whose Key-Write structure of 1024 slots takes RC (regions in ./regions)."""
    cleanup_prefix(prefix)
    collector_ns, translator_ns = Namespace.create(prefix + "c"), Namespace.create(prefix + "t")
    veth_pair(translator_ns, "t0", collector_ns, "c0", mac_a=KILL_TRANSLATOR["mac"], mac_b="02:5d:7a:00:01:01")
    address(translator_ns, "t0", "10.77.0.1/16")
    address(collector_ns, "c0", "10.77.1.1/16")
    text = EXAMPLE_COLLECTOR.read_text().replace('name = "c1"', f'name = "{name}"')
    text = text.replace('interface = ""', 'interface = "c0"').replace('data_dir = "c1-data"', 'data_dir = "regions"')
    text = text.replace('hash = "independent"', 'hash = "independent"\ntransport = "rc"').replace("change-me", TOKEN)
    return collector_ns, translator_ns, text.replace("slots = 131072", "slots = 1024")


def test_no_acknowledged_write_is_lost_across_kill_9_and_restart(tmp_path):
    """Writes, kill -9 of `softdta collector up`, more writes, a restart, more writes: every acknowledged write is
    in the collector's memory at the end, though no region was saved before the kill."""
    collector_ns, translator_ns, text = rc_collector_link(KILL_PREFIX, f"kill9-{os.getpid()}")
    (tmp_path / "collector.toml").write_text(text)
    config = CollectorConfig.from_toml(tmp_path / "collector.toml")
    pins = pin_dir_for(config.name, config.ip)
    steer = BpfObject(build_object(STEER_SOURCE))
    collector = None
    try:
        with in_netns(translator_ns.name):
            attach_xdp(socket.if_nametoindex("t0"), steer.programs["softdta_xsk"].fd)
        writer = RcWriter(translator_ns.name, "t0", config)
        collector = _start_collector(tmp_path / "collector.toml", collector_ns.name)
        qp = writer.connect()
        assert writer.write(qp, 40, wait_s=5) == 40
        collector.kill()
        collector.wait(10)
        assert not (tmp_path / "regions" / "key-write.region").exists(), "nothing was saved before the kill"
        # the killed collector's program keeps executing (into pinned memory) and acknowledging
        assert writer.write(qp, 40, wait_s=5) == 40
        collector = _start_collector(tmp_path / "collector.toml", collector_ns.name)
        adopted = writer.connect()
        writer.psn = adopted["start_psn"]  # as a translator adopts it
        assert writer.write(adopted, 40, wait_s=5) == 40
        collector.send_signal(signal.SIGTERM)
        assert collector.wait(20) == 0, collector.stderr.read()
        collector = None
        memory = (tmp_path / "regions" / "key-write.region").read_bytes()
        lost = [offset for offset, payload in writer.acknowledged.items()
                if memory[offset:offset + len(payload)] != payload]
        assert len(writer.acknowledged) >= 80 and not lost, f"{len(lost)} acknowledged writes lost"
        assert {**adopted, "start_psn": qp["start_psn"]} == qp, "the restarted collector took over the queue pair " \
            "and its R_Key"
        assert adopted["start_psn"] == 80, "it advertises the PSN its queue pair expects now"
        assert not pins.exists(), "a clean stop removes the pins"
    finally:
        if collector is not None:
            collector.kill()
            collector.wait(10)
        cleanup_prefix(KILL_PREFIX)
        steer.close()
        shutil.rmtree(pins, ignore_errors=True)


def test_a_region_too_big_for_memory_is_one_line_naming_the_structure(tmp_path):
    text = EXAMPLE_COLLECTOR.read_text().replace("slots = 131072", f"slots = {1 << 40}")
    (tmp_path / "collector.toml").write_text(text)
    result = subprocess.run([sys.executable, "-m", "softdta.cli", "collector", "up", "--config",
                             str(tmp_path / "collector.toml")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "structure key-write needs" in result.stderr and "lower its slots" in result.stderr


def test_pinned_memory_and_queue_pairs_are_adopted_only_by_the_same_configuration(tmp_path):
    """A collector that dies without stopping leaves its maps pinned: the next one of the same configuration
    takes over memory (not the older region file), queue pairs and R_Keys; another configuration is refused."""
    config = small_config(tmp_path)
    pins = ensure_bpffs() / f"softdta-adopt-{os.getpid()}"
    try:
        first = Collector(config, XdpBackend.for_config(config, pin_dir=pins))
        translator_ip, translator_mac = ip_bytes("10.77.0.1"), mac_bytes("02:5d:7a:00:00:01")
        session = first.open_session(translator_ip, translator_mac)
        advert = first.connect("key-write", Peer(translator_ip, translator_mac, 0x1000, 7), session)
        first.backend.checkpoint()
        first.regions["key-write"].view[:4] = [1, 2, 3, 4]  # written after the last save
        first.backend.responder.close()  # what a kill -9 leaves: the pins, and no save
        second = Collector(config, XdpBackend.for_config(config, pin_dir=pins))
        assert second.regions["key-write"].view[:4].tolist() == [1, 2, 3, 4]
        assert second.released, "adopted queue pairs wait for their translator"
        stranger = second.open_session(translator_ip, translator_mac, "a guess")
        assert stranger.secret != "a guess" and second.connection_of(stranger, "key-write", 0x1000) is None
        assert second.released, "only the secret saved in data_dir reclaims an adopted queue pair"
        reclaiming = second.open_session(translator_ip, translator_mac, session.secret)
        assert reclaiming.secret == session.secret
        assert second.connection_of(reclaiming, "key-write", 0x1000) == advert
        assert not second.released, "the translator that came back holds its queue pair again"
        second.backend.responder.close()
        with pytest.raises(BackendError, match=r"holds the memory of a collector configured differently \("
                                               r"its regions are laid out differently; responder_qp holds 1024 "
                                               r"entries, not 8; "):
            XdpBackend.for_config(replace(config, max_qps=5), pin_dir=pins)
        Collector(config, XdpBackend.for_config(config, pin_dir=pins)).close()  # a clean stop: saved, unpinned
        assert not pins.exists()
        assert (config.data_dir / "key-write.region").read_bytes()[:4] == bytes([1, 2, 3, 4])
    finally:
        shutil.rmtree(pins, ignore_errors=True)
