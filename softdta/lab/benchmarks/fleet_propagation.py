"""A new slot-map epoch reaching the fleet's translators: the time from the controller's etcd commit to the last
translator's applied generation (goal: at most 1 s, docs/fleet.md), on a lab of network namespaces.

`FleetLab` is that lab: etcd, collectors (`softdta collector up`, xdp backend) and translators that follow the fleet
(`softdta translator up --etcd`), each a process in its own namespace, all on one bridge; reporters send from a
namespace of their own. tests/live/test_fleet_translator.py runs on it too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from softdta.collector.xdp_backend import pin_dir_for
from softdta.core.fleet import APPLIED, MEMBERS, SLOT_MAP, Member, SlotMap, assign, fleet_prefix
from softdta.core.workload import ReporterAddress
from softdta.engines.python import EngineStats, engine_stats
from softdta.errors import SoftdtaError
from softdta.etcd.client import Etcd
from softdta.kernel.bpf import BpfObject, attach_xdp, ensure_bpffs
from softdta.kernel.netns import Namespace, address, cleanup_prefix, in_netns, veth_pair
from softdta.kernel.programs import VETH_PEER_SOURCE, build_object
from softdta.lab.benchmarks.workloads import ROOT
from softdta.lab.etcd_server import EtcdServer
from softdta.links.control import secrets_file_for
from softdta.links.fleet import fleet_status_file
from softdta.spec import DEFAULT_SLOT_BITS
from softdta.wire.frames import ip_bytes, mac_bytes

GOAL_S = 1.0
SOFTDTA = [sys.executable, "-m", "softdta.cli"]
FLEET_ADDRESS = "10.77.5.5"
ETCD_IP = "10.77.3.1"
REPORTER_IP, REPORTER_MAC = "10.77.9.1", "02:5d:7a:00:09:01"
CONTROL_PORT, QUERY_PORT = 40050, 8040
START_S = 30.0
T = TypeVar("T")


class Propagation(TypedDict):
    """`softdta bench`'s fleet_propagation."""

    translators: int
    collectors: int
    slots: int
    engine: str
    seconds: list[float]  # one per epoch committed: commit -> the last translator's applied generation
    stages_median_s: dict[str, float]  # the first translator's: commit -> map seen, -> tables built, -> applied
    median_s: float
    max_s: float
    goal_s: float
    met: bool


class FleetLabError(SoftdtaError, RuntimeError):
    """The fleet lab could not be built, or a process in it did not come up."""


@dataclass
class FleetLab:
    """The namespaces and processes of a fleet; `close` removes them all (names start with `prefix`)."""

    run_dir: Path
    collectors: int = 2
    translators: int = 1
    engine: str = "xdp"
    across: bool = False
    fleet: str = "lab"
    token: str = "fleet-token"
    prefix: str = field(default_factory=lambda: f"sdta-f{os.getpid()}-")
    processes: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    etcd_server: EtcdServer | None = None

    # addresses and names

    def collector_name(self, index: int) -> str:
        return f"f{os.getpid()}c{index}"

    def collector_ip(self, index: int) -> str:
        return f"10.77.1.{index}"

    def translator_name(self, index: int) -> str:
        return f"t{index}"

    def translator_ip(self, index: int) -> str:
        return f"10.77.0.{index}"

    def translator_mac(self, index: int) -> str:
        return f"02:5d:7a:00:00:{index:02x}"

    def pin(self, index: int) -> Path:
        return ensure_bpffs() / f"softdta-fleet-{os.getpid()}-t{index}"

    def member(self, index: int, weight: float = 1.0) -> Member:
        return Member(self.collector_name(index), self.collector_ip(index), f"02:5d:7a:00:01:{index:02x}",
                      f"{self.collector_ip(index)}:{CONTROL_PORT}", f"http://{self.collector_ip(index)}:{QUERY_PORT}",
                      weight)

    def reporter(self, translator: int = 1) -> ReporterAddress:
        """Where the reporter's frames come from and go: the translator's MAC, the fleet address."""
        return ReporterAddress(mac_bytes(REPORTER_MAC), ip_bytes(REPORTER_IP), mac_bytes(self.translator_mac(
            translator)), ip_bytes(FLEET_ADDRESS))

    # building and tearing down

    def build(self) -> FleetLab:
        cleanup_prefix(self.prefix)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        switch = Namespace.create(self.prefix + "sw")
        switch.run("ip", "link", "add", "br0", "type", "bridge")
        switch.run("ip", "link", "set", "br0", "up")
        ports = [("e", "e0", "02:5d:7a:00:03:01", ETCD_IP), ("r", "r0", REPORTER_MAC, REPORTER_IP)]
        ports += [(f"t{i}", "t0", self.translator_mac(i), self.translator_ip(i))
                  for i in range(1, self.translators + 1)]
        ports += [(f"c{i}", "c0", self.member(i).mac, self.collector_ip(i)) for i in range(1, self.collectors + 1)]
        with BpfObject(build_object(VETH_PEER_SOURCE)) as passer:
            for suffix, interface, mac, ip in ports:
                namespace = Namespace.create(self.prefix + suffix)
                veth_pair(namespace, interface, switch, f"sw-{suffix}", mac_a=mac)
                address(namespace, interface, f"{ip}/16")
                switch.run("ip", "link", "set", f"sw-{suffix}", "master", "br0")
                with in_netns(switch.name):  # XDP_TX'd frames enter a veth only if its peer runs XDP
                    attach_xdp(socket.if_nametoindex(f"sw-{suffix}"), passer.programs["softdta_pass"].fd)
        for index in range(1, self.translators + 1):
            (self.run_dir / f"translator{index}.toml").write_text(
                f'[translator]\nmac = "{self.translator_mac(index)}"\nip = "{self.translator_ip(index)}"\n')
        return self

    def close(self) -> None:
        for name, process in reversed(list(self.processes.items())):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)
        if self.etcd_server is not None:
            self.etcd_server.kill()
        cleanup_prefix(self.prefix)
        for index in range(1, self.translators + 1):
            shutil.rmtree(self.pin(index), ignore_errors=True)
            secrets = secrets_file_for(self.pin(index))
            for kept in [secrets, *secrets.parent.glob(f"{secrets.stem}.*.json")]:
                kept.unlink(missing_ok=True)
        for index in range(1, self.collectors + 1):
            shutil.rmtree(pin_dir_for(self.collector_name(index), ip_bytes(self.collector_ip(index))),
                          ignore_errors=True)

    def __enter__(self) -> FleetLab:
        return self.build()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # processes

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[str]:
        out, err = (open(self.run_dir / f"{name}.{stream}", "w") for stream in ("out", "err"))
        process = subprocess.Popen(SOFTDTA + argv, stdout=out, stderr=err, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        out.close()
        err.close()
        self.processes[name] = process
        return process

    def output(self, name: str, stream: str = "out") -> str:
        return (self.run_dir / f"{name}.{stream}").read_text()

    def wait_for_line(self, name: str, text: str, timeout: float = START_S) -> None:
        process = self.processes[name]
        wait_until(lambda: text in self.output(name) or process.poll() is not None, f"{name}: {text!r}", timeout)
        if text not in self.output(name):
            raise FleetLabError(f"{name} exited with {process.returncode} before printing {text!r}: "
                                f"{self.output(name, 'err').strip()[-2000:]}")

    def start_etcd(self) -> EtcdServer:
        if self.etcd_server is None:
            self.etcd_server = EtcdServer(self.run_dir / "etcd", host=ETCD_IP, client_port=2379, peer_port=2380)
        with in_netns(self.prefix + "e"):  # etcd's process starts in the namespace of the thread that forks it
            self.etcd_server.start()
        return self.etcd_server

    def etcd(self, call: Callable[[Etcd], T]) -> T:
        """`call` with an etcd client, made from the etcd namespace (the lab's etcd is on the bridge only)."""
        assert self.etcd_server is not None
        with in_netns(self.prefix + "e"):
            return call(self.etcd_server.client())

    def start_collector(self, index: int) -> None:
        name = f"collector{index}"
        config = (ROOT / "examples" / "collector.toml").read_text()
        member = self.member(index)
        for old, new in (('name = "c1"', f'name = "{member.name}"'), ('ip = "10.77.1.1"', f'ip = "{member.ip}"'),
                         ('mac = "02:5d:7a:00:01:01"', f'mac = "{member.mac}"'), ('interface = ""', 'interface = "c0"'),
                         ('data_dir = "c1-data"', f'data_dir = "{self.run_dir / name}"'),
                         ('token = "change-me"', f'token = "{self.token}"'),
                         ('hash = "independent"', 'hash = "independent"\nredundancy = 1'),
                         ("slots = 131072", "slots = 4096"), ("slots = 65536", "slots = 1024"),
                         ("slots = 32768", "slots = 1024")):
            config = config.replace(old, new)
        (self.run_dir / f"{name}.toml").write_text(config)
        self.spawn(name, ["collector", "up", "--config", str(self.run_dir / f"{name}.toml"),
                          "--netns", self.prefix + f"c{index}", "--query-host", member.ip])
        self.wait_for_line(name, f"collector {member.name} up")

    def register(self, index: int, weight: float = 1.0) -> None:
        """The collector's Member record, as a collector that registers itself writes it."""
        member = self.member(index, weight)
        self.etcd(lambda etcd: etcd.put(fleet_prefix(self.fleet) + MEMBERS + member.name, member.to_json()))

    def start_translator(self, index: int) -> None:
        name = f"translator{index}"
        shutil.rmtree(self.pin(index), ignore_errors=True)
        assert self.etcd_server is not None
        self.spawn(name, ["translator", "up", "--tables", str(self.run_dir / f"{name}.toml"), "-i", "t0",
                          "--netns", self.prefix + f"t{index}", "--pin", str(self.pin(index)),
                          "--engine", self.engine, "--token", self.token, "--etcd", self.etcd_server.endpoint,
                          "--fleet", self.fleet, "--fleet-address", FLEET_ADDRESS,
                          "--name", self.translator_name(index)] + (["--across"] if self.across else []))
        self.wait_for_line(name, "translator up on t0")

    # the fleet in etcd

    def slot_map(self, collectors: Iterable[int], previous: SlotMap | None = None, replicas: int = 1,
                 slot_bits: int = DEFAULT_SLOT_BITS, weights: dict[int, float] | None = None) -> SlotMap:
        members = {self.collector_name(i): self.member(i, (weights or {}).get(i, 1.0)) for i in collectors}
        return assign(members, replicas=replicas, slot_bits=slot_bits, previous=previous)

    def commit(self, value: str | bytes) -> int:
        """Write the slot map by compare-and-swap on its current revision, as the controller does; the wall clock
        (ns) just before the commit."""
        key = fleet_prefix(self.fleet) + SLOT_MAP

        def swap(etcd: Etcd) -> int:
            current = etcd.get(key)
            at_ns = time.time_ns()
            if not etcd.put_if(key, value, mod_revision=current.mod_revision if current else 0):
                raise FleetLabError(f"{key} changed under the commit")
            return at_ns
        return self.etcd(swap)

    def applied(self, index: int) -> dict[str, Any] | None:
        kv = self.etcd(lambda etcd: etcd.get(fleet_prefix(self.fleet) + APPLIED + self.translator_name(index)))
        return json.loads(kv.value) if kv else None

    def wait_applied(self, epoch: int, timeout: float = 10.0) -> int:
        """Waits for every translator to apply `epoch`; the wall clock (ns) of the last one's applied generation."""
        def applied_everywhere() -> list[dict[str, Any]] | None:
            records = [self.applied(index) for index in range(1, self.translators + 1)]
            done = all(record is not None and record["epoch"] >= epoch for record in records)
            return [record for record in records if record is not None] if done else None
        return max(int(record["at_ns"]) for record in wait_until(applied_everywhere, f"epoch {epoch} applied",
                                                                  timeout))

    # what the processes say

    def translator_stats(self, index: int) -> EngineStats:
        return engine_stats(self.pin(index))

    def fleet_status(self, index: int) -> dict[str, Any]:
        status: dict[str, Any] = json.loads(fleet_status_file(secrets_file_for(self.pin(index))).read_text())
        return status

    def softdta_stats(self, index: int) -> str:
        """What `softdta translator stats` prints for a translator."""
        return subprocess.run(SOFTDTA + ["translator", "stats", "--pin", str(self.pin(index))], capture_output=True,
                              text=True, timeout=60, check=True).stdout

    def http(self, collector: int, path: str, body: dict[str, Any] | None = None) -> Any:
        with in_netns(self.prefix + f"c{collector}"):
            request = urllib.request.Request(f"http://{self.collector_ip(collector)}:{QUERY_PORT}{path}",
                                             data=json.dumps(body).encode() if body else None,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())

    def send(self, frames: Iterable[bytes]) -> None:
        """Frames out of the reporter's interface."""
        with in_netns(self.prefix + "r"):
            sender = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            sender.bind(("r0", 0))
        with sender:
            for frame in frames:
                sender.send(frame)


def wait_until(condition: Callable[[], T | None], what: str, timeout: float) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except (OSError, ValueError, SoftdtaError):
            value = None  # a process between states
        if value:
            return value
        if time.monotonic() > deadline:
            raise FleetLabError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.01)


def fleet_propagation(rounds: int = 10, translators: int = 2, engine: str = "xdp") -> Propagation:
    """Commit `rounds` new epochs (a weight change moving slots between two collectors) to a fleet of
    `translators` translators; each round's time from the commit to the last translator's applied generation."""
    with tempfile.TemporaryDirectory(prefix="softdta-fleet-bench-") as run_dir, \
            FleetLab(Path(run_dir), collectors=2, translators=translators, engine=engine) as lab:
        lab.start_etcd()
        for index in (1, 2):
            lab.start_collector(index)
            lab.register(index)
        current = lab.slot_map((1, 2))
        lab.commit(current.to_json())
        for index in range(1, translators + 1):
            lab.start_translator(index)
        lab.wait_applied(current.epoch, START_S)
        seconds = []
        stages: dict[str, list[float]] = {"seen": [], "built": [], "applied": []}
        for round_ in range(rounds):
            current = lab.slot_map((1, 2), previous=current, weights={1 + round_ % 2: 2.0})
            committed = lab.commit(current.to_json())
            seconds.append(round((lab.wait_applied(current.epoch) - committed) / 1e9, 4))
            status = lab.fleet_status(1)
            times = [committed, status["slot_map_seen_at_ns"], status["built_at_ns"], status["applied_at_ns"]]
            for stage, before, after in zip(stages, times, times[1:]):
                stages[stage].append((after - before) / 1e9)
    return Propagation(translators=translators, collectors=2, slots=current.slot_count, engine=engine,
                       seconds=seconds, stages_median_s={stage: round(statistics.median(values), 4)
                                                         for stage, values in stages.items()},
                       median_s=statistics.median(seconds), max_s=max(seconds), goal_s=GOAL_S,
                       met=max(seconds) <= GOAL_S)
