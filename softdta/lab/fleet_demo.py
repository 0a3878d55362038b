"""`softdta demo --fleet`: a fleet in network namespaces, changed mid-run, and a strict verdict (docs/fleet.md).

    etcd + controller (e) ─┐
    collectors c1..c3 (c4 joins later) ─┤ bridge (sw) ├─ translators t1, t2 ─ reporters r1, r2 (t1), r3, r4 (t2)

Reporters send Key-Write (two copies, across collectors) and Append reports to the fleet address through their
translator, which resolves each report's slot with the slot map the controller keeps in etcd. Three phases of
traffic: on three collectors; after a fourth joined; after one was killed with SIGKILL. Between phases the demo
waits until every report sent was taken and every frame executed, then changes the fleet and waits until both
translators applied the new epoch. Then the federated router answers every key and list, and the verdict holds
each answer to the prediction: every Key-Write key reads back its last value (each has a copy on a collector that
survived), and each Append list reads back its entries in order, partial exactly where the killed collector held
them, naming their slot.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from softdta.collector.xdp_backend import pin_dir_for
from softdta.core.fleet import APPLIED, MEMBERS, SLOT_MAP, SlotMap, fleet_prefix, moved_fraction
from softdta.engines.python import engine_stats
from softdta.errors import SoftdtaError
from softdta.etcd.client import Etcd, EtcdUnavailable
from softdta.kernel.bpf import BpfObject, Map, attach_xdp, ensure_bpffs
from softdta.kernel.netns import Namespace, address, cleanup_prefix, in_netns, veth_pair
from softdta.kernel.programs import VETH_PEER_SOURCE, build_object
from softdta.kernel.tx_ring import RingReporter
from softdta.lab.etcd_server import EtcdServer
from softdta.spec import KeyHash, ResponderCounter
from softdta.wire import dta
from softdta.wire.frames import UdpEndpoints, build_udp_frame, ip_bytes, mac_bytes
from softdta.wire.hashing import key_slot

PREFIX = "sdta-fleet-"
STATE_DIR = Path("/run/softdta-fleet")
PIN_ROOT = Path("/sys/fs/bpf/softdta-fleet")
FLEET = "demo"
FLEET_ADDRESS = "10.78.9.9"
ETCD_IP, ETCD_PORT = "10.78.0.250", 2379
CONTROL_PORT, QUERY_PORT = 40050, 8040
LEASE_TTL_S = 3  # a killed collector leaves the fleet within this
REPLICAS = 2  # and Key-Write's two copies go to both
KEY_WRITE_COPIES = 2
KEY_WRITE_SLOTS = 65536
APPEND_LISTS = 64  # 16 per reporter: a list is always sent through one translator
APPEND_ENTRIES = 4096
APPEND_BATCH = 4
PHASES = ("3 collectors", "c4 joined", "c2 killed")
KILLED, JOINED = "c2", "c4"
WAIT_S = 30.0
T = TypeVar("T")


@dataclass(frozen=True)
class Node:
    name: str
    ip: str
    mac: str

    @property
    def netns(self) -> str:
        return PREFIX + self.name


COLLECTORS = [Node(f"c{n}", f"10.78.1.{n}", f"02:5d:7b:00:01:{n:02x}") for n in range(1, 5)]
TRANSLATORS = [Node(f"t{n}", f"10.78.0.{n}", f"02:5d:7b:00:00:{n:02x}") for n in range(1, 3)]
REPORTERS = [Node(f"r{n}", f"10.78.2.{n}", f"02:5d:7b:00:02:{n:02x}") for n in range(1, 5)]
ETCD = Node("e", ETCD_IP, "02:5d:7b:00:00:fa")


class FleetDemoError(SoftdtaError, RuntimeError):
    """The fleet demo could not run; the message names the step and where its log is."""


def translator_of(reporter: int) -> Node:
    """Reporters r1 and r2 send through t1, r3 and r4 through t2."""
    return TRANSLATORS[reporter // 2]


def collector_config(node: Node, token: str) -> str:
    return f"""[collector]
name = "{node.name}"
ip = "{node.ip}"
backend = "xdp"
mac = "{node.mac}"
interface = "{node.name}-0"
data_dir = "{STATE_DIR / node.name / "regions"}"
token = "{token}"
control_port = {CONTROL_PORT}
query_port = {QUERY_PORT}

[[structures]]
primitive = "key-write"
slots = {KEY_WRITE_SLOTS}
hash = "independent"

[[append]]
first_list = 0
lists = {APPEND_LISTS}
entries = {APPEND_ENTRIES}
batch = {APPEND_BATCH}
"""


def translator_settings(node: Node) -> str:
    return f"""[translator]
mac = "{node.mac}"
ip = "{node.ip}"
profile = "dta-v1"
ack_request_interval = 8
"""


# --------------------------------------------------------------------------------------------------
# the workload and what it must leave behind


@dataclass
class Workload:
    """Each reporter's reports per phase, and the truth they make: a key's last value, a list's entries."""

    per_phase: list[list[list[dta.Report]]]  # phase -> reporter -> reports
    key_writes: int = 0
    last_value: dict[bytes, int] = field(default_factory=dict)
    entries: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # list -> [(phase, entry value)]


def build_workload(keys_per_phase: int, entries_per_list: int, seed: int) -> Workload:
    """Disjoint keys and lists per reporter (so one translator orders each); a quarter of each phase's keys are
    earlier phases' keys written again (the newer value must win). No two keys share a slot in any copy's hash:
    what the demo shows is the fleet, not a hash table's collisions (docs/hashing.md has those), so every key
    must read back."""
    rng = random.Random(seed)
    load = Workload([])
    taken: set[int] = set()

    def new_key() -> bytes:
        while True:
            key = rng.randbytes(4)
            slots = {key_slot(key, copy, KEY_WRITE_SLOTS, KeyHash.INDEPENDENT) for copy in range(KEY_WRITE_COPIES)}
            if len(slots) == KEY_WRITE_COPIES and not slots & taken:
                taken.update(slots)
                return key
    owned: list[list[bytes]] = [[] for _ in REPORTERS]
    for phase in range(len(PHASES)):
        reports: list[list[dta.Report]] = []
        for index, _ in enumerate(REPORTERS):
            batch: list[tuple[dta.Report, int | None]] = []  # with the list id of an Append report
            rewrites = rng.sample(owned[index], min(len(owned[index]), keys_per_phase // 4))
            fresh = [new_key() for _ in range(keys_per_phase - len(rewrites))]
            for key in rewrites + fresh:
                value = phase << 24 | rng.randrange(1 << 24)
                batch.append((dta.key_write(key, value, KEY_WRITE_COPIES), None))
                load.last_value[key] = value
                load.key_writes += 1
            owned[index] += fresh
            lists = range(index * APPEND_LISTS // len(REPORTERS), (index + 1) * APPEND_LISTS // len(REPORTERS))
            for round_ in range(entries_per_list):
                for list_id in lists:
                    value = phase << 28 | index << 24 | list_id << 16 | round_ + 1  # never 0: an empty entry
                    batch.append((dta.append(list_id, value), list_id))
            rng.shuffle(batch)
            for report, appended_to in batch:  # in the order sent: the order each list's ring holds them
                if appended_to is not None:
                    load.entries.setdefault(appended_to, []).append((phase, int.from_bytes(report.data, "big")))
            reports.append([report for report, _ in batch])
        load.per_phase.append(reports)
    return load


# --------------------------------------------------------------------------------------------------
# the fleet's processes


def _softdta(*argv: str) -> list[str]:
    return [sys.executable, "-m", "softdta.cli", *argv]


class Fleet:
    """The namespaces, etcd, the controller, the collectors and the translators; `close` removes all of it."""

    def __init__(self, token: str):
        self.token = token
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.etcd_server: EtcdServer | None = None
        self.etcd = Etcd(f"http://{ETCD_IP}:{ETCD_PORT}", timeout=2.0)

    @property
    def etcd_url(self) -> str:
        return f"http://{ETCD_IP}:{ETCD_PORT}"

    def build(self) -> None:
        switch = Namespace.create(PREFIX + "sw")
        switch.run("ip", "link", "add", "br0", "type", "bridge")
        switch.run("ip", "link", "set", "br0", "up")
        with BpfObject(build_object(VETH_PEER_SOURCE)) as passer:
            for node in [ETCD, *COLLECTORS, *TRANSLATORS, *REPORTERS]:
                namespace = Namespace.create(node.netns)
                port = f"sw-{node.name}"
                veth_pair(namespace, f"{node.name}-0", switch, port, mac_a=node.mac)
                address(namespace, f"{node.name}-0", f"{node.ip}/16")
                switch.run("ip", "link", "set", port, "master", "br0")
                with in_netns(switch.name):  # XDP_TX'd frames enter a veth only if its peer runs XDP
                    attach_xdp(socket.if_nametoindex(port), passer.programs["softdta_pass"].fd)

    def start_etcd(self) -> None:
        self.etcd_server = EtcdServer(STATE_DIR / "etcd", host=ETCD_IP, client_port=ETCD_PORT,
                                      peer_port=ETCD_PORT + 1, netns=ETCD.netns).start()

    def _spawn(self, name: str, argv: list[str], netns: str | None = None) -> subprocess.Popen[bytes]:
        log = (STATE_DIR / f"{name}.log").open("ab")
        command = (["ip", "netns", "exec", netns] if netns else []) + argv
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
        log.close()
        self.processes[name] = process
        return process

    def start_controller(self) -> None:
        self._spawn("controller", _softdta("fleet", "controller", "--etcd", self.etcd_url, "--fleet", FLEET,
                                           "--replicas", str(REPLICAS)), ETCD.netns)

    def start_collector(self, node: Node) -> None:
        config = STATE_DIR / node.name / "collector.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(collector_config(node, self.token))
        self._spawn(node.name, _softdta("collector", "up", "--config", str(config), "--netns", node.netns,
                                        "--query-host", node.ip, "--etcd", self.etcd_url, "--fleet", FLEET,
                                        "--lease-ttl", str(LEASE_TTL_S)))

    def start_translator(self, node: Node) -> None:
        settings = STATE_DIR / node.name / "translator.toml"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(translator_settings(node))
        self._spawn(node.name, _softdta(
            "translator", "up", "--tables", str(settings), "-i", f"{node.name}-0", "--netns", node.netns,
            "--pin", str(PIN_ROOT / node.name), "--flush-idle-ms", "1", "--token", self.token, "--engine", "xdp",
            "--etcd", self.etcd_url, "--fleet", FLEET, "--fleet-address", FLEET_ADDRESS, "--across",
            "--name", node.name))

    def kill(self, name: str) -> None:
        process = self.processes[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if name != KILLED and process.poll() is not None:
                raise FleetDemoError(f"{name} exited with status {process.returncode}; see "
                                     f"{STATE_DIR / (name + '.log')}")

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(timeout=15)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(process.pid, signal.SIGKILL)
        if self.etcd_server is not None:
            self.etcd_server.kill()

    # ----------------------------------------------------------------------------------------------
    # what etcd says

    def read(self, key: str) -> bytes | None:
        with in_netns(ETCD.netns):
            kv = self.etcd.get(fleet_prefix(FLEET) + key)
        return kv.value if kv else None

    def slot_map(self) -> SlotMap | None:
        value = self.read(SLOT_MAP)
        return SlotMap.from_json(value) if value else None

    def applied(self) -> dict[str, int]:
        with in_netns(ETCD.netns):
            kvs, _ = self.etcd.get_prefix(fleet_prefix(FLEET) + APPLIED)
        return {kv.key.rsplit("/", 1)[1]: int(json.loads(kv.value)["epoch"]) for kv in kvs}

    def members(self) -> set[str]:
        with in_netns(ETCD.netns):
            kvs, _ = self.etcd.get_prefix(fleet_prefix(FLEET) + MEMBERS)
        return {kv.key.rsplit("/", 1)[1] for kv in kvs}

    def wait_for_map(self, members: set[str], after_epoch: int = 0) -> tuple[SlotMap, float]:
        """The first slot map past `after_epoch` over exactly `members`, and when the demo saw it."""
        def ready() -> tuple[SlotMap, float] | None:
            current = self.slot_map()
            if current and current.epoch > after_epoch and current.assigned() == members:
                return current, time.monotonic()
            return None
        return wait_until(ready, f"a slot map over {sorted(members)}", self.check_alive)

    def wait_applied(self, epoch: int) -> float:
        """When both translators applied `epoch`."""
        def ready() -> float | None:
            applied = self.applied()
            return time.monotonic() if all(applied.get(t.name, 0) >= epoch for t in TRANSLATORS) else None
        return wait_until(ready, f"both translators on epoch {epoch}", self.check_alive)


def wait_until(condition: Callable[[], T | None], what: str, check: Callable[[], None], timeout: float = WAIT_S) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = condition()
        except EtcdUnavailable:
            result = None
        if result:
            return result
        check()
        if time.monotonic() > deadline:
            raise FleetDemoError(f"waited {timeout:.0f} s for {what}; see the logs in {STATE_DIR}")
        time.sleep(0.01)


# --------------------------------------------------------------------------------------------------
# traffic and counters


def counter_total(pin: Path, name: str, counter: int) -> int:
    with Map.from_pinned(pin / name) as counters:
        return sum(int.from_bytes(value[:8], "little")
                   for value in counters.lookup_percpu(counter.to_bytes(4, "little")) or [])


def collector_pins(node: Node) -> Path:
    return pin_dir_for(node.name, ip_bytes(node.ip))


def executed(nodes: list[Node]) -> int:
    """Requests the collectors' responders executed (a killed collector's pinned counters stay readable)."""
    return sum(counter_total(collector_pins(node), "responder_counters", int(ResponderCounter.EXECUTED))
               for node in nodes)


def frames_to(nodes: list[Node]) -> dict[str, int]:
    """The frames both translators sent to each of `nodes`, from their queue pairs' counts."""
    by_ip = {node.ip: node.name for node in nodes}
    sent = dict.fromkeys(by_ip.values(), 0)
    for translator in TRANSLATORS:
        for qp in engine_stats(PIN_ROOT / translator.name)["qps"]:
            if qp["collector"] in by_ip:
                sent[by_ip[qp["collector"]]] += qp["frames_sent"]
    return sent


def executed_by(nodes: list[Node]) -> dict[str, int]:
    return {node.name: executed([node]) for node in nodes}


def translator_counters() -> dict[str, int]:
    totals: dict[str, int] = {}
    for node in TRANSLATORS:
        for name, value in engine_stats(PIN_ROOT / node.name)["counters"].items():
            totals[name] = totals.get(name, 0) + value
    return totals


def send_phase(load: Workload, phase: int, rate: float) -> int:
    """Every reporter's reports of `phase`, paced at `rate` reports/s over all reporters; the reports sent."""
    frames = []
    for index, node in enumerate(REPORTERS):
        ends = UdpEndpoints(src_mac=mac_bytes(node.mac), dst_mac=mac_bytes(translator_of(index).mac),
                            src_ip=ip_bytes(node.ip), dst_ip=ip_bytes(FLEET_ADDRESS), sport=40041, dport=40040)
        frames.append([build_udp_frame(ends, dta.encode(report)) for report in load.per_phase[phase][index]])
    senders = [RingReporter(f"{node.name}-0", node.netns, 256) for node in REPORTERS]
    chunk, sent, started = 32, 0, time.perf_counter()
    try:
        for start in range(0, max(map(len, frames)), chunk):
            for sender, reporter_frames in zip(senders, frames):
                part = reporter_frames[start:start + chunk]
                if part:
                    sender.send(part)
                    sent += len(part)
            ahead = sent / rate - (time.perf_counter() - started)
            if ahead > 0:
                time.sleep(ahead)
    finally:
        for sender in senders:
            sender.close()
    return sent


def wait_quiet(fleet: Fleet, sent_total: int, alive: list[Node]) -> dict[str, dict[str, int]]:
    """Until the translators took every report sent and each live collector executed every frame they sent it;
    then what each was sent and executed."""
    def quiet() -> dict[str, dict[str, int]] | None:
        if translator_counters().get("rx_reports", 0) < sent_total:
            return None
        sent, done = frames_to(alive), executed_by(alive)
        return {"sent": sent, "executed": done} if all(done[name] >= sent[name] for name in sent) else None
    return wait_until(quiet, "every report taken and every frame executed", fleet.check_alive)


# --------------------------------------------------------------------------------------------------
# the run


@contextmanager
def fleet_up(token: str) -> Iterator[Fleet]:
    """The fleet, removed afterwards but for its processes' logs in STATE_DIR (the next run removes those)."""
    cleanup()
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    ensure_bpffs()
    PIN_ROOT.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(token)
    try:
        fleet.build()
        fleet.start_etcd()
        fleet.start_controller()
        yield fleet
    finally:
        fleet.close()
        cleanup()


def cleanup() -> list[str]:
    """Remove every namespace and pin of a fleet demo; safe to run any number of times."""
    removed = cleanup_prefix(PREFIX)
    shutil.rmtree(PIN_ROOT, ignore_errors=True)
    for node in COLLECTORS:
        shutil.rmtree(collector_pins(node), ignore_errors=True)
    return removed


def query_fleet(load: Workload) -> dict[str, Any]:
    """Every key and every list through the federated router, as a user of the fleet asks (from the etcd
    namespace, which reaches etcd and every collector)."""
    import asyncio

    import numpy as np

    from softdta.core.primitives import KeyWrite
    from softdta.fleet.router import FOUND, FleetWatch, Router

    keys = sorted(load.last_value)
    rows = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), 4)

    async def ask(watch: FleetWatch) -> dict[str, Any]:
        async with Router(lambda: watch.view, FLEET) as router:
            result = await router.key_write(KeyWrite, rows, KEY_WRITE_COPIES)
            lists = {list_id: await router.append(list_id) for list_id in sorted(load.entries)}
        return {"epoch": result.epoch, "key_write_partial": result.partial, "epochs": watch.view.epochs()[::-1],
                "keys": {key: int.from_bytes(bytes(row), "big") if int(status) == FOUND else None
                         for key, status, row in zip(keys, result.status.tolist(), result.values)},
                "lists": lists}

    with in_netns(ETCD.netns):
        watch = FleetWatch(Etcd(f"http://{ETCD_IP}:{ETCD_PORT}"), FLEET).start()
        try:
            return asyncio.run(ask(watch))
        finally:
            watch.close()


def predicted_lists(load: Workload, maps: list[SlotMap], known: list[SlotMap]) -> dict[int, dict[str, Any]]:
    """Each list's answer: its holders in the order of the epochs the router knows (`known`, oldest first; a
    controller may have committed epochs before the demo's first, while collectors registered), each ring's entries
    in the order written during the phases (`maps`: the epoch of each phase), and the slot the killed collector
    makes partial."""
    from softdta.core.primitives import Append

    predicted = {}
    for list_id, entries in load.entries.items():
        key = Append.partition_key(dta.append(list_id, 0))
        owners = [slot_map.owners(key)[0] for slot_map in maps]
        holders = list(dict.fromkeys(slot_map.owners(key)[0] for slot_map in known))
        rings = {holder: [value for phase, value in entries if owners[phase] == holder] for holder in holders}
        assert set(owners) <= set(holders), "the router knows every epoch of the demo's phases"
        predicted[list_id] = {
            "entries": [value for holder in holders if holder != KILLED for value in rings[holder]],
            "collectors": holders, "partial": KILLED in holders,
            "missing_slots": [maps[-1].slot_of(key)] if KILLED in holders else []}
    return predicted


def verdict(load: Workload, maps: list[SlotMap], answers: dict[str, Any], counters: dict[str, int], sent: int,
            accounts: list[dict[str, dict[str, int]]]) -> tuple[dict[str, Any], list[str]]:
    """The summary and every problem: reports not taken, frames not executed, drops, keys not read back with
    their last value, lists whose entries differ from the prediction."""
    problems = []
    drops = {name: value for name, value in counters.items() if name.startswith("drop_") and value}
    if counters.get("rx_reports", 0) != sent:
        problems.append(f"the translators took {counters.get('rx_reports', 0):,} of {sent:,} reports")
    if drops:
        problems.append(f"the translators dropped {drops}")
    if counters.get("fleet_resolved", 0) != load.key_writes:  # Append goes by list id, through the lists' owners
        problems.append(f"the slot map resolved {counters.get('fleet_resolved', 0):,} of {load.key_writes:,} "
                        "Key-Write reports")
    for phase, frames in enumerate(accounts):
        short = {name: f"{frames['executed'][name]:,} of {sent:,}" for name, sent in frames["sent"].items()
                 if frames["executed"][name] != sent}
        if short:
            problems.append(f"after phase {phase + 1} collectors executed other than they were sent: {short}")
    wrong = {key.hex(): value for key, value in answers["keys"].items() if value != load.last_value[key]}
    lost = sum(1 for value in answers["keys"].values() if value is None)
    if wrong:
        problems.append(f"{len(wrong):,} of {len(load.last_value):,} keys read back wrong or not at all "
                        f"({lost:,} lost), e.g. {dict(list(wrong.items())[:3])}")
    predicted = predicted_lists(load, maps, answers["epochs"])
    differing = []
    for list_id, expected in predicted.items():
        got = answers["lists"][list_id]
        if {name: got.get(name) for name in expected} != expected:
            differing.append(list_id)
    if differing:
        first = differing[0]
        got, want = {name: answers["lists"][first].get(name) for name in predicted[first]}, predicted[first]
        problems.append(f"{len(differing)} Append lists differ from the prediction, e.g. list {first}: "
                        f"{ {name: value for name, value in got.items() if value != want[name]} } predicted "
                        f"{ {name: value for name, value in want.items() if got[name] != value} }")
    partial_lists = sorted(list_id for list_id, expected in predicted.items() if expected["partial"])
    summary = {
        "reports_sent": sent, "translators": {"received": counters.get("rx_reports", 0),
                                              "resolved_by_slot": counters.get("fleet_resolved", 0),
                                              "frames": counters.get("tx_frames", 0), "drops": drops},
        "frames_by_phase": accounts,
        "key_write": {"keys": len(load.last_value), "read_back": len(load.last_value) - len(wrong),
                      "lost_to_the_killed_collector": lost, "copies": KEY_WRITE_COPIES,
                      "partial_slots": len(answers["key_write_partial"].get("missing_slots", []))},
        "append": {"lists": len(predicted), "entries": sum(len(e) for e in load.entries.values()),
                   "entries_read": sum(len(answers["lists"][i]["entries"]) for i in predicted),
                   "partial_lists": partial_lists, "as_predicted": len(predicted) - len(differing)},
        "problems": problems}
    return summary, problems


def run(keys_per_phase: int = 1000, entries_per_list: int = 16, rate: float = 20_000.0, seed: int = 0,
        as_json: bool = False) -> int:
    """Bring the fleet up, run the three phases, query and judge; exit status 1 on any problem."""
    from rich.console import Console

    console = Console(stderr=as_json)
    load = build_workload(keys_per_phase, entries_per_list, seed)
    epochs: list[dict[str, Any]] = []
    with fleet_up(secrets.token_hex(16)) as fleet:
        with console.status("etcd, a controller and three collectors in namespaces"):
            for node in COLLECTORS[:3]:
                fleet.start_collector(node)
            first, _ = fleet.wait_for_map({node.name for node in COLLECTORS[:3]})
        with console.status("two translators following the slot map"):
            for node in TRANSLATORS:
                fleet.start_translator(node)
            fleet.wait_applied(first.epoch)
        maps, alive = [first], list(COLLECTORS[:3])
        epochs.append({"epoch": first.epoch, "collectors": sorted(first.assigned()),
                       "max_over_mean": round(first.max_over_mean(), 4)})
        sent, accounts = 0, []
        for phase, title in enumerate(PHASES):
            if phase == 1:
                with console.status(f"{JOINED} joins"):
                    fleet.start_collector(COLLECTORS[3])
                    alive.append(COLLECTORS[3])
                    maps.append(transition(fleet, maps[-1], {node.name for node in alive}, epochs))
            if phase == 2:
                with console.status(f"kill -9 {KILLED}"):
                    victim = next(node for node in alive if node.name == KILLED)
                    fleet.kill(KILLED)
                    alive.remove(victim)
                    maps.append(transition(fleet, maps[-1], {node.name for node in alive}, epochs))
            with console.status(f"phase {phase + 1} ({title}): {sum(map(len, load.per_phase[phase])):,} reports"):
                sent += send_phase(load, phase, rate)
                accounts.append(wait_quiet(fleet, sent, alive))
        with console.status("querying every key and list through the federated router"):
            answers = query_fleet(load)
        counters = translator_counters()
    summary, problems = verdict(load, maps, answers, counters, sent, accounts)
    summary["epochs"] = epochs
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        show(console, summary)
    return 1 if problems else 0


def transition(fleet: Fleet, before: SlotMap, members: set[str], epochs: list[dict[str, Any]]) -> SlotMap:
    """Wait for the controller's map over `members` and for both translators to apply it; note what moved."""
    started = time.monotonic()
    after, seen = fleet.wait_for_map(members, before.epoch)
    applied = fleet.wait_applied(after.epoch)
    epochs.append({"epoch": after.epoch, "collectors": sorted(after.assigned()),
                   "max_over_mean": round(after.max_over_mean(), 4),
                   "moved": round(moved_fraction(before, after), 4),
                   "ideal_moved": round(1 / max(len(members), len(before.assigned())), 4),
                   "map_after_s": round(seen - started, 3), "applied_after_s": round(applied - seen, 3)})
    return after


def show(console: Any, summary: dict[str, Any]) -> None:
    for epoch in summary["epochs"]:
        moved = (f"; moved {epoch['moved']:.2%} of the slot assignments (ideal {epoch['ideal_moved']:.2%}); in etcd "
                 f"{epoch['map_after_s']} s after the change, applied by both translators "
                 f"{epoch['applied_after_s']} s later") if "moved" in epoch else ""
        console.print(f"epoch {epoch['epoch']}: {', '.join(epoch['collectors'])}, max/mean "
                      f"{epoch['max_over_mean']}{moved}")
    translators, keys, lists = summary["translators"], summary["key_write"], summary["append"]
    last = summary["frames_by_phase"][-1]
    console.print(f"reports: {summary['reports_sent']:,} sent, {translators['received']:,} taken, "
                  f"{translators['resolved_by_slot']:,} resolved by slot; drops: {translators['drops'] or 'none'}; "
                  f"frames sent and executed per live collector: "
                  + ", ".join(f"{name} {sent:,}/{last['executed'][name]:,}" for name, sent in last["sent"].items()))
    console.print(f"Key-Write ({keys['copies']} copies across collectors): {keys['read_back']:,} of "
                  f"{keys['keys']:,} keys read back with their last value; lost to the killed collector: "
                  f"{keys['lost_to_the_killed_collector']}")
    console.print(f"Append: {lists['as_predicted']} of {lists['lists']} lists as predicted; {lists['entries_read']:,}"
                  f" of {lists['entries']:,} entries read, partial where {KILLED} held them "
                  f"({len(lists['partial_lists'])} lists, their slots named)")
    if summary["problems"]:
        console.print("[bold red]problems:[/] " + "; ".join(summary["problems"]))
    else:
        console.print("[bold green]every report accounted for; every answer is the predicted one")
