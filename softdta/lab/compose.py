"""The two roles of docker-compose.yml's lab that are not the product's own commands (docs/lab.md, "The lab in
containers"): reporters that send a fleet workload once the fleet is ready, and the check, a one-shot verdict that
reads every key and list back through the fleet's query router and the Append entries back from NATS JetStream.

Both build the same workload from the seed (`fleet_demo.build_workload`: Key-Write with two copies across
collectors and Append, disjoint per reporter, no two keys in one slot), so the check knows what every key and list
must read back. A reporter stays up after sending, as a switch would, so that `docker-compose up --exit-code-from
check` (which stops every service when one ends) ends with the check; it leaves what it sent in etcd, where the
check waits for it.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from softdta.core.fleet import APPLIED, SLOT_MAP, SlotMap, fleet_prefix
from softdta.core.workload import ReporterAddress
from softdta.errors import SoftdtaError
from softdta.etcd.client import Etcd
from softdta.kernel.tx_ring import RingReporter
from softdta.lab.fleet_demo import KEY_WRITE_COPIES, Workload, build_workload
from softdta.lab.fleet_lab import wait_until
from softdta.wire.frames import ip_bytes, mac_bytes

SENT = "compose/sent/"  # under the fleet's prefix: what each reporter sent
CHUNK = 32  # reports per paced send


@dataclass(frozen=True)
class Run:
    """What reporters and check agree on: the fleet, and the workload's size and seed."""

    etcd: str
    fleet: str
    reporters: int
    keys: int  # Key-Write keys per reporter
    entries: int  # Append entries per list
    seed: int

    def workload(self) -> Workload:
        return build_workload(self.keys, self.entries, self.seed, reporters=self.reporters, phases=1)

    def client(self) -> Etcd:
        return Etcd(self.etcd)

    @property
    def prefix(self) -> str:
        return fleet_prefix(self.fleet)


def ready_map(run: Run, collectors: int, translators: list[str]) -> SlotMap | None:
    """The slot map once it spans `collectors` collectors and every translator named applied it in full, with a
    queue pair to each of its replicas (a report to a replica not connected yet would be dropped as unmapped)."""
    etcd = run.client()
    kv = etcd.get(run.prefix + SLOT_MAP)
    if kv is None:
        return None
    slot_map = SlotMap.from_json(kv.value)
    if len(slot_map.assigned()) != collectors:
        return None
    applied, _ = etcd.get_prefix(run.prefix + APPLIED)
    records = {kv.key.rsplit("/", 1)[1]: json.loads(kv.value) for kv in applied}
    done = [name for name, record in records.items()
            if record["epoch"] >= slot_map.epoch and record.get("replicas_unconnected") == 0]
    return slot_map if set(translators) <= set(done) else None


def report(run: Run, index: int, address: ReporterAddress, interface: str, rate: float, collectors: int,
           translators: list[str], timeout: float) -> int:
    """Reporter `index` (from 1): wait for the fleet, send its share at `rate` reports/s, say so in etcd, then
    stay up until SIGTERM."""
    slot_map = wait_until(lambda: ready_map(run, collectors, translators),
                        f"a slot map over {collectors} collectors applied by {', '.join(translators)}", timeout)
    frames = [address.frame(report) for report in run.workload().per_phase[0][index - 1]]
    sender = RingReporter(interface, None, 256)
    started = time.perf_counter()
    try:
        for start in range(0, len(frames), CHUNK):
            sender.send(frames[start:start + CHUNK])
            ahead = (start + CHUNK) / rate - (time.perf_counter() - started)
            if ahead > 0:
                time.sleep(ahead)
    finally:
        sender.close()
    run.client().put(run.prefix + SENT + f"r{index}", json.dumps({"reports": len(frames), "epoch": slot_map.epoch}))
    print(f"reporter r{index} sent {len(frames):,} reports under epoch {slot_map.epoch}; up until stopped",
          flush=True)
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # as PID 1 in a container, a default action is no action
    signal.sigwait(stop)
    return 0


def _request(url: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def answers(router: str, fleet: str, load: Workload, lists: bool) -> dict[str, Any]:
    """Every key (and, with `lists`, every list) through the router, as a user of the fleet asks."""
    keys = sorted(load.last_value)
    read = _request(f"{router}/key-write/key-write@{fleet}",
                    {"keys": [key.hex() for key in keys], "redundancy": KEY_WRITE_COPIES})
    return {"keys": read, "lists": {list_id: _request(f"{router}/append/append@{fleet}?list={list_id}")
                                    for list_id in sorted(load.entries)} if lists else {}}


def problems_in(load: Workload, answered: dict[str, Any], exported: dict[str, Any] | None) -> list[str]:
    """Every way the answers differ from the prediction: a key not read back with its last value, a partial
    answer, a list whose entries differ, in the router's answer or, where the collectors export them (and so take
    them from their rings), in the stream."""
    problems = []
    read = answered["keys"]
    wrong = {result["key"]: result["value"] for result in read["results"]
             if result["value"] != load.last_value[bytes.fromhex(result["key"])].to_bytes(4, "big").hex()}
    if wrong or len(read["results"]) != len(load.last_value):
        problems.append(f"{len(wrong):,} of {len(load.last_value):,} keys read back wrong or not at all, e.g. "
                        f"{dict(list(wrong.items())[:3])}")
    partial = [name for name, answer in [("key-write", read), *((f"list {i}", a) for i, a in answered["lists"].items())]
               if answer.get("partial")]
    if partial:
        problems.append(f"partial answers (a collector did not answer): {', '.join(partial[:5])}")
    lists = {list_id: [value for _, value in entries] for list_id, entries in load.entries.items()}
    differing = [list_id for list_id, want in lists.items() if answered["lists"] and (
        answered["lists"][list_id]["entries"] != want or answered["lists"][list_id]["dropped"])]
    if differing:
        first = answered["lists"][differing[0]]
        problems.append(f"{len(differing)} Append lists differ from the prediction, e.g. list {differing[0]}: "
                        f"{len(first['entries'])} entries read, {first['dropped']} dropped, "
                        f"{len(lists[differing[0]])} sent")
    if exported is not None:
        streamed = {int(list_id): answer for list_id, answer in exported["lists"].items()}
        off = [list_id for list_id, want in lists.items()
               if streamed.get(list_id, {}).get("entries") != want or streamed.get(list_id, {}).get("dropped")]
        if off:
            problems.append(f"{len(off)} Append lists in NATS JetStream differ from the prediction, e.g. list "
                            f"{off[0]}: {len(streamed.get(off[0], {}).get('entries', []))} entries of "
                            f"{len(lists[off[0]])}")
    return problems


def check(run: Run, router: str, nats_url: str | None, timeout: float) -> tuple[dict[str, Any], list[str]]:
    """Wait until every reporter sent, then until the answers are the predicted ones or `timeout` s passed; the
    summary and what fell short."""
    load = run.workload()

    def all_sent() -> dict[str, Any] | None:
        kvs, _ = run.client().get_prefix(run.prefix + SENT)
        sent = {kv.key.rsplit("/", 1)[1]: json.loads(kv.value) for kv in kvs}
        return sent if len(sent) == run.reporters else None
    sent = wait_until(all_sent, f"all {run.reporters} reporters' reports sent", timeout)
    wait_until(lambda: _request(f"{router}/health"), f"the query router at {router}", timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            answered = answers(router, run.fleet, load, lists=not nats_url)
            exported = _exported(nats_url, deadline - time.monotonic()) if nats_url else None
            problems = problems_in(load, answered, exported)
        except (OSError, urllib.error.URLError, ValueError, SoftdtaError) as error:
            exported, problems = None, [f"{type(error).__name__}: {error}"]
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    summary = {
        "reports_sent": sum(reporter["reports"] for reporter in sent.values()),
        "reporters": sent,
        "key_write": {"keys": len(load.last_value), "copies": KEY_WRITE_COPIES},
        "append": {"lists": len(load.entries), "entries": sum(map(len, load.entries.values()))},
        "exported_lists": len(exported["lists"]) if exported else None,
        "problems": problems}
    return summary, problems


def _exported(nats_url: str, within: float) -> dict[str, Any]:
    """Every collector's exported Append lists, read from the stream's start to its last message."""
    from softdta.lab.export_consumer import ExportConsumer
    answer: dict[str, Any] = ExportConsumer(nats_url, None).start().finish(within=max(within, 1.0))
    return answer


def reporter_address(reporter_ip: str, reporter_mac: str, translator_mac: str, fleet_address: str) -> ReporterAddress:
    return ReporterAddress(mac_bytes(reporter_mac), ip_bytes(reporter_ip), mac_bytes(translator_mac),
                           ip_bytes(fleet_address))
