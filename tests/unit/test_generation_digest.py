"""The tables generation (control_plane.generation_of): a digest of the entries' values, not of how the objects
holding them happen to be shared, that changes with any one entry of a 4096-slot map."""

from softdta.core.control_plane import Entry, generation_of


def _slots(addresses: list[bytes]) -> list[Entry]:
    return [Entry("fleet_slot", {"slot": slot}, {"replicas": 1, "collector_ip": address})
            for slot, address in enumerate(addresses)]


def test_equal_entries_give_one_generation_however_their_values_are_shared():
    shared = bytes([10, 0, 0, 1]) * 4
    distinct = [bytes([10, 0, 0, 1]) * 4 for _ in range(4096)]
    assert len({id(address) for address in distinct}) == 4096
    assert generation_of(_slots([shared] * 4096)) == generation_of(_slots(distinct))


def test_any_one_slot_changes_the_generation_and_none_is_zero():
    addresses = [bytes([10, 0, 0, 1 + slot % 3]) * 4 for slot in range(4096)]
    first = generation_of(_slots(addresses))
    seen = {first.value["generation"]}
    for slot in (0, 1, 2047, 4095):
        changed = list(addresses)
        changed[slot] = bytes([10, 0, 0, 9]) * 4
        seen.add(generation_of(_slots(changed)).value["generation"])
    assert len(seen) == 5 and 0 not in seen
    assert generation_of([]).value["generation"] != 0
    assert first == Entry("tables_generation", {"index": 0}, first.value)
