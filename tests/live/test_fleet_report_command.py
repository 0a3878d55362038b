"""`softdta report --udp --fleet-map`, run as a user types it (a plain shell's environment): UDP sockets on port
40040 of several loopback addresses stand in for a fleet's collectors, and each gets exactly the reports of its
slots (docs/fleet.md)."""

import os
import socket
import subprocess
from pathlib import Path

import pytest

from softdta.core import registry
from softdta.core.fleet import Member, assign
from softdta.spec import DTA_PORT
from softdta.wire import dta
from softdta.wire.frames import ip_str, parse_udp_frame
from softdta.wire.pcap import read_pcap
from tests.common import ROOT, SOFTDTA

COUNT = 150
PREFIX = f"127.{100 + os.getpid() % 150}.{os.getpid() % 250}."  # this process's own /24 of the loopback


@pytest.fixture
def collectors():
    """Three receivers on 127.x.y.1..3, port 40040."""
    receivers = []
    try:
        for number in (1, 2, 3):
            receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            receiver.bind((f"{PREFIX}{number}", DTA_PORT))
            receiver.settimeout(10)
            receivers.append(receiver)
        yield {receiver.getsockname()[0]: receiver for receiver in receivers}
    finally:
        for receiver in receivers:
            receiver.close()


@pytest.fixture
def slot_map_file(tmp_path) -> tuple:
    slot_map = assign({f"c{n}": Member(f"c{n}", f"{PREFIX}{n}", f"02:5d:7a:00:01:0{n}", f"{PREFIX}{n}:40050",
                                       f"http://{PREFIX}{n}:8040") for n in (1, 2, 3)}, replicas=2, slot_bits=10)
    path = tmp_path / "slotmap.json"
    path.write_text(slot_map.to_json())
    return slot_map, path


def softdta(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*SOFTDTA, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home)})


def received(collectors: dict[str, socket.socket], expected: dict[str, int]) -> dict[str, list[bytes]]:
    """What each receiver got: its expected count, then nothing more (the loopback delivers in order)."""
    got = {}
    for where, receiver in collectors.items():
        got[where] = [receiver.recv(2048) for _ in range(expected.get(where, 0))]
        receiver.setblocking(False)
        with pytest.raises(BlockingIOError):
            receiver.recv(2048)
        receiver.setblocking(True)
    return got


@pytest.mark.parametrize("primitive", [primitive.name for primitive in registry.registered()])
def test_each_collector_gets_exactly_the_reports_of_its_slots(primitive, collectors, slot_map_file, tmp_path):
    slot_map, path = slot_map_file
    common = [primitive, "--count", str(COUNT), "-n", "2", "--lists", "16", "--fleet-map", str(path)]
    expected: dict[str, list[bytes]] = {}
    for packet in read_pcap(written_pcap(common, tmp_path)):
        udp = parse_udp_frame(packet.frame)
        expected.setdefault(ip_str(udp.dst_ip), []).append(udp.payload)
    sent = softdta("report", *common, "--udp", home=tmp_path)
    assert sent.returncode == 0, sent.stderr
    got = received(collectors, {where: len(payloads) for where, payloads in expected.items()})
    assert got == {where: expected.get(where, []) for where in collectors}
    for where, payloads in got.items():
        for payload in payloads:
            report = dta.decode(payload)
            owners = slot_map.owners(registry.by_opcode(report.opcode).partition_key(report))
            assert slot_map.members[owners[0]] == where
    spread = {where for where, payloads in got.items() if payloads}
    assert len(spread) == (1 if registry.by_name(primitive).partitioned_by == "sketch" else 3)


def test_with_across_each_replica_gets_the_copies_up_to_its_own(collectors, slot_map_file, tmp_path):
    slot_map, path = slot_map_file
    common = ["key-write", "--count", str(COUNT), "-n", "2", "--fleet-map", str(path), "--across"]
    sent = softdta("report", *common, "--udp", home=tmp_path)
    assert sent.returncode == 0, sent.stderr
    assert f"sent {COUNT} key-write reports in {2 * COUNT} datagrams" in sent.stdout
    expected = {where: 0 for where in collectors}
    for packet in read_pcap(written_pcap(common, tmp_path)):
        expected[ip_str(parse_udp_frame(packet.frame).dst_ip)] += 1
    got = received(collectors, expected)
    replicas = {}
    for where, payloads in got.items():
        for payload in payloads:
            report = dta.decode(payload)
            replicas[report.key, where] = report.redundancy
    assert len(replicas) == 2 * COUNT
    for (key, where), redundancy in replicas.items():
        owners = [slot_map.members[name] for name in slot_map.owners(key)]
        assert owners.index(where) + 1 == redundancy  # replica n holds copies 0..n


def written_pcap(common: list[str], tmp_path: Path) -> Path:
    """The same reports, addressed the same way, written to a pcap."""
    result = softdta("report", *common, "--out", str(tmp_path / "reports.pcap"), home=tmp_path)
    assert result.returncode == 0, result.stderr
    return tmp_path / "reports.pcap"


def test_a_bad_slot_map_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "bad.json").write_text('{"epoch": 1}')
    for path, words in ((tmp_path / "bad.json", "slot map is malformed"),
                        (tmp_path / "missing.json", "cannot read the slot map")):
        result = softdta("report", "key-write", "--udp", "--fleet-map", str(path), home=tmp_path)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr
