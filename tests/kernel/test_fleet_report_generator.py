"""The kernel report generator in a fleet, live on veth: each report it sends carries its slot's collector as
destination, with a correct IPv4 checksum, exactly as its plan predicts; `softdta report --fleet-map` drives it."""

import os
import subprocess

import pytest

from softdta.core import registry, workload
from softdta.core.fleet import Member, assign
from softdta.core.generator import plan
from softdta.kernel.generator import KernelReporter
from softdta.spec import DTA_PORT
from softdta.wire import dta
from softdta.wire.dta import Profile
from softdta.wire.frames import ip_bytes, ipv4_checksum, mac_bytes, parse_udp_frame
from tests.common import SOFTDTA, capture_on, generator_wire, udp_frames

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-fgen{os.getpid()}-"
TRANSLATOR_MAC = "02:5d:7a:00:00:01"
SLOT_MAP = assign({f"c{n}": Member(f"c{n}", f"10.77.1.{n}", f"02:5d:7a:00:01:0{n}", f"10.77.1.{n}:40050",
                                   f"http://10.77.1.{n}:8040") for n in (1, 2, 3)}, replicas=2, slot_bits=12)


@pytest.fixture
def wire():
    with generator_wire(PREFIX, TRANSLATOR_MAC) as ends:
        yield ends


def assert_each_report_went_to_its_slots_collector(frames: list[bytes]) -> set[str]:
    reached = set()
    for frame in frames:
        udp = parse_udp_frame(frame)
        report = dta.decode(udp.payload)
        owner = SLOT_MAP.members[SLOT_MAP.owners(registry.by_opcode(report.opcode).partition_key(report))[0]]
        assert udp.dst_ip == ip_bytes(owner), (report, owner)
        assert ipv4_checksum(frame[udp.ip_offset:udp.ip_offset + 20]) == 0, "a correct IPv4 header checksum"
        reached.add(owner)
    return reached


def test_each_generated_report_goes_to_its_slots_collector(wire):
    generator_ns, far = wire
    reporter = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"),
                                        mac_bytes(TRANSLATOR_MAC), ip_bytes("10.77.1.1"))
    template = dta.key_write(0x01020304, 0x10, 2)
    generator = plan(template, reporter.frame(template), Profile.DTA_V1, key_span=300, slot_map=SLOT_MAP)
    with capture_on(far.name, "t0") as capture, KernelReporter(generator, "g0", generator_ns.name) as sender:
        sender.run(count=3000)
        seen = udp_frames(capture, DTA_PORT, 3000)
    assert seen == [generator.frame_at(index) for index in range(3000)]
    assert assert_each_report_went_to_its_slots_collector(seen) == set(SLOT_MAP.members.values())


def test_softdta_report_with_a_fleet_map_on_the_kernel_engine(wire, tmp_path):
    generator_ns, far = wire
    slot_map = tmp_path / "slotmap.json"
    slot_map.write_text(SLOT_MAP.to_json())
    for primitive, reached in (("key-write", 3), ("append", 1)):
        with capture_on(far.name, "t0") as capture:
            result = subprocess.run([*SOFTDTA, "report", primitive, "-i", "g0", "--netns", generator_ns.name,
                                     "--count", "900", "-n", "1", "--keys", "90", "--fleet-map", str(slot_map)],
                                    capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, result.stderr
            seen = udp_frames(capture, DTA_PORT, 900)
        assert len(seen) == 900
        assert len(assert_each_report_went_to_its_slots_collector(seen)) == reached
    result = subprocess.run([*SOFTDTA, "report", "key-write", "-i", "g0", "--netns", generator_ns.name,
                             "--fleet-map", str(slot_map), "--across"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "use --engine python or --udp" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
