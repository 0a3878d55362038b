"""The kernel translator engine: builds bpf/translator.bpf.c, loads it through libbpf, fills its maps from the
translator tables, runs frames through it, attaches it to interfaces and reads its state.

The maps named after `spec.TRANSLATOR_MAPS` are the whole interface; `maps.map_layout()` gives their layouts.
"""

from __future__ import annotations

import queue
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, TypedDict

from softdta.core import registry
from softdta.core.control_plane import (
    CONFIG_TABLES,
    DEFAULT_FLUSH_IDLE_NS,
    Entry,
    LiveQp,
    Slots,
    address_fields,
    apply_plan,
    plan,
)
from softdta.core.settings import TableError
from softdta.core.tables import QueuePair, Tables
from softdta.core.translator import Output
from softdta.engines.engine import QpStatus, Stop, report_adoptions
from softdta.kernel.bpf import (
    BPF_MAP_TYPE_DEVMAP,
    BpfError,
    BpfObject,
    Map,
    Program,
    RingBuffer,
    TestRun,
    attach_tc_ingress,
    attach_xdp,
    detach_tc,
    detach_xdp,
    pin,
    possible_cpus,
    program_run_stats,
    xdp_md,
)
from softdta.kernel.maps import MapLayout, map_layout, record
from softdta.kernel.programs import (
    TRANSLATOR_SOURCE,
    XDP_ABORTED,
    XDP_PASS,
    XDP_REDIRECT,
    XDP_TX,
    EngineError,
    build_object,
)
from softdta.spec import (
    DTA_NACK_PORT,
    FANOUT_META_MAGIC,
    MAX_REDUNDANCY,
    PSN_MASK,
    TRANSLATOR_MAPS,
    QpState,
    TranslatorCounter,
)
from softdta.wire.frames import ip_str, parse_udp_frame
from softdta.wire.roce import parse_roce

DEFAULT_PIN_DIR = Path("/sys/fs/bpf/softdta")
_FANOUT_META = record("fanout_meta")
_DEFERRED_REPORT = record("deferred_report")
_FLUSH_TEMPLATE = bytes(64)
_FLUSH_RUNS_PER_TICK = 512


def _capacity(name: str) -> int:
    return next(t.max_entries for t in TRANSLATOR_MAPS if t.name == name)


# An entry of a config table as the target remembers it: (table, key fields in the spec's order), value items
HeldKey = tuple[str, tuple[int | bytes, ...]]
HeldValue = tuple[tuple[str, int | bytes], ...]


class MapTarget:
    """The XDP maps as a control-plane target: entries packed as the BPF structs in bpf/include/softdta_spec.h.

    An entry of a config table (`CONFIG_TABLES`, which the data path only reads) is written only when its value
    differs from the one `written` says the map holds: a new slot-map epoch rewrites the slots that moved, not all
    of them. `written` outlives the target (the translator keeps it from plan to plan) and starts empty, so a map
    the translator did not write itself (a pinned one) is written in full once."""

    def __init__(self, maps: dict[str, Map], written: dict[HeldKey, HeldValue] | None = None):
        self.maps = maps
        self.tables = frozenset(maps)
        self.written: dict[HeldKey, HeldValue] = {} if written is None else written

    def write(self, entry: Entry) -> None:
        held = _held_key(entry) if entry.table in CONFIG_TABLES else None
        value = tuple(entry.value.items())
        if held is not None and self.written.get(held) == value:
            return
        self.maps[entry.table].update(*map_entry(entry))
        if held is not None:
            self.written[held] = value

    def delete(self, entry: Entry) -> None:
        self.written.pop(_held_key(entry), None)
        self.maps[entry.table].delete(map_entry(entry)[0])

    def installed(self, name: str) -> list[Entry]:
        return [Entry(name, map_logical(name, map_layout(name).key.unpack(raw))) for raw in self.maps[name].keys()]


def _held_key(entry: Entry) -> HeldKey:
    return entry.table, tuple(entry.key[name] for name in _packing(entry.table)[2])


@cache
def _packing(name: str) -> tuple[MapLayout, frozenset[str], tuple[str, ...]]:
    """A map's layout, its address fields and its key's field names."""
    layout = map_layout(name)
    return layout, address_fields(name), tuple(layout.key.names)


def map_entry(entry: Entry) -> tuple[bytes, bytes]:
    """A control-plane entry as the (key, value) bytes of its BPF map."""
    layout, addresses, _ = _packing(entry.table)
    return (layout.key.pack(**_in_memory(entry.key, addresses)),
            layout.value.pack(**_in_memory(entry.value, addresses)))


def _in_memory(values: Mapping[str, int | bytes], addresses: frozenset[str]) -> dict[str, int | bytes]:
    """Addresses in integer fields as the kernel stores them: network order in memory, read as a host __u32."""
    return {name: int.from_bytes(v, "little") if name in addresses and isinstance(v, bytes) else v
            for name, v in values.items()}


def map_logical(name: str, values: Mapping[str, Any]) -> dict[str, int | bytes]:
    """Unpacked map fields of table `name` as control-plane values (the inverse of `map_entry`)."""
    addresses = address_fields(name)
    return {field: v.to_bytes(4, "little") if field in addresses else v for field, v in values.items()}


class XdpTranslator:
    """One loaded instance of the kernel translator.

    `pin_dir` pins every map there (under a bpffs), so a restarted translator finds its PSNs, Append heads and
    caches again. Without it, the maps live as long as this object. `source` may name a program that includes
    bpf/translator.bpf.c and adds to it (the benchmarks do, and local translation: bpf/local.bpf.c, whose maps
    named in `reuse` are another object's).
    """

    def __init__(self, tables: Tables, *, pin_dir: str | Path | None = None,
                 flush_idle_ns: int = DEFAULT_FLUSH_IDLE_NS, source: Path = TRANSLATOR_SOURCE,
                 reuse: dict[str, Map] | None = None):
        self.flush_idle_ns = flush_idle_ns
        try:
            self.object = BpfObject(build_object(source), pin_dir=pin_dir,
                                    map_sizes={"fanout": _capacity("fanout") * possible_cpus()}, reuse=reuse)
        except BpfError as error:
            raise EngineError(f"cannot load the kernel translator: {error}") from None
        self.maps: dict[str, Map] = self.object.maps
        self.xdp = self.object.programs["softdta_xdp"]
        self.flusher = self.object.programs["softdta_flush"]
        self.fanout = self.object.programs["softdta_fanout"]
        self.copy = self.object.programs["softdta_copy"]
        if pin_dir is not None:
            for program in (self.xdp, self.copy, self.fanout):  # so stats can read their run time from outside
                pin(program.fd, Path(pin_dir) / f"prog_{program.name}")
        self.ring = RingBuffer(self.maps["deferred"])
        self.slots = self._slots_in_maps()
        self.tables = tables
        self.attached: list[int] = []
        self.interfaces: list[str] = []
        self.mode = "native"
        self.copies_from_xdp = True  # natively, redundant reports leave by `copies` (attach)
        self._senders: dict[int, socket.socket] = {}  # ifindex -> AF_PACKET socket, in generic mode
        self._copy_interfaces: set[int] = set()  # egress ifindexes with `copies` entries
        self.reinjected = 0
        self._backlog: dict[int, list[tuple[int, int, bytes]]] = {}  # qp index -> (ifindex, RX queue, frame)
        self._quiet_since: dict[int, tuple[int, int]] = {}  # qp index -> (frames sent, first seen at)
        self._written: dict[HeldKey, HeldValue] = {}  # what the config maps hold, as this translator wrote it
        self.apply(tables)

    def close(self) -> None:
        self.detach()
        self.ring.close()
        self.object.close()

    def __enter__(self) -> XdpTranslator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------------
    # tables

    def apply(self, tables: Tables) -> None:
        """Write `tables` into the maps through the shared control plane (`control_plane.plan`). Entries that
        stay keep their state (PSNs, heads, caches); new QPs, and failed ones (their collector re-created its
        end), start at their start_psn; removed entries are deleted last, so traffic for the rest never sees a
        gap. Tables that give some structure fewer QPs than the attached interfaces have RX queues are refused."""
        egress = routes_once()
        check_queues(tables, self.interfaces)
        check_across(tables, egress)
        self._add_copies(tables, egress, self.attached)
        installed = {}
        for local_qpn, index in self.slots.qp.items():
            current, state = self.read("qp", qp_index=index), self.read("qp_state", qp_index=index)
            if current is not None and state is not None and state["state"] != QpState.FAILED:
                installed[index] = LiveQp(current["remote_qpn"], current["start_psn"], state["next_psn"],
                                          state["unacked_psn"])
        planned = plan(tables, self.slots, flush_idle_ns=self.flush_idle_ns, egress=egress,
                       installed_qps=installed)
        apply_plan(MapTarget(self.maps, self._written), planned)
        self.slots = planned.slots
        self.tables = tables
        self._add(TranslatorCounter.PSN_ADOPTED, report_adoptions(planned.restarts))

    def _add(self, counter: TranslatorCounter, n: int) -> None:
        """Count what the control plane did in the data path's counters (on CPU 0's copy)."""
        if n:
            key = int(counter).to_bytes(4, "little")
            values = self.maps["counters"].lookup_percpu(key) or [bytes(8)]
            values[0] = (int.from_bytes(values[0][:8], "little") + n).to_bytes(8, "little")
            self.maps["counters"].update_percpu(key, values)

    def _slots_in_maps(self) -> Slots:
        """Rebuild the index assignment from (pinned) maps, so a restarted translator keeps its state."""
        slots = Slots()
        for raw, value in self.maps["qp"].items():
            entry = map_layout("qp").value.unpack(value)
            if entry["remote_qpn"]:
                slots.qp[entry["local_qpn"]] = map_layout("qp").key.unpack(raw)["qp_index"]
        for raw, value in self.maps["append_list"].items():
            list_id, entry = map_layout("append_list").key.unpack(raw)["list_id"], \
                map_layout("append_list").value.unpack(value)
            slots.append[list_id], slots.append_qp[list_id] = entry["state_index"], entry["qp_index"]
        for raw, value in self.maps["structure"].items():
            key, entry = map_layout("structure").key.unpack(raw), map_layout("structure").value.unpack(value)
            slots.remember_structure(key["collector_ip"].to_bytes(4, "little"), key["primitive"], entry)
        return slots

    # ----------------------------------------------------------------------------------------------
    # state

    def read(self, name: str, **key: int | bytes) -> dict[str, Any] | None:
        layout = map_layout(name)
        raw = self.maps[name].lookup(layout.key.pack(**key))
        return None if raw is None else layout.value.unpack(raw)

    def _qp_state_entry(self, qp_index: int) -> dict[str, Any]:
        state = self.read("qp_state", qp_index=qp_index)
        assert state is not None  # an array map always has its entry
        return state

    def counters(self) -> Counter[TranslatorCounter]:
        tally: Counter[TranslatorCounter] = Counter()
        for counter in TranslatorCounter:
            total = self.maps["counters"].counter_total(counter)
            if total:
                tally[counter] = total
        return tally

    def counts(self) -> Counter[TranslatorCounter]:
        return self.counters()

    def qp_state(self, qp: QueuePair) -> QpStatus:
        state = self._qp_state_entry(self.slots.qp[qp.local_qpn])
        return QpStatus(next_psn=state["next_psn"], unacked_psn=state["unacked_psn"], state=state["state"],
                        grace_until_ns=state["grace_until_ns"], frames_sent=state["frames_sent"])

    def resync(self, qp: QueuePair, psn: int, now_ns: int | None = None) -> None:
        """Set a QP's next PSN and start its grace period (what a sequence-error NAK does)."""
        state = self._qp_state_entry(self.slots.qp[qp.local_qpn])
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        self._write_qp_state(qp, state, next_psn=psn & PSN_MASK, unacked_psn=psn & PSN_MASK,
                             state=int(QpState.GRACE), grace_until_ns=now_ns + self.tables.grace_ns)

    def revive(self, qp: QueuePair, psn: int) -> None:
        """Bring a failed QP back once the collector re-created its end."""
        self._write_qp_state(qp, self._qp_state_entry(self.slots.qp[qp.local_qpn]), next_psn=psn & PSN_MASK,
                             unacked_psn=psn & PSN_MASK, state=int(QpState.ACTIVE), grace_until_ns=0)

    def _write_qp_state(self, qp: QueuePair, current: dict[str, Any], **changes: int) -> None:
        layout = map_layout("qp_state")
        self.maps["qp_state"].update(layout.key.pack(qp_index=self.slots.qp[qp.local_qpn]),
                                     layout.value.pack(**{**current, **changes}))

    # ----------------------------------------------------------------------------------------------
    # frames through the program (BPF_PROG_TEST_RUN)

    def process(self, frame: bytes, now_ns: int = 0, queue: int = 0, ifindex: int = 0) -> Output:
        """Run one frame through the XDP program and return what it would put on the wire (the program reads the
        kernel's clock, not `now_ns`). A `queue` other than 0 needs the `ifindex` of an interface that has it."""
        run = self.xdp.test_run(frame, ctx=xdp_md(ingress_ifindex=ifindex, rx_queue_index=queue))
        out = _output(run.retval, run.data)
        fanned = self._fanned_out(run)
        if fanned is not None:
            out = Output(frames=fanned[1])
        out.deferred = bool(self.ring.consume())
        return out

    def _fanned_out(self, run: TestRun) -> tuple[int, list[bytes]] | None:
        """The frames of a redundant report and their egress ifindex (0: the ingress one): the packet is the first,
        the others are parked, for softdta_copy (broadcast to `copies`) or the tc stage (passed up)."""
        fanout = _FANOUT_META.unpack(run.meta[:_FANOUT_META.size]) if len(run.meta) >= _FANOUT_META.size else None
        if run.retval not in (XDP_PASS, XDP_REDIRECT) or not fanout or fanout["magic"] != FANOUT_META_MAGIC:
            return None
        parked = self._parked_frames(fanout["cpu"], fanout["sequence"]) if fanout["count"] > 1 else []
        return fanout["ifindex"], [run.data] + parked

    def _parked_frames(self, cpu: int, sequence: int) -> list[bytes]:
        """Frames 2..N of a redundant report, which the tc stage would send after the packet itself."""
        capacity = _capacity("fanout")
        entry = self.read("fanout", slot=cpu * capacity + sequence % capacity)
        if entry is None or entry["sequence"] != sequence:
            raise EngineError(f"no parked frames for fan-out sequence {sequence} on CPU {cpu}")
        length = entry["frame_len"]
        return [entry["frames"][i * length:(i + 1) * length] for i in range(entry["count"] - 1)]

    def flush_idle(self, now_ns: int = 0) -> list[bytes]:
        """What `flush` writes out: the program's idle flush runs on the kernel's clock, not on `now_ns`."""
        return self.flush()

    def flush(self) -> list[bytes]:
        """Run the idle flush until nothing more is due: the frames it writes out, oldest first."""
        frames: list[bytes] = []
        visits: Counter[bytes] = Counter()  # of each queue head since the last write, as the reference counts them
        queue = self.maps["flush_queue"]
        while (head := queue.lookup(b"")) is not None and visits[head] < 2:
            run = self.flusher.test_run(_FLUSH_TEMPLATE)
            if run.retval in (XDP_TX, XDP_REDIRECT):
                frames.append(run.data)
                visits.clear()
            else:
                visits[head] += 1
        return frames

    def take_deferred(self) -> list[tuple[int, int, int, bytes]]:
        """Essential reports parked while their QP could not send: (qp index, ingress ifindex, RX queue, frame)."""
        records: list[tuple[int, int, int, bytes]] = []
        for raw in self.ring.consume():
            parked = _DEFERRED_REPORT.unpack(raw[:_DEFERRED_REPORT.size])
            records.append((parked["qp_index"], parked["ingress_ifindex"], parked["rx_queue"],
                            parked["frame"][:parked["len"]]))
        return records

    # ----------------------------------------------------------------------------------------------
    # live operation

    def attach(self, interfaces: list[str], mode: str = "native", copies_from_xdp: bool = True) -> None:
        """XDP on every interface (reports in, collector replies in), tc fan-out on their ingress.

        Each RX queue writes through its own QPs, which keeps PSN order per QP without a lock (docs/translator.md),
        so every structure needs a QP for every RX queue of the interfaces. Natively, the `copies` devmaps exist
        before the program runs, so that no frame of a redundant report takes the tc stage; `copies_from_xdp`
        False sends them through the tc stage all the same (for drivers that cannot transmit redirected frames,
        and for comparison).
        """
        check_queues(self.tables, interfaces)
        self.mode, self.copies_from_xdp = mode, copies_from_xdp and mode == "native"
        if not self.copies_from_xdp:  # what an instance left pinned would broadcast, generic XDP too
            self.maps["copies"].clear()
        self._add_copies(self.tables, routes_once(), [interface_index(name) for name in interfaces])
        for name in interfaces:
            ifindex = interface_index(name)
            attach_xdp(ifindex, self.xdp.fd, mode=mode)
            attach_tc_ingress(ifindex, self.fanout.fd)
            self.attached.append(ifindex)
            self.interfaces.append(name)

    def _add_copies(self, tables: Tables, egress: Callable[[QueuePair], int], interfaces: list[int]) -> None:
        """Natively, a `copies` devmap for each egress interface and frame count: the frames of a redundant
        report leave from XDP, broadcast, with no skb. Generic XDP makes an skb of every frame anyway; without
        `copies` entries its redundant reports take the tc stage."""
        if not self.copies_from_xdp or not interfaces:
            return
        wanted = {*interfaces, *(ifindex for qp in tables.qps if (ifindex := egress(qp)))}
        layout = map_layout("copies")
        for ifindex in sorted(wanted - self._copy_interfaces):
            for count in range(1, MAX_REDUNDANCY + 1):
                devmap = Map.create("softdta_copies", BPF_MAP_TYPE_DEVMAP, 4, 8, MAX_REDUNDANCY)
                try:  # entry i: {ifindex, program fd}, as struct bpf_devmap_val
                    for copy in range(count):
                        devmap.update(copy.to_bytes(4, "little"),
                                      ifindex.to_bytes(4, "little") + self.copy.fd.to_bytes(4, "little"))
                    self.maps["copies"].update(layout.key.pack(ifindex=ifindex, count=count),
                                               layout.value.pack(devmap=devmap.fd))
                finally:
                    devmap.close()
            self._copy_interfaces.add(ifindex)

    def detach(self) -> None:
        while self.attached:
            ifindex = self.attached.pop()
            detach_tc(ifindex)
            detach_xdp(ifindex)
        self.maps["copies"].clear()
        self._copy_interfaces.clear()
        self.interfaces = []
        while self._senders:
            self._senders.popitem()[1].close()

    def tick(self) -> None:
        """One control-plane step: flush what is idle, re-inject parked essential reports whose QP is back."""
        if not self.attached:
            return
        self._flush()
        for qp_index, ifindex, rx_queue, frame in self.take_deferred():
            self._backlog.setdefault(qp_index, []).append((ifindex, rx_queue, frame))
        now = time.monotonic_ns()
        for qp_index, frames in list(self._backlog.items()):
            if self._idle(qp_index, now):
                for ifindex, rx_queue, frame in frames:  # on its queue again: its queue's QP writes it
                    self._emit(self.xdp, frame, ifindex or self.attached[0], rx_queue)
                self.reinjected += len(frames)
                del self._backlog[qp_index]
                self._quiet_since.pop(qp_index, None)

    def _emit(self, program: Program, frame: bytes, ifindex: int, rx_queue: int = 0) -> None:
        """Run `program` as if `frame` arrived on `ifindex`, sending what it transmits. In native mode the run sends
        (live frames). A generic-mode translator's interface may be a veth whose peer runs no XDP (docker's
        bridge ports), where such frames would be dropped unseen, so the frames of its run (XDP_TX, or passed to
        the tc stage for its egress and fan-out) leave through an AF_PACKET socket instead, like any of the
        stack's."""
        if self.mode == "native":
            program.test_run_live(frame, ifindex=ifindex, rx_queue=rx_queue)
            return
        run = program.test_run(frame, ctx=xdp_md(ingress_ifindex=ifindex, rx_queue_index=rx_queue))
        fanned = self._fanned_out(run)
        if fanned is not None:
            egress, frames = fanned[0] or ifindex, fanned[1]
        elif run.retval == XDP_TX:
            egress, frames = ifindex, [run.data]
        elif run.retval == XDP_REDIRECT:
            egress, frames = self._egress_of(run.data), [run.data]
        else:
            return
        if egress not in self._senders:
            self._senders[egress] = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            self._senders[egress].bind((socket.if_indextoname(egress), 0))
        for sent in frames:
            try:
                self._senders[egress].send(sent)
            except OSError:
                self._add(TranslatorCounter.DROP_CONTROL_SEND, 1)

    def _egress_of(self, frame: bytes) -> int:
        """The egress ifindex of a RoCEv2 frame the program redirected: its queue pair's interface."""
        udp = parse_udp_frame(frame)
        roce, collector_ip = parse_roce(frame, udp), udp.dst_ip
        for qp in self.tables.qps:
            if qp.remote_qpn == roce.bth["dest_qp"] and qp.collector_ip == collector_ip:
                return interface_index(qp.interface) if qp.interface else self.attached[0]
        raise EngineError(f"a control-plane run redirected a frame to QPN {roce.bth['dest_qp']:#x} at "
                          f"{ip_str(collector_ip)}, which no queue pair of the tables has")

    def _flush(self) -> None:
        """Run the flusher once per queue entry it can make progress on, transmitting what it writes out.

        One run per call: live mode costs far more per repetition when a run transmits nothing, and most runs
        don't; and a call of more than one run puts the program into the XDP dispatcher and takes it out again,
        two RCU grace periods (about 24 ms here, softdta.kernel.generator). The pass ends at an empty queue, or
        at an entry met twice (not due yet, or its QP is busy).
        """
        queue, visits = self.maps["flush_queue"], Counter[bytes]()
        for _ in range(_FLUSH_RUNS_PER_TICK):
            head = queue.lookup(b"")
            if head is None or visits[head] >= 2:
                return
            visits[head] += 1
            self._emit(self.flusher, _FLUSH_TEMPLATE, self.attached[0])

    def _idle(self, qp_index: int, now: int) -> bool:
        """Whether a QP can send and the data path has not used it for the idle time (as the flusher judges)."""
        state = self._qp_state_entry(qp_index)
        ready: bool = state["state"] == QpState.ACTIVE or (
            state["state"] == QpState.GRACE and now >= state["grace_until_ns"])
        frames_sent, since = self._quiet_since.get(qp_index, (None, now))
        if frames_sent != state["frames_sent"]:
            self._quiet_since[qp_index] = (state["frames_sent"], now)
            return False
        return ready and now - since >= self.flush_idle_ns


    def serve(self, stop: Stop, updates: queue.Queue[Tables] | None = None) -> None:
        """Run the control-plane loop until `stop` is set: ticks at half the idle-flush time (at least 100 µs),
        and applies new tables from `updates` (collector re-advertisements) between ticks."""
        interval = max(self.flush_idle_ns / 2e9, 1e-4)
        while not stop.wait(interval):
            while updates is not None and not updates.empty():
                self.apply(updates.get_nowait())
            self.tick()


class CpuTime(TypedDict):
    run_time_ns: int
    runs: int


class QpStats(TypedDict):
    local_qpn: int
    remote_qpn: int
    collector: str  # its IPv4 address
    transport: str  # "RC" or "UC"
    next_psn: int
    unacked_psn: int
    state: str  # a spec.QpState's name, in lower case
    frames_sent: int


class PinnedStats(TypedDict):
    counters: dict[str, int]  # the non-zero ones, by TranslatorCounter name in lower case
    qps: list[QpStats]
    cpu: dict[str, CpuTime]  # by program


def pinned_stats(pin_dir: Path) -> PinnedStats:
    """Counters and QP state from a translator's pinned maps, without loading the program."""
    def pinned(name: str) -> Map:
        try:
            return Map.from_pinned(pin_dir / name)
        except BpfError:
            raise EngineError(f"no translator state pinned in {pin_dir}; start one with `softdta translator up` "
                              "or pass --pin") from None

    counters: dict[str, int] = {}
    qps: list[QpStats] = []
    with pinned("counters") as counter_map, pinned("qp") as qp_map, pinned("qp_state") as state_map:
        for counter in TranslatorCounter:
            total = counter_map.counter_total(counter)
            if total:
                counters[counter.name.lower()] = total
        for raw, value in qp_map.items():
            entry = map_layout("qp").value.unpack(value)
            if not entry["remote_qpn"]:
                continue
            state_raw = state_map.lookup(raw)
            assert state_raw is not None  # an array map always has its entry
            state = map_layout("qp_state").value.unpack(state_raw)
            qps.append({"local_qpn": entry["local_qpn"], "remote_qpn": entry["remote_qpn"],
                        "collector": socket.inet_ntoa(entry["collector_ip"].to_bytes(4, "little")),
                        "transport": "RC" if entry["transport"] == 0 else "UC", "next_psn": state["next_psn"],
                        "unacked_psn": state["unacked_psn"], "state": QpState(state["state"]).name.lower(),
                        "frames_sent": state["frames_sent"]})
    cpu: dict[str, CpuTime] = {}
    for program in ("softdta_xdp", "softdta_copy", "softdta_fanout"):
        if (pin_dir / f"prog_{program}").exists():
            run_time_ns, runs = program_run_stats(pin_dir / f"prog_{program}")
            cpu[program] = {"run_time_ns": run_time_ns, "runs": runs}
    return {"counters": counters, "qps": qps, "cpu": cpu}


def _output(action: int, data: bytes) -> Output:
    if action == XDP_ABORTED:
        raise EngineError("the XDP program aborted; check `softdta translator stats` and the kernel log")
    if action in (XDP_TX, XDP_REDIRECT):
        to_reporter = parse_udp_frame(data).udp["dport"] == DTA_NACK_PORT  # the program sends only well-formed UDP
        return Output(to_reporter=[data]) if to_reporter else Output(frames=[data])
    if action == XDP_PASS:
        return Output(passed=True)
    return Output()


def route_egress(qp: QueuePair) -> int:
    """The interface towards a QP's collector: the configured one, else the route to the collector's IP, else
    0 (send back out of the interface the report came in on)."""
    if qp.interface:
        return interface_index(qp.interface)
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError
    try:
        with IPRoute() as ipr:
            return ipr.route("get", dst=socket.inet_ntoa(qp.collector_ip))[0].get_attr("RTA_OIF") or 0
    except NetlinkError:
        return 0


def routes_once() -> Callable[[QueuePair], int]:
    """`route_egress`, asking the kernel once per interface and collector: one apply routes many QPs to each."""
    found: dict[tuple[str, bytes], int] = {}

    def egress(qp: QueuePair) -> int:
        towards = (qp.interface, qp.collector_ip)
        if towards not in found:
            found[towards] = route_egress(qp)
        return found[towards]

    return egress


def check_queues(tables: Tables, interfaces: list[str]) -> None:
    """Refuse interfaces with more RX queues than some structure has QPs for: its reports on the others would
    be dropped (DROP_NO_QUEUE_QP)."""
    limit, owner = tables.queue_limit()
    for name in interfaces:
        queues = rx_queues(interface_index(name))
        if queues > limit:
            raise EngineError(f"{name} has {queues} RX queues, and {owner} has a QP for {limit}; give every "
                              f"structure one QP per RX queue (a qp array in the tables; --collector asks for "
                              f"them), or lower the queues (ethtool -L {name} combined {limit})")


def check_across(tables: Tables, egress: Callable[[QueuePair], int]) -> None:
    """Refuse a fleet with copies across replicas whose copies the program cannot send as one report's frames: it
    sends them all out of one interface (one broadcast, or the tc stage), and a QP's frames must always take one
    path (the one for redundant reports when its structure takes them), or they could leave out of PSN order."""
    fleet = tables.fleet
    if fleet is None or not fleet.across:
        return
    replicas = {ip for owners in fleet.slots for ip in owners}
    for primitive in {s.primitive for s in tables.structures if registry.by_opcode(s.primitive).redundant}:
        name = registry.by_opcode(primitive).name
        structures = [s for s in tables.structures if s.primitive == primitive and s.qp.collector_ip in replicas]
        if len({s.redundancy > 1 for s in structures}) > 1:
            listed = ", ".join(f"{s.name} (redundancy {s.redundancy})" for s in structures)
            raise TableError(f"[fleet] across: the {name} structures of the fleet's collectors must all take "
                             f"redundancy 1, or all more than 1, for the XDP engine to send copies across them: "
                             f"{listed}; align their redundancy, or run the python engine")
        interfaces = {egress(qp) for s in structures for qp in s.qps}
        if len(interfaces) > 1:
            raise TableError(f"[fleet] across: the {name} structures of the fleet's collectors are reached through "
                             f"{len(interfaces)} interfaces, and the XDP engine sends a report's copies out of one; "
                             "route the collectors through one interface, or run the python engine")


def rx_queues(ifindex: int) -> int:
    """RX queues of an interface, from netlink (sysfs shows the namespace it was mounted in, not ours)."""
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        return ipr.link("get", index=ifindex)[0].get_attr("IFLA_NUM_RX_QUEUES") or 1


def interface_index(name: str) -> int:
    if not name:
        return 0
    try:
        return socket.if_nametoindex(name)
    except OSError:
        raise EngineError(f"interface {name!r} does not exist in this network namespace; check `ip link`") from None
