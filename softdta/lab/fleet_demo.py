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
them, naming their slot. The fleet is softdta.lab.fleet_lab's; its logs stay in /run/softdta-fleet.
"""

from __future__ import annotations

import json
import random
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from softdta.core.fleet import SlotMap, moved_fraction
from softdta.kernel.bpf import Map
from softdta.kernel.netns import in_netns
from softdta.kernel.tx_ring import RingReporter
from softdta.lab.fleet_lab import FleetLab
from softdta.spec import KeyHash, ResponderCounter
from softdta.wire import dta
from softdta.wire.hashing import key_slot

PREFIX = "sdta-fleet-"  # of the namespaces
STATE_DIR = Path("/run/softdta-fleet")
FLEET = "demo"
LEASE_TTL_S = 3  # a killed collector leaves the fleet within this
REPLICAS = 2  # and Key-Write's two copies go to both
KEY_WRITE_COPIES = 2
KEY_WRITE_SLOTS = 65536
APPEND_LISTS = 64  # 16 per reporter: a list is always sent through one translator
APPEND_ENTRIES = 4096
APPEND_BATCH = 4
REPORTERS = 4
PHASES = ("3 collectors", "c4 joined", "c2 killed")
KILLED, JOINED = 2, 4  # collectors c2 and c4
STRUCTURES = f"""
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


def demo_lab(token: str) -> FleetLab:
    """Four collectors (named c1..c4), two translators with copies across collectors, four reporters."""
    return FleetLab(STATE_DIR, collectors=4, translators=2, reporters=REPORTERS, across=True, fleet=FLEET,
                    token=token, prefix=PREFIX, network=78, names="", structures=STRUCTURES,
                    translator_settings='profile = "dta-v1"\nack_request_interval = 8\n',
                    translator_args=("--flush-idle-ms", "1"))


# --------------------------------------------------------------------------------------------------
# the workload and what it must leave behind


@dataclass
class Workload:
    """Each reporter's reports per phase, and the truth they make: a key's last value, a list's entries."""

    per_phase: list[list[list[dta.Report]]]  # phase -> reporter -> reports
    key_writes: int = 0
    last_value: dict[bytes, int] = field(default_factory=dict)
    entries: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # list -> [(phase, entry value)]


def build_workload(keys_per_phase: int, entries_per_list: int, seed: int, reporters: int = REPORTERS,
                   phases: int = len(PHASES)) -> Workload:
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
    owned: list[list[bytes]] = [[] for _ in range(reporters)]
    for phase in range(phases):
        reports: list[list[dta.Report]] = []
        for index in range(reporters):
            batch: list[tuple[dta.Report, int | None]] = []  # with the list id of an Append report
            rewrites = rng.sample(owned[index], min(len(owned[index]), keys_per_phase // 4))
            fresh = [new_key() for _ in range(keys_per_phase - len(rewrites))]
            for key in rewrites + fresh:
                value = phase << 24 | rng.randrange(1 << 24)
                batch.append((dta.key_write(key, value, KEY_WRITE_COPIES), None))
                load.last_value[key] = value
                load.key_writes += 1
            owned[index] += fresh
            lists = range(index * APPEND_LISTS // reporters, (index + 1) * APPEND_LISTS // reporters)
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
# traffic and counters


def counter_total(pin: Path, name: str, counter: int) -> int:
    with Map.from_pinned(pin / name) as counters:
        return counters.counter_total(counter)


def executed_by(lab: FleetLab, collectors: list[int]) -> dict[str, int]:
    """Requests each collector's responder executed (a killed collector's pinned counters stay readable)."""
    return {lab.collector(index).name: counter_total(lab.collector_pins(index), "responder_counters",
                                                     int(ResponderCounter.EXECUTED)) for index in collectors}


def frames_to(lab: FleetLab, collectors: list[int]) -> dict[str, int]:
    """The frames both translators sent to each of `collectors`, from their queue pairs' counts."""
    by_ip = {lab.collector(index).ip: lab.collector(index).name for index in collectors}
    sent = dict.fromkeys(by_ip.values(), 0)
    for translator in range(1, lab.translators + 1):
        for qp in lab.translator_stats(translator)["qps"]:
            if qp["collector"] in by_ip:
                sent[by_ip[qp["collector"]]] += qp["frames_sent"]
    return sent


def translator_counters(lab: FleetLab) -> dict[str, int]:
    totals: dict[str, int] = {}
    for translator in range(1, lab.translators + 1):
        for name, value in lab.translator_stats(translator)["counters"].items():
            totals[name] = totals.get(name, 0) + value
    return totals


def send_phase(lab: FleetLab, load: Workload, phase: int, rate: float) -> int:
    """Every reporter's reports of `phase`, paced at `rate` reports/s over all reporters; the reports sent."""
    frames = [[lab.reporter_address(index + 1).frame(report) for report in load.per_phase[phase][index]]
              for index in range(REPORTERS)]
    nodes = [lab.reporter(index + 1) for index in range(REPORTERS)]
    senders = [RingReporter(node.interface, node.netns, 256) for node in nodes]
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


def wait_quiet(lab: FleetLab, sent_total: int, alive: list[int]) -> dict[str, dict[str, int]]:
    """Until the translators took every report sent and each live collector executed every frame they sent it;
    then what each was sent and executed."""
    def quiet() -> dict[str, dict[str, int]] | None:
        if translator_counters(lab).get("rx_reports", 0) < sent_total:
            return None
        sent, done = frames_to(lab, alive), executed_by(lab, alive)
        return {"sent": sent, "executed": done} if all(done[name] >= sent[name] for name in sent) else None
    return lab.wait_until(quiet, "every report taken and every frame executed")


# --------------------------------------------------------------------------------------------------
# the run


def query_fleet(lab: FleetLab, load: Workload) -> dict[str, Any]:
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

    assert lab.etcd_server is not None
    with in_netns(lab.etcd_node.netns):
        watch = FleetWatch(lab.etcd_server.client(), FLEET).start()
        try:
            return asyncio.run(ask(watch))
        finally:
            watch.close()


def predicted_lists(load: Workload, maps: list[SlotMap], known: list[SlotMap],
                    killed: str) -> dict[int, dict[str, Any]]:
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
            "entries": [value for holder in holders if holder != killed for value in rings[holder]],
            "collectors": holders, "partial": killed in holders,
            "missing_slots": [maps[-1].slot_of(key)] if killed in holders else []}
    return predicted


def verdict(load: Workload, maps: list[SlotMap], answers: dict[str, Any], counters: dict[str, int], sent: int,
            accounts: list[dict[str, dict[str, int]]], killed: str) -> tuple[dict[str, Any], list[str]]:
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
    predicted = predicted_lists(load, maps, answers["epochs"], killed)
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
    with demo_lab(secrets.token_hex(16)) as lab:
        killed = lab.collector(KILLED).name
        with console.status("etcd, a controller and three collectors in namespaces"):
            lab.start_etcd()
            lab.start_controller(REPLICAS)
            alive = [1, 2, 3]
            lab.start_collectors(*alive, lease_ttl=LEASE_TTL_S)
            first = lab.wait_for_map(names(lab, alive))
        with console.status("two translators following the slot map"):
            lab.start_translators(1, 2)
            lab.wait_applied(first.epoch)
        maps = [first]
        epochs.append({"epoch": first.epoch, "collectors": sorted(first.assigned()),
                       "max_over_mean": round(first.max_over_mean(), 4)})
        sent, accounts = 0, []
        for phase, title in enumerate(PHASES):
            if phase == 1:
                with console.status(f"{lab.collector(JOINED).name} joins"):
                    lab.start_collectors(JOINED, lease_ttl=LEASE_TTL_S)
                    alive.append(JOINED)
                    maps.append(transition(lab, maps[-1], names(lab, alive), epochs))
            if phase == 2:
                with console.status(f"kill -9 {killed}"):
                    lab.kill(killed)
                    alive.remove(KILLED)
                    maps.append(transition(lab, maps[-1], names(lab, alive), epochs))
            with console.status(f"phase {phase + 1} ({title}): {sum(map(len, load.per_phase[phase])):,} reports"):
                sent += send_phase(lab, load, phase, rate)
                accounts.append(wait_quiet(lab, sent, alive))
        with console.status("querying every key and list through the federated router"):
            answers = query_fleet(lab, load)
        counters = translator_counters(lab)
    summary, problems = verdict(load, maps, answers, counters, sent, accounts, killed)
    summary["epochs"] = epochs
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        show(console, summary, killed)
    return 1 if problems else 0


def names(lab: FleetLab, collectors: list[int]) -> set[str]:
    return {lab.collector(index).name for index in collectors}


def transition(lab: FleetLab, before: SlotMap, members: set[str], epochs: list[dict[str, Any]]) -> SlotMap:
    """Wait for the controller's map over `members` and for both translators to apply it; note what moved."""
    started = time.monotonic()
    after = lab.wait_for_map(members, before.epoch)
    seen = time.monotonic()
    lab.wait_applied(after.epoch)
    applied = time.monotonic()
    epochs.append({"epoch": after.epoch, "collectors": sorted(after.assigned()),
                   "max_over_mean": round(after.max_over_mean(), 4),
                   "moved": round(moved_fraction(before, after), 4),
                   "ideal_moved": round(1 / max(len(members), len(before.assigned())), 4),
                   "map_after_s": round(seen - started, 3), "applied_after_s": round(applied - seen, 3)})
    return after


def show(console: Any, summary: dict[str, Any], killed: str) -> None:
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
                  f" of {lists['entries']:,} entries read, partial where {killed} held them "
                  f"({len(lists['partial_lists'])} lists, their slots named)")
    if summary["problems"]:
        console.print("[bold red]problems:[/] " + "; ".join(summary["problems"]))
    else:
        console.print("[bold green]every report accounted for; every answer is the predicted one")
