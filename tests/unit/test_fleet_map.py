"""The fleet's partition hash and slot map (core/fleet.py): one hash in every form, independent of the structures'
slot hashes; a balanced assignment that moves only what a join or a leave must; maps that cannot be used refused."""

import json
import random

import numpy as np
import pytest

from softdta.core.fleet import FleetError, Member, SlotMap, assign, check_successor, moved_fraction
from softdta.spec import PARTITION_HASH_NAME, PARTITION_POLYNOMIAL, KeyHash
from softdta.wire.hashing import (
    crc32_poly,
    crc32_rows,
    key_hashes_rows,
    key_slot_hash,
    partition_hash,
    partition_slot,
    partition_slots_rows,
    postcard_slot_hash,
)
from tests.common import bitwise_crc32

SLOT_BITS = 12
STRUCTURE_SLOT_BITS = 17  # a structure of 2^17 slots: 12 + 17 partition and slot bits from a 32-bit key


def member(index: int, weight: float = 1.0) -> Member:
    return Member(f"c{index:02d}", f"10.0.{index // 250}.{index % 250 + 1}", "02:00:00:00:00:01",
                  "127.0.0.1:4791", "http://127.0.0.1:8040", weight)


def members(count: int, start: int = 0) -> dict[str, Member]:
    return {m.name: m for m in map(member, range(start, start + count))}


# ---- the partition hash ------------------------------------------------------------------------------------


def test_partition_hash_is_crc32k2():
    # the parameters are the CRC catalogue's: its check value of CRC-32D (CRC-32/BASE91-D) comes out
    assert crc32_poly(0xA833982B, b"123456789") == bitwise_crc32(0xA833982B, b"123456789") == 0x87315576
    assert (PARTITION_HASH_NAME, PARTITION_POLYNOMIAL) == ("crc32k2", 0x32583499)
    assert partition_hash(b"123456789") == bitwise_crc32(PARTITION_POLYNOMIAL, b"123456789") == 0xEEB754CC
    assert partition_hash(b"") == 0
    rng = random.Random(32)
    for length in range(33):
        key = rng.randbytes(length)
        assert partition_hash(key) == bitwise_crc32(PARTITION_POLYNOMIAL, key)


@pytest.mark.parametrize("length", range(33))
def test_scalar_and_numpy_partition_hashes_agree(length):
    rng = np.random.default_rng(length)
    rows = rng.integers(0, 256, size=(200, length), dtype=np.uint8)
    keys = [bytes(row) for row in rows]
    assert crc32_rows(rows, PARTITION_POLYNOMIAL).tolist() == [partition_hash(key) for key in keys]
    for slot_bits in (1, SLOT_BITS, 16):
        assert partition_slots_rows(rows, slot_bits).tolist() == [partition_slot(key, slot_bits) for key in keys]


def structure_slot_hashes():
    """Every slot hash a structure may use on a 4-byte key, by name."""
    hashes = {f"{scheme.name} copy {copy}": (lambda key, copy=copy, scheme=scheme: key_slot_hash(key, copy, scheme))
              for scheme in KeyHash for copy in range(4)}
    hashes["postcard"] = postcard_slot_hash
    return hashes


def linear_rows(hash_function, bits: int) -> list[int]:
    """The low `bits` output bits of an affine hash of 4-byte keys as rows over GF(2): bit i of row j says whether
    key bit i flips output bit j. Checks first that the hash is affine, so the rows are all there is to it."""
    def of(value: int) -> int:
        return hash_function(value.to_bytes(4, "big"))
    zero = of(0)
    rng = random.Random(bits)
    for _ in range(64):
        a, b = rng.getrandbits(32), rng.getrandbits(32)
        assert of(a ^ b) == of(a) ^ of(b) ^ zero
    columns = [of(1 << i) ^ zero for i in range(32)]
    return [sum(((column >> j) & 1) << i for i, column in enumerate(columns)) for j in range(bits)]


def gf2_rank(rows: list[int]) -> int:
    basis: list[int] = []  # kept reduced: each element's top bit is set in no other
    for row in rows:
        for element in basis:
            row = min(row, row ^ element)
        if row:
            basis.append(row)
    return len(basis)


@pytest.mark.parametrize("name", sorted(structure_slot_hashes()))
def test_partition_bits_and_structure_slot_bits_are_linearly_independent(name):
    # full rank: for every (partition slot, structure slot) exactly 2^(32 - 29) keys, so the keys a collector
    # gets for one partition slot spread over every slot of its structures, and no slot stays empty
    partition = linear_rows(partition_hash, SLOT_BITS)
    structure = linear_rows(structure_slot_hashes()[name], STRUCTURE_SLOT_BITS)
    assert gf2_rank(partition) == SLOT_BITS and gf2_rank(structure) == STRUCTURE_SLOT_BITS
    assert gf2_rank(partition + structure) == SLOT_BITS + STRUCTURE_SLOT_BITS


@pytest.mark.parametrize("slot_bits", range(1, 17))
def test_every_slot_map_size_is_independent_of_structures_up_to_27_bits_together(slot_bits):
    # what docs/fleet.md promises for every --slot-bits: 27 bits of a 4-byte key's partition and slot hashes
    partition = linear_rows(partition_hash, slot_bits)
    for name, slot_hash in structure_slot_hashes().items():
        structure = linear_rows(slot_hash, 27 - slot_bits)
        assert gf2_rank(partition + structure) == 27, name


def test_keys_of_one_partition_slot_fill_every_structure_slot():
    # long keys, empirically: the keys of a partition slot land evenly in a 32-slot structure, by every slot hash
    rng = np.random.default_rng(16)
    rows = rng.integers(0, 256, size=(1 << 20, 16), dtype=np.uint8)
    partition = partition_slots_rows(rows, SLOT_BITS)
    structure_slots = 32
    hashes = {"postcard": crc32_rows(rows)}
    for scheme in KeyHash:
        _checksums, slot_hashes = key_hashes_rows(rows, 4, scheme)
        hashes.update({f"{scheme.name} copy {copy}": slot_hashes[copy] for copy in range(4)})
    for slot in (0, 1, 2048, 4095):
        mine = partition == slot
        expected = mine.sum() / structure_slots  # about 8
        for name, slot_hash in hashes.items():
            counts = np.bincount(slot_hash[mine] & (structure_slots - 1), minlength=structure_slots)
            chi_square = float(((counts - expected) ** 2 / expected).sum())
            assert chi_square < 90, (slot, name, counts.tolist())  # 31 degrees of freedom: p < 1e-6 above 90


# ---- assignment --------------------------------------------------------------------------------------------


def balance(slot_map: SlotMap) -> float:
    """The most (slot, replica) assignments any collector holds, over the mean."""
    held = [len(slot_map.slots_of(name)) for name in slot_map.members]
    return max(held) / (sum(held) / len(held))


@pytest.mark.parametrize("replicas", [1, 2])
def test_balance_and_moves_on_join_for_3_to_64_collectors(replicas):
    # grown one join at a time, as a fleet grows, and from scratch at a few sizes
    slot_map = assign(members(3), replicas=replicas)
    for count in range(3, 64):
        assert slot_map.max_over_mean() <= 1.10 and balance(slot_map) <= 1.10, count
        joined = assign(members(count + 1), replicas=replicas, previous=slot_map)
        assert moved_fraction(slot_map, joined) <= 1.2 / count, count
        slot_map = joined
    assert slot_map.max_over_mean() <= 1.10 and balance(slot_map) <= 1.10
    for count in (5, 17, 64):
        fresh = assign(members(count), replicas=replicas)
        assert fresh.max_over_mean() <= 1.10 and balance(fresh) <= 1.10, count


@pytest.mark.parametrize("count, replicas", [(3, 1), (4, 1), (16, 1), (33, 1), (4, 2), (5, 2), (16, 2), (33, 2),
                                             (5, 3), (16, 3)])
def test_a_leave_moves_only_the_leavers_assignments(count, replicas):
    # with at least replicas + 1 survivors; with exactly `replicas`, every slot holds them all and balancing the
    # positions may reorder a replica set
    before = assign(members(count), replicas=replicas)
    leaver = "c01"
    survivors = {name: m for name, m in members(count).items() if name != leaver}
    after = assign(survivors, replicas=replicas, previous=before)
    for slot, (old, new) in enumerate(zip(before.slots, after.slots)):
        assert len(new) == replicas and leaver not in new
        for position, name in enumerate(old):
            if name != leaver:
                assert new[position] == name, (slot, old, new)
    assert moved_fraction(before, after) == pytest.approx(len(before.slots_of(leaver)) / (4096 * replicas))
    assert after.max_over_mean() <= 1.10 and balance(after) <= 1.10


def test_weights_are_respected():
    fleet = members(4)
    fleet["c00"] = member(0, weight=2.0)
    counts = assign(fleet, replicas=1).primary_counts()
    assert abs(counts["c00"] - 4096 * 2 / 5) < 1
    for name in ("c01", "c02", "c03"):
        assert abs(counts[name] - 4096 / 5) < 1


def test_assignment_is_deterministic_and_ignores_member_order():
    fleet = members(7)
    first = assign(fleet, replicas=2)
    assert assign(fleet, replicas=2) == first
    assert assign(dict(reversed(fleet.items())), replicas=2) == first
    joined = assign(members(8), replicas=2, previous=first)
    assert assign(dict(reversed(members(8).items())), replicas=2, previous=first) == joined


@pytest.mark.parametrize("count, replicas", [(1, 2), (2, 2), (3, 3), (5, 4), (9, 2)])
def test_replica_sets_are_distinct_and_as_large_as_the_fleet_allows(count, replicas):
    slot_map = assign(members(count), replicas=replicas)
    assert slot_map.replicas == min(count, replicas)
    assert all(len(set(owners)) == len(owners) == min(count, replicas) for owners in slot_map.slots)


def test_each_assignment_takes_the_next_epoch():
    first = assign(members(3), replicas=1)
    assert first.epoch == 1
    second = assign(members(4), replicas=1, previous=first)
    assert second.epoch == 2
    assert assign(members(4), replicas=1, previous=second).epoch == 3
    check_successor(None, first)
    check_successor(first, second)


def test_an_epoch_that_does_not_grow_is_refused():
    first = assign(members(3), replicas=1)
    second = assign(members(4), replicas=1, previous=first)
    for stale in (first, second):
        with pytest.raises(FleetError, match="does not follow epoch 2"):
            check_successor(second, stale)


def test_no_collector_no_map():
    with pytest.raises(FleetError, match="no collector"):
        assign({}, replicas=1)


# ---- the slot map's JSON -----------------------------------------------------------------------------------


def document(slot_bits: int = 2) -> dict:
    return json.loads(assign(members(3), replicas=2, slot_bits=slot_bits).to_json())


def test_the_json_round_trips():
    slot_map = assign(members(5), replicas=2)
    assert SlotMap.from_json(slot_map.to_json()) == slot_map


def changed(**fields) -> str:
    return json.dumps({**document(), **fields})


@pytest.mark.parametrize("text, message", [
    ("{", "malformed"),
    ("[]", "malformed"),
    (json.dumps({k: v for k, v in document().items() if k != "slots"}), "malformed"),
    (changed(epoch="one"), "malformed"),
    (changed(members=["c00"]), "malformed"),
    (changed(epoch=0), "epoch 0"),
    (changed(slot_bits=17), "slot_bits 17"),
    (changed(replicas=5), "replicas 5"),
    (changed(slots=[[0, 1]] * 3), "3 slots"),
    (changed(slots=[[0, 1]] * 8), "8 slots"),
    (changed(slots=[[0, 0], [0, 1], [1, 2], [2, 0]]), "distinct"),
    (changed(slots=[[0, 1, 2], [0, 1], [1, 2], [2, 0]]), "distinct"),
    (changed(slots=[[], [0, 1], [1, 2], [2, 0]]), "distinct"),
    (changed(slots=[[0, 3], [0, 1], [1, 2], [2, 0]]), "unknown collector"),
    (changed(slots=[[0, -1], [0, 1], [1, 2], [2, 0]]), "unknown collector"),
    (changed(slots=[[0, "c01"], [0, 1], [1, 2], [2, 0]]), "unknown collector"),
    (changed(members={"c00": "10.0.0.1", "c01": "10.0.0.2", "c02": "ten"}), "c02"),
])
def test_unusable_maps_are_refused(text, message):
    with pytest.raises(FleetError, match=message):
        SlotMap.from_json(text)


def test_a_map_naming_a_collector_it_does_not_list_is_refused():
    with pytest.raises(FleetError, match="unknown collector 'c09'"):
        SlotMap(1, 1, 1, {"c00": "10.0.0.1"}, (("c00",), ("c09",)))
