"""The reference translator at a fleet address: each report goes to its slot's collectors (docs/fleet.md)."""

import random

import pytest

from softdta.core import registry
from softdta.core.settings import TableError
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.core.workload import ReporterAddress
from softdta.spec import DtaOpcode, RoceOpcode, TranslatorCounter
from softdta.wire import dta
from softdta.wire.frames import ip_bytes, ip_str, mac_bytes
from softdta.wire.hashing import key_slot, partition_slot
from softdta.wire.roce import parse_roce
from tests.common import FLEET_ADDRESS, fleet_document, fleet_tables

REPORTER = ReporterAddress(mac_bytes("02:00:00:00:00:09"), ip_bytes("10.77.2.1"), mac_bytes("02:5d:7a:00:00:01"),
                           ip_bytes(FLEET_ADDRESS))


def to(address: str) -> ReporterAddress:
    return ReporterAddress(REPORTER.mac, REPORTER.ip, REPORTER.translator_mac, ip_bytes(address))


def collector_of(frame: bytes) -> str:
    return ip_str(frame[30:34])


def keys(count: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(4) for _ in range(count)]


@pytest.mark.parametrize("kind", [DtaOpcode.KEY_WRITE, DtaOpcode.KEY_INCREMENT, DtaOpcode.POSTCARDING])
def test_keyed_reports_to_the_fleet_address_land_at_their_slots_first_replica(kind):
    tables, slot_map = fleet_tables()
    translator = Translator(tables)
    make = {DtaOpcode.KEY_WRITE: lambda key: dta.key_write(key, 7, 1),
            DtaOpcode.KEY_INCREMENT: lambda key: dta.key_increment(key, 3, 1),
            DtaOpcode.POSTCARDING: lambda key: dta.postcard(key, 1, 5)}[kind]
    landed = {}
    for key in keys(300):
        out = translator.process(REPORTER.frame(make(key)), 0)
        assert out.drop is None
        owner = slot_map.members[slot_map.owners(key)[0]]
        assert {collector_of(frame) for frame in out.frames} <= {owner}
        landed[owner] = landed.get(owner, 0) + 1
    assert len(landed) == 3, "300 random keys reach every collector"
    assert translator.counters[TranslatorCounter.FLEET_RESOLVED] == 300


def test_a_report_to_a_collectors_own_address_is_not_resolved():
    tables, _ = fleet_tables()
    translator = Translator(tables)
    out = translator.process(to("10.77.1.2").frame(dta.key_write(b"\x01\x02\x03\x04", 7, 1)), 0)
    assert [collector_of(frame) for frame in out.frames] == ["10.77.1.2"]
    assert translator.counters[TranslatorCounter.FLEET_RESOLVED] == 0


def test_copies_across_collectors_go_to_replica_n_at_copy_ns_slot():
    tables, slot_map = fleet_tables(replicas=2, across=True)
    translator = Translator(tables)
    for key in keys(50):
        frames = translator.process(REPORTER.frame(dta.key_write(key, 9, 2)), 0).frames
        owners = [slot_map.members[name] for name in slot_map.owners(key)]
        assert [collector_of(frame) for frame in frames] == owners
        for copy, frame in enumerate(frames):
            structure = tables.structure(ip_bytes(owners[copy]), DtaOpcode.KEY_WRITE)
            offset = key_slot(key, copy, structure.slot_count, structure.key_hash) * structure.slot_size
            assert parse_roce(frame).headers["reth"]["va"] == structure.qp.base_va + offset


def test_without_across_every_copy_goes_to_the_first_replica():
    tables, slot_map = fleet_tables(replicas=2)
    translator = Translator(tables)
    key = keys(1)[0]
    frames = translator.process(REPORTER.frame(dta.key_increment(key, 5, 3)), 0).frames
    assert [collector_of(frame) for frame in frames] == [slot_map.members[slot_map.owners(key)[0]]] * 3
    assert {parse_roce(frame).opcode for frame in frames} == {RoceOpcode.RC_FETCH_ADD}


def test_a_copy_whose_replica_is_in_grace_is_skipped_and_counted_the_others_go():
    tables, slot_map = fleet_tables(replicas=2, across=True)
    translator = Translator(tables)
    key = keys(1)[0]
    second = ip_bytes(slot_map.members[slot_map.owners(key)[1]])
    translator.resync(tables.structure(second, DtaOpcode.KEY_WRITE).qp, 0, now_ns=0)
    frames = translator.process(REPORTER.frame(dta.key_write(key, 9, 2)), 0).frames
    assert [collector_of(frame) for frame in frames] == [slot_map.members[slot_map.owners(key)[0]]]
    assert translator.counters[TranslatorCounter.DROP_GRACE] == 1


def test_a_slot_whose_collectors_have_no_such_structure_is_a_counted_drop():
    tables, slot_map = fleet_tables(collectors=2, replicas=1)
    tables.structures = [s for s in tables.structures if s.primitive != DtaOpcode.POSTCARDING
                         or ip_str(s.qp.collector_ip) != "10.77.1.1"]
    tables.qps = [qp for owner in tables.structures + tables.append_lists for qp in owner.qps]
    tables.validate()
    translator = Translator(tables)
    orphan = next(key for key in keys(100) if slot_map.owners(key) == ("c1",))
    out = translator.process(REPORTER.frame(dta.postcard(orphan, 1, 5)), 0)
    assert out.drop is TranslatorCounter.DROP_FLEET_UNMAPPED and not out.frames


def test_append_lists_go_to_the_owner_of_their_slot():
    tables, slot_map = fleet_tables()
    translator = Translator(tables)
    for list_id in range(64):
        lists = tables.append_range(list_id)
        owner = slot_map.owners(list_id.to_bytes(4, "big"))[0]
        assert ip_str(lists.qp.collector_ip) == slot_map.members[owner]
        for _ in range(lists.batch):
            out = translator.process(REPORTER.frame(dta.append(list_id, 1)), 0)
        assert [collector_of(frame) for frame in out.frames] == [slot_map.members[owner]]


def test_every_primitive_names_its_partition_key():
    assert registry.by_opcode(DtaOpcode.APPEND).partition_key(dta.append(0x01020304, 1)) == bytes([1, 2, 3, 4])
    assert registry.by_opcode(DtaOpcode.KEY_WRITE).partition_key(dta.key_write(b"abcd", 1, 1)) == b"abcd"
    for primitive in registry.registered():
        assert primitive.partitioned_by


def test_the_sketch_lives_on_one_collector():
    tables, slot_map = fleet_tables()
    translator = Translator(tables)
    owner = slot_map.members[slot_map.slots[partition_slot(b"", 12)][0]]
    sent = []
    for reporter in range(2):
        for column in range(64):
            sent += translator.process(REPORTER.frame(dta.sketch_column(reporter, column, [1, 2, 3, 4])), 0).frames
    assert sent and {collector_of(frame) for frame in sent} == {owner}


@pytest.mark.parametrize("change, message", [
    (lambda fleet: fleet.update(slots=fleet["slots"][:-1]), "4095 slots given"),
    (lambda fleet: fleet["slots"].__setitem__(5, ["c1", "c9"]), "slot 5 names collector 'c9'"),
    (lambda fleet: fleet["slots"].__setitem__(5, ["c1", "c1"]), "slot 5 needs at most 4 distinct"),
    (lambda fleet: fleet.update(address="10.77.1.1"), "is a collector's"),
    (lambda fleet: fleet.update(slot_bits=17), "slot_bits = 17 is out of range"),
    (lambda fleet: fleet.update(across="yes"), "must be true or false"),
    (lambda fleet: fleet.update(spread=1), "unknown setting 'spread'"),
])
def test_bad_fleet_sections_name_the_problem(change, message):
    document, _ = fleet_document()
    change(document["fleet"])
    with pytest.raises(TableError, match=message):
        Tables.from_dict(document)


def moved_list_tables():
    """Tables of epoch 1 and of an epoch 2 whose slots all moved one collector on, and an Append list."""
    document, _ = fleet_document()
    first = Tables.from_dict(document)
    rotate = {"c1": "c2", "c2": "c3", "c3": "c1"}
    document["fleet"] = dict(document["fleet"], epoch=2,
                             slots=[[rotate[name] for name in owners] for owners in document["fleet"]["slots"]])
    return first, Tables.from_dict(document), 5


def test_a_list_moved_to_another_collector_starts_its_ring_there_and_keeps_its_waiting_entries():
    first, second, list_id = moved_list_tables()
    translator = Translator(first)
    batch = first.append_range(list_id).batch
    for entry in range(batch + 1):  # one batch written, one entry waiting
        translator.process(REPORTER.frame(dta.append(list_id, entry)), 0)
    translator.retable(second)
    lists = second.append_range(list_id)
    frames = []
    for entry in range(batch + 1, 2 * batch):
        frames += translator.process(REPORTER.frame(dta.append(list_id, entry)), 0).frames
    assert [collector_of(frame) for frame in frames] == [ip_str(lists.qp.collector_ip)]
    write = parse_roce(frames[0])
    assert write.headers["reth"]["va"] == lists.qp.base_va + lists.ring_offset(list_id)
    assert write.payload[:4] == batch.to_bytes(4, "little"), "the entry that waited leads the new ring"
    translator.retable(first)  # back to its first collector: on after the batch it wrote there
    frames = []
    for entry in range(batch):
        frames += translator.process(REPORTER.frame(dta.append(list_id, entry)), 0).frames
    lists = first.append_range(list_id)
    assert parse_roce(frames[0]).headers["reth"]["va"] == \
        lists.qp.base_va + lists.ring_offset(list_id) + batch * lists.data_len


def test_the_control_plane_gives_a_moved_list_a_fresh_ring_and_its_old_one_back_when_it_returns():
    from softdta.core.control_plane import LiveQp, Slots, plan
    first, second, list_id = moved_list_tables()
    before = plan(first, Slots(), flush_idle_ns=0, egress=lambda qp: 0)
    live = {before.slots.qp[qp.local_qpn]: LiveQp(qp.remote_qpn, qp.start_psn) for qp in first.qps}
    after = plan(second, before.slots, flush_idle_ns=0, egress=lambda qp: 0, installed_qps=live)
    reset = {entry.key["state_index"] for entry in after.state if entry.table == "append_state"}
    assert after.slots.append[list_id] != before.slots.append[list_id] and after.slots.append[list_id] in reset
    assert before.slots.append[list_id] not in reset, "the ring it left keeps its head"
    back = plan(first, after.slots, flush_idle_ns=0, egress=lambda qp: 0, installed_qps=live)
    assert back.slots.append[list_id] == before.slots.append[list_id]
    assert not [entry for entry in back.state if entry.table == "append_state"]
