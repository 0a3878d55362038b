"""A primitive added in the test tree alone (tests/primitives/key_max.py), registered once, runs through the
reference translator, the batch translator, the offline collector and the query service."""

import asyncio
import random

import aiohttp
import pytest
import uvloop

from softdta.collector.service import OfflineSource, serve
from softdta.core import registry
from softdta.core.batch import BatchTranslator
from softdta.core.offline import OfflineCollector
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.spec import TranslatorCounter
from softdta.wire.frames import build_udp_frame, ip_str
from tests.common import ENDS
from tests.primitives.key_max import KeyMax

COLLECTOR = ip_str(ENDS.dst_ip)
TABLES = {
    "translator": {"mac": "02:5d:7a:00:00:01", "ip": "10.77.0.1"},
    "collectors": [{"name": "c1", "ip": COLLECTOR, "mac": "02:5d:7a:00:01:01"}],
    "structures": [{"primitive": "key-max", "collector": "c1", "hash": "independent",
                    "qp": {"remote_qpn": 0x111, "local_qpn": 0x211, "rkey": 0x1011, "base": 0x7F0000000000,
                           "length": 1 << 16}}],
}


@pytest.fixture
def key_max():
    registry.register(KeyMax)
    yield Tables.from_dict(TABLES)
    registry.unregister(KeyMax)


def reports(count: int, keys: int, seed: int = 7) -> tuple[list[bytes], dict[bytes, int]]:
    """Frames of `count` Key-Max reports over `keys` keys, and each key's largest value."""
    rng, maxima, frames = random.Random(seed), {}, []
    for _ in range(count):
        key, value = rng.randrange(keys).to_bytes(4, "big"), rng.randrange(1 << 32)
        maxima[key] = max(maxima.get(key, 0), value)
        frames.append(build_udp_frame(ENDS, KeyMax.report(key, value)))
    return frames, maxima


def test_the_tables_take_it_by_its_name_and_lay_out_its_structure(key_max):
    structure = key_max.structures[0]
    assert registry.by_name("key-max") is KeyMax and structure.primitive == KeyMax.opcode
    assert structure.slot_size == 8 and structure.slot_count == (1 << 16) // 8
    assert structure.name == f"key_max@{COLLECTOR}"


def test_the_reference_writes_only_what_raises_a_keys_maximum(key_max):
    translator = Translator(key_max)
    key = (5).to_bytes(4, "big")
    sent = [build_udp_frame(ENDS, KeyMax.report(key, value)) for value in (10, 3, 10, 12)]
    written = [len(translator.process(frame).frames) for frame in sent]
    assert written == [1, 0, 0, 1]
    assert translator.counters[TranslatorCounter.TX_FRAMES] == 2


def test_batches_equal_the_reference_and_the_collector_answers_each_keys_maximum(key_max):
    frames, maxima = reports(3000, 200)
    oracle = Translator(key_max)
    reference = [out for frame in frames for out in oracle.process(frame).frames]
    batch = BatchTranslator(Translator(key_max))
    batched = [out for low in range(0, len(frames), 256)
               for out in batch.process_batch(frames[low:low + 256]).frames]
    assert batched == reference and len(reference) < len(frames)

    collector = OfflineCollector(key_max)
    for frame in batched:
        collector.deliver(frame)
    counters = collector.counters()
    assert {name: n for name, n in counters.items() if n} == {"executed": len(batched)}, counters
    keys = sorted(maxima)
    body = {"keys": [key.hex() for key in keys], "redundancy": 1}
    answer = asyncio.Runner(loop_factory=uvloop.new_event_loop).run(
        query(OfflineSource(collector), f"/key-max/key-max@{COLLECTOR}", body))
    assert [result["key"] for result in answer["results"]] == [key.hex() for key in keys]
    values = [None if result["value"] is None else int(result["value"], 16) for result in answer["results"]]
    found = sum(value == maxima[key] for key, value in zip(keys, values))
    collided = sum(value is None for value in values)
    assert found + collided == len(keys) and found >= 0.95 * len(keys), (found, collided)
    assert all(value is None or value == maxima[key] for key, value in zip(keys, values))


async def query(source: OfflineSource, path: str, body: dict) -> dict:
    server = await serve(source, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{server.addresses[0][1]}") as http:
            listed = await (await http.get("/structures")).json()
            assert any(entry["primitive"] == "key-max" for entry in listed["structures"]), listed
            async with http.post(path, json=body) as response:
                assert response.status == 200, await response.text()
                return await response.json()
    finally:
        await server.cleanup()
