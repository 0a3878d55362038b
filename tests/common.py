"""Shared test constants and helpers (imported by tests; fixtures live in conftest.py)."""

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from softdta.core.export import (
    COUNT_HEADER,
    DEFAULT_STREAM,
    DEFAULT_SUBJECT_PREFIX,
    KIND_HEADER,
    LIST_HEADER,
    MESSAGE_ID_HEADER,
    SEQUENCE_HEADER,
)
from softdta.core.workload import ReporterAddress
from softdta.kernel.netns import in_netns
from softdta.lab import rxe as rxe_lab
from softdta.lab.benchmarks.workloads import COLLECTOR_IP as COLLECTOR_IP  # the collector of examples/tables.toml
from softdta.plugins.latency_sum import LatencySum
from softdta.spec import DTA_PORT, PSN_MASK
from softdta.wire.dta import Profile, Report
from softdta.wire.frames import UdpEndpoints, build_udp_frame, ip_bytes, mac_bytes
from softdta.wire.roce import RoceFrame, parse_roce

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_TABLES = ROOT / "examples" / "tables.toml"
COLLECTOR_CONFIG = (ROOT / "examples" / "collector.toml").read_text()
SOFTDTA = [sys.executable, "-m", "softdta.cli"]


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The one line a command that exits 2 on bad input prints, checked to be that."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("softdta: error: "), result.stderr
    return lines[0]


def edited(text: str, pattern: str, replacement: str) -> str:
    """`text` with the first match of `pattern` (once, and it must match) replaced."""
    changed, count = re.subn(pattern, replacement, text, count=1, flags=re.MULTILINE)
    assert count == 1, pattern
    return changed


def assert_every_queue_wrote_in_psn_order(tables, seen: list[bytes], expected: list[bytes]) -> None:
    """RoCEv2 frames `seen` from a translator with a QP per RX queue, against the reference's `expected` (made as
    if every report came in on queue 0): each QP's PSNs run on from its start, queue 0's QPs and the others both
    sent, and the frames do to the collector's memory what the reference's do (all but QPN and PSN)."""
    by_qpn: dict[int, list[RoceFrame]] = {}
    for frame in map(parse_roce, seen):
        assert frame.icrc_ok
        by_qpn.setdefault(frame.bth["dest_qp"], []).append(frame)
    start = {qp.remote_qpn: qp.start_psn for qp in tables.qps}
    for qpn, frames in by_qpn.items():
        assert [f.bth["psn"] for f in frames] == [(start[qpn] + i) & PSN_MASK for i in range(len(frames))], \
            f"QP {qpn:#x} out of PSN order"
    later_queues = {qp.remote_qpn for owner in tables.structures + tables.append_lists for qp in owner.queue_qps}
    assert set(by_qpn) & later_queues and set(by_qpn) - later_queues, "the reports took one RX queue only"

    def writes(frames: list[bytes]) -> list[tuple]:
        return sorted((f.opcode, repr(sorted(f.headers.items())), f.payload) for f in map(parse_roce, frames))
    assert writes(seen) == writes(expected)


@contextmanager
def generator_wire(prefix: str, translator_mac: str):
    """Namespaces g (the generator, g0) and t (t0) under `prefix`, one veth pair; both ends run XDP, so that frames
    XDP sends enter them, and t0 captures everything it receives."""
    from softdta.kernel.bpf import BpfObject, attach_xdp
    from softdta.kernel.netns import Namespace, address, cleanup_prefix, veth_pair
    from softdta.kernel.programs import VETH_PEER_SOURCE, build_object

    cleanup_prefix(prefix)
    generator, far = Namespace.create(prefix + "g"), Namespace.create(prefix + "t")
    try:
        veth_pair(generator, "g0", far, "t0", mac_b=translator_mac)
        address(far, "t0", "10.77.0.1/16")
        with BpfObject(build_object(VETH_PEER_SOURCE)) as passer:
            for namespace, interface in ((generator, "g0"), (far, "t0")):
                with in_netns(namespace.name):
                    attach_xdp(socket.if_nametoindex(interface), passer.programs["softdta_pass"].fd)
        yield generator, far
    finally:
        cleanup_prefix(prefix)


def eventually(condition, within: float = 10.0, what: str = "the condition"):
    """`condition()`'s first truthy value, polled until `within` seconds have passed (then the test fails)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f"{what} did not hold within {within} s")


def bitwise_crc32(polynomial: int, data: bytes) -> int:
    """Reflected CRC-32 computed bit by bit (no tables), init and xorout 0xFFFFFFFF: the definition."""
    reflected = int(f"{polynomial:032b}"[::-1], 2)
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (reflected if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def frames_of(reporter: ReporterAddress, reports: list[Report], profile: Profile = Profile.DTA_V1) -> list[bytes]:
    return [reporter.frame(report, profile) for report in reports]


def shared_tool(name: str, variable: str, folder: str, how_to_get: str) -> str:
    """A tool not packaged for Debian or PyPI: from $`variable` (its bin directory), then PATH, then
    ../shared/tools/`folder`/bin. Missing, it fails the test in CI (CI=true) and skips it elsewhere."""
    given = Path(os.environ.get(variable, "")) / name if os.environ.get(variable) else None
    shared = ROOT.parent / "shared" / "tools" / folder / "bin" / name
    found = (str(given) if given and given.is_file() else None) or shutil.which(name) \
        or (str(shared) if shared.is_file() else None)
    if found:
        return found
    message = f"{name} not found: {how_to_get}, then set {variable} to its bin directory or put it on PATH (docs/p4.md)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def p4_tool(name: str) -> str:
    """p4c's `name` (p4test, p4c-bm2-ss)."""
    return shared_tool(name, "P4C", "p4c", "build p4c (https://github.com/p4lang/p4c)")


def bmv2_tool(name: str) -> str:
    """bmv2's `name` (simple_switch_grpc, simple_switch_CLI)."""
    return shared_tool(name, "BMV2", "bmv2", "build p4lang/behavioral-model with its P4Runtime server")


# the query and control processes of live tests

def wait_for_line(process: subprocess.Popen, text: str, timeout: float = 20.0, stream: str = "stdout") -> str:
    """The first line of the process's `stream` with `text` in it, within `timeout` s while the process runs.

    Reads the pipe a byte at a time: a buffered readline takes in whatever follows its line too, and select, which
    sees only the pipe, then waits for a line that already came."""
    fd = getattr(process, stream).fileno()
    deadline = time.monotonic() + timeout
    line = bytearray()
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], 0.2)[0]:
            if process.poll() is None:
                continue
        elif byte := os.read(fd, 1):
            line += byte
            if byte == b"\n":
                if text in (decoded := line.decode(errors="replace")):
                    return decoded
                line.clear()
            continue
        try:  # the stream ended, or the process did
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{process.args[3:5]} closed its {stream} and runs on") from None
        raise AssertionError(f"{process.args[3:5]} exited ({process.returncode}): {line.decode(errors='replace')}"
                             f"{process.stderr.read()}")
    raise AssertionError(f"no {text!r} from {process.args[3:5]} within {timeout} s")


# Latency-Sum reports, for the plug-in tests of both engines

ENDS = UdpEndpoints(src_mac=mac_bytes("02:5d:7a:00:09:01"), dst_mac=mac_bytes("02:5d:7a:00:00:01"),
                    src_ip=ip_bytes("10.77.9.1"), dst_ip=COLLECTOR_IP, sport=40041, dport=DTA_PORT)


def hop_frames(key: bytes, latencies: list[int]) -> list[bytes]:
    return [build_udp_frame(ENDS, LatencySum.report(key, hop, len(latencies), latency))
            for hop, latency in enumerate(latencies, 1)]


# tshark, the independent RoCEv2 dissector

TSHARK = shutil.which("tshark")
needs_tshark = pytest.mark.skipif(TSHARK is None, reason="tshark is not installed (apt-get install tshark)")


PAYLOAD_HEURISTICS = ("rpcordma", "nvme-rdma", "iser", "smb_direct", "smc", "lnet", "infiniband_sdp", "fcoib")


def run_tshark(frames: list[bytes], tmp_path, *options: str) -> list[dict]:
    from scapy.layers.l2 import Ether  # here: the wheel's test environment has no scapy
    from scapy.utils import wrpcap

    path = tmp_path / "roce.pcap"
    packets = [Ether(f) for f in frames]
    assert [bytes(p) for p in packets] == frames
    wrpcap(str(path), packets, linktype=1)
    # Payload heuristics (RPC-over-RDMA, NVMe-oF, ...) would claim the opaque SEND/WRITE payloads.
    heuristics = [arg for proto in PAYLOAD_HEURISTICS for arg in ("--disable-protocol", proto)]
    out = subprocess.run([TSHARK, "-n", "-r", str(path), *heuristics, *options, "-T", "json"], capture_output=True,
                         text=True, timeout=60, check=True)
    return [p["_source"]["layers"] for p in json.loads(out.stdout)]


ETH_P_ALL, SOL_PACKET, PACKET_IGNORE_OUTGOING, SO_RCVBUFFORCE = 0x0003, 263, 23, 33


def processes() -> dict[int, str]:
    """Every process's command name by pid (/proc/PID/comm), without those that end while the list is read."""
    names = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                names[int(proc.name)] = (proc / "comm").read_text().strip()
            except OSError:
                continue  # it ended
    return names


def capture_on(namespace: str, interface: str) -> socket.socket:
    """A raw socket on `interface` in `namespace` that sees every frame arriving there (not those sent), with a
    buffer that holds everything until it is read."""
    with in_netns(namespace):
        capture = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        capture.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        capture.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 25)
        capture.bind((interface, ETH_P_ALL))
        capture.settimeout(0.2)
    return capture


def udp_frames(capture: socket.socket, port: int, expected: int | None = None, quiet_s: float = 1.0,
               deadline_s: float = 10.0) -> list[bytes]:
    """IPv4 frames to UDP `port`, until `expected` came, nothing more came for `quiet_s`, or `deadline_s` passed."""
    frames: list[bytes] = []
    give_up, quiet_until = time.monotonic() + deadline_s, time.monotonic() + quiet_s
    while (expected is None or len(frames) < expected) and time.monotonic() < min(give_up, quiet_until):
        try:
            frame = capture.recv(4096)
        except TimeoutError:
            continue
        if frame[12:14] == b"\x08\x00" and int.from_bytes(frame[36:38], "big") == port:
            frames.append(frame)
            quiet_until = time.monotonic() + quiet_s
    return frames


def num(text: str) -> int:
    return int(text, 16) if text.startswith("0x") else int(text)


# the soft-RoCE guest

class Link:
    """The host end of the tap: frames out to rxe, rxe's replies back in."""

    def __init__(self, guest):
        self.guest = guest
        with in_netns(guest.namespace.name):
            self.replies = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
            self.replies.bind((rxe_lab.TAP, 0))

    def collect(self, wait: float = 0.0) -> list[bytes]:
        frames = []
        while select.select([self.replies], [], [], wait)[0]:
            frame = self.replies.recv(4096)
            if len(frame) > 42 and frame[36:38] == (4791).to_bytes(2, "big") and frame[0:6] == mac_bytes(
                    self.guest.host_mac):
                frames.append(frame)
            wait = 0.05
        return frames


FLEET_ADDRESS = "10.77.9.9"


def fleet_tables(collectors: int = 3, replicas: int = 2, slot_bits: int = 12, across: bool = False):
    """(tables, slot map) of `fleet_document`."""
    from softdta.core.tables import Tables

    document, slot_map = fleet_document(collectors, replicas, slot_bits, across)
    return Tables.from_dict(document), slot_map


def fleet_document(collectors: int = 3, replicas: int = 2, slot_bits: int = 12, across: bool = False,
                   example: Path = EXAMPLE_TABLES):
    """(tables document, slot map) of a fleet: `collectors` copies of the example's collector and its structures and
    Append lists (each with its own IP, QPNs and R_Keys), and the slot map core.fleet.assign gives them, at
    FLEET_ADDRESS."""
    import tomllib

    from softdta.core.fleet import Member, assign

    base = tomllib.loads(example.read_text())
    document = {"translator": base["translator"], "collectors": [], "structures": [], "append": []}
    members = {}
    for number in range(1, collectors + 1):
        name, ip, mac = f"c{number}", f"10.77.1.{number}", f"02:5d:7a:00:01:{number:02x}"
        document["collectors"].append({"name": name, "ip": ip, "mac": mac})
        members[name] = Member(name, ip, mac, f"{ip}:4790", f"http://{ip}:8080")
        for section in ("structures", "append"):
            for entry in base.get(section, []):
                qp = dict(entry["qp"], remote_qpn=entry["qp"]["remote_qpn"] + 0x1000 * number,
                          local_qpn=entry["qp"]["local_qpn"] + 0x1000 * number,
                          rkey=entry["qp"]["rkey"] + 0x10000 * number)
                document[section].append(dict(entry, collector=name, qp=qp))
    slot_map = assign(members, replicas=replicas, slot_bits=slot_bits)
    document["fleet"] = {"address": FLEET_ADDRESS, "epoch": slot_map.epoch, "slot_bits": slot_bits, "across": across,
                         "slots": [list(owners) for owners in slot_map.slots]}
    return document, slot_map


@dataclass
class ExportedStream:
    """What a consumer read of a collector's export (docs/export.md): per de-duplication ID, its copies."""

    copies: dict[str, list[tuple[dict, bytes]]] = field(default_factory=lambda: defaultdict(list))

    @property
    def stored(self) -> int:
        return sum(len(copies) for copies in self.copies.values())

    def lists(self) -> dict[int, tuple[list[int], int]]:
        """Per Append list, its 4-byte entries in sequence order and the entries its gaps stand for; checks that
        the copies of an ID are identical and that a list's messages tile its sequence numbers from 0."""
        messages: dict[int, list[tuple[int, str, int, bytes]]] = defaultdict(list)
        for message_id, copies in self.copies.items():
            assert all(copy == copies[0] for copy in copies), f"{message_id}: copies differ"
            headers, data = copies[0]
            if headers[KIND_HEADER] != "state":
                messages[int(headers[LIST_HEADER])].append((int(headers[SEQUENCE_HEADER]), headers[KIND_HEADER],
                                                               int(headers[COUNT_HEADER]), data))
        lists = {}
        for list_id, in_list in messages.items():
            entries, gaps, sequence = [], 0, 0
            for first, kind, count, data in sorted(in_list):
                assert first == sequence, f"list {list_id}: a message at {first}, expected {sequence} (hole or overlap)"
                if kind == "gap":
                    gaps += count
                else:
                    assert len(data) == 4 * count
                    entries += [int.from_bytes(data[i:i + 4], "big") for i in range(0, len(data), 4)]
                sequence += count
            lists[list_id] = (entries, gaps)
        return lists


async def read_exported(url: str, subjects: str = f"{DEFAULT_SUBJECT_PREFIX}.>",
                        stream: str = DEFAULT_STREAM) -> ExportedStream:
    """Every message of `stream`, from the first, through an ordered consumer (a consumer that replays)."""
    import nats

    client = await nats.connect(url)
    try:
        context = client.jetstream()
        expected = (await context.stream_info(stream)).state.messages
        exported = ExportedStream()
        subscription = await context.subscribe(subjects, ordered_consumer=True)
        for _ in range(expected):
            message = await subscription.next_msg(timeout=10)
            exported.copies[message.headers[MESSAGE_ID_HEADER]].append((message.headers, message.data))
        await subscription.unsubscribe()
        return exported
    finally:
        await client.close()


@contextmanager
def signals_meanwhile(every_s: float = 0.0002) -> Iterator[list[int]]:
    """SIGUSR1 at the calling thread every `every_s` until the block ends, as a daemon's reloads and stops come: a
    system call it is in returns EINTR. Yields the signals handled, which Python counts once the call returns."""
    handled: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda number, _frame: handled.append(number))
    stop, target = threading.Event(), threading.get_ident()

    def interrupt() -> None:
        while not stop.wait(every_s):
            signal.pthread_kill(target, signal.SIGUSR1)

    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    try:
        yield handled
    finally:
        stop.set()
        interrupter.join()
        signal.signal(signal.SIGUSR1, previous)
