"""The fleet's query router against one collector asked directly: Key-Write point lookups per second, batched.

Four collector query services run, each in its own process, over a Key-Write region filled with numpy exactly where
the translator would have written (as the `queries` benchmark fills its store): one holds every key (asked
directly), three hold the keys their slots own in a three-collector slot map (asked through the router, which
splits each batch by owner and asks the three at once). Both are asked the same batches of keys, in the key-rows
form (the query service's binary body), one after the other, so their ratio holds on a shared machine.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import urllib.request
from typing import TypedDict

import aiohttp
import numpy as np
import numpy.typing as npt
import uvloop

from softdta.collector.service import ROWS_CONTENT_TYPE, OfflineSource
from softdta.collector.service import run as serve_collector
from softdta.core import registry
from softdta.core.fleet import FleetError, Member, assign
from softdta.core.offline import OfflineCollector
from softdta.core.primitives.key_write.queries import parse_lookup_rows
from softdta.core.primitives.key_write.region import KeyWriteRegion
from softdta.core.tables import Tables
from softdta.fleet.router import FOUND, FleetView, Router
from softdta.lab.benchmarks.workloads import ROUNDS, Stats, stats
from softdta.lab.local_server import free_port
from softdta.spec import KeyHash
from softdta.wire.hashing import key_hashes_rows, partition_slots_rows

SLOT_BITS = 22  # per collector: 4 M slots of 8 bytes (32 MiB)
LOAD = 0.1  # keys written per slot of one collector
SLOT_SIZE = 8
STARTUP_S = 60.0


class RouterRate(TypedDict):
    keys_per_batch: int
    direct_keys_per_s: Stats
    router_keys_per_s: Stats
    router_over_direct: float
    found: float  # the fraction of keys the router found, of those it asked (all were written)
    goal_keys_per_s: int
    goal_ratio: float


def _tables(number: int, slot_bits: int) -> Tables:
    """A collector with one Key-Write structure of 2^slot_bits slots."""
    return Tables.from_dict({
        "translator": {"mac": "02:5d:7a:00:00:01", "ip": "10.77.0.1"},
        "collectors": [{"name": f"c{number}", "ip": f"10.77.1.{number}", "mac": f"02:5d:7a:00:01:{number:02x}"}],
        "structures": [{"primitive": "key-write", "collector": f"c{number}", "hash": "independent",
                        "qp": {"remote_qpn": 0x100 + number, "local_qpn": 0x200 + number, "rkey": 0x1000 + number,
                               "base": 0x7F0000000000, "length": SLOT_SIZE << slot_bits}}]})


def _filled(number: int, slot_bits: int, rows: npt.NDArray[np.uint8], data: npt.NDArray[np.uint32]
            ) -> OfflineCollector:
    """A collector whose Key-Write region holds `rows` (one copy each), written where the translator writes."""
    tables = _tables(number, slot_bits)
    collector = OfflineCollector(tables)
    structure = tables.structures[0]
    region = KeyWriteRegion.for_structure(collector.region_of(structure.qp), structure)
    checksums, hashes = key_hashes_rows(rows, 1, KeyHash.INDEPENDENT)
    slots = hashes[0] & np.uint32((1 << slot_bits) - 1)
    region.checksums[slots] = checksums
    region.data.view(">u4").reshape(-1)[slots] = data  # data as reported: big-endian on the wire
    return collector


def _serve(number: int, slot_bits: int, rows: npt.NDArray[np.uint8], data: npt.NDArray[np.uint32],
           port: int) -> None:
    serve_collector(OfflineSource(_filled(number, slot_bits, rows, data)), "127.0.0.1", port)


def _wait_until_up(url: str, process: multiprocessing.process.BaseProcess) -> None:
    deadline = time.monotonic() + STARTUP_S
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            if not process.is_alive() or time.monotonic() > deadline:
                raise FleetError(f"the benchmark's collector at {url} did not start") from None
            time.sleep(0.05)


def router_rate(batch: int = 100_000, slot_bits: int = SLOT_BITS, rounds: int = ROUNDS) -> RouterRate:
    """Key-Write lookups per second of `batch` keys: one collector directly, and three through the router."""
    rng = np.random.default_rng(31)
    count = int(LOAD * (1 << slot_bits))
    keys = np.unique(rng.integers(0, 1 << 32, size=count + count // 4, dtype=np.uint64).astype(np.uint32))[:count]
    rng.shuffle(keys)
    rows = np.ascontiguousarray(keys.astype(">u4")).view(np.uint8).reshape(-1, 4)
    data = rng.integers(1, 1 << 32, size=count, dtype=np.uint64).astype(np.uint32)
    members = {f"c{n}": Member(f"c{n}", f"10.77.1.{n}", f"02:5d:7a:00:01:{n:02x}", "127.0.0.1:1", "")
               for n in (1, 2, 3)}
    slot_map = assign(members, replicas=1)
    owner = np.array([int(names[0][1:]) for names in slot_map.slots])[
        partition_slots_rows(rows, slot_map.slot_bits)]
    context = multiprocessing.get_context("fork")
    ports = {n: free_port() for n in (0, 1, 2, 3)}  # 0: the one asked directly, holding every key
    processes = {}
    try:
        for n in ports:
            held = slice(None) if n == 0 else owner == n
            processes[n] = context.Process(target=_serve, args=(n or 9, slot_bits, rows[held], data[held], ports[n]),
                                           daemon=True)
            processes[n].start()
        for n, process in processes.items():
            _wait_until_up(f"http://127.0.0.1:{ports[n]}", process)
        members = {name: Member(m.name, m.ip, m.mac, m.control, f"http://127.0.0.1:{ports[int(name[1:])]}")
                   for name, m in members.items()}
        view = FleetView(slot_map, (), members, etcd_up=True)
        batch = min(batch, count)
        batches = [rows[rng.choice(count, size=batch, replace=False)] for _ in range(rounds)]
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            direct, routed, found = runner.run(_measure(f"http://127.0.0.1:{ports[0]}", view, batches))
    finally:
        for process in processes.values():
            process.terminate()
            process.join(10)
    ratio = direct["median"] and routed["median"] / direct["median"]
    return {"keys_per_batch": batch, "direct_keys_per_s": direct, "router_keys_per_s": routed,
            "router_over_direct": round(ratio, 3), "found": found, "goal_keys_per_s": 1_000_000, "goal_ratio": 0.5}


async def _measure(direct_url: str, view: FleetView, batches: list[npt.NDArray[np.uint8]]
                   ) -> tuple[Stats, Stats, float]:
    key_write = registry.by_name("key-write")
    direct_path = f"{direct_url}/key-write/key-write@10.77.1.9"
    direct, routed, found, asked = [], [], 0, 0
    async with aiohttp.ClientSession() as http, Router(lambda: view, "bench") as router:
        async def ask_directly(keys: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
            async with http.post(direct_path, data=keys.tobytes(), params={"redundancy": "1"},
                                 headers={"Content-Type": ROWS_CONTENT_TYPE}) as response:
                return parse_lookup_rows(await response.read(), 4)[0]
        await ask_directly(batches[0][:10])  # connections open, structures known
        await router.key_write(key_write, batches[0][:10], 1)
        for keys in batches:
            started = time.perf_counter()
            await ask_directly(keys)
            direct.append(len(keys) / (time.perf_counter() - started))
            started = time.perf_counter()
            result = await router.key_write(key_write, keys, 1)
            routed.append(len(keys) / (time.perf_counter() - started))
            found += int(np.count_nonzero(result.status == FOUND))
            asked += len(keys)
    return stats(direct), stats(routed), round(found / asked, 4)
