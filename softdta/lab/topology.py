"""The live lab: reporters, an XDP translator and a collector in network namespaces, joined by a switch.

    reporter r1 (r1-0) ─┐
    reporter r2 (r2-0) ─┤ switch (namespace sw) ├─ (t0) translator: softdta translator up --collector ...
                        └───────────────────────┴─ (c0) collector: softdta collector up (XDP responder)

With `--collector rxe` the collector is the Linux kernel's soft-RoCE instead: c0 and the tap of a QEMU guest
(softdta.lab.rxe) are bridged in the collector namespace, and the guest runs `softdta collector up` on the verbs
backend over rdma_rxe, at the collector's address.

The translator is `softdta translator up --engine xdp` (the kernel fast path) or `--engine python` (the
reference translator on AF_XDP, softdta.engines.python). It is single-armed, like a translator box with one port
on the switch: reports come in, RoCEv2 leaves and the collector's ACKs and NAKs return on t0, which has one RX
queue, so the translator asks for one queue pair per structure (docs/translator.md, "Order on the wire").
The switch forwards frames to the translator and the XDP collector in XDP (bpf/lab_switch.bpf.c), at the speed a
hardware switch would, and everything else through a kernel bridge.
Every name starts with `sdta-lab-`; `down` finds and removes them even when `up` crashed half-way. The
translator and the collector run as processes (their own CLI); their PIDs, logs and configuration live in
STATE_DIR, and the translator's maps are pinned in PIN_DIR.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

from softdta.collector.xdp_backend import pin_dir_for
from softdta.engines.python import EngineInfo, engine_stats
from softdta.engines.xdp import CpuTime, QpStats
from softdta.errors import SoftdtaError
from softdta.kernel.bpf import BpfObject, attach_xdp, ensure_bpffs
from softdta.kernel.maps import map_layout
from softdta.kernel.netns import Namespace, NetnsError, address, cleanup_prefix, in_netns, realtime_napi, veth_pair
from softdta.kernel.programs import LAB_SWITCH_SOURCE, EngineError, build_object
from softdta.lab import rxe as rxe_lab
from softdta.lab.nats_server import NatsServer
from softdta.wire.frames import ip_bytes, mac_bytes

PREFIX = "sdta-lab-"
STATE_DIR = Path("/run/softdta-lab")
PIN_DIR = Path("/sys/fs/bpf/softdta-lab")
TRANSLATOR_MAC, TRANSLATOR_IP = "02:5d:7a:00:00:01", "10.77.0.1"
COLLECTOR_MAC, COLLECTOR_IP = "02:5d:7a:00:01:01", "10.77.1.1"
COLLECTOR_NAME = "lab"
CONTROL_PORT, QUERY_PORT = 40050, 8040
COLLECTORS = ("xdp", "rxe")
ENGINES = ("xdp", "python")
GUEST_RUN_DIR = STATE_DIR / "guest"
BRIDGE_IP = "10.77.1.254/16"  # the collector namespace's own address, beside the guest (rxe)
# frames the links of the python engine's path (t0, sw-c) queue while their peer's ring is full (its socket waits
# instead: AF_XDP does not use the queue)
QUEUE_LIMIT = 1000
NAPI_PRIORITY = 50  # the SCHED_FIFO priority of the lab's NAPI threads (see _realtime_data_path)
PYTHON_ENGINE_NICE = -10  # the python engine's scheduling priority in the lab (see _start)


class LabError(SoftdtaError, RuntimeError):
    """The lab cannot be built or used; the message names the problem and the fix."""


class ReporterPort(TypedDict):
    """A reporter's namespace, interface and addresses."""

    netns: str
    interface: str
    mac: str
    ip: str


class TranslatorStatus(TypedDict):
    pid: int
    running: bool
    engine: EngineInfo
    counters: NotRequired[dict[str, int]]  # these three from its pinned maps (engine_stats), when it has them
    qps: NotRequired[list[QpStats]]
    cpu: NotRequired[dict[str, CpuTime]]
    error: NotRequired[str]  # why its pinned maps could not be read


class CollectorStatus(TypedDict):
    kind: str  # "xdp" or "rxe"
    running: bool
    pid: NotRequired[int]  # xdp: the collector's
    qemu_pid: NotRequired[int]  # rxe: the guest's


class LabStatus(TypedDict):
    up: bool
    namespaces: list[str]
    reporters: NotRequired[int]  # these four when a lab is up
    query_url: NotRequired[str]
    translator: NotRequired[TranslatorStatus]
    collector: NotRequired[CollectorStatus]


@dataclass
class LabState:
    reporters: int
    token: str
    collector: str = "xdp"
    engine: str = "xdp"  # the translator's: the kernel fast path, or the reference translator on AF_XDP
    translator_pid: int = 0
    collector_pid: int = 0  # xdp only: the rxe collector runs inside the guest
    export_url: str = ""  # the nats-server (in the collector's namespace) the collector exports Append entries to
    nats_pid: int = 0

    @property
    def query_url(self) -> str:
        return f"http://{COLLECTOR_IP}:{QUERY_PORT}"

    def reporter(self, index: int) -> ReporterPort:
        """Namespace, interface and addresses of reporter `index` (1-based)."""
        return {"netns": f"{PREFIX}r{index}", "interface": f"r{index}-0", "mac": f"02:5d:7a:00:09:{index:02x}",
                "ip": f"10.77.9.{index}"}


def collector_config(state: LabState) -> str:
    """The lab collector: every primitive, sized for the demo's workloads (INT path tracing with 5-tuple keys)."""
    backend = (f'backend = "xdp"\nmac = "{COLLECTOR_MAC}"\ninterface = "c0"\ndata_dir = "{STATE_DIR / "regions"}"'
               if state.collector == "xdp" else
               f'backend = "verbs"\nmac = "{rxe_lab.GUEST_MAC}"\ndata_dir = "/dev/shm/softdta"')
    export = f'\n[export]                      # Append entries to NATS JetStream\nurl = "{state.export_url}"\n' \
        if state.export_url else ""
    return f"""[collector]
name = "{COLLECTOR_NAME}"
ip = "{COLLECTOR_IP}"
{backend}
token = "{state.token}"
control_port = {CONTROL_PORT}
query_port = {QUERY_PORT}

[[structures]]
primitive = "key-write"       # INT path tracing: 5-tuple keys, five 4-byte switch IDs
slots = 65536
key_len = 13
data_len = 20
hash = "independent"

[[structures]]
primitive = "key-increment"   # Marple-style per-flow counters
slots = 65536
hash = "independent"

[[structures]]
primitive = "postcarding"     # INT postcards, 5 hops
slots = 32768
hops = 5

[[structures]]
primitive = "sketch-merge"
slots = 64
rows = 4
reporters = {state.reporters}
merge = "sum"
batch = 8

[[append]]                    # congestion and loss events, one list per port
first_list = 0
lists = 256
entries = 1024
batch = 16
{export}"""


def translator_settings(collector: str) -> str:
    """rxe in an emulated guest answers in milliseconds: a NAK's resync grace must outlast that."""
    return f"""[translator]
mac = "{TRANSLATOR_MAC}"
ip = "{TRANSLATOR_IP}"
profile = "dta-v1"
dscp = 26
ack_request_interval = 8
grace_ms = {1.0 if collector == "xdp" else 50.0}
"""


def flush_idle_ms(collector: str, engine: str = "xdp") -> float:
    """At rxe's pace (DEFAULTS in lab/demo.py) a Postcarding path's hops arrive up to ~100 ms apart: a 1 ms idle
    flush would write most paths out in pieces. The same holds at the python engine's pace, where the paced
    reporters' chunks, which can split a path, arrive tens of milliseconds apart."""
    return 1.0 if collector == "xdp" and engine == "xdp" else 250.0


def _softdta(*argv: str) -> list[str]:
    return [sys.executable, "-m", "softdta.cli", *argv]


def _wait_for(log: Path, text: str, process: subprocess.Popen[bytes], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text():
            return
        if process.poll() is not None:
            raise LabError(f"{what} exited with {process.returncode}:\n"
                           f"{log.read_text()[-2000:] if log.exists() else ''}")
        time.sleep(0.1)
    raise LabError(f"{what} did not come up within {timeout:.0f} s; see {log}")


def up(reporters: int = 2, collector: str = "xdp", engine: str = "xdp", export: bool = False) -> LabState:
    """Build the topology and start the collector and the translator; returns the state `status` shows. With
    `export` (the xdp collector only), a nats-server with JetStream in the collector's namespace, and the
    collector exporting its Append entries to it."""
    if collector not in COLLECTORS:
        raise LabError(f"--collector {collector}: choose one of {', '.join(COLLECTORS)}")
    if engine not in ENGINES:
        raise LabError(f"--engine {engine}: choose one of {', '.join(ENGINES)}")
    if not 1 <= reporters <= 16:
        raise LabError(f"--reporters {reporters}: give 1..16 reporter namespaces")
    if export and collector != "xdp":
        raise LabError("--export: the lab exports from the xdp collector only (the rxe collector runs in a guest)")
    if read_state() is not None:
        raise LabError("a lab is already up; `softdta lab down` removes it first")
    down()
    state = LabState(reporters=reporters, token=secrets.token_hex(16), collector=collector, engine=engine)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    try:
        _build(state)
        if export:
            _start_nats(state)
        _start(state)
    except (LabError, NetnsError, OSError, rxe_lab.RxeLabError) as error:
        down()
        raise LabError(f"lab up failed and was rolled back: {error}") from None
    return state


def _build(state: LabState) -> None:
    switch = Namespace.create(PREFIX + "sw")
    switch.run("ip", "link", "add", "br0", "type", "bridge")
    switch.run("ip", "link", "set", "br0", "up")
    translator = Namespace.create(PREFIX + "t")
    collector = Namespace.create(PREFIX + "c")
    ports = [(translator, "t0", TRANSLATOR_MAC, f"{TRANSLATOR_IP}/16", "sw-t"),
             (collector, "c0", COLLECTOR_MAC, f"{COLLECTOR_IP}/16" if state.collector == "xdp" else None, "sw-c")]
    for index in range(1, state.reporters + 1):
        reporter = state.reporter(index)
        ports.append((Namespace.create(reporter["netns"]), reporter["interface"], reporter["mac"],
                      f"{reporter['ip']}/16", f"sw-r{index}"))
    # forwarded in XDP with the XDP translator: frames to it, and its frames to the xdp collector (both ends run XDP
    # from the start); with the python engine, everything goes through the bridge (see below)
    in_xdp = {TRANSLATOR_MAC, *([COLLECTOR_MAC] if state.collector == "xdp" else [])} if state.engine == "xdp" \
        else set()
    switch_port = map_layout("switch_port")
    with BpfObject(build_object(LAB_SWITCH_SOURCE)) as forwarder:
        for namespace, interface, mac, cidr, port in ports:
            veth_pair(namespace, interface, switch, port, mac_a=mac)
            if cidr:
                address(namespace, interface, cidr)
            switch.run("ip", "link", "set", port, "master", "br0")
            with in_netns(switch.name):
                ifindex = socket.if_nametoindex(port)
                if mac in in_xdp:
                    forwarder.maps["switch_port"].update(switch_port.key.pack(mac=mac_bytes(mac), pad=0),
                                                         switch_port.value.pack(ifindex=ifindex))
                attach_xdp(ifindex, forwarder.programs["softdta_switch"].fd)
    if state.engine == "python":
        # The python engine's frames leave through its socket (`--transmit socket`). A veth with a queueing
        # discipline makes the socket wait while the switch port's ring is full, where frames sent from XDP
        # would be dropped: a step's burst of thousands of frames then waits for room. Past the switch, a
        # redirect would pour that burst into the collector's ring faster than its responder empties it; the
        # bridge hands them to sw-c, whose queueing discipline holds them while that ring is full. The same holds
        # the other way: the replies to a step's frames come back in one burst, which with the reports on their
        # way overflowed t0's ring; from the bridge they wait in sw-t's queueing discipline (docs/lab.md).
        translator.run("tc", "qdisc", "replace", "dev", "t0", "root", "pfifo", "limit", str(QUEUE_LIMIT))
        for port in ("sw-c", "sw-t"):
            switch.run("tc", "qdisc", "replace", "dev", port, "root", "pfifo", "limit", str(QUEUE_LIMIT))
    if state.collector == "rxe":
        collector.run("ip", "link", "add", "br0", "type", "bridge")
        collector.run("ip", "link", "set", "c0", "master", "br0")
        collector.run("ip", "link", "set", "br0", "up")


def _start(state: LabState) -> None:
    (STATE_DIR / "collector.toml").write_text(collector_config(state))
    (STATE_DIR / "translator.toml").write_text(translator_settings(state.collector))
    ensure_bpffs()
    PIN_DIR.mkdir(parents=True, exist_ok=True)
    if state.collector == "rxe":
        _start_guest_collector(state)
    else:
        _start_xdp_collector(state)
    translator_log = STATE_DIR / "translator.log"
    translator = subprocess.Popen(
        _softdta("translator", "up", "--tables", str(STATE_DIR / "translator.toml"), "-i", "t0",
                 "--netns", PREFIX + "t", "--pin", str(PIN_DIR), "--collector", f"{COLLECTOR_IP}:{CONTROL_PORT}",
                 "--flush-idle-ms", str(flush_idle_ms(state.collector, state.engine)),
                 "--token", state.token, "--engine", state.engine,
                 *(["--transmit", "socket"] if state.engine == "python" else [])),
        stdout=translator_log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    if state.engine == "python":
        # The translator stands for a box of its own: the python engine translates on the CPU, and it must not
        # wait behind the demo's sender, the collector's Python or whatever else runs on these two cores, while
        # its ring fills (threads it starts later inherit the priority).
        os.setpriority(os.PRIO_PROCESS, translator.pid, PYTHON_ENGINE_NICE)
    state.translator_pid = translator.pid
    write_state(state)
    _wait_for(translator_log, "translator up on", translator, "translator up")
    _realtime_data_path(state)


def _realtime_data_path(state: LabState) -> None:
    """The lab's links and switch stand for hardware, and the translator for a box of its own: their NAPI polls
    must not wait behind the demo's sender or other user processes (netns.realtime_napi).

    With the python engine, sw-t passes the translator's frames to the bridge, at about 1.5 µs each: a step's
    burst holds its CPU for milliseconds. Behind it wait only the translator's socket and queue, which wait for
    room anyway; at one priority, the polls of the rings that drop once full (the reporters' ports and sw-c,
    filled by XDP) would wait too, and overflow. So it polls one priority below them."""
    switch_ports = ["sw-t", "sw-c", *(f"sw-r{index}" for index in range(1, state.reporters + 1))]
    for namespace, interfaces in ((PREFIX + "sw", switch_ports), (PREFIX + "t", ["t0"]), (PREFIX + "c", ["c0"])):
        for interface in interfaces:
            below = interface == "sw-t" and state.engine == "python"
            realtime_napi(Namespace(namespace), interface, NAPI_PRIORITY - 1 if below else NAPI_PRIORITY)


def _start_nats(state: LabState) -> None:
    """nats-server with JetStream on the collector namespace's loopback, its store under the lab's directory."""
    server = NatsServer(STATE_DIR / "nats")
    with in_netns(PREFIX + "c"):
        server.start()
    assert server.process is not None
    state.export_url, state.nats_pid = server.url, server.process.pid
    write_state(state)


def _start_xdp_collector(state: LabState) -> None:
    collector_log = STATE_DIR / "collector.log"
    collector = subprocess.Popen(
        _softdta("collector", "up", "--config", str(STATE_DIR / "collector.toml"), "--netns", PREFIX + "c",
                 "--query-host", COLLECTOR_IP),
        stdout=collector_log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    state.collector_pid = collector.pid
    write_state(state)
    _wait_for(collector_log, "collector lab up", collector, "collector up")


def guest() -> rxe_lab.Guest:
    """The lab's soft-RoCE guest, for `run` and `close` from any process."""
    booted = rxe_lab.Guest(namespace=PREFIX + "c", run_dir=GUEST_RUN_DIR)
    booted.host_ip, booted.guest_ip = BRIDGE_IP.split("/")[0], COLLECTOR_IP
    return booted


def _start_guest_collector(state: LabState, timeout: float = 60.0) -> None:
    """Boot the guest on the collector namespace's bridge, then `softdta collector up` on rxe0 inside it."""
    write_state(state)  # `down` finds the guest from here on, whatever happens next
    rxe_lab.Guest(namespace=PREFIX + "c", run_dir=GUEST_RUN_DIR).boot(BRIDGE_IP, COLLECTOR_IP, bridge="br0")
    vm = guest()
    config = (STATE_DIR / "collector.toml").read_text()
    status, output = vm.run(f"mkdir -p /dev/shm/softdta && cat > /tmp/collector.toml <<'EOF'\n{config}EOF\n"
                            "cd /tmp && python3 -m softdta.cli collector up --config /tmp/collector.toml "
                            "--query-host 0.0.0.0 > /tmp/collector.log 2>&1 & echo $!")
    if status != 0:
        raise LabError(f"starting the collector in the guest failed: {output}")
    pid = output.split()[-1]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = vm.run("cat /tmp/collector.log")[1]
        if "collector lab up" in log:
            (STATE_DIR / "collector.log").write_text(log)
            return
        if vm.run(f"kill -0 {pid}")[0] != 0:  # the guest has no procps
            raise LabError(f"the collector in the guest exited:\n{log[-2000:]}")
        time.sleep(0.5)
    raise LabError(f"the collector in the guest did not come up within {timeout:.0f} s:\n{log[-2000:]}")


def write_state(state: LabState) -> None:
    (STATE_DIR / "state.json").write_text(json.dumps(asdict(state)))


def read_state() -> LabState | None:
    try:
        return LabState(**json.loads((STATE_DIR / "state.json").read_text()))
    except (FileNotFoundError, json.JSONDecodeError, TypeError):
        return None


def _stop(pid: int) -> None:
    """SIGTERM, then SIGKILL after 10 s: the daemons detach their programs and save their regions on SIGTERM."""
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def down() -> list[str]:
    """Stop the daemons and remove every namespace, link and pin of the lab; safe to run any number of times."""
    state = read_state()
    if state is not None:
        _stop(state.translator_pid)
        _stop(state.collector_pid)
        _stop(state.nats_pid)  # after the collector: its exporter's last acknowledgements
    rxe_lab.stop_qemu(GUEST_RUN_DIR)
    removed = cleanup_prefix(PREFIX)
    shutil.rmtree(PIN_DIR, ignore_errors=True)
    shutil.rmtree(pin_dir_for(COLLECTOR_NAME, ip_bytes(COLLECTOR_IP)), ignore_errors=True)  # a killed collector's
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    return removed


def status() -> LabStatus:
    """What is up: namespaces, daemons, and the translator's counters and queue pairs."""
    state = read_state()
    namespaces = sorted(name for name in os.listdir("/run/netns") if name.startswith(PREFIX)) \
        if os.path.isdir("/run/netns") else []
    if state is None:
        return {"up": False, "namespaces": namespaces}

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False

    collector: CollectorStatus
    if state.collector == "rxe":
        qemu = GUEST_RUN_DIR / "qemu.pid"
        pid = int(qemu.read_text()) if qemu.exists() else 0
        collector = {"kind": "rxe", "qemu_pid": pid, "running": bool(pid) and alive(pid)}
    else:
        collector = {"kind": "xdp", "pid": state.collector_pid, "running": alive(state.collector_pid)}
    translator: TranslatorStatus = {"pid": state.translator_pid, "running": alive(state.translator_pid),
                                    "engine": {"name": state.engine}}
    if PIN_DIR.exists():
        try:
            stats = engine_stats(PIN_DIR)
        except EngineError as error:
            translator["error"] = str(error)
        else:
            translator["counters"], translator["qps"], translator["cpu"] = stats["counters"], stats["qps"], stats["cpu"]
            translator["engine"] = stats["engine"]
    return {"up": True, "namespaces": namespaces, "reporters": state.reporters, "query_url": state.query_url,
            "translator": translator, "collector": collector}
