"""The python engine live on veth at a fleet address: reports sent to the fleet's one address leave as RoCEv2
frames to their slots' collectors (copies across replicas when the fleet asks), exactly the reference
translator's frames; a new epoch applied live moves the keys of the slots that moved, and no others."""

import os
import queue
import random
import shutil
import threading
import time

import pytest

from softdta.core import workload
from softdta.core.fleet import Member, SlotMap, assign
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.engines.python import PythonEngine, engine_stats
from softdta.kernel.bpf import ensure_bpffs
from softdta.kernel.netns import in_netns
from softdta.spec import ROCE_PORT, TranslatorCounter
from softdta.wire import dta
from softdta.wire.frames import ip_bytes, ip_str, mac_bytes
from softdta.wire.roce import parse_roce
from tests.common import FLEET_ADDRESS, fleet_document, udp_frames
from tests.kernel.test_python_engine import NO_FLUSH, send, wire  # noqa: F401 (wire: the fixture)

pytestmark = pytest.mark.privileged

FLEET = ip_bytes(FLEET_ADDRESS)


def members(count: int) -> dict[str, Member]:
    """The collectors of tests.common.fleet_document."""
    return {f"c{n}": Member(f"c{n}", f"10.77.1.{n}", f"02:5d:7a:00:01:{n:02x}", f"10.77.1.{n}:4790",
                            f"http://10.77.1.{n}:8080") for n in range(1, count + 1)}


def key_writes(tables: Tables, count: int, seed: int) -> tuple[list[bytes], list[bytes]]:
    """Key-Writes of 2 copies to the fleet address, key i carrying data i: (keys, frames)."""
    rng = random.Random(seed)
    reporter = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac, FLEET)
    keys = [rng.randbytes(4) for _ in range(count)]
    return keys, [reporter.frame(dta.key_write(key, index, 2)) for index, key in enumerate(keys)]


def landed(frames: list[bytes]) -> dict[int, list[str]]:
    """Key-Write frames by the data they carry (the key's index): the collectors they went to, in order."""
    places: dict[int, list[str]] = {}
    for frame in frames:
        packet = parse_roce(frame)
        if len(packet.payload) == 8:  # checksum ‖ 4 bytes of data: a Key-Write
            places.setdefault(int.from_bytes(packet.payload[4:], "big"), []).append(ip_str(packet.dst_ip))
    return places


def owners(slot_map: SlotMap, key: bytes, copies: int) -> list[str]:
    replicas = [slot_map.members[name] for name in slot_map.owners(key)]
    return [replicas[copy % len(replicas)] for copy in range(copies)]


@pytest.mark.parametrize("across", [False, True], ids=["first-replica", "across"])
def test_reports_to_the_fleet_address_land_at_their_slots_collectors(wire, across, request):  # noqa: F811
    far, translator_ns, capture = wire
    document, slot_map = fleet_document(across=across)
    tables = Tables.from_dict(document)
    keys, frames = key_writes(tables, 300, 1)
    reporter = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac, FLEET)
    # every other primitive too, in amounts that leave nothing for the idle flush
    frames += [reporter.frame(report) for report in
               workload.key_increment(60, seed=2, redundancy=2) + workload.append(4 * 8, seed=3, lists=2)
               + workload.postcards(20, seed=4, hops=5) + workload.sketch_epoch(2, 64, 4, seed=5)]
    reference = Translator(tables)
    expected = [emitted for frame in frames for emitted in reference.process(frame).frames]
    pin = ensure_bpffs() / f"softdta-python-fleet-{os.getpid()}"
    request.addfinalizer(lambda: shutil.rmtree(pin, ignore_errors=True))
    stop = threading.Event()
    with PythonEngine(tables, pin_dir=pin, flush_idle_ns=NO_FLUSH) as engine:
        with in_netns(translator_ns.name):
            engine.attach(["t0"])
        server = threading.Thread(target=engine.serve, args=(stop,))
        server.start()
        try:
            send(far, frames)
            seen = udp_frames(capture, ROCE_PORT, expected=len(expected), quiet_s=1.0)
        finally:
            stop.set()
            server.join()
    assert len(seen) == len(expected) and seen == expected
    places = landed(seen)
    assert places == {index: owners(slot_map, key, 2) if across else owners(slot_map, key, 1) * 2
                      for index, key in enumerate(keys)}
    assert {place for found in places.values() for place in found} == {f"10.77.1.{n}" for n in (1, 2, 3)}
    counters = engine_stats(pin)["counters"]
    assert counters["fleet_resolved"] == len(frames) - 4 * 8 == reference.counters[TranslatorCounter.FLEET_RESOLVED]
    assert counters["rx_reports"] == len(frames) and counters.get("drop_fleet_unmapped", 0) == 0


def test_a_new_epoch_applied_live_moves_the_keys_of_the_slots_that_moved(wire):  # noqa: F811
    """c4 joins: the engine serving the epoch of c1..c3 takes the next epoch's tables from its updates queue, and
    from then on the keys of the slots c4 took go to c4, every other key where it went before."""
    far, translator_ns, capture = wire
    old_document, old_map = fleet_document(collectors=3)
    new_document, _ = fleet_document(collectors=4)
    new_map = assign(members(4), replicas=2, previous=old_map)
    new_document["fleet"].update(epoch=new_map.epoch, slots=[list(owned) for owned in new_map.slots])
    old_tables, new_tables = Tables.from_dict(old_document), Tables.from_dict(new_document)
    keys, frames = key_writes(old_tables, 400, 2)
    stop, updates = threading.Event(), queue.Queue()
    with PythonEngine(old_tables, flush_idle_ns=NO_FLUSH) as engine:
        with in_netns(translator_ns.name):
            engine.attach(["t0"])
        server = threading.Thread(target=engine.serve, args=(stop, updates))
        server.start()
        try:
            send(far, frames)
            before = landed(udp_frames(capture, ROCE_PORT, expected=2 * len(keys), quiet_s=1.0))
            updates.put(new_tables)
            deadline = time.monotonic() + 5
            while engine.tables is not new_tables and time.monotonic() < deadline:
                time.sleep(0.01)
            assert engine.tables is new_tables
            send(far, frames)
            after = landed(udp_frames(capture, ROCE_PORT, expected=2 * len(keys), quiet_s=1.0))
        finally:
            stop.set()
            server.join()
    assert before == {index: owners(old_map, key, 1) * 2 for index, key in enumerate(keys)}
    assert after == {index: owners(new_map, key, 1) * 2 for index, key in enumerate(keys)}
    moved = [index for index, key in enumerate(keys) if before[index] != after[index]]
    assert moved and all(after[index] == ["10.77.1.4"] * 2 for index in moved)
