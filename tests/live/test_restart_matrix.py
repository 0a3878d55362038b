"""The restart matrix: every restart of the collector or the translator, and a storm of table reloads, keeps every
acknowledged write.

Each case runs the real processes as users run them (`softdta collector up`, `softdta translator up --collector`)
in reporter, translator and collector namespaces joined by veth pairs, with the translator's defaults (no
`ack_request_interval`). Key-Write reports go in from a raw socket; once the collector's responder has executed
them they are acknowledged, and must be found after the restart. Writes made after the restart must land too,
unless a counter names exactly those lost. `scripts/restart_matrix_soak.sh` runs the matrix repeatedly under CPU
hogs.
"""

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from softdta.collector.control import VERSION, receive, send
from softdta.collector.xdp_backend import pin_dir_for
from softdta.core.workload import ReporterAddress
from softdta.engines.python import engine_stats
from softdta.errors import SoftdtaError
from softdta.kernel.bpf import BpfObject, attach_xdp, ensure_bpffs
from softdta.kernel.netns import Namespace, address, cleanup_prefix, in_netns, veth_pair
from softdta.kernel.programs import VETH_PEER_SOURCE, build_object
from softdta.links.control import secrets_file_for
from softdta.spec import ROCE_PORT, KeyHash, RoceOpcode
from softdta.wire import dta
from softdta.wire.frames import UdpEndpoints, ip_bytes, mac_bytes
from softdta.wire.hashing import key_hashes_rows, keys_to_rows
from softdta.wire.roce import build_roce_frame, transport_payload
from tests.common import ROOT

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-m{os.getpid()}-"
COLLECTOR = f"matrix{os.getpid()}"
COLLECTOR_IP, TRANSLATOR_IP, REPORTER_IP = "10.77.1.1", "10.77.0.1", "10.77.9.1"
TRANSLATOR_MAC, COLLECTOR_MAC, REPORTER_MAC = "02:5d:7a:00:00:01", "02:5d:7a:00:01:01", "02:5d:7a:00:09:01"
TOKEN = "matrix-token"
STRUCTURE = f"key-write@{COLLECTOR_IP}"
SLOTS = 4096
SOFTDTA = [sys.executable, "-m", "softdta.cli"]
# translator counters that name writes which never reached the collector's memory
LOST_WRITE_COUNTERS = ("nak_lost_writes", "drop_grace", "drop_qp_failed")
RESTARTS = ("collector-sigterm", "collector-kill9", "second-collector", "translator-sigterm", "translator-kill9",
            "translator-down-forget", "translator-lost-pin", "second-translator", "translator-sighup")
START_S, WRITES_S, SETTLE_S = 30.0, 10.0, 3.0


def distinct_slot_keys(count: int) -> list[int]:
    """Keys that each have a Key-Write slot of their own (redundancy 1): no write can be lost to a collision."""
    candidates = np.arange(1, 16 * count + 1)
    _, hashes = key_hashes_rows(keys_to_rows(candidates), 1, KeyHash.INDEPENDENT)
    _, first = np.unique(hashes[0] & (SLOTS - 1), return_index=True)
    return sorted(candidates[np.sort(first)[:count]].tolist())


KEYS = distinct_slot_keys(400)
BATCH_1, BATCH_1B, BATCH_2_NEW = KEYS[:200], KEYS[200:300], KEYS[300:]
OVERWRITTEN = BATCH_1[:50] + BATCH_1B[:25]  # batch 2 gives these new values


@dataclass
class Case:
    """One cell of the matrix: its processes, what it wrote, what it saw, for the summary on failure."""

    restart: str
    recreated: bool
    transport: str
    engine: str
    tmp: Path
    reporter: Namespace
    translator_ns: Namespace
    collector_ns: Namespace
    pin: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)  # by the name of its log files
    collector: subprocess.Popen | None = None
    translator: subprocess.Popen | None = None
    timeline: list[str] = field(default_factory=list)
    latest: dict[int, int] = field(default_factory=dict)  # key -> the value of its last write
    acknowledged: dict[int, int] = field(default_factory=dict)  # key -> value, executed before the restart
    notes: list[str] = field(default_factory=list)
    state: list[str] = field(default_factory=list)  # what the processes said at the end (snapshot)
    started: float = field(default_factory=time.monotonic)

    def log(self, text: str) -> None:
        self.timeline.append(f"{time.monotonic() - self.started:6.2f} s  {text}")

    # the processes, as users start them

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        out, err = (open(self.tmp / f"{name}.{stream}", "w") for stream in ("out", "err"))
        process = subprocess.Popen(SOFTDTA + argv, stdout=out, stderr=err, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        out.close()
        err.close()
        self.processes[name] = process
        return process

    def start_collector(self, name: str = "collector") -> subprocess.Popen:
        return self.spawn(name, ["collector", "up", "--config", str(self.tmp / "collector.toml"),
                                 "--netns", self.collector_ns.name, "--query-host", COLLECTOR_IP])

    def collector_up(self, name: str = "collector") -> None:
        self.collector = self.start_collector(name)
        self.wait_for_line(self.collector, f"collector {COLLECTOR} up")
        self.log(f"{name} up (pid {self.collector.pid})")

    @property
    def egress(self) -> str:
        """The translator's interface towards the collector: the XDP engine's second one, the python engine's only
        one (one-armed, behind the switch)."""
        return "t1" if self.engine == "xdp" else "t0"

    @property
    def other_pin(self) -> Path:
        """Where a careless second translator keeps its state: its own, on the first one's interfaces."""
        return self.pin.with_name(self.pin.name + "-other")

    def start_translator(self, name: str, pin: Path | None = None) -> subprocess.Popen:
        interfaces = ["-i", "t0", "-i", "t1"] if self.engine == "xdp" else ["-i", "t0", "--engine", "python"]
        return self.spawn(name, [
            "translator", "up", "--tables", str(self.tmp / "translator.toml"), *interfaces,
            "--pin", str(pin or self.pin), "--netns", self.translator_ns.name, "--collector",
            f"{COLLECTOR_IP}:40050", "--token", TOKEN])

    def translator_up(self, name: str = "translator") -> None:
        self.translator = self.start_translator(name)
        self.wait_for_line(self.translator, "translator up on t0, t1" if self.engine == "xdp" else
                           "translator up on t0")
        self.log(f"{name} up (pid {self.translator.pid})")

    def name_of(self, process: subprocess.Popen) -> str:
        return next(name for name, known in self.processes.items() if known is process)

    def output(self, process: subprocess.Popen, stream: str = "out") -> str:
        return (self.tmp / f"{self.name_of(process)}.{stream}").read_text()

    def wait_for_line(self, process: subprocess.Popen, text: str) -> None:
        self.wait_until(lambda: text in self.output(process) or process.poll() is not None, f"{text!r}", START_S)
        if text not in self.output(process):
            raise AssertionError(f"{self.name_of(process)} exited with {process.returncode} before printing "
                                 f"{text!r}: {self.output(process, 'err').strip()}")

    def stop(self, process: subprocess.Popen, how: str) -> int:
        """SIGTERM or kill -9, and wait for the exit."""
        process.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        code = process.wait(20)
        self.log(f"{self.name_of(process)} {how}: exited with {code}")
        return code

    def softdta(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(SOFTDTA + list(argv), capture_output=True, text=True, timeout=60)

    # what the collector and the translator say

    def http(self, path: str, body: dict | None = None) -> dict:
        with in_netns(self.collector_ns.name):
            request = urllib.request.Request(f"http://{COLLECTOR_IP}:8040{path}",
                                             data=json.dumps(body).encode() if body else None,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())

    def responder(self) -> dict:
        return self.http("/stats")["responder"]

    def executed(self) -> int:
        return self.responder().get("executed", 0)

    def translator_stats(self) -> dict:
        """What `softdta translator stats --pin PIN --json` prints, read in this process: polled, the command's
        start-up time would dominate."""
        return engine_stats(self.pin)

    def counters(self) -> dict:
        return self.translator_stats()["counters"]

    def collector_qps(self) -> dict[int, dict]:
        """This translator's queue pairs at the collector, by collector QPN."""
        return {int(qpn, 16): entry for qpn, entry in self.http("/health")["qps"].items()
                if entry["translator"] == TRANSLATOR_IP}

    def key_write_qps(self) -> tuple[int, dict, dict | None]:
        """The collector's Key-Write queue pair that the translator writes into (QPN, /health entry), and the
        translator's QP that writes it (None if the translator writes into none of them)."""
        into = {qp["remote_qpn"]: qp for qp in self.translator_stats()["qps"]}
        key_write = [(qpn, entry) for qpn, entry in self.collector_qps().items() if entry["structure"] == "key-write"]
        if not key_write:
            raise LookupError("the collector holds no Key-Write queue pair for the translator")
        qpn, entry = next(((qpn, entry) for qpn, entry in key_write if qpn in into), key_write[0])
        return qpn, entry, into.get(qpn)

    def wait_until(self, condition, what: str, timeout: float = WRITES_S):
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = condition()
            except (OSError, urllib.error.URLError, LookupError, json.JSONDecodeError, SoftdtaError):
                value = None  # a process between restarts
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:.0f} s")
            time.sleep(0.05)

    def connected(self) -> bool:
        """Every queue pair the translator writes into is held by its open session at the collector, and its QP
        into the Key-Write queue pair is active. (Queue pairs of a session that ended may linger, released.)"""
        held = self.collector_qps()
        into = {qp["remote_qpn"] for qp in self.translator_stats()["qps"]}
        _, _, ours = self.key_write_qps()
        return all(qpn in held and held[qpn]["session"] == "open" for qpn in into) and ours is not None \
            and ours["state"] == "active"

    def reconnected(self) -> None:
        """Waits for the translator to hold its queue pairs again; on RC, also for it to write at the PSN the
        collector expects (it has applied the advertisements), for a while: a translator that never gets there
        goes on to the writes, whose fate the verdict judges."""
        self.wait_until(self.connected, "the translator back with its queue pairs", START_S)
        if self.transport == "rc":
            def in_step() -> bool:
                _, entry, ours = self.key_write_qps()
                return ours is not None and ours["next_psn"] == entry["expected_psn"]
            try:
                self.wait_until(in_step, "the PSNs in step", SETTLE_S)
            except AssertionError:
                _, entry, ours = self.key_write_qps()
                self.log(f"the translator writes at PSN {ours and ours['next_psn']}, the collector expects "
                         f"{entry['expected_psn']}")

    # writes

    def write(self, batch: str, items: dict[int, int]) -> None:
        """Key-Write reports for `items` (key -> value); returns once the responder executed them all, or its
        translator took them all in and the collector executed nothing more for a second."""
        with in_netns(self.reporter.name):
            sender = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            sender.bind(("r0", 0))
        reporter = ReporterAddress(mac_bytes(REPORTER_MAC), ip_bytes(REPORTER_IP), mac_bytes(TRANSLATOR_MAC),
                                   ip_bytes(COLLECTOR_IP))
        executed_before, taken_before = self.executed(), self.counters().get("rx_key_write", 0)
        with sender:
            for key, value in items.items():
                sender.send(reporter.frame(dta.key_write(key, value, 1)))
                self.latest[key] = value
        quiet = {"executed": -1, "since": time.monotonic()}

        def done() -> bool:
            executed = self.executed() - executed_before
            if executed >= len(items):
                return True
            if executed != quiet["executed"]:
                quiet.update(executed=executed, since=time.monotonic())
                return False
            taken = self.counters().get("rx_key_write", 0) - taken_before
            return taken >= len(items) and time.monotonic() - quiet["since"] >= 1.0
        self.wait_until(done, f"batch {batch}: the translator taking its {len(items)} reports in", WRITES_S)
        executed = self.executed() - executed_before
        self.log(f"batch {batch}: {len(items)} writes, {executed} executed")
        if batch != "2":
            if executed < len(items):
                raise AssertionError(f"batch {batch} (before the restart): {executed} of {len(items)} writes "
                                     "executed")
            self.acknowledged.update(items)

    # the QP re-creation

    def recreate_key_write_qp(self) -> None:
        """Have the collector re-create the translator's Key-Write queue pair, and the translator go on with it."""
        qpn, entry, ours = self.key_write_qps()
        assert ours is not None, "the translator has no QP into the collector's Key-Write queue pair"
        errors_before = self.responder().get("remote_access_errors", 0)
        if self.transport == "rc":
            # an RC WRITE with the right PSN and iCRC but an R_Key no region has (they are never 0): a fatal
            # remote-access error puts the queue pair in ERROR, and the collector's repair loop re-creates it
            ends = UdpEndpoints(src_mac=mac_bytes(TRANSLATOR_MAC), dst_mac=mac_bytes(COLLECTOR_MAC),
                                src_ip=ip_bytes(TRANSLATOR_IP), dst_ip=ip_bytes(COLLECTOR_IP), sport=49152,
                                dport=ROCE_PORT)
            payload = bytes(8)
            frame = build_roce_frame(ends, transport_payload(
                RoceOpcode.RC_WRITE_ONLY, qpn, entry["expected_psn"],
                {"reth": {"va": 0, "rkey": 0, "dma_length": len(payload)}}, payload))
            with in_netns(self.translator_ns.name):
                with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as forger:
                    forger.bind((self.egress, 0))
                    forger.send(frame)
            self.wait_until(lambda: self.responder().get("remote_access_errors", 0) > errors_before,
                            "the collector's queue pair put in ERROR")
            self.log(f"queue pair {qpn:#x} in ERROR (a WRITE with a bad R_Key at PSN {entry['expected_psn']})")
        else:
            # UC drops a bad WRITE without an error state, and the translator takes no NAK on UC: what re-creates
            # a UC queue pair is a `failed` report over the control protocol
            answer = self.report_failed(ours["local_qpn"])
            if answer.get("type") != "advertise":
                raise AssertionError(f"`failed` for QP {ours['local_qpn']:#x}: {answer}")
            self.log(f"queue pair {qpn:#x} re-created on a `failed` report (advertised PSN "
                     f"{answer['qp']['start_psn']})")

        def revived() -> bool:
            _, entry_now, ours_now = self.key_write_qps()
            return entry_now["state"] == "ready" and ours_now is not None and ours_now["state"] == "active" and \
                ours_now["next_psn"] == entry_now["expected_psn"]
        self.wait_until(revived, "the queue pair re-created and the translator writing at its expected PSN")
        self.log("queue pair re-created; the translator's QP active at the collector's expected PSN")
        into = {qp["remote_qpn"] for qp in self.translator_stats()["qps"]}
        ended = [f"{qpn:#x}" for qpn, entry in self.collector_qps().items() if entry["session"] != "open" and
                 qpn in into]
        if ended:  # they would be freed RELEASE_GRACE_S later, under a translator still connected
            self.notes.append(f"after the re-creation the collector counts the translator's session as ended "
                              f"(queue pairs {', '.join(ended)}), though its control connection is open")

    def report_failed(self, local_qpn: int) -> dict:
        """What the translator sends for a failed QP, on another control connection from the translator's
        namespace, as the same translator: with the session secret it keeps for its pins."""
        kept = json.loads(secrets_file_for(self.pin).read_text())
        hello = {"type": "hello", "version": VERSION, "token": TOKEN, "secret": kept[f"{COLLECTOR_IP}:40050"],
                 "translator": {"ip": TRANSLATOR_IP, "mac": TRANSLATOR_MAC}}

        async def exchange() -> dict:
            reader, writer = await asyncio.open_connection(COLLECTOR_IP, 40050)
            try:
                await send(writer, hello)
                welcome = await receive(reader, 5)
                assert welcome["type"] == "welcome", welcome
                await send(writer, {"type": "failed", "structure": "key-write", "qpn": local_qpn})
                return await receive(reader, 5)
            finally:
                writer.close()
        with in_netns(self.translator_ns.name):
            return asyncio.run(exchange())

    # the restarts

    def restart_now(self) -> None:
        if self.restart in ("collector-sigterm", "collector-kill9"):
            code = self.stop(self.collector, self.restart.removeprefix("collector-"))
            if self.restart == "collector-sigterm" and code != 0:
                self.notes.append(f"the collector exited with {code} on SIGTERM")
            self.collector_up("collector-2")
            self.reconnected()
        elif self.restart == "second-collector":
            self.refused_second("collector", self.start_collector("collector-second"), self.collector)
        elif self.restart == "second-translator":
            self.refused_second("translator", self.start_translator("translator-second"), self.translator)
            # nor may `down --forget` take the running one's programs and state from under it
            down = self.softdta("translator", "down", "--pin", str(self.pin), "--forget")
            self.log(f"translator down --forget while it runs: {down.returncode} {down.stderr.strip()}")
            if down.returncode != 2 or len(down.stderr.strip().splitlines()) != 1 or not self.pin.exists():
                self.notes.append(f"translator down --forget while a translator runs: exit {down.returncode}, "
                                  f"{down.stderr.strip()[-300:]!r}, pins {'kept' if self.pin.exists() else 'gone'}")
            # another --pin is other state, not another interface
            self.refused_second("translator", self.start_translator("translator-other-pin", self.other_pin),
                                self.translator)
            down = subprocess.run(["ip", "netns", "exec", self.translator_ns.name, *SOFTDTA, "translator", "down",
                                   "-i", "t0", "--pin", str(self.other_pin)], capture_output=True, text=True,
                                  timeout=60)
            self.log(f"translator down -i t0 --pin (another) while it runs: {down.returncode} "
                     f"{down.stderr.strip()}")
            if down.returncode != 2 or len(down.stderr.strip().splitlines()) != 1:
                self.notes.append(f"translator down -i t0 under another --pin while a translator runs there: exit "
                                  f"{down.returncode}, {down.stderr.strip()[-300:]!r}")
        elif self.restart in ("translator-sigterm", "translator-kill9", "translator-down-forget",
                              "translator-lost-pin"):
            how = "kill9" if self.restart in ("translator-kill9", "translator-lost-pin") else "sigterm"
            code = self.stop(self.translator, how)
            if how == "sigterm" and code != 0:
                self.notes.append(f"the translator exited with {code} on SIGTERM")
            if self.restart == "translator-down-forget":
                # SIGTERM detached it already; `down` has no --netns to name its interfaces with
                down = self.softdta("translator", "down", "--pin", str(self.pin), "--forget")
                self.log(f"translator down --forget: {down.returncode} {down.stdout.strip()}")
                if down.returncode or self.pin.exists() or secrets_file_for(self.pin).exists():
                    raise AssertionError(f"translator down --forget: {down.returncode} {down.stderr.strip()}")
            if self.restart == "translator-lost-pin":
                # its maps gone (an operator's rm -rf, a bpffs remounted), its session secrets kept in /run
                shutil.rmtree(self.pin)
                self.log("translator pins removed")
            self.translator_up("translator-2")
            self.reconnected()
        self.log("restarted")

    @contextmanager
    def meanwhile(self) -> Iterator[None]:
        """What goes on while batch 2 is written: for translator-sighup, a SIGHUP every millisecond, so tables are
        reloaded while reports come in and frames leave; else nothing. (Batch 2 leaves in runs too short for a
        signal to cut the python engine's transmit: tests/live/test_translator_signals.py sends whole steps.)"""
        if self.restart != "translator-sighup":
            yield
            return
        translator, done, sent = self.translator, threading.Event(), [0]

        def storm() -> None:
            while not done.wait(0.001) and translator.poll() is None:
                translator.send_signal(signal.SIGHUP)
                sent[0] += 1
        thread = threading.Thread(target=storm, daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            reloads = self.output(translator).count("tables reloaded")
            self.log(f"{sent[0]} SIGHUPs while batch 2 was written, {reloads} reloads")
            if not sent[0] or not reloads:
                self.notes.append(f"translator-sighup: {sent[0]} SIGHUPs sent, {reloads} reloads")

    def refused_second(self, role: str, second: subprocess.Popen, first: subprocess.Popen) -> None:
        """A second `role` on the first one's state exits with 2 in one line, and the first one runs on."""
        code = self.wait_until(lambda: second.poll() is not None and (second.returncode,),
                               f"the second {role} refusing to start", START_S)[0]
        refusal = self.output(second, "err").strip()
        self.log(f"second {role} exited with {code}: {refusal}")
        if code != 2 or len(refusal.splitlines()) != 1:
            self.notes.append(f"the second {role} exited with {code} (expected 2 and one line): {refusal[-400:]!r}")
        if first.poll() is not None:
            raise AssertionError(f"the first {role} exited ({first.returncode}) when the second one started")

    # the verdict

    def verdict(self, lost_counted: int, counters_before: dict, counters_after: dict) -> list[str]:
        keys = sorted(self.latest)
        found = self.http(f"/key-write/{STRUCTURE}", {"keys": keys, "redundancy": 1})["results"]
        value_of = {key: int(row["value"], 16) if row["value"] is not None else None
                    for key, row in zip(keys, found)}
        problems = []
        lost_acknowledged = {key: (value, value_of[key]) for key, value in self.acknowledged.items()
                             if key not in OVERWRITTEN and value_of[key] != value}
        if lost_acknowledged:
            problems.append(f"{len(lost_acknowledged)} acknowledged writes lost (no counter excuses those): "
                            + describe(lost_acknowledged))
        batch_2 = {key: value for key, value in self.latest.items() if value >> 24 == 2}
        missing = {key: (value, value_of[key]) for key, value in batch_2.items() if value_of[key] != value}
        # a missing batch-2 write leaves the key as it was: its acknowledged value, or nothing
        wrong = {key: got for key, (_, got) in missing.items() if got != self.acknowledged.get(key)}
        if wrong:
            problems.append(f"{len(wrong)} keys hold a value never written last nor before: "
                            + describe({key: missing[key] for key in wrong}))
        if len(missing) != lost_counted:
            problems.append(f"batch 2: {len(missing)} of {len(batch_2)} writes missing, and the translator's "
                            f"counters name {lost_counted} lost ({counter_delta(counters_before, counters_after)})"
                            + (": " + describe(missing) if missing else ""))
        self.log(f"queried {len(keys)} keys: {len(lost_acknowledged)} acknowledged lost, {len(missing)} of batch 2 "
                 f"missing, {lost_counted} counted lost")
        return problems

    def snapshot(self) -> None:
        """What the translator and the collector say now, for the summary (before they are stopped)."""
        self.state = []
        for what, read in (("translator stats", self.translator_stats), ("collector /health", lambda: self.http(
                "/health")["qps"]), ("collector responder", self.responder)):
            try:
                self.state.append(f"{what}: {json.dumps(read(), sort_keys=True)}")
            except (OSError, urllib.error.URLError, SoftdtaError) as error:
                self.state.append(f"{what}: unavailable ({error})")

    def stop_cleanly(self) -> list[str]:
        """SIGTERM to what still runs: each must exit with 0, and no process may have printed a traceback."""
        problems = []
        for name, process in reversed(self.processes.items()):  # the translator before its collector
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                if process.wait(20):
                    problems.append(f"{name} exited with {process.returncode} on SIGTERM")
            if "Traceback" in self.output(process, "err"):
                problems.append(f"{name} printed a traceback: {self.output(process, 'err').strip().splitlines()[-1]}")
        self.log("stopped")
        return problems

    def summary(self) -> str:
        lines = [f"case {self.engine} engine / {self.restart} / "
                 f"{'after a QP re-creation' if self.recreated else 'no re-creation'} / {self.transport.upper()}",
                 "timeline:", *("  " + line for line in self.timeline), *self.state]
        for name, process in self.processes.items():
            for stream in ("out", "err"):
                text = self.output(process, stream).strip().splitlines()
                if text:
                    lines.append(f"{name}.{stream} (last lines):")
                    lines += ["  " + line[:300] for line in text[-8:]]
        return "\n".join(lines)

    def close(self) -> None:
        for process in reversed(self.processes.values()):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(10)


def describe(values: dict[int, tuple]) -> str:
    shown = ", ".join(f"{key}: wrote {want:#x}, found {'nothing' if got is None else hex(got)}"
                      for key, (want, got) in list(values.items())[:6])
    return shown + (f" and {len(values) - 6} more" if len(values) > 6 else "")


def lost_writes(counters: dict) -> int:
    return sum(counters.get(name, 0) for name in LOST_WRITE_COUNTERS)


def counter_delta(before: dict, after: dict) -> dict:
    return {name: after.get(name, 0) - before.get(name, 0) for name in sorted(set(before) | set(after))
            if after.get(name, 0) != before.get(name, 0)}


def configure(tmp: Path, transport: str, redundancy: int) -> None:
    config = (ROOT / "examples" / "collector.toml").read_text()
    config = config.replace('name = "c1"', f'name = "{COLLECTOR}"').replace('token = "change-me"',
                                                                           f'token = "{TOKEN}"')
    config = config.replace('interface = ""', 'interface = "c0"').replace('data_dir = "c1-data"',
                                                                          f'data_dir = "{tmp / "regions"}"')
    config = config.replace('hash = "independent"',
                            f'hash = "independent"\nredundancy = {redundancy}\ntransport = "{transport}"')
    config = config.replace("slots = 131072", f"slots = {SLOTS}").replace("slots = 65536", "slots = 1024")
    config = config.replace("slots = 32768", "slots = 1024")
    (tmp / "collector.toml").write_text(config)
    # the translator's defaults are part of what is tested: its section names only its addresses
    (tmp / "translator.toml").write_text(f'[translator]\nmac = "{TRANSLATOR_MAC}"\nip = "{TRANSLATOR_IP}"\n')


CASES = [pytest.param(engine, restart, recreated, transport,
                      id=f"{engine}-{restart}-{'recreated' if recreated else 'plain'}-{transport}")
         for engine in ("xdp", "python") for restart in RESTARTS for recreated in (False, True)
         for transport in ("uc", "rc")]


def wire(engine: str, reporter: Namespace, translator_ns: Namespace, collector_ns: Namespace) -> None:
    """The XDP engine between two links (reports in on t0, RoCEv2 out of t1); the python engine one-armed on t0,
    behind a bridge in a switch namespace that joins it to the reporter and the collector. A bridge port whose
    peer sends from XDP (the collector's responder, the python engine) runs XDP itself, so that those frames
    arrive."""
    if engine == "xdp":
        veth_pair(reporter, "r0", translator_ns, "t0", mac_a=REPORTER_MAC, mac_b=TRANSLATOR_MAC)
        veth_pair(translator_ns, "t1", collector_ns, "c0", mac_a=TRANSLATOR_MAC, mac_b=COLLECTOR_MAC)
        address(translator_ns, "t1", f"{TRANSLATOR_IP}/16")
        address(collector_ns, "c0", f"{COLLECTOR_IP}/16")
        return
    switch = Namespace.create(PREFIX + "s")
    switch.run("ip", "link", "add", "br0", "type", "bridge")
    switch.run("ip", "link", "set", "br0", "up")
    with BpfObject(build_object(VETH_PEER_SOURCE)) as passer:
        for namespace, interface, mac, port in ((reporter, "r0", REPORTER_MAC, "sr"),
                                                (translator_ns, "t0", TRANSLATOR_MAC, "st"),
                                                (collector_ns, "c0", COLLECTOR_MAC, "sc")):
            veth_pair(namespace, interface, switch, port, mac_a=mac)
            switch.run("ip", "link", "set", port, "master", "br0")
            if port != "sr":
                with in_netns(switch.name):
                    attach_xdp(socket.if_nametoindex(port), passer.programs["softdta_pass"].fd)
    address(translator_ns, "t0", f"{TRANSLATOR_IP}/16")
    address(collector_ns, "c0", f"{COLLECTOR_IP}/16")


@pytest.mark.parametrize("engine, restart, recreated, transport", CASES)
def test_a_restart_keeps_every_acknowledged_write(engine, restart, recreated, transport, tmp_path):
    """Batch 1 executed (and, after a QP re-creation, batch 1b); the restart; batch 2 with new keys and new values
    for old ones; then every key holds its last value, but for batch-2 writes the translator counts as lost."""
    collector_pins = pin_dir_for(COLLECTOR, ip_bytes(COLLECTOR_IP))
    pin = ensure_bpffs() / f"softdta-matrix-{os.getpid()}"
    shutil.rmtree(collector_pins, ignore_errors=True)
    shutil.rmtree(pin, ignore_errors=True)
    secrets_file_for(pin).unlink(missing_ok=True)
    cleanup_prefix(PREFIX)
    # reports ask for one copy; a structure that takes two sends it by the translator's devmap broadcast, one that
    # takes one with a plain redirect: the two paths out of XDP, each through every restart
    configure(tmp_path, transport, 2 if recreated else 1)
    reporter, translator_ns, collector_ns = (Namespace.create(PREFIX + n) for n in ("r", "t", "c"))
    case = Case(restart, recreated, transport, engine, tmp_path, reporter, translator_ns, collector_ns, pin)
    try:
        wire(engine, reporter, translator_ns, collector_ns)
        try:
            case.collector_up()
            case.translator_up()
            case.wait_until(case.connected, "the translator connected", START_S)
            case.write("1", {key: 1 << 24 | key for key in BATCH_1})
            if recreated:
                case.recreate_key_write_qp()
                case.write("1b", {key: 1 << 24 | 0x800000 | key for key in BATCH_1B})
            case.restart_now()
            before = case.counters()
            batch_2 = {key: 2 << 24 | key for key in OVERWRITTEN if key in case.latest}
            batch_2.update({key: 2 << 24 | key for key in BATCH_2_NEW})
            with case.meanwhile():
                case.write("2", batch_2)
            after = case.counters()
            problems = case.verdict(lost_writes(after) - lost_writes(before), before, after)
            case.snapshot()
            problems += case.stop_cleanly()
        except Exception as error:  # any failure gets the case's summary
            problems = [f"{type(error).__name__}: {error}"]
            case.snapshot()
        problems = case.notes + problems
        assert not problems, "\n".join(problems) + "\n" + case.summary()
    finally:
        case.close()
        cleanup_prefix(PREFIX)
        for kept in (pin, case.other_pin):
            shutil.rmtree(kept, ignore_errors=True)
            secrets_file_for(kept).unlink(missing_ok=True)
        shutil.rmtree(collector_pins, ignore_errors=True)
