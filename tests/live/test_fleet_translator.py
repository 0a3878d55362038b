"""Translators that follow a fleet in etcd (`softdta translator up --etcd`): a real etcd, collectors and a translator
as processes in namespaces (softdta.lab.fleet_lab.FleetLab); reports sent to the fleet address
land at the owners of their slot under the running epoch."""

import dataclasses
import json
import os

import pytest

from softdta.core.fleet import MEMBERS, SlotMap, fleet_prefix
from softdta.lab.fleet_lab import FleetLab, wait_until
from softdta.wire import dta

pytestmark = pytest.mark.privileged

KEYS = list(range(1, 301))
SLOT_BITS = 8
ENGINES = ["python", "xdp"]


@pytest.fixture
def lab(tmp_path, request):
    fleet = FleetLab(tmp_path, collectors=2, translators=1, engine=request.param, fleet=f"test{os.getpid()}")
    try:
        yield fleet.build()
    finally:
        fleet.close()


def owner_of(lab: FleetLab, slot_map: SlotMap, key: int) -> int:
    """The collector (index) owning a Key-Write key's slot."""
    owner = slot_map.owners(dta.key_write(key, 0).key)[0]
    return next(index for index in range(1, lab.collectors + 1) if lab.collector(index).name == owner)


def write(lab: FleetLab, values: dict[int, int]) -> None:
    lab.send(lab.reporter_address().frame(dta.key_write(key, value, 1)) for key, value in values.items())


def stored(lab: FleetLab, collector: int, keys: list[int]) -> dict[int, int | None]:
    """What the collector's Key-Write structure holds for `keys`."""
    rows = lab.http(collector, f"/key-write/key-write@{lab.collector(collector).ip}",
                    {"keys": keys, "redundancy": 1})["results"]
    return {key: int(row["value"], 16) if row["value"] is not None else None for key, row in zip(keys, rows)}


def wait_stored(lab: FleetLab, collector: int, values: dict[int, int], what: str) -> None:
    keys = sorted(values)
    wait_until(lambda: stored(lab, collector, keys) == values, f"{what}: collector {collector} holding "
               f"{len(keys)} keys", 10)


def swapped(slot_map: SlotMap, epoch: int) -> SlotMap:
    """The map with the owners of every slot exchanged between the two collectors."""
    first, second = sorted(slot_map.members)
    other = {first: second, second: first}
    return SlotMap(epoch, slot_map.slot_bits, slot_map.replicas, slot_map.members,
                   tuple(tuple(other[name] for name in owners) for owners in slot_map.slots))


def connected_everywhere(lab: FleetLab, collectors: set[int]) -> bool:
    status = lab.fleet_status(1)
    states = {name for name, state in status["collectors"].items() if state == "connected"}
    return states == {lab.collector(index).name for index in collectors} and status["replicas_unconnected"] == 0


def counters(lab: FleetLab) -> dict[str, int]:
    return lab.translator_stats(1)["counters"]


def up(lab: FleetLab, slot_map: SlotMap, started: tuple[int, ...] = (1, 2)) -> None:
    lab.start_etcd()
    lab.start_collectors(*started)
    for index in range(1, lab.collectors + 1):
        lab.register(index)
    lab.commit(slot_map.to_json())
    lab.start_translators(1)
    lab.wait_applied(slot_map.epoch)


def check_owners(lab: FleetLab, slot_map: SlotMap, values: dict[int, int], what: str) -> None:
    """Every key's value is at its owner under `slot_map`."""
    for index in (1, 2):
        wait_stored(lab, index, {key: value for key, value in values.items() if owner_of(lab, slot_map, key) == index},
                    what)


@pytest.mark.parametrize("lab", ENGINES, indirect=True)
def test_a_new_epoch_moves_the_remapped_keys_reports_to_their_new_owner(lab):
    first = lab.slot_map((1, 2), slot_bits=SLOT_BITS)
    up(lab, first)
    wait_until(lambda: connected_everywhere(lab, {1, 2}), "both collectors connected", 10)
    before = {key: 1 << 24 | key for key in KEYS}
    write(lab, before)
    check_owners(lab, first, before, "epoch 1")
    assert {owner_of(lab, first, key) for key in KEYS} == {1, 2}

    second = swapped(first, 2)
    lab.commit(second.to_json())
    lab.wait_applied(2)
    after = {key: 2 << 24 | key for key in KEYS}
    write(lab, after)
    check_owners(lab, second, after, "epoch 2")
    for index in (1, 2):  # the old owner keeps what it was written under epoch 1
        kept = {key: value for key, value in before.items() if owner_of(lab, first, key) == index}
        assert stored(lab, index, sorted(kept)) == kept
    wait_until(lambda: counters(lab).get("fleet_resolved", 0) == 2 * len(KEYS), "every report resolved", 5)
    assert lab.applied()["t1"]["epoch"] == 2 and lab.fleet_status(1)["epoch"] == 2


@pytest.mark.parametrize("lab", ["python"], indirect=True)
def test_a_collector_added_to_the_map_is_connected_and_its_slots_wait_for_it(lab):
    first = lab.slot_map((1,), slot_bits=SLOT_BITS)
    up(lab, first, started=(1,))
    assert connected_everywhere(lab, {1})
    second = lab.slot_map((1, 2), previous=first, slot_bits=SLOT_BITS)
    lab.commit(second.to_json())
    lab.wait_applied(2)
    status = lab.fleet_status(1)
    assert status["collectors"][lab.collector(2).name] in ("connecting", "unreachable")
    moved = [key for key in KEYS if owner_of(lab, second, key) == 2]
    assert moved and status["slots_unmapped"] == sum(1 for owners in second.slots if owners[0] == lab.collector(2).name)
    # the epoch is applied, but not in full: applied/ says how many replicas wait for their collector
    wait_until(lambda: lab.applied()["t1"]["replicas_unconnected"] == status["replicas_unconnected"] > 0,
               "epoch 2 applied without collector 2's replicas", 10)
    dropped = counters(lab).get("drop_fleet_unmapped", 0)
    write(lab, {key: 3 << 24 | key for key in moved})  # their collector is not up: dropped, and counted
    wait_until(lambda: counters(lab).get("drop_fleet_unmapped", 0) - dropped == len(moved), "unmapped drops", 10)
    assert "not connected and left out" in lab.log("t1")

    lab.start_collectors(2)
    wait_until(lambda: connected_everywhere(lab, {1, 2}), "collector 2 connected", 15)
    values = {key: 4 << 24 | key for key in KEYS}
    write(lab, values)
    check_owners(lab, second, values, "epoch 2 with collector 2")
    wait_until(lambda: lab.applied()["t1"]["replicas_unconnected"] == 0, "epoch 2 applied in full", 10)


@pytest.mark.parametrize("lab", ["python"], indirect=True)
def test_with_etcd_killed_the_translator_runs_on_its_epoch_and_catches_up_when_etcd_returns(lab):
    first = lab.slot_map((1, 2), slot_bits=SLOT_BITS)
    up(lab, first)
    wait_until(lambda: connected_everywhere(lab, {1, 2}), "both collectors connected", 10)
    lab.etcd_server.kill()  # kill -9
    wait_until(lambda: not lab.fleet_status(1)["etcd_reachable"], "the translator seeing etcd gone", 10)
    status = lab.fleet_status(1)
    assert status["epoch"] == 1 and status["etcd_outages"] == 1
    values = {key: 5 << 24 | key for key in KEYS}
    write(lab, values)
    check_owners(lab, first, values, "etcd down, epoch 1")
    stats = lab.softdta_stats(1)
    assert "UNREACHABLE, running on the last epoch" in stats and "epoch 1" in stats

    lab.start_etcd()
    second = swapped(first, 2)
    lab.commit(second.to_json())
    lab.wait_applied(2)
    assert lab.fleet_status(1)["etcd_reachable"]
    values = {key: 6 << 24 | key for key in KEYS}
    write(lab, values)
    check_owners(lab, second, values, "etcd back, epoch 2")


@pytest.mark.parametrize("lab", ["python"], indirect=True)
def test_a_bad_slot_map_is_refused_and_the_running_one_stays(lab):
    first = lab.slot_map((1, 2), slot_bits=SLOT_BITS)
    second = swapped(first, 2)
    up(lab, first)
    lab.commit(second.to_json())
    lab.wait_applied(2)
    unknown = json.loads(swapped(first, 3).to_json())
    unknown["slots"][7] = [5]  # a collector the map does not list
    for refused, (bad, reasons) in enumerate([(json.dumps(unknown), ("unknown collector", "malformed")),
                                              (first.to_json(), ("epoch 1 does not follow epoch 2",)),
                                              ("{not json", ("slot map is malformed",))], start=1):
        lab.commit(bad)
        wait_until(lambda: lab.fleet_status(1)["slot_maps_refused"] == refused, f"refusal {refused}", 10)
        assert any(reason in lab.fleet_status(1)["last_refusal"] for reason in reasons)
        assert any("slot map refused, epoch 2 stays" in line and any(reason in line for reason in reasons)
                   for line in lab.log("t1").splitlines())
    assert lab.fleet_status(1)["epoch"] == 2 and lab.applied()["t1"]["epoch"] == 2
    values = {key: 7 << 24 | key for key in KEYS}
    write(lab, values)
    check_owners(lab, second, values, "after the refusals, epoch 2")


@pytest.mark.parametrize("lab", ["python"], indirect=True)
def test_a_collector_back_with_other_regions_is_connected_again(lab):
    first = lab.slot_map((1, 2), slot_bits=SLOT_BITS)
    up(lab, first)
    wait_until(lambda: connected_everywhere(lab, {1, 2}), "both collectors connected", 10)
    member = lab.member(1)
    other = dataclasses.replace(member, layout="another")  # what a collector restarted with other regions writes
    lab.etcd(lambda etcd: etcd.put(fleet_prefix(lab.fleet) + MEMBERS + member.name, other.to_json()))
    lab.wait_for_line(lab.translator(1).name, f"collector {member.name} left the slot map, moved or came back with "
                      "other regions")
    wait_until(lambda: connected_everywhere(lab, {1, 2}), "collector 1 connected again", 10)
    values = {key: 3 << 24 | key for key in KEYS}
    write(lab, values)
    check_owners(lab, first, values, "after the reconnect")
