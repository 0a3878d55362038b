"""The v1model program at a fleet address, in bmv2, against the reference translator: a report to the fleet address
goes to the first replica of its partition key's slot that holds a structure of its primitive (the slot hashed by
bmv2's crc32_custom with the spec's partition polynomial), a slot with none drops it as DROP_FLEET_UNMAPPED, and a
new epoch applied live moves exactly the keys whose slots changed owner. Every frame out of the switch equals the
reference's, and so do the fleet counters. Runs the switch as tests/p4/test_bmv2.py does."""

import pytest

from softdta.core import workload
from softdta.core.fleet import Member, assign
from softdta.core.settings import TableError
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.spec import DtaOpcode, TranslatorCounter
from softdta.wire.frames import ip_bytes, ip_str
from softdta.wire.hashing import partition_slot
from tests.common import FLEET_ADDRESS, bmv2_tool, fleet_document
from tests.p4.test_bmv2 import Switch, counters, program, scapy_icrc_ok, without_psn  # noqa: F401  (fixture)

pytestmark = [pytest.mark.privileged, pytest.mark.interop]

SLOT_BITS = 8  # 256 slot entries: quick to write to bmv2, enough to spread random keys over three collectors
LONELY_EVERY = 16  # every 16th slot is c3's alone, and c3 has no Key-Write structure: those keys are unmapped
FLEET_COUNTERS = [TranslatorCounter[name] for name in (
    "FLEET_RESOLVED", "DROP_FLEET_UNMAPPED", "DROP_UNKNOWN_COLLECTOR", "RX_REPORTS", "TX_FRAMES")]


def members(names: list[str]) -> dict[str, Member]:
    """The collectors of tests.common.fleet_document, by name."""
    numbers = {name: int(name[1:]) for name in names}
    return {name: Member(name, f"10.77.1.{n}", f"02:5d:7a:00:01:{n:02x}", f"10.77.1.{n}:4790",
                         f"http://10.77.1.{n}:8080") for name, n in numbers.items()}


def fleet_with_holes() -> dict:
    """Three collectors, two replicas per slot; c3 holds no Key-Write structure and c1 no Postcarding one, and every
    LONELY_EVERY-th slot is c3's alone."""
    document, _ = fleet_document(collectors=3, replicas=2, slot_bits=SLOT_BITS)
    missing = {("key-write", "c3"), ("postcarding", "c1")}
    document["structures"] = [s for s in document["structures"] if (s["primitive"], s["collector"]) not in missing]
    document["fleet"]["slots"] = [["c3"] if slot % LONELY_EVERY == 0 else owners
                                  for slot, owners in enumerate(document["fleet"]["slots"])]
    return document


REPORTER_MAC, REPORTER_IP = b"\x02\x00\x00\x00\x00\x09", bytes([10, 0, 0, 9])


def reporter_to(tables: Tables, address: str) -> workload.ReporterAddress:
    return workload.ReporterAddress(REPORTER_MAC, REPORTER_IP, tables.mac, ip_bytes(address))


def sketch(tables: Tables) -> list:
    structure = next(s for s in tables.structures if s.primitive is DtaOpcode.SKETCH_MERGE)
    return workload.sketch_epoch(structure.reporters, structure.columns, structure.rows, seed=6)


CASES = {
    "key-write": lambda tables: workload.key_write(200, seed=1, redundancy=1),
    "key-write-n2": lambda tables: workload.key_write(60, seed=2, redundancy=2),
    "key-increment": lambda tables: workload.key_increment(120, seed=3, redundancy=1, flows=100),
    "postcarding": lambda tables: workload.postcards(40, seed=5, switch_ids=list(range(1, 100))),
    "sketch-merge": sketch,
    "append": lambda tables: workload.append(160, seed=4, lists=40),
}


@pytest.fixture
def fleet_switch(program, tmp_path):  # noqa: F811  (the compiled program, from test_bmv2)
    tables = Tables.from_dict(fleet_with_holes())
    started = Switch(program, tables, tmp_path / "switch.log")
    yield started, tables
    started.close()


def collector_of(frame: bytes) -> str:
    return ip_str(frame[30:34])


@pytest.mark.parametrize("case", CASES)
def test_reports_to_the_fleet_address_equal_the_reference(fleet_switch, case):
    bmv2, tables = fleet_switch
    reports = CASES[case](tables)
    reference = Translator(tables)
    frames = [reporter_to(tables, FLEET_ADDRESS).frame(report) for report in reports]
    expected = [out for frame in frames for out in reference.process(frame, 0).frames]
    got = bmv2.exchange(frames, len(expected))
    print(f"{case}: {len(reports)} reports, {len(expected)} frames compared, "
          f"{reference.counters[TranslatorCounter.DROP_FLEET_UNMAPPED]} unmapped")
    assert len(got) == len(expected), f"{case}: {len(got)} frames out of bmv2, the reference emits {len(expected)}"
    assert all(scapy_icrc_ok(frame) for frame in got)
    if case == "key-write-n2":  # the replication engine orders a report's copies its own way
        assert [sorted(map(without_psn, got[i:i + 2])) for i in range(0, len(got), 2)] == \
            [sorted(map(without_psn, expected[i:i + 2])) for i in range(0, len(expected), 2)]
    else:
        assert got == expected
    if case in ("key-write", "key-increment", "postcarding"):
        assert len({collector_of(frame) for frame in expected}) >= 2, "random keys reach several collectors"
    if case == "key-write":
        assert reference.counters[TranslatorCounter.DROP_FLEET_UNMAPPED] > 0, "some keys fall on c3's lonely slots"
        assert "10.77.1.3" not in {collector_of(frame) for frame in expected}
    expected_counts = {c.name.lower(): reference.counters[c] for c in FLEET_COUNTERS if reference.counters[c]}
    assert counters(bmv2_tool("simple_switch_CLI"), FLEET_COUNTERS) == expected_counts


def test_a_report_to_a_collectors_own_address_is_not_resolved(fleet_switch):
    bmv2, tables = fleet_switch
    reports = workload.key_write(20, seed=8, redundancy=1)
    reference = Translator(tables)
    frames = [reporter_to(tables, "10.77.1.2").frame(report) for report in reports]
    expected = [out for frame in frames for out in reference.process(frame, 0).frames]
    assert {collector_of(frame) for frame in expected} == {"10.77.1.2"}
    assert bmv2.exchange(frames, len(expected)) == expected
    assert counters(bmv2_tool("simple_switch_CLI"), FLEET_COUNTERS) == {"rx_reports": 20, "tx_frames": 20}


def test_a_new_epoch_applied_live_moves_the_remapped_keys(program, tmp_path):  # noqa: F811
    """c3 leaves the slot map (its QPs and structures stay): the new epoch, pushed to the running switch, moves the
    keys of c3's slots to the survivors and leaves every other key where it was; the PSNs go on."""
    document, old_map = fleet_document(collectors=3, replicas=1, slot_bits=SLOT_BITS)
    tables = Tables.from_dict(document)
    bmv2 = Switch(program, tables, tmp_path / "switch.log")
    try:
        reference = Translator(tables)
        reports = workload.key_write(150, seed=11, redundancy=1)
        frames = [reporter_to(tables, FLEET_ADDRESS).frame(report) for report in reports]
        before = [out for frame in frames for out in reference.process(frame, 0).frames]
        assert bmv2.exchange(frames, len(before)) == before

        new_map = assign(members(["c1", "c2"]), replicas=1, slot_bits=SLOT_BITS, previous=old_map)
        assert new_map.epoch == old_map.epoch + 1
        document["fleet"] = dict(document["fleet"], epoch=new_map.epoch, slots=[list(s) for s in new_map.slots])
        new_tables = Tables.from_dict(document)
        bmv2.switch.translator().apply(new_tables)
        reference.tables = new_tables  # same QPs, same indexes: its PSN state carries on, as the switch's does
        after = [out for frame in frames for out in reference.process(frame, 0).frames]
        got = bmv2.exchange(frames, len(after))
        assert got == after
        moved = {report.key for report, old, new in zip(reports, before, got) if collector_of(old) != collector_of(new)}
        on_c3 = {report.key for report in reports if old_map.slots[partition_slot(report.key, SLOT_BITS)] == ("c3",)}
        assert moved == on_c3 and moved, "exactly the keys of c3's slots move"
        assert "10.77.1.3" not in {collector_of(frame) for frame in got}
    finally:
        bmv2.close()


def test_copies_across_collectors_are_refused_before_anything_is_written(fleet_switch):
    """The P4 programs multicast a report's copies through one QP: tables asking for copies across collectors are
    refused with the engines that make them, and the switch goes on with the tables it had."""
    bmv2, tables = fleet_switch
    document = fleet_with_holes()
    document["fleet"]["across"] = True
    with pytest.raises(TableError, match=r"the P4 translators send copies to one collector; use the XDP or python "
                                         r"engine for copies across collectors"):
        bmv2.switch.translator().apply(Tables.from_dict(document))
    reports = workload.key_write(20, seed=12, redundancy=2)
    reference = Translator(tables)
    frames = [reporter_to(tables, FLEET_ADDRESS).frame(report) for report in reports]
    expected = [out for frame in frames for out in reference.process(frame, 0).frames]
    assert len({collector_of(expected[i]) for i in range(0, len(expected), 2)}) >= 2
    got = bmv2.exchange(frames, len(expected))
    assert [collector_of(frame) for frame in got] == [collector_of(frame) for frame in expected]
