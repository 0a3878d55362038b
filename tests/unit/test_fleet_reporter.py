"""The slot map applied at the reporter, DTA's way (docs/fleet.md): every report addressed to its slot's
collector, copies across the replicas landing where a translator at the fleet address puts them, the kernel
generator's plan addressing each report, and the UDP reporter's live map updates."""

import dataclasses
import os
import random
import socket

import numpy as np
import pytest

from softdta.core import registry, workload
from softdta.core.fleet import FleetError, Member, SlotMap, assign
from softdta.core.fleet_reporter import address, highest_copy, primary_ips_rows
from softdta.core.generator import GeneratorError, plan
from softdta.core.translator import Translator
from softdta.kernel.udp_reporter import UdpReporter
from softdta.spec import DTA_PORT
from softdta.wire import dta
from softdta.wire.dta import Profile
from softdta.wire.frames import ip_bytes, ip_str, mac_bytes
from softdta.wire.hashing import partition_slot
from softdta.wire.roce import parse_roce
from tests.common import FLEET_ADDRESS, fleet_tables

REPORTER = workload.ReporterAddress(mac_bytes("02:00:00:00:00:09"), ip_bytes("10.77.2.1"),
                                    mac_bytes("02:5d:7a:00:00:01"), ip_bytes(FLEET_ADDRESS))
PARAMS = workload.WorkloadParams(200, seed=3, redundancy=2, lists=16, reporters=2)


def fleet(count: int = 3, replicas: int = 2, slot_bits: int = 8, prefix: str = "10.77.1.",
          previous: SlotMap | None = None) -> SlotMap:
    members = {f"c{n}": Member(f"c{n}", f"{prefix}{n}", "02:5d:7a:00:01:01", f"{prefix}{n}:40050",
                               f"http://{prefix}{n}:8040") for n in range(1, count + 1)}
    return assign(members, replicas=replicas, slot_bits=slot_bits, previous=previous)


def to(collector: bytes) -> workload.ReporterAddress:
    return dataclasses.replace(REPORTER, collector_ip=collector)


@pytest.mark.parametrize("primitive", registry.registered(), ids=lambda primitive: primitive.name)
@pytest.mark.parametrize("across", [False, True])
def test_every_report_goes_to_its_slots_first_replica(primitive, across):
    slot_map = fleet()
    reached = set()
    for report in primitive.workload(PARAMS):
        addressed = address(slot_map, report, copies_across=across)
        slot = partition_slot(primitive.partition_key(report), slot_map.slot_bits)
        assert addressed[0].collector == ip_bytes(slot_map.members[slot_map.slots[slot][0]])
        if not (across and primitive.redundant):
            assert len(addressed) == 1 and addressed[0].report == report
        reached.add(addressed[0].collector)
    assert len(reached) == (1 if primitive.partitioned_by == "sketch" else 3), "the reports spread over the fleet"


@pytest.mark.parametrize("replicas,copies,expected", [
    (2, 1, [1]),  # one copy: the first replica alone
    (2, 2, [1, 2]),  # copy 1 at replica 1, at its slot hash 1: copies 0..1
    (3, 2, [1, 2]),  # a third replica holds no copy
    (2, 3, [3, 2]),  # copies 0 and 2 at replica 0, copy 1 at replica 1
    (1, 3, [3]),  # one replica holds them all
])
def test_copies_across_give_each_replica_the_copies_up_to_its_highest(replicas, copies, expected):
    slot_map = fleet(count=3, replicas=replicas)
    report = dta.key_write(0x0A0B0C0D, 9, copies)
    addressed = address(slot_map, report, copies_across=True)
    owners = slot_map.owners(report.key)
    assert [each.collector for each in addressed] == [ip_bytes(slot_map.members[name]) for name in owners][:copies]
    assert [each.report.redundancy for each in addressed] == expected
    assert [highest_copy(replica, replicas, copies) + 1 for replica in range(min(replicas, copies))] == expected
    assert all(dataclasses.replace(each.report, redundancy=copies) == report for each in addressed)


def writes(frames: list[bytes]) -> set[tuple[str, int]]:
    """(collector, remote address) of every RDMA WRITE or Fetch&Add."""
    found = set()
    for frame in frames:
        headers = parse_roce(frame).headers
        found.add((ip_str(frame[30:34]), (headers.get("reth") or headers["atomic_eth"])["va"]))
    return found


@pytest.mark.parametrize("redundancy", [2, 3])
@pytest.mark.parametrize("make", [lambda key, copies: dta.key_write(key, 0x55, copies),
                                  lambda key, copies: dta.key_increment(key, 7, copies)],
                         ids=["key-write", "key-increment"])
def test_copies_across_land_wherever_a_translator_at_the_fleet_address_puts_them(make, redundancy):
    """The one query path of a fleet reads copy n at replica n, at slot hash n: reports the reporter addresses
    put every such copy where the translator-side fleet does (and no copy outside the slot's replicas)."""
    tables, slot_map = fleet_tables(collectors=3, replicas=2, across=True)
    at_the_translator, at_the_reporter = Translator(tables), Translator(tables)
    rng = random.Random(5)
    for _ in range(100):
        report = make(rng.randbytes(4), redundancy)
        resolved = writes(at_the_translator.process(REPORTER.frame(report)).frames)
        addressed = address(slot_map, report, copies_across=True)
        direct = writes([frame for each in addressed
                         for frame in at_the_reporter.process(to(each.collector).frame(each.report)).frames])
        assert len(resolved) == redundancy and resolved <= direct
        owners = {slot_map.members[name] for name in slot_map.owners(report.key)}
        assert {collector for collector, _ in direct} == owners


def test_the_vectorized_addressing_is_the_scalar_one():
    slot_map = fleet(count=5, replicas=3, slot_bits=12)
    keys = np.random.default_rng(1).integers(0, 256, size=(2000, 13), dtype=np.uint8)
    ips = primary_ips_rows(slot_map, keys)
    expected = [address(slot_map, dta.key_write(bytes(key), 1, 1, extended=True))[0].collector for key in keys]
    assert [int(ip).to_bytes(4, "big") for ip in ips] == expected


TEMPLATES = {
    "key-write": dta.key_write(0x0A0B0C0D, 0xFFFFFFF0, 2, seqnum=250),
    "key-write extended": dta.key_write(bytes(range(13)), bytes(20), 3, extended=True),
    "key-increment": dta.key_increment(5, 1500, 1),
    "postcarding": dta.postcard(bytes(8), 2, 77, path_length=5, extended=True),
    "append": dta.append(3, 1),
    "sketch-merge": dta.sketch_column(1, 9, [1, 2, 3, 4]),
}


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_kernel_generators_plan_sends_each_report_to_its_slots_collector(name):
    template = TEMPLATES[name]
    slot_map = fleet(count=4, slot_bits=6)
    generator = plan(template, REPORTER.frame(template), Profile.DTA_V1, key_span=200, slot_map=slot_map)
    reached = set()
    for index in [0, 1, 2, 3, 57, 199, 200, 201, 1000, 2**32 + 7]:
        report = generator.report_at(index)
        (addressed,) = address(slot_map, report)
        assert generator.destination_at(index) == addressed.collector, index
        assert generator.frame_at(index) == to(addressed.collector).frame(report), index
        reached.add(addressed.collector)
    assert len(reached) > 1 or registry.by_opcode(template.opcode).partitioned_by != "key"


def test_a_plan_without_a_fleet_keeps_the_templates_destination():
    template = TEMPLATES["key-write"]
    generator = plan(template, REPORTER.frame(template), key_span=50)
    assert generator.destination_offset == 0
    assert {generator.destination_at(index) for index in range(50)} == {ip_bytes(FLEET_ADDRESS)}


def test_a_kernel_plan_keeps_a_destination_per_key_for_a_bounded_span():
    template = TEMPLATES["key-write"]
    with pytest.raises(GeneratorError, match="give fewer keys"):
        plan(template, REPORTER.frame(template), key_span=(1 << 20) + 1, slot_map=fleet())


def loopback_collectors(count: int) -> list[socket.socket]:
    """UDP sockets on port 40040 of 127.x.y.1..count (this process's own /24 of the loopback)."""
    prefix = f"127.{100 + os.getpid() % 150}.{os.getpid() % 250}."
    sockets = []
    for number in range(1, count + 1):
        receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        receiver.bind((f"{prefix}{number}", DTA_PORT))
        receiver.settimeout(5)
        sockets.append(receiver)
    return sockets


def test_the_udp_reporter_applies_a_later_map_and_refuses_an_earlier_one():
    collectors = loopback_collectors(3)
    prefix = collectors[0].getsockname()[0].rsplit(".", 1)[0] + "."
    first = fleet(count=2, slot_bits=4, prefix=prefix)
    joined = fleet(count=3, slot_bits=4, prefix=prefix, previous=first)
    key = next(bytes([n]) * 4 for n in range(256) if joined.owners(bytes([n]) * 4)[0] == "c3")
    report = dta.key_write(key, 1, 1)
    try:
        with UdpReporter(slot_map=first) as reporter:
            reporter.send(report)
            reporter.update(joined)
            reporter.send(report)
            with pytest.raises(FleetError, match="does not follow epoch 2"):
                reporter.update(first)
            assert reporter.slot_map is joined
            reporter.send(report)
        before = first.members[first.owners(key)[0]]
        expected = {before: [dta.encode(report)], f"{prefix}3": [dta.encode(report)] * 2}
        received = {}
        for receiver in collectors:
            where = receiver.getsockname()[0]
            received[where] = [receiver.recv(64) for _ in expected.get(where, [])]
            receiver.setblocking(False)  # and nothing more: the loopback delivers in order
            with pytest.raises(BlockingIOError):
                receiver.recv(64)
        assert received == {**dict.fromkeys(received, []), **expected}
        assert reporter.sent == {before: 1, f"{prefix}3": 2}
    finally:
        for receiver in collectors:
            receiver.close()
