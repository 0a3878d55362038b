"""The query service over real HTTP on loopback.

A collector is filled by the reference translator with every primitive, the service runs on a uvloop loop
on 127.0.0.1 (ephemeral port), and an aiohttp client checks its answers against the reports sent and against
the query engines called directly.
"""

import asyncio
import json
import threading
from dataclasses import dataclass, replace

import aiohttp
import numpy as np
import pytest
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from softdta.collector.service import OfflineSource, serve
from softdta.core import workload
from softdta.core.offline import OfflineCollector
from softdta.core.primitives.key_increment.queries import keyincrement_query
from softdta.core.primitives.key_write.queries import KeyLookup, key_write_query
from softdta.core.primitives.postcarding.queries import postcard_query
from softdta.core.query import BLANK
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.core.workload import ReporterAddress
from softdta.spec import DtaOpcode
from softdta.wire.frames import ip_bytes, mac_bytes
from tests.common import COLLECTOR_IP, EXAMPLE_TABLES

KEY_WRITE = "key-write@10.77.1.1"
KEY_INCREMENT = "key-increment@10.77.1.1"
POSTCARDING = "postcarding@10.77.1.1"
SKETCH = "sketch-merge@10.77.1.1"
APPEND = "append0@10.77.1.1"
REDUNDANCY = 2
TOKEN = "the-collectors-token"
TAKE = {"Authorization": f"Bearer {TOKEN}"}
SWITCH_IDS = list(range(1, 1025))


class Service:
    """The service and an aiohttp client on one uvloop loop, driven from sync tests: each call runs the loop
    until its coroutine is done, which is also when the server handles requests."""

    def __init__(self, source, token):
        self.loop = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        self.server = self.loop.run(serve(source, "127.0.0.1", 0, token))
        self.http = self.loop.run(self._session(f"http://127.0.0.1:{self.server.addresses[0][1]}"))

    @staticmethod
    async def _session(base_url: str) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(base_url)

    def run(self, coroutine):
        return self.loop.run(coroutine)

    def call(self, method: str, path: str, status: int = 200, **kwargs):
        """The JSON answer of one request, after checking its status."""
        async def request():
            async with self.http.request(method, path, **kwargs) as response:
                body = await response.text()
                assert response.status == status, body
                return json.loads(body) if response.content_type == "application/json" else body
        return self.run(request())

    def close(self) -> None:
        self.run(self.http.close())
        self.run(self.server.cleanup())
        self.loop.close()


@pytest.fixture
def start_service():
    started = []

    def start(source, token=TOKEN) -> Service:
        started.append(Service(source, token))
        return started[-1]

    yield start
    for service in started:
        service.close()


def new_pipeline() -> tuple[Tables, Translator, OfflineCollector, ReporterAddress]:
    tables = Tables.from_toml(EXAMPLE_TABLES)
    reporter = ReporterAddress(mac=mac_bytes("02:5d:7a:00:09:01"), ip=ip_bytes("10.77.9.1"),
                               translator_mac=tables.mac, collector_ip=COLLECTOR_IP)
    return tables, Translator(tables), OfflineCollector(tables), reporter


def send(translator: Translator, collector: OfflineCollector, reporter: ReporterAddress, reports) -> None:
    for report in reports:
        for frame in translator.process(reporter.frame(report)).frames:
            for reply in collector.deliver(frame):
                assert translator.process(reply).drop is None


def flush(translator: Translator, collector: OfflineCollector) -> None:
    """Write out partial Append batches and Postcarding paths."""
    for frame in translator.flush_idle(now_ns=0):
        collector.deliver(frame)


@dataclass
class Filled:
    tables: Tables
    collector: OfflineCollector
    key_write: list
    key_increment: list
    postcards: list
    sketch: list

    def region(self, primitive: DtaOpcode):
        return self.collector.structure_region(primitive, COLLECTOR_IP)

    def structure(self, primitive: DtaOpcode):
        return self.tables.structure(COLLECTOR_IP, primitive)


@pytest.fixture(scope="module")
def filled() -> Filled:
    """A collector holding every primitive but Append (whose polls change memory; those tests fill their own)."""
    tables, translator, collector, reporter = new_pipeline()
    sketch_merge = tables.structure(COLLECTOR_IP, DtaOpcode.SKETCH_MERGE)
    reports = Filled(tables, collector, workload.key_write(2000, seed=1, redundancy=REDUNDANCY),
                     workload.key_increment(3000, seed=3, redundancy=REDUNDANCY, flows=50),
                     workload.postcards(300, seed=5, switch_ids=SWITCH_IDS),
                     workload.sketch_epoch(sketch_merge.reporters, sketch_merge.columns, sketch_merge.rows, seed=6))
    for kind in (reports.key_write, reports.key_increment, reports.postcards, reports.sketch):
        send(translator, collector, reporter, kind)
    flush(translator, collector)
    return reports


@pytest.fixture
def service(filled, start_service) -> Service:
    return start_service(OfflineSource(filled.collector))


def unknown_keys(count: int) -> list[str]:
    return [f"ee{index:06x}" for index in range(count)]


# --------------------------------------------------------------------------------------------------
# Queries


def test_structures_lists_every_structure_with_its_fill(service, filled):
    listed = {entry["name"]: entry for entry in service.call("GET", "/structures")["structures"]}
    assert set(listed) == {KEY_WRITE, KEY_INCREMENT, POSTCARDING, SKETCH, APPEND}
    key_write = listed[KEY_WRITE]
    region = filled.region(DtaOpcode.KEY_WRITE)
    occupied = np.count_nonzero((region.checksums != 0) | region.data.any(axis=1))
    assert key_write["slot_count"] == region.slot_count == 131072
    assert key_write["fill"] == occupied / region.slot_count
    assert key_write["load_factor"] == pytest.approx(-np.log(1 - key_write["fill"]))
    assert key_write["load_factor"] == pytest.approx(2000 * REDUNDANCY / 131072, rel=0.05)
    counters = filled.region(DtaOpcode.KEY_INCREMENT).counters
    assert listed[KEY_INCREMENT]["fill"] == np.count_nonzero(counters) / counters.size
    assert listed[SKETCH]["fill"] > 0 and listed[SKETCH]["load_factor"] is None
    assert listed[SKETCH]["slot_count"] == filled.structure(DtaOpcode.SKETCH_MERGE).columns
    assert listed[APPEND]["fill"] == 0 and listed[APPEND]["lists"] == 64
    assert listed[POSTCARDING]["hops"] == 5


def test_key_write_answers_match_the_reports_and_the_engine(service, filled):
    keys = [report.key.hex() for report in filled.key_write] + unknown_keys(200)
    answer = service.call("POST", f"/key-write/{KEY_WRITE}", json={"keys": keys, "redundancy": REDUNDANCY})
    results = answer["results"]
    assert [result["key"] for result in results] == keys
    truth = {report.key.hex(): report.data.hex() for report in filled.key_write}
    found = [result for result in results if result["status"] == "found"]
    assert len(found) == answer["found"] > 0.99 * 2000  # 2000 keys in 131072 slots
    assert all(result["value"] == truth[result["key"]] for result in found)
    assert all(result["value"] is None and result["votes"] == 0 for result in results if result not in found)
    assert answer["found"] + answer["empty"] + answer["collided"] == len(keys)
    assert all(result["status"] != "empty" for result in results[:2000])  # written: found or overwritten
    assert all(result["status"] != "found" for result in results[2000:])
    assert answer["empty"] > 170  # of the 200 unknown keys; slots are 3 % occupied, so most find both empty

    structure = filled.structure(DtaOpcode.KEY_WRITE)
    rows = np.frombuffer(bytes.fromhex("".join(keys)), dtype=np.uint8).reshape(len(keys), 4)
    direct = key_write_query(filled.region(DtaOpcode.KEY_WRITE), rows, REDUNDANCY, key_hash=structure.key_hash)
    assert [result["status"] == "found" for result in results] == direct.found.tolist()
    assert [result["votes"] for result in results] == direct.votes.tolist()
    assert [int(result["value"], 16) for result in found] == direct.values[direct.found].tolist()


def test_key_write_integer_keys_and_consensus_mode(service, filled):
    keys = [report.key for report in filled.key_write[:300]]
    as_hex = service.call("POST", f"/key-write/{KEY_WRITE}", json={"keys": [k.hex() for k in keys], "redundancy": 2})
    as_int = service.call("POST", f"/key-write/{KEY_WRITE}",
                          json={"keys": [int.from_bytes(k, "big") for k in keys], "redundancy": 2})
    assert as_int == as_hex

    strict = service.call("POST", f"/key-write/{KEY_WRITE}",
                          json={"keys": [k.hex() for k in keys], "redundancy": 2, "mode": "consensus"})
    assert strict["consensus"] == 2  # default: every copy agrees
    structure = filled.structure(DtaOpcode.KEY_WRITE)
    direct = key_write_query(filled.region(DtaOpcode.KEY_WRITE), keys, 2, consensus=2, key_hash=structure.key_hash)
    assert [result["status"] == "found" for result in strict["results"]] == direct.found.tolist()
    assert all(result["votes"] == 2 for result in strict["results"] if result["status"] == "found")


def test_key_increment_returns_the_true_counts(service, filled):
    truth: dict[str, int] = {}
    for report in filled.key_increment:
        truth[report.key.hex()] = truth.get(report.key.hex(), 0) + report.counter
    keys = list(truth)
    answer = service.call("POST", f"/key-increment/{KEY_INCREMENT}", json={"keys": keys, "redundancy": REDUNDANCY})
    assert [result["key"] for result in answer["results"]] == keys
    assert [result["count"] for result in answer["results"]] == [truth[key] for key in keys]  # no collisions
    structure = filled.structure(DtaOpcode.KEY_INCREMENT)
    direct = keyincrement_query(filled.region(DtaOpcode.KEY_INCREMENT), [bytes.fromhex(k) for k in keys],
                                REDUNDANCY, structure.key_hash)
    assert [result["count"] for result in answer["results"]] == direct.tolist()


def test_postcarding_decodes_the_paths(service, filled):
    paths: dict[str, list[int]] = {}
    for report in filled.postcards:
        paths.setdefault(report.key.hex(), [0] * 5)[report.hop - 1] = int.from_bytes(report.data, "big")
    keys = list(paths) + unknown_keys(50)
    answer = service.call("POST", f"/postcarding/{POSTCARDING}", json={"keys": keys, "value_set": SWITCH_IDS})
    results = answer["results"]
    complete = [result for result in results if result["complete"]]
    assert len(complete) == answer["complete"] > 0.95 * len(paths)
    assert all(result["path"] == paths[result["key"]] for result in complete)
    direct = postcard_query(filled.region(DtaOpcode.POSTCARDING), [bytes.fromhex(k) for k in keys], SWITCH_IDS)
    assert [result["path"] for result in results] == [[None if value == BLANK else value for value in path]
                                                      for path in direct.values.tolist()]


def test_sketch_is_the_merged_matrix_by_column(service, filled):
    structure = filled.structure(DtaOpcode.SKETCH_MERGE)
    expected = np.zeros((structure.columns, structure.rows), dtype=np.uint64)
    for report in filled.sketch:
        expected[report.column] += np.array(report.counters, dtype=np.uint64)
    answer = service.call("GET", f"/sketch-merge/{SKETCH}")
    assert (answer["columns"], answer["rows"], answer["merge"]) == (structure.columns, structure.rows, "sum")
    assert answer["matrix"] == expected.tolist()


def test_stats_health_and_metrics(service, filled):
    counters = filled.collector.counters()
    stats = service.call("GET", "/stats")
    assert stats["responder"] == counters and counters["executed"] > 0
    health = service.call("GET", "/health")
    assert health["status"] == "ok" and health["backend"] == "offline"
    key_write_qp = filled.structure(DtaOpcode.KEY_WRITE).qp
    assert health["qps"][key_write_qp.name]["expected_psn"] == 2000 * REDUNDANCY
    assert not any(qp["error"] for qp in health["qps"].values())

    families = {family.name: family for family in text_string_to_metric_families(service.call("GET", "/metrics"))}
    fill = {sample.labels["structure"]: sample.value for sample in families["softdta_structure_fill"].samples}
    structures = {entry["name"]: entry for entry in stats["structures"]}
    assert fill == {name: entry["fill"] for name, entry in structures.items()}
    load = {sample.labels["structure"]: sample.value for sample in families["softdta_structure_load_factor"].samples}
    assert load == {name: structures[name]["load_factor"] for name in (KEY_WRITE, KEY_INCREMENT, POSTCARDING)}
    responder = {sample.labels["counter"]: sample.value for sample in families["softdta_responder_events"].samples}
    assert responder == counters
    qps_up = {sample.labels["qpn"]: sample.value for sample in families["softdta_qp_up"].samples}
    assert qps_up == {name: 1.0 for name in health["qps"]}


def test_completions_number_every_write_with_immediate(start_service):
    tables, translator, collector, reporter = new_pipeline()
    service = start_service(OfflineSource(collector))
    reports = [replace(report, immediate=index % 3 == 0)
               for index, report in enumerate(workload.key_write(30, seed=7, redundancy=REDUNDANCY))]
    send(translator, collector, reporter, reports)
    answer = service.call("GET", "/completions")
    assert answer["total"] == 10 * REDUNDANCY
    assert [entry["seq"] for entry in answer["completions"]] == list(range(1, 10 * REDUNDANCY + 1))
    assert {entry["byte_len"] for entry in answer["completions"]} == {8}  # a slot: key checksum and value
    later = service.call("GET", f"/completions?since={answer['total'] - 3}")["completions"]
    assert later == answer["completions"][-3:]
    families = {family.name: family for family in text_string_to_metric_families(service.call("GET", "/metrics"))}
    assert families["softdta_completions"].samples[0].value == 10 * REDUNDANCY


# --------------------------------------------------------------------------------------------------
# Append


def test_append_returns_every_entry_exactly_once(start_service):
    tables, translator, collector, reporter = new_pipeline()
    reports = workload.append(1000, seed=4, lists=16)  # about 63 per 256-entry ring
    send(translator, collector, reporter, reports)
    flush(translator, collector)
    sent = {list_id: [int.from_bytes(r.data, "big") for r in reports if r.list_id == list_id] for list_id in range(16)}
    service = start_service(OfflineSource(collector))

    list_3 = {"append": APPEND, "list": 3, "entries": sent[3], "dropped": 0}
    assert service.call("GET", f"/append/{APPEND}?list=3") == list_3  # a read takes nothing
    assert service.call("GET", f"/append/{APPEND}?list=3") == list_3
    assert service.call("POST", f"/append/{APPEND}?list=3", headers=TAKE) == list_3
    assert service.call("POST", f"/append/{APPEND}?list=3", headers=TAKE)["entries"] == []
    assert service.call("GET", f"/append/{APPEND}?list=3")["entries"] == []
    everything = {str(list_id): {"entries": sent[list_id], "dropped": 0} for list_id in range(16) if list_id != 3}
    assert service.call("GET", f"/append/{APPEND}")["lists"] == everything
    assert service.call("POST", f"/append/{APPEND}", headers=TAKE)["lists"] == everything
    assert service.call("POST", f"/append/{APPEND}", headers=TAKE) == {"append": APPEND, "lists": {}}
    assert not any(collector.region_of(tables.append_lists[0].qp))  # the poller zeroed what it took


@pytest.mark.parametrize("headers,status", [({}, 401), ({"Authorization": "Bearer not-the-token"}, 401),
                                            ({"Authorization": f"Basic {TOKEN}"}, 401), (TAKE, 403)])
def test_append_entries_are_taken_only_with_the_collectors_token(start_service, headers, status):
    """Any local client may read; only the token's holder takes. An offline view (no token) takes nothing."""
    tables, translator, collector, reporter = new_pipeline()
    reports = workload.append(64, seed=4, lists=1)
    send(translator, collector, reporter, reports)
    service = start_service(OfflineSource(collector), token=None if status == 403 else TOKEN)
    for query in ("", "?list=0", "?list=0&follow=1"):
        answer = service.call("POST", f"/append/{APPEND}{query}", status, headers=headers)
        assert ("needs the header 'Authorization: Bearer <token>'" if status == 401 else "this service has none") \
            in answer["error"]
    assert service.call("GET", f"/append/{APPEND}?list=0")["entries"] == [int.from_bytes(r.data, "big")
                                                                          for r in reports]


def test_append_keeps_at_most_one_ring_of_unread_entries(start_service):
    tables, translator, collector, reporter = new_pipeline()
    service = start_service(OfflineSource(collector))
    sent = []
    for round_ in range(2):  # 2 x 200 entries for list 0, drained by polls that take list 1
        reports = workload.append(200, seed=round_, lists=1)
        sent += [int.from_bytes(r.data, "big") for r in reports]
        send(translator, collector, reporter, reports)
        assert service.call("POST", f"/append/{APPEND}?list=1", headers=TAKE)["entries"] == []
    ring = tables.append_lists[0].entries
    assert service.call("GET", f"/append/{APPEND}?list=0")["dropped"] == len(sent) - ring
    answer = service.call("POST", f"/append/{APPEND}?list=0", headers=TAKE)
    assert answer["entries"] == sent[-ring:] and answer["dropped"] == len(sent) - ring


@pytest.mark.parametrize("laps", [1, 3])
def test_a_ring_lapped_by_its_writer_counts_what_it_lost_and_keeps_the_rest_oldest_first(start_service, laps):
    tables, translator, collector, reporter = new_pipeline()
    service = start_service(OfflineSource(collector))
    lists = tables.append_lists[0]
    assert service.call("POST", f"/append/{APPEND}?list=0", headers=TAKE)["entries"] == []
    reports = workload.append(laps * lists.entries + 10 * lists.batch, seed=5, lists=1)
    sent = [int.from_bytes(r.data, "big") for r in reports]
    send(translator, collector, reporter, reports)
    survivors = {"append": APPEND, "list": 0, "entries": sent[-lists.entries:], "dropped": len(sent) - lists.entries}
    assert service.call("GET", f"/append/{APPEND}?list=0") == survivors
    assert service.call("POST", f"/append/{APPEND}?list=0", headers=TAKE) == survivors
    more = workload.append(3 * lists.batch, seed=6, lists=1)
    send(translator, collector, reporter, more)  # after the lap, the ring reads on where the writer is
    assert service.call("POST", f"/append/{APPEND}?list=0", headers=TAKE) == {
        "append": APPEND, "list": 0, "entries": [int.from_bytes(r.data, "big") for r in more], "dropped": 0}


def test_append_follow_streams_entries_added_after_it_started(start_service):
    tables, translator, collector, reporter = new_pipeline()
    before = workload.append(40, seed=7, lists=1, first_list=2)  # whole batches of 4: no flush needed
    after = workload.append(80, seed=8, lists=1, first_list=2)
    late = workload.append(8, seed=9, lists=1, first_list=2)
    values = [[int.from_bytes(r.data, "big") for r in reports] for reports in (before, after, late)]
    send(translator, collector, reporter, before)
    service = start_service(OfflineSource(collector))

    async def follow():
        async with service.http.post(f"/append/{APPEND}?list=2&follow=1", headers=TAKE) as response:
            assert response.status == 200 and response.content_type == "application/x-ndjson"
            streamed = []

            async def read_until(count):
                while len(streamed) < count:
                    line = json.loads(await asyncio.wait_for(response.content.readline(), timeout=5))
                    assert line["list"] == 2 and line["dropped"] == 0 and line["entries"]
                    streamed.extend(line["entries"])

            await read_until(len(values[0]))
            for report in after:  # one report at a time while the stream is open
                send(translator, collector, reporter, [report])
                await asyncio.sleep(0)
            await read_until(len(values[0]) + len(values[1]))
            return streamed

    assert service.run(follow()) == values[0] + values[1]
    service.run(asyncio.sleep(0.05))  # the server notices the client left
    send(translator, collector, reporter, late)
    assert service.call("POST", f"/append/{APPEND}?list=2", headers=TAKE)["entries"] == values[2]  # no stream took them


# --------------------------------------------------------------------------------------------------
# Errors

BAD_REQUESTS = [
    ("GET", "/completions?since=last", None, 400, "since must be an integer"),
    ("POST", "/key-write/nope", {"keys": ["0a000001"], "redundancy": 2}, 404, "no key-write structure named 'nope'"),
    ("POST", f"/key-write/{KEY_INCREMENT}", {"keys": ["0a000001"], "redundancy": 2}, 404, "no key-write structure"),
    ("POST", "/key-increment/nope", {"keys": ["0a000001"], "redundancy": 2}, 404, "no key-increment structure"),
    ("POST", "/postcarding/nope", {"keys": ["0a000001"], "value_set": [1]}, 404, "no postcarding structure"),
    ("GET", "/sketch-merge/nope", None, 404, "no sketch-merge structure"),
    ("GET", "/append/nope", None, 404, "no Append range named 'nope'"),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": ["0a0000"], "redundancy": 2}, 400, "has key_len 4 (8 hex digits)"),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": [1 << 32], "redundancy": 2}, 400, "key_len of 4 bytes"),
    ("POST", f"/key-increment/{KEY_INCREMENT}", {"keys": ["0a00000102"], "redundancy": 2}, 400, "key_len 4"),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": ["zz000001"], "redundancy": 2}, 400, "is not a hex string"),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": [True], "redundancy": 2}, 400, "must be a hex string or an integer"),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": "0a000001", "redundancy": 2}, 400, "keys must be a non-empty list"),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": [], "redundancy": 2}, 400, "keys must be a non-empty list"),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": ["0a000001"]}, 400, "missing field(s) ['redundancy']"),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": ["0a000001"], "redundancy": "2"}, 400,
     "redundancy must be an integer"),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": ["0a000001"], "redundancy": 5}, 400,
     "redundancy must be an integer in 1..4"),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": ["0a000001"], "redundancy": 2, "mode": "majority"}, 400,
     'mode must be "plurality" or "consensus"'),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": ["0a000001"], "redundancy": 2, "mode": "consensus", "consensus": 3},
     400, "consensus must be an integer in 1..2"),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": ["0a000001"], "redundancy": 2, "consensus": 2}, 400,
     'consensus applies to mode "consensus" only'),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": ["0a000001"], "redundancy": 2, "redundnacy": 2}, 400,
     "unknown field(s) ['redundnacy']"),
    ("POST", f"/key-write/{KEY_WRITE}", ["0a000001"], 400, "body must be a JSON object"),
    ("POST", f"/key-write/{KEY_WRITE}", b'{"keys": [', 400, "body is not valid JSON"),
    ("POST", f"/postcarding/{POSTCARDING}", {"keys": ["0a000001"], "value_set": []}, 400, "value_set must be"),
    ("POST", f"/postcarding/{POSTCARDING}", {"keys": ["0a000001"], "value_set": [-1]}, 400,
     "value_set[0] must be an integer in 0..4294967295"),
    ("GET", f"/append/{APPEND}?list=64", None, 400, "list must be a list id in 0..63"),
    ("GET", f"/append/{APPEND}?list=abc", None, 400, "list must be a list id in 0..63"),
    ("POST", f"/append/{APPEND}?follow=yes", None, 400, "follow must be 0 or 1"),
    ("GET", f"/append/{APPEND}?follow=1", None, 400, "follow takes the entries it streams: send it as a POST"),
    ("GET", f"/append/{APPEND}?list={'9' * 5000}", None, 400, "list must be a list id in 0..63"),
    ("POST", f"/key-write/{KEY_WRITE}", b"[" * 100_000, 400, "body is not valid JSON: it nests too deeply"),
    ("POST", f"/key-write/{KEY_WRITE}", b"\xff\xfe{}", 400, "body is not valid JSON"),
    ("POST", f"/key-write/{KEY_WRITE}", {"keys": [0] * 100_001, "redundancy": 2}, 400,
     "100,001 keys in one request; send at most 100,000 at a time"),
    ("POST", f"/key-write/{KEY_WRITE}", b" " * ((4 << 20) + 1), 413, "the body is over 4,194,304 bytes (4 MiB)"),
    ("GET", "/nope", None, 404, "404: Not Found (GET /nope)"),
    ("GET", f"/key-write/{KEY_WRITE}", None, 405, "405: Method Not Allowed"),
]


def test_bad_requests_get_a_clear_json_error(service):
    for method, path, body, status, message in BAD_REQUESTS:
        sent = {"data": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
        answer = service.call(method, path, status, headers=TAKE, **sent)
        assert message in answer["error"], (path[:80], body[:80] if body else body, answer)
        if status == 404 and path.startswith("/key-write/"):
            assert answer["known"] == [KEY_WRITE]
        if path == "/append/nope":
            assert answer["known"] == [APPEND]

    async def chunked_over_the_limit():
        for _ in range(5):
            yield b" " * (1 << 20)
    answer = service.call("POST", f"/key-write/{KEY_WRITE}", 413, data=chunked_over_the_limit())
    assert "the body is over 4,194,304 bytes (4 MiB)" in answer["error"]


# --------------------------------------------------------------------------------------------------
# Careless and hostile clients


def test_health_answers_while_a_query_runs(filled, start_service, monkeypatch):
    """Queries run on a worker thread: one that takes long (held here until /health has answered, or 10 s)
    never holds up the event loop."""
    health_answered, order = threading.Event(), []
    answer = KeyLookup.answer

    def slow_answer(query, region):
        health_answered.wait(10)
        order.append("query")
        return answer(query, region)

    monkeypatch.setattr(KeyLookup, "answer", slow_answer)
    service = start_service(OfflineSource(filled.collector))

    async def both():
        async def query():
            async with service.http.post(f"/key-write/{KEY_WRITE}", json={"keys": unknown_keys(4),
                                                                        "redundancy": 2}) as response:
                assert response.status == 200

        running = asyncio.create_task(query())
        async with service.http.get("/health") as response:
            assert response.status == 200
            order.append("health")
            health_answered.set()
        await running

    service.run(both())
    assert order == ["health", "query"]


async def _answer(reader: asyncio.StreamReader, deadline: float = 10.0) -> bytes:
    """What the server sends until it closes the connection (within the deadline)."""
    return await asyncio.wait_for(reader.read(), deadline)


async def _response(reader: asyncio.StreamReader, deadline: float = 10.0) -> bytes:
    """One HTTP response: its head, and a body of its Content-Length."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), deadline)
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return head + await asyncio.wait_for(reader.readexactly(length), deadline)


def test_idle_and_slow_clients_are_cut_off(filled, start_service, monkeypatch):
    from softdta.collector import service as service_module
    monkeypatch.setattr(service_module, "IDLE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(service_module, "BODY_TIMEOUT_S", 0.5)
    service = start_service(OfflineSource(filled.collector))
    port = service.server.addresses[0][1]

    async def clients():
        silent = await asyncio.open_connection("127.0.0.1", port)
        half_header = await asyncio.open_connection("127.0.0.1", port)
        half_header[1].write(b"POST /key-write/" + KEY_WRITE.encode() + b" HTTP/1.1\r\nHost: x\r\n")
        half_body = await asyncio.open_connection("127.0.0.1", port)
        half_body[1].write(b"POST /key-write/" + KEY_WRITE.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"keys\": ")
        return await _answer(silent[0]), await _answer(half_header[0]), await _response(half_body[0])

    silent, half_header, half_body = service.run(clients())
    assert silent == b"" and half_header == b""
    assert half_body.startswith(b"HTTP/1.1 408") and b'{"error": "the body did not arrive within' in half_body
    assert service.call("GET", "/health")["status"] == "ok"


class Dribbler:
    """A slow client: the head of a Key-Write query at once, then `burst` bytes of its body, then the rest one byte
    every `interval` seconds, going on after any answer as a hostile client would."""

    def __init__(self, port: int, body: bytes, interval: float, burst: int = 0):
        self.port, self.body, self.interval, self.burst = port, body, interval, burst
        self.sent_some = asyncio.Event()  # set once the server has had the head and a byte of the body

    async def start(self) -> "Dribbler":
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(b"POST /key-write/%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (KEY_WRITE.encode(), len(self.body),
                                                              self.body[:self.burst]))
        self.began = asyncio.get_running_loop().time()
        self.sending = asyncio.create_task(self._send())
        return self

    async def _send(self) -> None:
        try:
            for index in range(self.burst, len(self.body)):
                await asyncio.sleep(self.interval)  # the client's pace
                self.writer.write(self.body[index:index + 1])
                await self.writer.drain()
                self.sent_some.set()
        except ConnectionError:
            pass  # the server has closed the connection

    def _since_start(self) -> float:
        return asyncio.get_running_loop().time() - self.began

    async def answer(self, deadline: float) -> tuple[bytes, float]:
        """The server's response, and when it came (seconds after the head)."""
        return await _response(self.reader, deadline), self._since_start()

    async def closed(self, deadline: float) -> float:
        """When the server closed the connection (seconds after the head), waiting at most `deadline`."""
        try:
            async with asyncio.timeout(deadline):
                while await self.reader.read(1 << 16):
                    pass
        except ConnectionResetError:
            pass  # closed with the client's last bytes unread
        return self._since_start()

    def stop(self) -> None:
        self.sending.cancel()
        self.writer.close()


def _one_key_body(filled: Filled, pad_to: int = 0) -> bytes:
    return json.dumps({"keys": [filled.key_write[0].key.hex()], "redundancy": REDUNDANCY}).encode().ljust(pad_to)


def test_slow_bodies_hold_up_no_other_query(filled, start_service, monkeypatch):
    """Five clients dribble their bodies at once; a one-key query from another client is answered at once, the two
    dribblers that finish within the body deadline get their answer, the three that would take 12 s a 408."""
    from softdta.collector import service as service_module
    body_timeout_s = 3.0
    monkeypatch.setattr(service_module, "BODY_TIMEOUT_S", body_timeout_s)
    service = start_service(OfflineSource(filled.collector))
    body = _one_key_body(filled)

    async def clients():
        port = service.server.addresses[0][1]
        slow = [await Dribbler(port, body, 12.0 / len(body)).start() for _ in range(3)]
        in_time = [await Dribbler(port, body, 1.0 / len(body)).start() for _ in range(2)]
        try:
            await asyncio.wait_for(asyncio.gather(*(dribbler.sent_some.wait() for dribbler in slow + in_time)), 5)
            began = asyncio.get_running_loop().time()

            async def query():
                async with service.http.post(f"/key-write/{KEY_WRITE}", data=body) as response:
                    return response.status, await response.json()

            status, answer = await asyncio.wait_for(query(), 2.0)
            took = asyncio.get_running_loop().time() - began
            answers = await asyncio.gather(*(dribbler.answer(body_timeout_s + 5) for dribbler in slow + in_time))
        finally:
            for dribbler in slow + in_time:
                dribbler.stop()
        return status, answer, took, answers[:3], answers[3:]

    status, answer, took, slow, in_time = service.run(clients())
    assert status == 200 and answer["results"][0]["key"] == filled.key_write[0].key.hex() and took < 2.0
    for response, after in in_time:
        assert response.startswith(b"HTTP/1.1 200") and after < body_timeout_s
        assert json.loads(response.split(b"\r\n\r\n", 1)[1]) == answer
    for response, after in slow:
        assert response.startswith(b"HTTP/1.1 408") and body_timeout_s <= after < body_timeout_s + 1.5
        assert b'{"error": "the body did not arrive within 3 s' in response


def test_a_client_too_slow_with_its_body_is_answered_408_and_disconnected(filled, start_service, monkeypatch):
    from softdta.collector import service as service_module
    monkeypatch.setattr(service_module, "BODY_TIMEOUT_S", 1.0)
    service = start_service(OfflineSource(filled.collector))

    async def client():
        dribbler = await Dribbler(service.server.addresses[0][1], _one_key_body(filled, 100), 0.2).start()  # 20 s
        try:
            return *await dribbler.answer(6.0), await dribbler.closed(service_module.LINGER_S + 3.0)
        finally:
            dribbler.stop()

    response, answered_after, closed_after = service.run(client())
    assert response.startswith(b"HTTP/1.1 408") and b"Connection: close" in response
    assert 1.0 <= answered_after < 2.5
    assert closed_after < answered_after + service_module.LINGER_S + 1.0
    assert service.call("GET", "/health")["status"] == "ok"


def test_bodies_waiting_for_their_query_are_bounded_in_memory(filled, start_service, monkeypatch):
    """Beyond MAX_BUFFERED_BODY_BYTES of bodies held at once, a query is refused with 503 until they are gone."""
    from softdta.collector import service as service_module
    monkeypatch.setattr(service_module, "MAX_BUFFERED_BODY_BYTES", 1000)
    monkeypatch.setattr(service_module, "BODY_TIMEOUT_S", 3.0)
    service = start_service(OfflineSource(filled.collector))
    query = {"data": _one_key_body(filled, 300)}

    async def over_the_limit():
        # 800 bytes at once, then a byte every 0.5 s: the body holds 800 bytes until the server cuts it off
        dribbler = await Dribbler(service.server.addresses[0][1], _one_key_body(filled, 900), 0.5, 800).start()
        try:
            await asyncio.wait_for(dribbler.sent_some.wait(), 15)
            async with service.http.post(f"/key-write/{KEY_WRITE}", **query) as response:
                refused = response.status, await response.json()
            cut_off, _ = await dribbler.answer(5.0)
        finally:
            dribbler.stop()
        return refused, cut_off

    (status, refused), cut_off = service.run(over_the_limit())
    assert status == 503 and "request bodies" in refused["error"], refused
    assert cut_off.startswith(b"HTTP/1.1 408")
    answer = service.call("POST", f"/key-write/{KEY_WRITE}", **query)  # the held body is gone
    assert answer["results"][0]["key"] == filled.key_write[0].key.hex()


def test_connections_beyond_the_limit_are_refused_and_the_service_goes_on(filled, start_service, monkeypatch):
    from softdta.collector import service as service_module
    monkeypatch.setattr(service_module, "MAX_CONNECTIONS", 4)
    service = start_service(OfflineSource(filled.collector))
    port = service.server.addresses[0][1]

    async def flood():
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        reader, _ = await asyncio.open_connection("127.0.0.1", port)
        refused = await _answer(reader)
        for _, writer in idle:
            writer.close()
        return refused

    refused = service.run(flood())
    assert refused.startswith(b"HTTP/1.1 503") and b"connections open; try again later" in refused

    async def health_when_they_are_gone():  # the server sees the idle ones close on its own time
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            async with service.http.get("/health") as response:
                if response.status == 200 or asyncio.get_running_loop().time() > deadline:
                    return response.status
            await asyncio.sleep(0.05)

    assert service.run(health_when_they_are_gone()) == 200
