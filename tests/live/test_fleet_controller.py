"""The fleet's control plane on a real etcd process: `softdta fleet controller` (elected, debounced, committing each
epoch by compare-and-swap), collector registrations under leases, `softdta fleet status`, and the faults of
docs/fleet.md's failure model: unusable and backward slot maps, expired leases, etcd refusing and vanishing, two
controllers, and a collector back with another region layout."""

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from softdta.core.fleet import FleetError, Member, SlotMap, check_successor, fleet_prefix, moved_fraction
from softdta.etcd.lease import KeptKey
from softdta.fleet.controller import DEBOUNCE_S
from softdta.lab.etcd_server import EtcdServer
from softdta.lab.local_server import free_port
from tests.common import ROOT, SOFTDTA, eventually, one_line_error

FLEET = "lab"
PREFIX = fleet_prefix(FLEET)
TTL = 2  # etcd's shortest lease
PLAIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Process:
    """A `softdta` command run in a clean environment; its stdout and stderr lines collected as they come."""

    def __init__(self, args, home):
        self.process = subprocess.Popen(SOFTDTA + [str(arg) for arg in args], cwd=ROOT, text=True,
                                        env={"PATH": PLAIN_PATH, "HOME": str(home)},
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: list[str] = []
        for stream in (self.process.stdout, self.process.stderr):
            threading.Thread(target=self._collect, args=(stream,), daemon=True).start()

    def _collect(self, stream):
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, within: float = 15.0, count: int = 1) -> list[str]:
        def found():
            if self.process.poll() is not None and len(self.matching(text)) < count:
                raise AssertionError(f"{self.process.args[3:5]} exited ({self.process.returncode}): {self.lines}")
            return len(self.matching(text)) >= count
        eventually(found, within, f"{count} line(s) with {text!r} (got {self.lines})")
        return self.matching(text)

    def matching(self, text: str) -> list[str]:
        return [line for line in list(self.lines) if text in line]

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            assert self.process.wait(20) == 0, self.lines

    def kill(self):
        self.process.kill()
        self.process.wait(20)


@pytest.fixture
def etcd(tmp_path):
    with EtcdServer(tmp_path / "etcd") as server:
        yield server


@pytest.fixture
def run(tmp_path):
    """Starts `softdta ARGS...`; every process is stopped at the end of the test."""
    started: list[Process] = []
    (tmp_path / "home").mkdir()

    def start(*args) -> Process:
        process = Process(args, tmp_path / "home")
        started.append(process)
        return process
    yield start
    for process in started:
        if process.process.poll() is None:
            process.kill()


class Registrations:
    """Collectors' memberships, kept by the registration code collectors run (KeptKey under a lease)."""

    def __init__(self):
        self.keys: dict[str, KeptKey] = {}

    def add(self, etcd, name: str, ip: str, layout: str = "regions-1", weight: float = 1.0) -> KeptKey:
        member = Member(name, ip, "02:5d:7a:00:01:01", f"{ip}:40050", f"http://{ip}:8040", weight, layout)
        key = KeptKey(etcd.client(), PREFIX + "members/" + name, member.to_json(), TTL, what=name, log=lambda _: None)
        self.keys[name] = key.start()
        eventually(lambda: key.registered, what=f"{name} registered")
        return key

    def remove(self, name: str) -> None:
        self.keys.pop(name).close()


@pytest.fixture
def members():
    kept = Registrations()
    yield kept
    for key in kept.keys.values():
        key.close()


def controller(run, etcd, ident: str, *extra) -> Process:
    return run("fleet", "controller", "--etcd", etcd.endpoint, "--fleet", FLEET, "--id", ident, "--replicas", 2,
               "--slot-bits", 8, "--lease-ttl", TTL, *extra)


def slot_map(etcd) -> SlotMap | None:
    kv = etcd.client().get(PREFIX + "slotmap")
    return SlotMap.from_json(kv.value) if kv else None


def map_where(etcd, condition, within: float = 15.0, what: str = "the slot map") -> SlotMap:
    def check():
        try:
            current = slot_map(etcd)
        except FleetError:
            return None
        return current if current is not None and condition(current) else None
    return eventually(check, within, what)


def counters(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("softdta_fleet_controller_events_total{"):
            name = line.split('event="')[1].split('"')[0]
            found[name] = float(line.rsplit(" ", 1)[1])
    return found


# --------------------------------------------------------------------------------------------------
# the controller's work



def test_the_leader_commits_each_membership_change_as_one_new_epoch_moving_little(etcd, run, members):
    for i in range(1, 4):
        members.add(etcd, f"c{i}", f"10.77.1.{i}")
    leader = controller(run, etcd, "A")
    leader.wait_for("leading fleet lab")
    first = map_where(etcd, lambda m: set(m.members) == {"c1", "c2", "c3"}, what="the map of c1..c3")
    assert first.epoch == 1 and first.replicas == 2 and first.slot_count == 256
    assert all(len(owners) == 2 for owners in first.slots)

    members.add(etcd, "c4", "10.77.1.4")
    joined = map_where(etcd, lambda m: "c4" in m.members, what="c4's join")
    assert joined.epoch == 2
    check_successor(first, joined)
    assert 0 < moved_fraction(first, joined) <= 1.2 / 4, "a join moves about 1/N of the assignments"

    members.remove("c2")  # a collector that stops leaves at once: its lease is revoked
    left = map_where(etcd, lambda m: "c2" not in m.members, what="c2's leave")
    assert left.epoch == 3
    for slot, (before, after) in enumerate(zip(joined.slots, left.slots)):
        assert [name for name in before if name != "c2"] == [name for name in after if name in before], \
            f"slot {slot}: only c2's places moved"
    assert len(leader.wait_for("committed epoch", count=3)) == 3  # the log line may follow the map in etcd


def test_a_burst_of_joins_becomes_one_epoch(etcd, run, members):
    leader = controller(run, etcd, "A")
    leader.wait_for("no collector is registered")
    joined = []
    for i in range(1, 6):
        members.add(etcd, f"c{i}", f"10.77.1.{i}")
        joined.append(time.monotonic())
        time.sleep(0.04)  # the burst's pace (not a wait): joins 40 ms apart, within the 200 ms debounce
    final = map_where(etcd, lambda m: len(m.members) == 5, what="the map of the five")
    # a loaded machine may stretch a gap past the debounce: each such pause may end an epoch, nothing else may
    pauses = sum(1 for before, after in zip(joined, joined[1:]) if after - before > DEBOUNCE_S)
    assert final.epoch <= 2 + pauses, f"joins 40 ms apart are debounced into (about) one epoch ({pauses} pauses)"


def test_an_unusable_or_foreign_slot_map_is_replaced_by_a_valid_next_epoch(etcd, run, members):
    members.add(etcd, "c1", "10.77.1.1")
    members.add(etcd, "c2", "10.77.1.2")
    port = free_port()
    leader = controller(run, etcd, "A", "--metrics", f"127.0.0.1:{port}")
    good = map_where(etcd, lambda m: len(m.members) == 2)
    client = etcd.client()

    # a map whose slots name a collector it does not list: readers refuse it, the controller replaces it
    unknown = json.loads(good.to_json())
    unknown["epoch"], unknown["slots"][0] = 7, [0, 5]
    client.put(PREFIX + "slotmap", json.dumps(unknown))
    with pytest.raises(FleetError):
        SlotMap.from_json(client.get(PREFIX + "slotmap").value)
    replaced = map_where(etcd, lambda m: m.epoch > 7, what="the replacement of the unusable map")
    assert replaced.epoch == 8 and set(replaced.members) == {"c1", "c2"}
    leader.wait_for("the slot map in etcd is unusable")

    # not JSON at all
    client.put(PREFIX + "slotmap", b"\x00 not a slot map")
    map_where(etcd, lambda m: m.epoch == 9, what="the replacement of the malformed map")

    # a valid map that gives slots to a collector that is not registered
    ghost = SlotMap(20, 8, 1, {"ghost": "10.77.1.99"}, tuple(("ghost",) for _ in range(256)))
    client.put(PREFIX + "slotmap", ghost.to_json())
    fixed = map_where(etcd, lambda m: m.epoch > 20, what="the map without the ghost")
    assert fixed.epoch == 21 and "ghost" not in fixed.assigned() and set(fixed.members) == {"c1", "c2"}
    assert counters(port)["invalid_maps_replaced"] == 2
    assert counters(port)["epochs_committed"] == 4


def test_an_epoch_that_goes_backwards_is_refused_and_superseded(etcd, run, members):
    members.add(etcd, "c1", "10.77.1.1")
    port = free_port()
    leader = controller(run, etcd, "A", "--metrics", f"127.0.0.1:{port}")
    first = map_where(etcd, lambda m: m.epoch == 1)
    members.add(etcd, "c2", "10.77.1.2")
    second = map_where(etcd, lambda m: m.epoch == 2)
    etcd.client().put(PREFIX + "slotmap", first.to_json())  # a stale controller's write
    with pytest.raises(FleetError, match="does not follow"):
        check_successor(second, first)
    third = map_where(etcd, lambda m: m.epoch == 3, what="the epoch after the backward one")
    assert third.slots == second.slots, "the last good map is restored, not the stale one"
    leader.wait_for("went backwards")
    assert counters(port)["backward_epochs"] == 1


def test_an_epoch_applied_by_a_translator_is_never_reused_by_a_new_controller(etcd, run, members):
    members.add(etcd, "c1", "10.77.1.1")
    client = etcd.client()
    client.put(PREFIX + "applied/t1", json.dumps({"epoch": 41, "generation": 3, "at_ns": 1}))
    stale = SlotMap(5, 8, 1, {"c1": "10.77.1.1"}, tuple(("c1",) for _ in range(256)))
    client.put(PREFIX + "slotmap", stale.to_json())
    controller(run, etcd, "A")
    assert map_where(etcd, lambda m: m.epoch > 5).epoch == 42


def test_a_member_record_that_is_not_an_advertisement_is_ignored(etcd, run, members):
    members.add(etcd, "c1", "10.77.1.1")
    etcd.client().put(PREFIX + "members/broken", "{not json")
    etcd.client().put(PREFIX + "members/liar", Member("c9", "10.77.1.9", "", "", "").to_json())
    port = free_port()
    leader = controller(run, etcd, "A", "--metrics", f"127.0.0.1:{port}")
    assert set(map_where(etcd, lambda m: m.epoch == 1).members) == {"c1"}
    leader.wait_for("ignoring /softdta/lab/members/broken")
    leader.wait_for("ignoring /softdta/lab/members/liar: it names collector 'c9'")
    assert counters(port)["invalid_members"] == 2


# --------------------------------------------------------------------------------------------------
# leases, etcd faults, several controllers


def test_a_lease_gone_mid_run_re_registers_and_the_controller_reassigns(etcd, run, members):
    members.add(etcd, "c1", "10.77.1.1")
    c2 = members.add(etcd, "c2", "10.77.1.2")
    controller(run, etcd, "A")
    map_where(etcd, lambda m: len(m.members) == 2)
    lines = []
    c2.log = lines.append
    etcd.client().revoke(c2.lease)  # what an expiry does, now: the key goes with the lease
    eventually(lambda: c2.registrations == 2, what="c2's second registration")
    assert c2.lease_expiries == 1 and c2.registered
    assert any("lease" in line and "expired" in line for line in lines), lines
    final = map_where(etcd, lambda m: len(m.members) == 2 and len(m.slots_of("c2")) > 0)
    member = Member.from_json(etcd.client().get(PREFIX + "members/c2").value)
    assert member.name == "c2" and final.members["c2"] == "10.77.1.2"


def test_a_paused_registration_whose_lease_expired_registers_again(etcd, run, members, tmp_path):
    members.add(etcd, "c1", "10.77.1.1")
    script = (f"import sys, time; from softdta.etcd.client import Etcd; from softdta.etcd.lease import KeptKey\n"
              f"from softdta.core.fleet import Member\n"
              f"member = Member('c2', '10.77.1.2', '', '10.77.1.2:40050', 'http://10.77.1.2:8040')\n"
              f"KeptKey(Etcd('{etcd.endpoint}'), '{PREFIX}members/c2', member.to_json(), {TTL}, what='c2').start()\n"
              f"time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        controller(run, etcd, "A")
        map_where(etcd, lambda m: "c2" in m.members)
        holder.send_signal(signal.SIGSTOP)
        map_where(etcd, lambda m: "c2" not in m.members, within=TTL + 10, what="c2's slots given away")
        holder.send_signal(signal.SIGCONT)
        map_where(etcd, lambda m: "c2" in m.members, what="c2 back after its pause")
    finally:
        holder.kill()
        holder.wait()
    assert "expired while this process ran" in holder.stderr.read()


def test_a_killed_registration_disappears_within_the_ttl(etcd, run, members):
    members.add(etcd, "c1", "10.77.1.1")
    script = (f"import time; from softdta.etcd.client import Etcd; from softdta.etcd.lease import KeptKey\n"
              f"KeptKey(Etcd('{etcd.endpoint}'), '{PREFIX}members/c2', "
              f"'{Member('c2', '10.77.1.2', '', '', '').to_json()}', {TTL}, what='c2').start()\n"
              f"time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stderr=subprocess.DEVNULL)
    try:
        eventually(lambda: etcd.client().get(PREFIX + "members/c2"), what="c2 registered")
        holder.kill()
        killed = time.monotonic()
        eventually(lambda: etcd.client().get(PREFIX + "members/c2") is None, within=TTL + 5, what="c2 gone")
        assert time.monotonic() - killed <= TTL + 1.5  # etcd checks expiries every 500 ms
    finally:
        holder.kill()
        holder.wait()


def test_two_controllers_commit_each_epoch_once_and_the_survivor_of_a_kill_9_takes_over(etcd, run, members):
    members.add(etcd, "c1", "10.77.1.1")
    a = controller(run, etcd, "A")
    a.wait_for("leading fleet lab")
    b = controller(run, etcd, "B")
    b.wait_for("A leads fleet lab; standing by")
    _, start = etcd.client().get_prefix(PREFIX + "slotmap")
    history = etcd.client().watch(PREFIX + "slotmap", 1)
    for i in range(2, 5):
        members.add(etcd, f"c{i}", f"10.77.1.{i}")
        latest = map_where(etcd, lambda m, i=i: f"c{i}" in m.members)
    assert not b.matching("committed epoch"), "the follower writes nothing"
    # a commit is logged just after it lands in etcd: a kill between the two would lose the line, not the epoch
    a.wait_for(f"committed epoch {latest.epoch} ")

    a.kill()
    killed = time.monotonic()
    b.wait_for("leading fleet lab", within=TTL + 5)
    took_over = time.monotonic() - killed
    assert took_over <= TTL + 1.5, f"took over after {took_over:.1f} s"
    assert etcd.client().get(PREFIX + "leader").value == b"B"
    members.add(etcd, "c5", "10.77.1.5")
    map_where(etcd, lambda m: "c5" in m.members)
    members.remove("c1")
    last = map_where(etcd, lambda m: "c1" not in m.members)

    epochs = []
    eventually(lambda: [epochs.extend(SlotMap.from_json(event.value).epoch for event in history.poll(0.2))]
               and epochs and epochs[-1] == last.epoch, what="the slot map's history")
    history.close()
    assert epochs == list(range(1, last.epoch + 1)), "every epoch written once, in order"
    committed = [int(line.split("committed epoch ")[1].split()[0]) for line in a.lines + b.lines
                 if "committed epoch" in line]
    assert sorted(committed) == epochs


def test_etcd_killed_and_restarted_the_controller_runs_through_and_resumes(etcd, run, members):
    members.add(etcd, "c1", "10.77.1.1")
    port = free_port()
    leader = controller(run, etcd, "A", "--metrics", f"127.0.0.1:{port}")
    # its epoch once etcd has said so: a commit that lands as etcd dies is not the controller's to know of
    leader.wait_for("committed epoch 1 ")
    etcd.kill()
    leader.wait_for("runs on its last epoch (1)")
    assert leader.process.poll() is None
    assert counters(port)["etcd_failures"] >= 1
    etcd.start()
    leader.wait_for("answers again")
    eventually(lambda: members.keys["c1"].registered, what="c1's registration back")
    members.add(etcd, "c2", "10.77.1.2")
    after = map_where(etcd, lambda m: "c2" in m.members)
    assert after.epoch == 2 and set(after.members) == {"c1", "c2"}
    assert len(leader.matching("runs on its last epoch")) == 1, "one line per outage"
    assert len(leader.matching("leading fleet lab")) == 1, "it kept its lead across the outage"


def test_a_controller_given_no_etcd_waits_for_one(tmp_path, run, members):
    port = free_port()
    waiting = run("fleet", "controller", "--etcd", f"http://127.0.0.1:{port}", "--fleet", FLEET, "--id", "A",
                  "--lease-ttl", TTL, "--slot-bits", 8)
    waiting.wait_for("is unreachable")
    with EtcdServer(tmp_path / "etcd", client_port=port) as etcd:
        members.add(etcd, "c1", "10.77.1.1")
        waiting.wait_for("leading fleet lab", within=20)
        map_where(etcd, lambda m: m.epoch == 1)
        assert len(waiting.matching("is unreachable")) == 1  # while etcd runs: its end is another outage


class NotEtcdHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.dumps({"status": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def not_etcd():
    service = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotEtcdHandler)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{service.server_address[1]}"
    service.shutdown()


@pytest.mark.parametrize("command", [["fleet", "controller"], ["fleet", "status"]])
def test_something_else_than_etcd_ends_the_command_with_one_line(not_etcd, command, tmp_path):
    result = subprocess.run(SOFTDTA + command + ["--etcd", not_etcd, "--fleet", FLEET], cwd=ROOT, text=True,
                            capture_output=True, timeout=60, env={"PATH": PLAIN_PATH, "HOME": str(tmp_path)})
    assert "is that etcd's client port?" in one_line_error(result)


def test_fleet_status_without_etcd_says_so_in_one_line(tmp_path):
    result = subprocess.run(SOFTDTA + ["fleet", "status", "--etcd", f"http://127.0.0.1:{free_port()}", "--fleet",
                                       FLEET], cwd=ROOT, text=True, capture_output=True, timeout=60,
                            env={"PATH": PLAIN_PATH, "HOME": str(tmp_path)})
    assert "is unreachable" in one_line_error(result)


def test_fleet_status_shows_members_leader_epoch_slots_and_applied_epochs(etcd, run, members, tmp_path):
    members.add(etcd, "c1", "10.77.1.1", weight=1.0)
    members.add(etcd, "c2", "10.77.1.2", weight=3.0)
    controller(run, etcd, "A").wait_for("committed epoch 1")
    client = etcd.client()
    client.put(PREFIX + "applied/t1", json.dumps({"epoch": 1, "generation": 4, "at_ns": 5}))
    client.put(PREFIX + "applied/r1", json.dumps({"epoch": 0, "generation": 1, "at_ns": 5}))
    environment = {"PATH": PLAIN_PATH, "HOME": str(tmp_path)}
    shown = subprocess.run(SOFTDTA + ["fleet", "status", "--etcd", etcd.endpoint, "--fleet", FLEET, "--json"],
                           cwd=ROOT, text=True, capture_output=True, timeout=60, env=environment, check=True)
    status = json.loads(shown.stdout)
    assert status["leader"] == "A" and status["epoch"] == 1
    assert {name: member["weight"] for name, member in status["members"].items()} == {"c1": 1.0, "c2": 3.0}
    led = {name: member["slots_led"] for name, member in status["members"].items()}
    assert sum(led.values()) == 256 and led["c2"] == 3 * led["c1"]
    assert status["applied"]["t1"]["current"] and not status["applied"]["r1"]["current"]
    text = subprocess.run(SOFTDTA + ["fleet", "status", "--etcd", etcd.endpoint, "--fleet", FLEET], cwd=ROOT,
                          text=True, capture_output=True, timeout=60, env=environment, check=True).stdout
    assert "weight 3" in text and f"slots {led['c2']}/256" in text and "epoch 0 (behind 1)" in text


# --------------------------------------------------------------------------------------------------
# a collector back with other regions


def test_a_collector_back_with_another_layout_keeps_its_slots_under_a_new_epoch(etcd, run, members):
    members.add(etcd, "c1", "10.77.1.1")
    members.add(etcd, "c2", "10.77.1.2", layout="regions-1")
    port = free_port()
    leader = controller(run, etcd, "A", "--metrics", f"127.0.0.1:{port}")
    before = map_where(etcd, lambda m: m.epoch == 1 and len(m.members) == 2)
    changed = Member("c2", "10.77.1.2", "02:5d:7a:00:01:01", "10.77.1.2:40050", "http://10.77.1.2:8040", 1.0,
                     "regions-2")
    etcd.client().put(PREFIX + "members/c2", changed.to_json(), lease=members.keys["c2"].lease)
    after = map_where(etcd, lambda m: m.epoch == 2)
    assert after.slots == before.slots, "its slots stay"
    assert json.loads(etcd.client().get(PREFIX + "slotmap").value)["layouts"]["c2"] == "regions-2"
    leader.wait_for("c2 re-registered with another region layout")
    assert counters(port)["layout_changes"] == 1
    members.add(etcd, "c3", "10.77.1.3")
    assert map_where(etcd, lambda m: m.epoch == 3).members.keys() == {"c1", "c2", "c3"}
    assert counters(port)["layout_changes"] == 1, "a layout change bumps one epoch, once"


# --------------------------------------------------------------------------------------------------
# `softdta collector up --etcd --fleet`


def test_collector_fleet_options_go_together(tmp_path):
    (tmp_path / "collector.toml").write_text((ROOT / "examples" / "collector.toml").read_text())
    for options, problem in ((["--etcd", "http://127.0.0.1:2379"], "--etcd and --fleet go together"),
                             (["--etcd", "https://127.0.0.1:2379", "--fleet", FLEET], "is not http://HOST:PORT"),
                             (["--etcd", "http://127.0.0.1:2379", "--fleet", FLEET, "--lease-ttl", "1"],
                              "below etcd's shortest lease"),
                             (["--etcd", "http://127.0.0.1:2379", "--fleet", FLEET, "--weight", "0"],
                              "must be a positive number")):
        result = subprocess.run(SOFTDTA + ["collector", "up", "--config", str(tmp_path / "collector.toml"), *options],
                                cwd=ROOT, text=True, capture_output=True, timeout=60,
                                env={"PATH": PLAIN_PATH, "HOME": str(tmp_path)})
        assert problem in one_line_error(result)


def _collector_metrics(config) -> tuple[dict, str]:
    base = f"http://127.0.0.1:{config.query_port}"
    stats = json.loads(urllib.request.urlopen(base + "/stats", timeout=5).read())
    return stats.get("fleet", {}), urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()


@pytest.mark.privileged
def test_a_collector_registers_leaves_on_stop_re_registers_after_a_pause_and_vanishes_after_kill_9(tmp_path):
    from softdta.collector.config import CollectorConfig
    from softdta.collector.registration import layout_fingerprint
    from softdta.collector.xdp_backend import pin_dir_for
    from softdta.kernel.netns import cleanup_prefix, in_netns
    from tests.live.test_collector import rc_collector_link

    prefix = f"sdta-f{os.getpid()}-"
    collector_ns, _, text = rc_collector_link(prefix, f"fleet-{os.getpid()}")
    (tmp_path / "regions").mkdir()
    (tmp_path / "collector.toml").write_text(text)
    config = CollectorConfig.from_toml(tmp_path / "collector.toml")
    key = PREFIX + "members/" + config.name
    collector = None
    try:
        with in_netns(collector_ns.name), EtcdServer(tmp_path / "etcd") as etcd:
            client = etcd.client()

            def start() -> subprocess.Popen:
                process = subprocess.Popen(
                    SOFTDTA + ["collector", "up", "--config", str(tmp_path / "collector.toml"), "--etcd",
                               etcd.endpoint, "--fleet", FLEET, "--lease-ttl", str(TTL), "--weight", "2"],
                    cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                eventually(lambda: client.get(key), within=30, what="the collector's registration")
                return process

            collector = start()
            member = Member.from_json(client.get(key).value)
            assert (member.name, member.ip, member.weight) == (config.name, "10.77.1.1", 2.0)
            assert member.control == f"10.77.1.1:{config.control_port}"
            assert member.query == f"http://127.0.0.1:{config.query_port}"
            assert member.layout == layout_fingerprint(config)
            fleet, metrics = _collector_metrics(config)
            assert fleet["registered"] and fleet["registrations"] == 1
            assert "softdta_fleet_registered 1.0" in metrics

            etcd.kill()  # etcd away: the collector serves on, says so, and registers again when it is back
            eventually(lambda: _collector_metrics(config)[0]["etcd_failures"] > 0, what="the outage counted")
            assert not _collector_metrics(config)[0]["registered"]
            assert collector.poll() is None
            etcd.start()
            eventually(lambda: _collector_metrics(config)[0]["registered"], what="registered again")

            collector.send_signal(signal.SIGSTOP)  # paused longer than its lease: it leaves, then comes back
            eventually(lambda: client.get(key) is None, within=TTL + 5, what="the paused collector's key gone")
            collector.send_signal(signal.SIGCONT)
            eventually(lambda: client.get(key), what="the collector back after its pause")
            eventually(lambda: _collector_metrics(config)[0]["lease_expiries"] == 1, what="the expiry counted")

            collector.send_signal(signal.SIGTERM)
            assert collector.wait(30) == 0
            assert client.get(key) is None, "a collector that stops leaves at once"
            stderr = collector.stderr.read()
            assert stderr.count("is unreachable") == 1, stderr
            assert "expired while this process ran" in stderr

            collector = start()
            collector.kill()
            killed = time.monotonic()
            eventually(lambda: client.get(key) is None, within=TTL + 5, what="the killed collector's key gone")
            assert time.monotonic() - killed <= TTL + 1.5
    finally:
        if collector is not None and collector.poll() is None:
            collector.kill()
            collector.wait()
        cleanup_prefix(prefix)
        shutil.rmtree(pin_dir_for(config.name, config.ip), ignore_errors=True)
