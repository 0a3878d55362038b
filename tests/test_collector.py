"""The collector: configuration, the xdp backend with its region files, advertisements that become translator
tables, and the control protocol over loopback with a real client."""

import asyncio
import json
import threading
from dataclasses import replace

import numpy as np
import pytest

from softdta import dta, workload
from softdta.collector.backend import Peer
from softdta.collector.collector import Collector, tables_document
from softdta.collector.config import CollectorConfig
from softdta.collector.control import CollectorLinks, ControlError, ControlServer, cancel_tasks
from softdta.collector.xdp_backend import XdpBackend
from softdta.frames import UdpEndpoints, ip_bytes, mac_bytes
from softdta.query import keyincrement_query, keywrite_query
from softdta.roce import build_roce_frame, parse_roce, transport_payload
from softdta.spec import ROCE_PORT, KeyHash, Primitive, ResponderCounter, RoceOpcode
from softdta.tables import TableError, Tables
from softdta.translator import Translator
from softdta.workload import ReporterAddress

from common import ROOT

pytestmark = pytest.mark.privileged

EXAMPLE_COLLECTOR = ROOT / "examples" / "collector.toml"
TRANSLATOR = {"mac": "02:5d:7a:00:00:01", "ip": "10.77.0.1", "profile": "dta-v1", "grace_ms": 1.0}
TOKEN = "s3cret"


def small_config(tmp_path, **changes) -> CollectorConfig:
    config = CollectorConfig.from_toml(EXAMPLE_COLLECTOR)
    config.data_dir = tmp_path / "regions"
    config.token = TOKEN
    for structure in config.structures:
        if structure.primitive is not Primitive.SKETCH_MERGE:
            structure.slots = 4096
    return replace(config, **changes)


def open_collector(config: CollectorConfig) -> Collector:
    return Collector(config, XdpBackend.for_config(config))


@pytest.mark.parametrize("change, message", [
    ({"slots": 1000}, "power of two"),
    ({"transport": "uc", "primitive": "key-increment"}, "needs transport \"rc\""),
    ({"hash": "md5"}, "hash 'md5'"),
])
def test_bad_structures_are_refused_with_the_reason(change, message):
    document = {"collector": {"ip": "10.77.1.1", "mac": "02:00:00:00:00:01"},
                "structures": [{"primitive": "key-write", "slots": 1024, **change}]}
    with pytest.raises(TableError, match=message):
        CollectorConfig.from_dict(document)


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
        answer = keywrite_query(collector.structure_region(Primitive.KEY_WRITE, config.ip),
                                [r.key for r in written], redundancy=2, key_hash=KeyHash.INDEPENDENT)
        assert answer.found.mean() > 0.97
        counts = keyincrement_query(collector.structure_region(Primitive.KEY_INCREMENT, config.ip),
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

    def __init__(self, collector: Collector, keepalive_s: float = 0.5):
        self.loop = asyncio.new_event_loop()
        self.control = ControlServer(collector, TOKEN, keepalive_s)
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
        assert {s.primitive for s in tables.structures} == set(Primitive) - {Primitive.APPEND}
        assert [a.lists for a in tables.append_lists] == [64]
        ki = tables.structure(ip_bytes("10.77.1.1"), Primitive.KEY_INCREMENT)
        assert ki.qp.remote_qpn in collector.connections
        # A request with a wrong R_Key puts the QP into ERROR; the collector re-creates it and re-advertises.
        responder = collector.backend.responder
        bad = _fetch_add_with_wrong_key(tables, ki)
        assert responder.process(bad).replies and responder.counters()[ResponderCounter.REMOTE_ACCESS_ERRORS] == 1
        updated = links.updates.get(timeout=5)
        ki_after = updated.structure(ip_bytes("10.77.1.1"), Primitive.KEY_INCREMENT)
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


def _fetch_add_with_wrong_key(tables, structure):
    qp = structure.qp
    ends = UdpEndpoints(tables.mac, qp.collector_mac, tables.ip, qp.collector_ip, 49152, ROCE_PORT)
    atomic = {"atomic_eth": {"va": qp.base_va, "rkey": qp.rkey ^ 1, "swap_add": 1}}
    return build_roce_frame(ends, transport_payload(RoceOpcode.RC_FETCH_ADD, qp.remote_qpn, qp.start_psn, atomic))


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
