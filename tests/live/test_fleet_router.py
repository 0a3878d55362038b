"""The fleet's query router over a real etcd and three real collector query services.

The collectors' memory is filled the way a fleet fills it: reports addressed to the fleet are translated by the
reference translator with the fleet's slot map in its tables, and each collector's offline collector executes the
frames addressed to it. A single collector that got the same reports is the truth the router must equal."""

import asyncio
import json
import subprocess
import threading
from dataclasses import dataclass, replace

import pytest
import uvloop

from softdta.collector.service import OfflineSource, serve
from softdta.core import workload
from softdta.core.fleet import MEMBERS, SLOT_MAP, Member, SlotMap, assign, fleet_prefix
from softdta.core.offline import OfflineCollector
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.core.workload import ReporterAddress
from softdta.fleet.router import FleetWatch, Router
from softdta.fleet.router import serve as serve_router
from softdta.lab.etcd_server import EtcdServer
from softdta.wire.frames import ip_bytes, mac_bytes
from softdta.wire.hashing import partition_slot
from tests.common import SOFTDTA

FLEET = "lab"
FLEET_ADDRESS = "10.77.2.1"
SLOT_BITS = 6  # 64 slots: a few hundred keys reach every one
NAMES = ("c1", "c2", "c3")
SOLO = "solo"
TRANSLATOR = {"mac": "02:5d:7a:00:00:01", "ip": "10.77.0.1"}
VALUE_SET = list(range(1, 1025))  # the switch IDs workload.postcards reports


def collector(name: str, number: int) -> dict:
    return {"name": name, "ip": f"10.77.1.{number}", "mac": f"02:5d:7a:00:01:{number:02x}"}


def structures(name: str, number: int) -> tuple[list[dict], list[dict]]:
    """One collector's structures and Append range, its queue pairs numbered after it."""
    def qp(k: int, length: int) -> dict:
        return {"remote_qpn": 0x100 * number + k, "local_qpn": 0x1000 * number + k, "rkey": 0x10000 * number + k,
                "base": 0x7F0000000000 + (number << 32) + (k << 28), "length": length}
    return ([{"primitive": "key-write", "collector": name, "hash": "independent", "qp": qp(1, 1 << 22)},
             {"primitive": "key-increment", "collector": name, "hash": "independent", "qp": qp(2, 1 << 20)},
             {"primitive": "postcarding", "collector": name, "hops": 5, "qp": qp(3, 1 << 23)},
             {"primitive": "sketch-merge", "collector": name, "columns": 64, "rows": 4, "reporters": 2,
              "merge": "sum", "batch": 8, "qp": qp(4, 1024)}],
            [{"collector": name, "first_list": 0, "lists": 16, "entries": 1024, "batch": 4, "qp": qp(5, 1 << 16)}])


def tables_of(names: tuple[str, ...], fleet: SlotMap | None = None, across: bool = False) -> Tables:
    numbers = {name: 9 if name == SOLO else NAMES.index(name) + 1 for name in names}
    document = {"translator": TRANSLATOR, "collectors": [collector(n, numbers[n]) for n in names],
                "structures": [], "append": []}
    for name in names:
        held, ranges = structures(name, numbers[name])
        document["structures"] += held
        document["append"] += ranges
    if fleet is not None:
        document["fleet"] = {"address": FLEET_ADDRESS, "epoch": fleet.epoch, "slot_bits": fleet.slot_bits,
                             "across": across, "slots": [list(owners) for owners in fleet.slots]}
    return Tables.from_dict(document)


def members() -> dict[str, Member]:
    return {name: Member(name, collector(name, i + 1)["ip"], collector(name, i + 1)["mac"], "127.0.0.1:1", "")
            for i, name in enumerate(NAMES)}


class Services:
    """Collector query services on one event loop thread: `start` one over a collector's memory, `stop` it."""

    def __init__(self):
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runners = {}

    def start(self, name: str, collector: OfflineCollector) -> str:
        runner = asyncio.run_coroutine_threadsafe(serve(OfflineSource(collector), "127.0.0.1", 0), self.loop).result(5)
        self.runners[name] = runner
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    def stop(self, name: str) -> None:
        asyncio.run_coroutine_threadsafe(self.runners.pop(name).cleanup(), self.loop).result(10)

    def close(self) -> None:
        for name in list(self.runners):
            self.stop(name)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclass
class Fleet:
    """The fleet's collectors (memory and query URLs), the single collector, and etcd with the fleet in it."""

    etcd: EtcdServer
    services: Services
    collectors: dict[str, OfflineCollector]
    urls: dict[str, str]
    solo: OfflineCollector
    solo_url: str
    translator: Translator
    solo_translator: Translator

    def register(self, slot_map: SlotMap) -> None:
        client = self.etcd.client()
        for name, member in members().items():
            client.put(fleet_prefix(FLEET) + MEMBERS + name, Member(
                member.name, member.ip, member.mac, member.control, self.urls[name]).to_json())
        client.put(fleet_prefix(FLEET) + SLOT_MAP, slot_map.to_json())

    def send(self, reports: list) -> None:
        """Reports to the fleet address through the fleet's translator, and to the single collector."""
        to_fleet = ReporterAddress(mac_bytes("02:00:00:00:09:01"), ip_bytes("10.77.9.1"),
                                   mac_bytes(TRANSLATOR["mac"]), ip_bytes(FLEET_ADDRESS))
        to_solo = ReporterAddress(to_fleet.mac, to_fleet.ip, to_fleet.translator_mac,
                                  ip_bytes(collector(SOLO, 9)["ip"]))
        for report in reports:
            for frame in self.translator.process(to_fleet.frame(report)).frames:
                for held in self.collectors.values():
                    held.deliver(frame)
            for frame in self.solo_translator.process(to_solo.frame(report)).frames:
                self.solo.deliver(frame)
        self.flush()

    def flush(self) -> None:
        """Append's partial batches written out (an idle flush), as they would be before an epoch changes."""
        for frame in self.translator.flush_idle(now_ns=1 << 62):
            for held in self.collectors.values():
                held.deliver(frame)
        for frame in self.solo_translator.flush_idle(now_ns=1 << 62):
            self.solo.deliver(frame)

    def apply(self, slot_map: SlotMap, across: bool = False) -> None:
        """The fleet's translator takes a new epoch live, as its engine re-applies tables."""
        self.translator.retable(tables_of(NAMES, slot_map, across))


def make_fleet(tmp_path, slot_map: SlotMap, across: bool = False) -> Fleet:
    etcd = EtcdServer(tmp_path / "etcd").start()
    services = Services()
    collectors = {name: OfflineCollector(tables_of((name,))) for name in NAMES}
    urls = {name: services.start(name, held) for name, held in collectors.items()}
    solo = OfflineCollector(tables_of((SOLO,)))
    fleet = Fleet(etcd, services, collectors, urls, solo, services.start(SOLO, solo),
                  Translator(tables_of(NAMES, slot_map, across)), Translator(tables_of((SOLO,))))
    fleet.register(slot_map)
    return fleet


@pytest.fixture
def fleets(tmp_path):
    made = []

    def make(slot_map: SlotMap, across: bool = False) -> Fleet:
        made.append(make_fleet(tmp_path / str(len(made)), slot_map, across))
        return made[-1]
    yield make
    for fleet in made:
        fleet.services.close()
        fleet.etcd.kill()


def ask(fleet: Fleet, run):
    """Run `run(router)` with a router that follows the fleet in etcd."""
    watch = FleetWatch(fleet.etcd.client(), FLEET).start()

    async def go():
        async with Router(lambda: watch.view, FLEET) as router:
            return await run(router, watch)
    try:
        return asyncio.run(go())
    finally:
        watch.close()


async def solo_answer(url: str, path: str, body: dict | None = None) -> dict:
    import aiohttp
    async with aiohttp.ClientSession() as http:
        request = http.post(url + path, json=body) if body is not None else http.get(url + path)
        async with request as response:
            assert response.status == 200, await response.text()
            return await response.json()


def write_reports(keys: int, seed: int = 1):
    return workload.key_write(keys, seed=seed, redundancy=2)


def every_query(fleet: Fleet, key_writes, increments, flows, lists):
    """The router's answers and the single collector's, for every primitive."""
    async def run(router, watch):
        solo = fleet.solo_url
        answers = {}
        body = {"keys": [r.key.hex() for r in key_writes], "redundancy": 2}
        answers["key-write"] = (await router.query(_kind("key-write"), body),
                                await solo_answer(solo, f"/key-write/key-write@{collector(SOLO, 9)['ip']}", body))
        body = {"keys": sorted({r.key.hex() for r in increments}), "redundancy": 2}
        answers["key-increment"] = (await router.query(_kind("key-increment"), body), await solo_answer(
            solo, f"/key-increment/key-increment@{collector(SOLO, 9)['ip']}", body))
        if flows:
            body = {"keys": flows, "value_set": VALUE_SET}
            answers["postcarding"] = (await router.query(_kind("postcarding"), body), await solo_answer(
                solo, f"/postcarding/postcarding@{collector(SOLO, 9)['ip']}", body))
        answers["sketch-merge"] = (await router.query(_kind("sketch-merge"), {}), await solo_answer(
            solo, f"/sketch-merge/sketch-merge@{collector(SOLO, 9)['ip']}"))
        answers["append"] = {list_id: (await router.append(list_id), await solo_answer(
            solo, f"/append/append0@{collector(SOLO, 9)['ip']}?list={list_id}")) for list_id in lists}
        return answers
    return run


def _kind(name: str):
    from softdta.core import registry
    return registry.by_name(name)


def _results(answer: dict, *fields: str) -> list[tuple]:
    return [tuple(result.get(f) for f in ("key", *fields)) for result in answer["results"]]


def test_the_routers_answers_equal_one_collectors_over_every_primitive(fleets):
    slot_map = assign(members(), replicas=1, slot_bits=SLOT_BITS)
    fleet = fleets(slot_map)
    key_writes = write_reports(600)
    increments = workload.key_increment(2000, seed=2, flows=64)
    # flow after flow: the translators' postcard caches then never evict a partial path (they hold 1 and 3 caches)
    postcards = sorted(workload.postcards(200, seed=3), key=lambda r: r.key)
    appends = workload.append(400, seed=4, lists=16)
    sketch = workload.sketch_epoch(2, 64, 4, seed=5)
    fleet.send(workload.interleave([key_writes, increments, postcards, appends, sketch], seed=6))
    flows = sorted({r.key.hex() for r in postcards})
    answers = ask(fleet, every_query(fleet, key_writes, increments, flows, range(16)))

    routed, solo = answers["key-write"]
    assert _results(routed, "value", "status") == _results(solo, "value", "status")
    assert routed["found"] == len(key_writes) and not routed["partial"] and routed["missing_slots"] == []
    assert {result["value"] for result in routed["results"]} == {r.data.hex() for r in key_writes}
    assert routed["epoch"] == slot_map.epoch
    routed, solo = answers["key-increment"]
    assert _results(routed, "count") == _results(solo, "count") and not routed["partial"]
    assert sum(result["count"] for result in routed["results"]) == sum(r.counter for r in increments)
    routed, solo = answers["postcarding"]
    assert _results(routed, "path", "complete") == _results(solo, "path", "complete")
    assert routed["complete"] == len(flows)
    routed, solo = answers["sketch-merge"]
    assert routed["matrix"] == solo["matrix"] and any(map(any, routed["matrix"]))
    for list_id, (routed, solo) in answers["append"].items():
        assert routed["entries"] == solo["entries"] and not routed["partial"], list_id
    assert sum(len(routed["entries"]) for routed, _ in answers["append"].values()) == len(appends)
    # the keys really are spread: every collector holds some
    holders = {slot_map.owners(r.key)[0] for r in key_writes}
    assert holders == set(NAMES)


def test_a_killed_collector_gives_a_partial_answer_naming_exactly_its_slots(fleets):
    slot_map = assign(members(), replicas=1, slot_bits=SLOT_BITS)
    fleet = fleets(slot_map)
    key_writes = write_reports(800)
    fleet.send(key_writes)
    fleet.services.stop("c2")
    body = {"keys": [r.key.hex() for r in key_writes], "redundancy": 2}

    async def run(router, watch):
        return await router.query(_kind("key-write"), body), await router.query(_kind("sketch-merge"), {})
    answer, sketch = ask(fleet, run)
    lost = {r.key.hex() for r in key_writes if slot_map.owners(r.key)[0] == "c2"}
    assert answer["partial"] and answer["down"] == ["c2"]
    assert answer["missing_slots"] == slot_map.slots_of("c2")  # 800 keys reach all of its slots
    assert answer["missing_slots"] == sorted({partition_slot(bytes.fromhex(k), SLOT_BITS) for k in lost})
    statuses = {result["key"]: result["status"] for result in answer["results"]}
    assert {key for key, status in statuses.items() if status == "missing"} == lost
    assert all(status == "found" for key, status in statuses.items() if key not in lost)
    assert answer["missing"] == len(lost) and answer["found"] == len(key_writes) - len(lost)
    owner = slot_map.owners(b"")[0]
    assert sketch["partial"] == (owner == "c2")


def test_copies_across_collectors_lose_no_key_to_a_killed_one(fleets):
    slot_map = assign(members(), replicas=2, slot_bits=SLOT_BITS)
    fleet = fleets(slot_map, across=True)
    key_writes = write_reports(500)
    fleet.send(key_writes)
    body = {"keys": [r.key.hex() for r in key_writes], "redundancy": 2, "mode": "consensus"}

    async def run(router, watch):
        return await router.query(_kind("key-write"), body)
    whole = ask(fleet, run)
    assert whole["found"] == len(key_writes) and not whole["partial"]
    assert {result["votes"] for result in whole["results"]} == {2}  # one copy on each of two collectors
    fleet.services.stop("c1")
    answer = ask(fleet, run)
    assert answer["partial"] and answer["down"] == ["c1"] and answer["missing_slots"] == slot_map.slots_of("c1")
    with_c1 = {r.key.hex() for r in key_writes if "c1" in slot_map.owners(r.key)}
    assert 0 < len(with_c1) < len(key_writes)
    statuses = {result["key"]: result["status"] for result in answer["results"]}
    assert {key for key, status in statuses.items() if status == "missing"} == with_c1, \
        "a consensus of 2 needs both copies"
    assert answer["found"] == len(key_writes) - len(with_c1)
    body["mode"] = "plurality"
    answer = ask(fleet, run)
    assert answer["found"] == len(key_writes), "every key kept a copy on a survivor"
    assert [result["value"] for result in answer["results"]] == [r.data.hex() for r in key_writes]


def test_across_an_epoch_change_the_router_reads_old_and_new_owners(fleets):
    two = {name: member for name, member in members().items() if name != "c3"}
    first = assign(two, replicas=1, slot_bits=SLOT_BITS)
    fleet = fleets(first)
    key_writes = write_reports(600)
    increments = workload.key_increment(1500, seed=2, flows=64)
    appends = workload.append(300, seed=4, lists=16)
    fleet.send(workload.interleave([key_writes[:400], increments[:700], appends[:150]], seed=7))

    second = assign(members(), replicas=1, slot_bits=SLOT_BITS, previous=first)
    moved = [slot for slot in range(first.slot_count) if first.slots[slot] != second.slots[slot]]
    assert moved and set(second.slots[slot][0] for slot in moved) == {"c3"}
    # rewritten under the new epoch: the newer value must win
    newer = [replace(r, data=bytes(b ^ 0xFF for b in r.data)) for r in key_writes[:200]]

    async def run(router, watch):
        before = await router.query(_kind("key-write"), {"keys": [r.key.hex() for r in key_writes[:400]],
                                                            "redundancy": 2})
        fleet.etcd.client().put(fleet_prefix(FLEET) + SLOT_MAP, second.to_json())
        view = await asyncio.to_thread(watch.wait_for, lambda v: v.current is not None and v.current.epoch == 2, 10)
        assert [slot_map.epoch for slot_map in view.history] == [1]
        fleet.apply(second)
        fleet.send(workload.interleave([key_writes[400:], newer, increments[700:], appends[150:]], seed=8))
        return before, await every_query(fleet, key_writes, increments, [], range(16))(router, watch)
    before, answers = ask(fleet, run)
    assert before["found"] == 400 and before["epoch"] == 1

    routed, solo = answers["key-write"]
    assert routed["epoch"] == 2 and not routed["partial"]
    assert _results(routed, "value", "status") == _results(solo, "value", "status")
    latest = {r.key.hex(): r.data.hex() for r in key_writes + newer}
    assert {result["key"]: result["value"] for result in routed["results"]} == latest
    rewritten_and_moved = [r for r in newer if second.slot_of(r.key) in moved]
    assert rewritten_and_moved, "some rewritten keys changed owners: their old owner still holds the old value"
    routed, solo = answers["key-increment"]
    assert _results(routed, "count") == _results(solo, "count")
    assert sum(result["count"] for result in routed["results"]) == sum(r.counter for r in increments)
    split = [r for r in increments if second.slot_of(r.key) in moved]
    assert split, "some counted flows changed owners: their counts are summed over both"
    for list_id, (routed, solo) in answers["append"].items():
        assert routed["entries"] == solo["entries"], list_id
    assert any(len(routed["collectors"]) == 2 for routed, _ in answers["append"].values())


def test_the_router_service_and_fleet_query_answer_as_a_collector_does(fleets):
    slot_map = assign(members(), replicas=1, slot_bits=SLOT_BITS)
    fleet = fleets(slot_map)
    key_writes = write_reports(300)
    fleet.send(key_writes)
    body = {"keys": [r.key.hex() for r in key_writes], "redundancy": 2}

    async def run(router, watch):
        runner = await serve_router(router, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            listed = await solo_answer(url, "/structures")
            answer = await solo_answer(url, f"/key-write/key-write@{FLEET}", body)
            health = await solo_answer(url, "/health")
        finally:
            await runner.cleanup()
        return listed, answer, health
    listed, answer, health = ask(fleet, run)
    assert {entry["name"] for entry in listed["structures"]} >= {f"key-write@{FLEET}", f"append@{FLEET}"}
    assert answer["found"] == len(key_writes) and health["epoch"] == slot_map.epoch and health["etcd"] == "up"
    keys = [str(int.from_bytes(r.key, "big")) for r in key_writes[:50]]  # as integers: hex of digits reads as one
    result = subprocess.run([*SOFTDTA, "fleet", "query", "--etcd", fleet.etcd.endpoint, "--fleet", FLEET, "key-write",
                             *keys], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert [r["value"] for r in printed["results"]] == [r.data.hex() for r in key_writes[:50]]


def test_fleet_query_without_etcd_is_one_line(tmp_path):
    from tests.common import one_line_error
    result = subprocess.run([*SOFTDTA, "fleet", "query", "--etcd", "http://127.0.0.1:9", "--fleet", FLEET,
                             "key-write", "00000001"], capture_output=True, text=True, timeout=60)
    assert "etcd" in one_line_error(result)


def test_a_collector_answers_key_rows_as_its_json_answer_says(fleets):
    """The binary form the router uses: keys as rows in the body, one answer row per key."""
    import aiohttp
    import numpy as np

    from softdta.collector.service import ROWS_CONTENT_TYPE
    from softdta.core.primitives.key_write.queries import LOOKUP_STATUSES, parse_lookup_rows
    fleet = fleets(assign(members(), replicas=1, slot_bits=SLOT_BITS))
    key_writes = write_reports(300)
    increments = workload.key_increment(500, seed=2, flows=16)
    fleet.send(key_writes + increments)
    solo = collector(SOLO, 9)["ip"]
    unknown = [bytes([0xEE, 0, 0, n]) for n in range(5)]
    keys = [r.key for r in key_writes] + unknown
    flows = sorted({r.key for r in increments})

    async def run():
        async with aiohttp.ClientSession(fleet.solo_url) as http:
            async def post(path, body, params=None, content_type=ROWS_CONTENT_TYPE):
                async with http.post(path, data=body, params=params, headers={"Content-Type": content_type}) as reply:
                    return reply.status, await reply.read()
            rows = await post(f"/key-write/key-write@{solo}", b"".join(keys), {"redundancy": "2"})
            as_json = await solo_answer(fleet.solo_url, f"/key-write/key-write@{solo}",
                                        {"keys": [k.hex() for k in keys], "redundancy": 2})
            counts = await post(f"/key-increment/key-increment@{solo}", b"".join(flows), {"redundancy": "2"})
            counts_json = await solo_answer(fleet.solo_url, f"/key-increment/key-increment@{solo}",
                                            {"keys": [k.hex() for k in flows], "redundancy": 2})
            consensus = await post(f"/key-write/key-write@{solo}", b"".join(keys),
                                   {"redundancy": "2", "mode": "consensus", "consensus": "2"})
            consensus_json = await solo_answer(fleet.solo_url, f"/key-write/key-write@{solo}", {
                "keys": [k.hex() for k in keys], "redundancy": 2, "mode": "consensus", "consensus": 2})
            ragged = await post(f"/key-write/key-write@{solo}", b"\x01\x02\x03", {"redundancy": "2"})
            unknown_field = await post(f"/key-write/key-write@{solo}", keys[0], {"redundancy": "2", "x": "1"})
            paths = await post(f"/postcarding/postcarding@{solo}", keys[0], {"value_set": "[1, 2]"})
            return rows, as_json, counts, counts_json, (consensus, consensus_json), ragged, unknown_field, paths
    rows, as_json, counts, counts_json, (consensus, consensus_json), ragged, unknown_field, paths = asyncio.run(run())
    assert rows[0] == 200 and consensus[0] == 200
    status, votes, values = parse_lookup_rows(rows[1], 4)
    assert [LOOKUP_STATUSES[s] for s in status] == [r["status"] for r in as_json["results"]]
    assert votes.tolist() == [r["votes"] for r in as_json["results"]]
    assert [v.tobytes().hex() if r["value"] else None for v, r in zip(values, as_json["results"])] == \
        [r["value"] for r in as_json["results"]]
    assert [LOOKUP_STATUSES[s] for s in status[-5:]] == ["empty"] * 5
    assert [LOOKUP_STATUSES[s] for s in parse_lookup_rows(consensus[1], 4)[0]] == \
        [r["status"] for r in consensus_json["results"]]
    assert counts[0] == 200
    assert np.frombuffer(counts[1], ">u8").tolist() == [r["count"] for r in counts_json["results"]]
    assert ragged[0] == 400 and b"whole keys" in ragged[1]
    assert unknown_field[0] == 400 and b"unknown field" in unknown_field[1]
    assert paths[0] == 415 and b"JSON only" in paths[1]


def test_softdta_fleet_router_serves_until_stopped(fleets):
    import signal
    import urllib.request
    fleet = fleets(assign(members(), replicas=1, slot_bits=SLOT_BITS))
    key_writes = write_reports(100)
    fleet.send(key_writes)
    router = subprocess.Popen([*SOFTDTA, "fleet", "router", "--etcd", fleet.etcd.endpoint, "--fleet", FLEET,
                               "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = router.stdout.readline()
        assert line.startswith("softdta fleet router up on http://127.0.0.1:"), line + router.stderr.read()
        url = line.split()[5].rstrip(":")
        body = json.dumps({"keys": [r.key.hex() for r in key_writes], "redundancy": 2}).encode()
        request = urllib.request.Request(f"{url}/key-write/key-write@{FLEET}", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            answer = json.loads(reply.read())
        assert answer["found"] == len(key_writes) and not answer["partial"]
        router.send_signal(signal.SIGTERM)
        assert router.wait(timeout=30) == 0
    finally:
        if router.poll() is None:
            router.kill()
            router.wait()
