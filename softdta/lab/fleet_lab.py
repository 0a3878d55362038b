"""A fleet in network namespaces: etcd, the controller, collectors, translators and reporters on one bridge, each
process in a namespace of its own with a log of its own in the lab's run directory. `softdta demo --fleet`, the
fleet_propagation benchmark and tests/live/test_fleet_translator.py run on it.

    etcd + controller (e) ─┐
    collectors c1..cN ─────┤ bridge (sw) ├─ translators t1..tM ─ reporters r1..rK

Addresses are 10.<network>.<role>.<n> (roles: translators 0, collectors 1, reporters 2, etcd 3); the fleet address,
which only translators answer, is 10.<network>.9.9. Reporters are spread evenly over the translators.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from softdta.collector.xdp_backend import pin_dir_for
from softdta.core.fleet import APPLIED, MEMBERS, SLOT_MAP, Member, SlotMap, assign, fleet_prefix
from softdta.core.workload import ReporterAddress
from softdta.engines.python import EngineStats, engine_stats
from softdta.errors import SoftdtaError
from softdta.etcd.client import Etcd
from softdta.kernel.bpf import BpfObject, attach_xdp, ensure_bpffs
from softdta.kernel.netns import Namespace, address, cleanup_prefix, in_netns, veth_pair
from softdta.kernel.programs import VETH_PEER_SOURCE, build_object
from softdta.lab.etcd_server import EtcdServer
from softdta.links.control import secrets_file_for
from softdta.links.fleet import fleet_status_file
from softdta.spec import DEFAULT_SLOT_BITS
from softdta.wire.frames import ip_bytes, mac_bytes

SOFTDTA = [sys.executable, "-m", "softdta.cli"]
TRANSLATOR, COLLECTOR, REPORTER, ETCD = range(4)
CONTROL_PORT, QUERY_PORT, ETCD_PORT = 40050, 8040, 2379
WAIT_S = 30.0
T = TypeVar("T")

# every primitive, small: a collector starts in about a second
STRUCTURES = """
[[structures]]
primitive = "key-write"
slots = 4096
key_len = 4
data_len = 4
hash = "independent"
redundancy = 1

[[structures]]
primitive = "key-increment"
slots = 1024

[[structures]]
primitive = "postcarding"
slots = 1024
hops = 5

[[structures]]
primitive = "sketch-merge"
slots = 64
rows = 4
reporters = 2
merge = "sum"
batch = 8

[[append]]
first_list = 0
lists = 64
entries = 256
batch = 4
"""


class FleetLabError(SoftdtaError, RuntimeError):
    """The fleet lab could not be built, or a process in it did not come up or ended; the message names its log."""


@dataclass(frozen=True)
class Node:
    """A namespace on the lab's bridge with one interface; `name` is what the fleet calls what runs there."""

    name: str
    ip: str
    mac: str
    netns: str
    interface: str


def wait_until(condition: Callable[[], T | None], what: str, timeout: float,
               check: Callable[[], None] | None = None) -> T:
    """`condition`'s first true value, polled until `timeout` s; `check` raises when waiting is pointless."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            value = condition()
        except (OSError, ValueError, SoftdtaError) as error:
            value, last = None, f" (last: {error})"  # a process or etcd between states
        if value:
            return value
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise FleetLabError(f"{what}: not within {timeout:.0f} s{last}")
        time.sleep(0.01)


@dataclass
class FleetLab:
    """The namespaces and processes of a fleet. `run_dir` is the lab's own (`build` empties it; the logs stay after
    `close`); every namespace's name starts with `prefix`, and `close` (or the next `build` with that prefix, after
    a crash) removes them, their processes and pins."""

    run_dir: Path
    collectors: int = 2
    translators: int = 1
    reporters: int = 1
    engine: str = "xdp"
    across: bool = False
    fleet: str = "lab"
    token: str = "fleet-token"
    prefix: str = field(default_factory=lambda: f"sdta-f{os.getpid()}-")
    network: int = 77
    names: str = field(default_factory=lambda: f"f{os.getpid()}")  # before collector names: their pins are global
    structures: str = STRUCTURES  # the collectors' [[structures]] and [[append]]
    translator_settings: str = ""  # more [translator] lines
    translator_args: tuple[str, ...] = ()  # more `softdta translator up` options
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)
    etcd_server: EtcdServer | None = None

    # nodes and addresses

    def _node(self, role: int, index: int, short: str, name: str) -> Node:
        return Node(name, f"10.{self.network}.{role}.{index}", f"02:5d:{self.network:02x}:00:{role:02x}:{index:02x}",
                    self.prefix + short, f"{short}-0")

    def collector(self, index: int) -> Node:
        return self._node(COLLECTOR, index, f"c{index}", f"{self.names}c{index}")

    def translator(self, index: int) -> Node:
        return self._node(TRANSLATOR, index, f"t{index}", f"t{index}")

    def reporter(self, index: int) -> Node:
        return self._node(REPORTER, index, f"r{index}", f"r{index}")

    @property
    def etcd_node(self) -> Node:
        return self._node(ETCD, 1, "e", "e")

    @property
    def fleet_address(self) -> str:
        return f"10.{self.network}.9.9"

    def translator_of(self, reporter: int) -> int:
        return (reporter - 1) * self.translators // self.reporters + 1

    def reporter_address(self, reporter: int = 1) -> ReporterAddress:
        """Where a reporter's frames come from and go: its translator's MAC, the fleet address."""
        node, translator = self.reporter(reporter), self.translator(self.translator_of(reporter))
        return ReporterAddress(mac_bytes(node.mac), ip_bytes(node.ip), mac_bytes(translator.mac),
                               ip_bytes(self.fleet_address))

    def member(self, index: int, weight: float = 1.0) -> Member:
        node = self.collector(index)
        return Member(node.name, node.ip, node.mac, f"{node.ip}:{CONTROL_PORT}", f"http://{node.ip}:{QUERY_PORT}",
                      weight)

    @property
    def pin_root(self) -> Path:
        return ensure_bpffs() / self.prefix.rstrip("-")

    def pin(self, translator: int) -> Path:
        return self.pin_root / self.translator(translator).name

    def collector_pins(self, index: int) -> Path:
        node = self.collector(index)
        return pin_dir_for(node.name, ip_bytes(node.ip))

    # building and tearing down

    def build(self) -> FleetLab:
        self.cleanup()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir(parents=True)
        self.pin_root.mkdir(parents=True, exist_ok=True)
        switch = Namespace.create(self.prefix + "sw")
        switch.run("ip", "link", "add", "br0", "type", "bridge")
        switch.run("ip", "link", "set", "br0", "up")
        nodes = [self.etcd_node, *map(self.collector, range(1, self.collectors + 1)),
                 *map(self.translator, range(1, self.translators + 1)),
                 *map(self.reporter, range(1, self.reporters + 1))]
        with BpfObject(build_object(VETH_PEER_SOURCE)) as passer:
            for node in nodes:
                namespace = Namespace.create(node.netns)
                port = "sw-" + node.netns.removeprefix(self.prefix)
                veth_pair(namespace, node.interface, switch, port, mac_a=node.mac)
                address(namespace, node.interface, f"{node.ip}/16")
                switch.run("ip", "link", "set", port, "master", "br0")
                with in_netns(switch.name):  # XDP_TX'd frames enter a veth only if its peer runs XDP
                    attach_xdp(socket.if_nametoindex(port), passer.programs["softdta_pass"].fd)
        return self

    def close(self) -> None:
        for process in reversed(self.processes.values()):  # translators before the collectors they use
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(20)
            except ProcessLookupError:
                pass  # ended already
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        if self.etcd_server is not None:
            self.etcd_server.kill()
        self.cleanup()

    def cleanup(self) -> None:
        """Remove the lab's namespaces with what still runs in them, its translators' pins and secrets and its
        collectors' pins; what a crashed run left too."""
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        for netns in (line.split()[0] for line in listed.splitlines() if line.startswith(self.prefix)):
            pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
            for pid in map(int, pids):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        cleanup_prefix(self.prefix)
        for index in range(1, self.translators + 1):
            secrets = secrets_file_for(self.pin(index))
            for kept in [secrets, *secrets.parent.glob(f"{secrets.stem}.*.json")]:
                kept.unlink(missing_ok=True)
        shutil.rmtree(self.pin_root, ignore_errors=True)
        for index in range(1, self.collectors + 1):
            shutil.rmtree(self.collector_pins(index), ignore_errors=True)

    def __enter__(self) -> FleetLab:
        return self.build()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # processes

    def spawn(self, name: str, argv: list[str], netns: str | None = None) -> subprocess.Popen[bytes]:
        """`argv` (in `netns`, if given) in a session of its own, its output in `name`.log."""
        with (self.run_dir / f"{name}.log").open("ab") as log:
            process = subprocess.Popen((["ip", "netns", "exec", netns] if netns else []) + argv, stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.processes[name] = process
        return process

    def log(self, name: str) -> str:
        return (self.run_dir / f"{name}.log").read_text()

    def kill(self, name: str) -> None:
        """kill -9 the process `name` (and what it started)."""
        process = self.processes[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        self.killed.add(name)

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if name not in self.killed and process.poll() is not None:
                raise FleetLabError(f"{name} exited with status {process.returncode}: "
                                    f"{self.log(name).strip()[-2000:]} (log: {self.run_dir / name}.log)")

    def wait_until(self, condition: Callable[[], T | None], what: str, timeout: float = WAIT_S) -> T:
        """As `wait_until`, and a process of the lab that ended (other than by `kill`) ends the wait."""
        return wait_until(condition, f"{what} (the logs are in {self.run_dir})", timeout, self.check_alive)

    def wait_for_line(self, name: str, text: str) -> None:
        self.wait_until(lambda: text in self.log(name), f"{name}: {text!r}")

    def start_etcd(self) -> EtcdServer:
        """etcd in its namespace; again after a kill, with its data."""
        if self.etcd_server is None:
            node = self.etcd_node
            self.etcd_server = EtcdServer(self.run_dir / "etcd", host=node.ip, client_port=ETCD_PORT,
                                          peer_port=ETCD_PORT + 1, netns=node.netns)
        return self.etcd_server.start()

    def start_controller(self, replicas: int = 1) -> None:
        """`softdta fleet controller`, in etcd's namespace."""
        assert self.etcd_server is not None
        self.spawn("controller", SOFTDTA + ["fleet", "controller", "--etcd", self.etcd_server.endpoint, "--fleet",
                                            self.fleet, "--replicas", str(replicas)], self.etcd_node.netns)

    def start_collectors(self, *indices: int, lease_ttl: int | None = None) -> None:
        """`softdta collector up` for each, until each is up; with `lease_ttl`, each registers itself in the fleet
        under a lease of that TTL (s)."""
        for index in indices:
            node = self.collector(index)
            (self.run_dir / node.name).mkdir(exist_ok=True)
            config = self.run_dir / node.name / "collector.toml"
            config.write_text(f'[collector]\nname = "{node.name}"\nip = "{node.ip}"\nbackend = "xdp"\n'
                              f'mac = "{node.mac}"\ninterface = "{node.interface}"\n'
                              f'data_dir = "{self.run_dir / node.name / "regions"}"\ntoken = "{self.token}"\n'
                              f"control_port = {CONTROL_PORT}\nquery_port = {QUERY_PORT}\n{self.structures}")
            registering = []
            if lease_ttl is not None:
                assert self.etcd_server is not None
                registering = ["--etcd", self.etcd_server.endpoint, "--fleet", self.fleet,
                               "--lease-ttl", str(lease_ttl)]
            self.spawn(node.name, SOFTDTA + ["collector", "up", "--config", str(config), "--netns", node.netns,
                                             "--query-host", node.ip, *registering])
        for index in indices:
            self.wait_for_line(self.collector(index).name, f"collector {self.collector(index).name} up")

    def register(self, index: int, weight: float = 1.0) -> None:
        """The collector's Member record, written as a collector that registers itself writes it (no lease)."""
        member = self.member(index, weight)
        self.etcd(lambda etcd: etcd.put(fleet_prefix(self.fleet) + MEMBERS + member.name, member.to_json()))

    def start_translators(self, *indices: int) -> None:
        """`softdta translator up --etcd` following the fleet at its address, until each is up."""
        assert self.etcd_server is not None
        for index in indices:
            node = self.translator(index)
            settings = self.run_dir / f"{node.name}.toml"
            settings.write_text(f'[translator]\nmac = "{node.mac}"\nip = "{node.ip}"\n{self.translator_settings}')
            self.spawn(node.name, SOFTDTA + [
                "translator", "up", "--tables", str(settings), "-i", node.interface, "--netns", node.netns,
                "--pin", str(self.pin(index)), "--engine", self.engine, "--token", self.token,
                "--etcd", self.etcd_server.endpoint, "--fleet", self.fleet, "--fleet-address", self.fleet_address,
                "--name", node.name, *(["--across"] if self.across else []), *self.translator_args])
        for index in indices:
            self.wait_for_line(self.translator(index).name, f"translator up on {self.translator(index).interface}")

    # the fleet in etcd

    def etcd(self, call: Callable[[Etcd], T]) -> T:
        """`call` with an etcd client, from etcd's namespace (the lab's etcd is on the bridge only)."""
        assert self.etcd_server is not None
        with in_netns(self.etcd_node.netns):
            return call(self.etcd_server.client())

    def slot_map(self, collectors: Iterable[int], previous: SlotMap | None = None, replicas: int = 1,
                 slot_bits: int = DEFAULT_SLOT_BITS, weights: dict[int, float] | None = None) -> SlotMap:
        """The map the controller would assign over `collectors` (indices, with their weights)."""
        members = {self.collector(i).name: self.member(i, (weights or {}).get(i, 1.0)) for i in collectors}
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

    def committed_map(self) -> SlotMap | None:
        kv = self.etcd(lambda etcd: etcd.get(fleet_prefix(self.fleet) + SLOT_MAP))
        return SlotMap.from_json(kv.value) if kv else None

    def members(self) -> set[str]:
        kvs, _ = self.etcd(lambda etcd: etcd.get_prefix(fleet_prefix(self.fleet) + MEMBERS))
        return {kv.key.rsplit("/", 1)[1] for kv in kvs}

    def applied(self) -> dict[str, dict[str, Any]]:
        """What each translator and reporter applied ({"epoch", "generation", "at_ns"}), by name."""
        kvs, _ = self.etcd(lambda etcd: etcd.get_prefix(fleet_prefix(self.fleet) + APPLIED))
        return {kv.key.rsplit("/", 1)[1]: json.loads(kv.value) for kv in kvs}

    def wait_for_map(self, members: set[str], after_epoch: int = 0) -> SlotMap:
        """The first slot map past `after_epoch` over exactly `members` (collector names)."""
        def ready() -> SlotMap | None:
            current = self.committed_map()
            return current if current and current.epoch > after_epoch and current.assigned() == members else None
        return self.wait_until(ready, f"a slot map over {sorted(members)}")

    def wait_applied(self, epoch: int, timeout: float = WAIT_S) -> int:
        """Waits for every translator to apply `epoch`; the wall clock (ns) of the last one's applied generation."""
        names = [self.translator(index).name for index in range(1, self.translators + 1)]

        def everywhere() -> int | None:
            applied = self.applied()
            done = all(name in applied and applied[name]["epoch"] >= epoch for name in names)
            return max(int(applied[name]["at_ns"]) for name in names) if done else None
        return self.wait_until(everywhere, f"epoch {epoch} applied by every translator", timeout)

    # what the processes say, and traffic

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
        """A request to a collector's query service, from its namespace."""
        node = self.collector(collector)
        with in_netns(node.netns):
            request = urllib.request.Request(f"http://{node.ip}:{QUERY_PORT}{path}",
                                             data=json.dumps(body).encode() if body else None,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())

    def send(self, frames: Iterable[bytes], reporter: int = 1) -> None:
        """Frames out of a reporter's interface."""
        node = self.reporter(reporter)
        with in_netns(node.netns):
            sender = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            sender.bind((node.interface, 0))
        with sender:
            for frame in frames:
                sender.send(frame)
