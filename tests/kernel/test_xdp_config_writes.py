"""The XDP translator writes a config map entry only when its value changes: a new slot-map epoch rewrites the
slots that moved, not all 4096. The data path never writes those maps, so an entry changed behind the
translator's back is how a test sees which entries a plan wrote."""

import os
import random
import shutil

import pytest

from softdta.core.control_plane import Entry, fleet_entries
from softdta.core.fleet import assign
from softdta.core.tables import Tables
from softdta.engines.xdp import XdpTranslator, map_entry
from softdta.kernel.bpf import ensure_bpffs
from tests.kernel.test_xdp_fleet import SLOT_BITS, fleet_document, members

pytestmark = pytest.mark.privileged

BEHIND_ITS_BACK = Entry("fleet_slot", {"slot": 0}, {"replicas": 1, "collector_ip": bytes([10, 99, 99, 99]) * 4})


def _epochs() -> tuple[Tables, Tables]:
    """A three-collector fleet, then the epoch after c4 joined."""
    old_map = assign(members(["c1", "c2", "c3"]), replicas=2, slot_bits=SLOT_BITS)
    new_map = assign(members(["c1", "c2", "c3", "c4"]), replicas=2, slot_bits=SLOT_BITS, previous=old_map)
    return (Tables.from_dict(fleet_document(random.Random(1), old_map)),
            Tables.from_dict(fleet_document(random.Random(1), new_map)))


def _slots_held(kernel: XdpTranslator) -> dict[bytes, bytes | None]:
    """The map's entries of the slot map's slots (the array has room for larger maps)."""
    keys = [slot.to_bytes(4, "little") for slot in range(1 << SLOT_BITS)]
    return {key: kernel.maps["fleet_slot"].lookup(key) for key in keys}


def _plant(kernel: XdpTranslator, slots: list[int]) -> None:
    for slot in slots:
        key, value = map_entry(Entry("fleet_slot", {"slot": slot}, BEHIND_ITS_BACK.value))
        kernel.maps["fleet_slot"].update(key, value)


def test_a_new_epoch_writes_the_slots_that_moved_and_no_other():
    old_tables, new_tables = _epochs()
    old_slots, new_slots = old_tables.fleet.slots, new_tables.fleet.slots
    moved = [slot for slot, (old, new) in enumerate(zip(old_slots, new_slots)) if old != new]
    stayed = [slot for slot, (old, new) in enumerate(zip(old_slots, new_slots)) if old == new]
    assert moved and stayed
    with XdpTranslator(old_tables, flush_idle_ns=0) as kernel:
        _plant(kernel, stayed[:50] + moved[:50])
        kernel.apply(new_tables)
        held = _slots_held(kernel)
        assert kernel.read("fleet_config", index=0)["epoch"] == new_tables.fleet.epoch
    planted = map_entry(BEHIND_ITS_BACK)[1]
    wanted = dict(map_entry(entry) for entry in fleet_entries(new_tables) if entry.table == "fleet_slot")
    assert [slot for slot in stayed[:50] if held[slot.to_bytes(4, "little")] == planted] == stayed[:50]
    assert {key: value for key, value in held.items() if value != planted} == \
        {key: value for key, value in wanted.items() if int.from_bytes(key, "little") not in stayed[:50]}


def test_a_translator_over_pinned_maps_writes_every_entry_once():
    """It does not know what the pinned maps hold: its first apply writes them in full."""
    old_tables, _ = _epochs()
    pin = ensure_bpffs() / f"softdta-test-{os.getpid()}"
    pin.mkdir(parents=True, exist_ok=True)
    try:
        with XdpTranslator(old_tables, pin_dir=pin, flush_idle_ns=0) as first:
            _plant(first, list(range(1 << SLOT_BITS)))
        with XdpTranslator(old_tables, pin_dir=pin, flush_idle_ns=0) as second:
            held = _slots_held(second)
    finally:
        shutil.rmtree(pin, ignore_errors=True)
    assert held == dict(map_entry(entry) for entry in fleet_entries(old_tables) if entry.table == "fleet_slot")
