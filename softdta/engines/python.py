"""The python engine: the batch translator (core/batch.py) over the reference translator's state, on the wire.

A tiny XDP program (bpf/xsk_steer.bpf.c) steers DTA reports and collectors' ACKs into an AF_XDP socket; the
engine takes them a batch at a time, translates the batch (every built-in primitive vectorized, and plug-ins
with `translate_batch`; everything else through the oracle in order), and transmits what comes out, a batch
per call: from XDP, through the same program (softdta.kernel.xdp_transmit), where the interface takes frames
from XDP (a veth whose peer runs XDP), else through the AF_XDP socket.
Without AF_XDP it falls back to an AF_PACKET TPACKET_V3 ring. Tables come from the same TOML or collector
control links as the XDP engine's, and the counters and QP state go into maps with the XDP engine's layouts,
pinned in the same place, so `softdta translator stats` and `softdta lab status` read both.
"""

from __future__ import annotations

import queue
import select
import socket
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from softdta.core.batch import BatchTranslator
from softdta.core.control_plane import DEFAULT_FLUSH_IDLE_NS, LiveQp, PsnRestart, restart_psn
from softdta.core.primitives import Output, Primitive
from softdta.core.tables import QueuePair, Tables
from softdta.core.translator import QpRuntime, Translator
from softdta.engines.engine import QpStatus, Stop, report_adoptions
from softdta.engines.xdp import CpuTime, QpStats, check_queues, pinned_stats, rx_queues
from softdta.kernel.bpf import BpfError, BpfObject, Map, attach_xdp, detach_xdp
from softdta.kernel.heap import keep_freed_memory
from softdta.kernel.maps import map_layout, record
from softdta.kernel.netdev import NetdevError
from softdta.kernel.programs import EngineError, build_object
from softdta.kernel.resources import BPF_DIR
from softdta.kernel.xdp_transmit import XdpTransmitter
from softdta.kernel.xsk import PacketRing, XskError, XskSocket
from softdta.spec import DTA_PORT, TRANSMIT_FRAME_MAX, QpState, TranslatorCounter
from softdta.wire.columns import FrameRows, frame_lengths, udp_dports

STEER_SOURCE = BPF_DIR / "xsk_steer.bpf.c"
IO_CHOICES = ("auto", "af_xdp", "af_packet")
# auto: from XDP where the interface takes frames from it, else through the queue's socket; socket: always there
TRANSMIT_CHOICES = ("auto", "socket")
IO_CODES = {"AF_XDP copy": 1, "AF_XDP zero-copy": 2, "AF_PACKET TPACKET_V3": 3}
# The most frames one step takes: a vector batch has a fixed cost, which larger steps amortize (Key-Write N=1,
# live: about 490 k reports/s per core at 4096 against 410 k at 2048 and 300 k at 1024; docs/benchmarks.md).
# The AF_XDP RX ring holds one such step. A step is what waits in the ring: at low rates, a few frames.
BATCH = 4096
PUBLISH_INTERVAL_NS = 100_000_000
MAX_DRAIN_NS = 100_000_000  # under overload, still tick (tables, flush, stats) this often
# Before a step, the engine waits up to this long for a whole step's frames to gather in its ring. A step's fixed
# cost (its numpy calls, a few per layout and structure in it) is as high for 50 frames as for 4096: the demo's
# mix costs 20 us a report in steps of 256 against 2.5 us in steps of 4096, translation alone. Taking whatever
# waited at each wake-up, the engine spent its CPU on fixed costs exactly when the senders and the kernel's
# receive path needed it. At most a quarter of the idle flush's time, so that a path's hops never wait in the
# ring for a good part of it.
GATHER_NS = 10_000_000
GATHER_POLL_S = 0.0002
# A stream at more than 5 k frames/s never pauses this long; a sender that waits for its reports to be taken (the
# lab's demo) waits this long for each step, which at 1 ms cost the demo 11-29 % of its rate (docs/lab.md).
GATHER_IDLE_NS = 200_000
# published after every step, for whoever paces a sender by them (softdta.lab.demo)
PROGRESS_COUNTERS = (TranslatorCounter.RX_REPORTS, TranslatorCounter.TX_FRAMES)
# Reports on their way through the socket, counted outside the translator: by the XDP program as it passes them
# to the socket, and by the engine as it takes them off it, published before the step translates them, so that a
# paced sender may fill the ring with the next step meanwhile.
SOCKET_COUNTERS = (TranslatorCounter.RX_TO_SOCKET, TranslatorCounter.RX_FROM_SOCKET)
# each RX queue's packet I/O, in map `xsk_io` (bpf/xsk_steer.bpf.c): its socket's statistics, steps and wake-ups
_IO_RECORD = record("xsk_io_value")
IO_STATS = tuple(_IO_RECORD.names)
# the frames dropped, by reason: no free frame in the fill ring (counted in rx_dropped too, and veth counts them as the
# interface's rx_dropped), a full RX ring, a descriptor the kernel could not use
IO_DROPS = ("rx_dropped", "rx_ring_full", "rx_fill_ring_empty_descs", "rx_invalid_descs")


class PythonEngine:
    """One python translator: `attach` opens the packet I/O on an interface, `serve` runs until stopped."""

    def __init__(self, tables: Tables, *, pin_dir: str | Path | None = None,
                 flush_idle_ns: int = DEFAULT_FLUSH_IDLE_NS, plugins: Iterable[type[Primitive]] = (),
                 io: str = "auto", gather_ns: int | None = None, transmit: str = "auto"):
        """`gather_ns`: how long a step waits for a whole step's frames (default GATHER_NS, at most a quarter of
        `flush_idle_ns`; 0: a step takes what waits). `transmit`: one of TRANSMIT_CHOICES. Frames sent from XDP
        cost the least, but a full ring on the way drops them; the socket's, where the interface has a queueing
        discipline, wait for room instead (docs/lab.md)."""
        if io not in IO_CHOICES:
            raise EngineError(f"--io {io}: choose one of {', '.join(IO_CHOICES)}")
        if transmit not in TRANSMIT_CHOICES:
            raise EngineError(f"--transmit {transmit}: choose one of {', '.join(TRANSMIT_CHOICES)}")
        self.transmit_choice = transmit
        keep_freed_memory()  # else each step faults its arrays' memory in again (softdta.kernel.heap)
        self.translator = Translator(tables, tuple(plugins))
        self.batch = BatchTranslator(self.translator)
        self.flush_idle_ns, self.io_choice = flush_idle_ns, io
        self.gather_ns = min(GATHER_NS, flush_idle_ns // 4) if gather_ns is None else gather_ns
        try:
            self.object = BpfObject(build_object(STEER_SOURCE), pin_dir=pin_dir)
        except BpfError as error:
            raise EngineError(f"cannot load the AF_XDP steering program: {error}") from None
        self.maps: dict[str, Map] = self.object.maps
        self.from_socket = 0  # reports taken off the AF_XDP sockets (RX_FROM_SOCKET)
        for counter in SOCKET_COUNTERS:  # from 0, as the engine's own counts: pins may be reused
            self._publish_count(counter, 0)
        self.queues: list[XskSocket | PacketRing] = []  # packet I/O of RX queue 0, 1, ... (AF_PACKET: one for all)
        self.io_name = ""
        self.attached: list[int] = []
        self.interfaces: list[str] = []
        self.deferred: list[tuple[int, bytes]] = []  # essential reports waiting for their QP, with their RX queue
        self.run_time_ns = self.runs = 0
        self.steps: list[int] = []  # steps taken on each RX queue
        self.wakeups = 0  # times the loop found frames after waiting for them
        self.fallback_reason = ""  # why AF_XDP was not used, when it was not
        self.transmitter: XdpTransmitter | None = None  # frames from XDP, when the interface takes them
        self.transmit_reason = ""  # why frames do not leave from XDP, when they do not
        self._published_ns = 0
        self._published_qps: dict[int, tuple[int, ...]] = {}  # what the pins hold of each QP's state
        self._qp_indices: set[int] = set()
        # the start PSN each restored QP state was made under, by local QPN (what `apply` compares tables with)
        self._restored_start_psns: dict[int, int] = {}
        self._restore_qp_state(tables)
        self.apply(tables)

    def close(self) -> None:
        self.publish()
        self.detach()
        self.object.close()

    def __enter__(self) -> PythonEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def tables(self) -> Tables:
        return self.translator.tables

    def process(self, frame: bytes, now_ns: int = 0) -> Output:
        """One frame through the engine's translator, off the wire."""
        return self.translator.process(frame, now_ns)

    def flush_idle(self, now_ns: int = 0) -> list[bytes]:
        return self.translator.flush_idle(now_ns)

    def counts(self) -> Counter[TranslatorCounter]:
        return self.translator.counts()

    def apply(self, tables: Tables) -> None:
        """New tables, live: a QP that stays (same local and remote QPN) keeps its PSN and state, unless it failed
        (its collector re-created its end): it starts over at its start_psn. With an AF_XDP socket per RX queue,
        tables that give some structure fewer QPs than that are refused."""
        if len(self.queues) > 1:
            check_queues(tables, self.interfaces)
        held = {qp.local_qpn: (qp, self.translator.qp_state[qp.index]) for qp in self.translator.tables.qps
                if qp.index in self.translator.qp_state and self.translator.qp_state[qp.index].state != QpState.FAILED}
        restored, self._restored_start_psns = self._restored_start_psns, {}
        states: dict[int, QpRuntime] = {}
        restarts: list[PsnRestart] = []
        for qp in tables.qps:
            before, runtime = held.get(qp.local_qpn, (None, None))
            live = None if before is None or runtime is None else LiveQp(
                before.remote_qpn, restored.get(before.local_qpn, before.start_psn), runtime.next_psn,
                runtime.unacked_psn)
            psn = restart_psn(qp, live)
            if psn is None:
                assert runtime is not None  # restart_psn keeps only a QP with live state
                states[qp.index] = runtime
            else:
                states[qp.index] = QpRuntime(psn)
                restarts.append(PsnRestart(qp.name, qp.local_qpn, psn, live.next_psn if live else None))
        self.translator.qp_state = states
        self.translator.counters[TranslatorCounter.PSN_ADOPTED] += report_adoptions(restarts)
        self.translator.retable(tables)
        collectors, layout = self.maps["collector"], map_layout("collector")
        wanted = {layout.key.pack(ip=int.from_bytes(qp.collector_ip, "little")): layout.value.pack(mac=qp.collector_mac)
                  for qp in tables.qps}
        for raw in set(collectors.keys()) - set(wanted):
            collectors.delete(raw)
        for key, value in wanted.items():
            collectors.update(key, value)
        layout = map_layout("qp")
        for index in self._qp_indices - {qp.index for qp in tables.qps}:
            self.maps["qp"].update(layout.key.pack(qp_index=index), bytes(layout.value.size))
        for qp in tables.qps:
            self.maps["qp"].update(layout.key.pack(qp_index=qp.index), layout.value.pack(
                remote_qpn=qp.remote_qpn, local_qpn=qp.local_qpn, rkey=qp.rkey,
                collector_ip=int.from_bytes(qp.collector_ip, "little"), collector_mac=qp.collector_mac,
                transport=int(qp.transport), start_psn=qp.start_psn, base_va=qp.base_va, length=qp.length))
        self._qp_indices = {qp.index for qp in tables.qps}
        self.publish()

    def qp_state(self, qp: QueuePair) -> QpStatus:
        """A QP's PSN and state, in the fields `XdpTranslator.qp_state` reads from its map."""
        # another thread (rdma_cm links) may ask while `apply` swaps the tables: a QP not yet in the state
        # is one being added, at its start
        runtime = self.translator.qp_state.get(qp.index) or QpRuntime(qp.start_psn)
        return QpStatus(next_psn=runtime.next_psn, unacked_psn=cast(int, runtime.unacked_psn),  # set by __post_init__
                        state=int(runtime.state), grace_until_ns=runtime.grace_until_ns,
                        frames_sent=runtime.frames_sent)

    def _restore_qp_state(self, tables: Tables) -> None:
        """PSNs and QP states a previous run left in the pinned maps, for QPs that are still the same ones."""
        qp_layout, state_layout = map_layout("qp"), map_layout("qp_state")
        for qp in tables.qps:
            key = qp_layout.key.pack(qp_index=qp.index)
            pinned_qp, pinned_state = self.maps["qp"].lookup(key), self.maps["qp_state"].lookup(key)
            if pinned_qp is None or pinned_state is None:
                continue
            entry, state = qp_layout.value.unpack(pinned_qp), state_layout.value.unpack(pinned_state)
            if (entry["local_qpn"], entry["remote_qpn"]) == (qp.local_qpn, qp.remote_qpn):
                self._restored_start_psns[qp.local_qpn] = entry["start_psn"]
                self.translator.qp_state[qp.index] = QpRuntime(
                    state["next_psn"], QpState(state["state"]), state["grace_until_ns"], state["frames_sent"],
                    state["flush_mark"], state["flush_mark_ns"], state["unacked_psn"])

    # ----------------------------------------------------------------------------------------------
    # packet I/O

    def attach(self, interfaces: list[str], mode: str = "native") -> None:
        """An AF_XDP socket on each RX queue of the interface (the steering program attached in `mode`), each
        queue's reports written through its QPs; else AF_PACKET, which takes the frames of every queue and writes
        them through queue 0's."""
        if len(interfaces) != 1:
            raise EngineError("the python engine translates on one interface (reports in, RoCEv2 out); give one -i")
        name = interfaces[0]
        if name == "lo":  # its program sends the engine's frames in test runs on the loopback
            raise EngineError("the python engine does not translate on the loopback; give the interface the "
                              "reports arrive on")
        try:
            ifindex = socket.if_nametoindex(name)
        except OSError:
            raise EngineError(f"interface {name!r} does not exist in this network namespace; check `ip link`") \
                from None
        failure = ""
        if self.io_choice in ("auto", "af_xdp"):
            try:
                check_queues(self.tables, interfaces)
                for queue in range(rx_queues(ifindex)):
                    self.queues.append(XskSocket(name, queue))
                    # before any redirect to it
                    self.maps["xsks"].update(queue.to_bytes(4, "little"), self.queues[-1].fd.to_bytes(4, "little"))
                attach_xdp(ifindex, self.object.programs["softdta_xsk"].fd, mode=mode)
                self.attached.append(ifindex)
                self.interfaces = [name]
                self.io_name = f"AF_XDP {self.queues[0].mode}"
                if self.transmit_choice == "auto":
                    self.transmitter = XdpTransmitter(self.object, ifindex)
                    self._follow_transmit_path()
                else:
                    self.transmit_reason = "--transmit socket asks for it"
            except (XskError, BpfError, EngineError) as error:
                self.detach()
                failure = str(error)
                if self.io_choice == "af_xdp":
                    raise EngineError(f"AF_XDP is unavailable on {name}: {error}; try --io af_packet") from None
        if not self.queues:
            try:
                self.queues = [PacketRing(name)]
            except (XskError, PermissionError) as error:
                raise EngineError(f"cannot open an AF_PACKET ring on {name}: {error}") from None
            self.io_name = "AF_PACKET TPACKET_V3"
        self.fallback_reason = failure
        self.steps, self.wakeups = [0] * len(self.queues), 0
        for rx_queue in range(self.maps["xsk_io"].max_entries):  # a reused pin directory: another engine's queues
            self.maps["xsk_io"].update(rx_queue.to_bytes(4, "little"), bytes(_IO_RECORD.size))
        self.publish()

    def detach(self) -> None:
        if self.transmitter is not None:
            self.transmitter.close()
            self.transmitter = None
        while self.attached:
            detach_xdp(self.attached.pop())
        for rx_queue, io in enumerate(self.queues):
            if isinstance(io, XskSocket):  # the map holds the socket: the queue is free only without it
                self.maps["xsks"].delete(rx_queue.to_bytes(4, "little"))
            io.close()
        self.queues, self.interfaces = [], []

    # ----------------------------------------------------------------------------------------------
    # the loop

    def step(self, limit: int = BATCH) -> int:
        """Translate one batch from each RX queue's ring (through that queue's QPs) and transmit what it produced
        on the same queue; returns the frames taken."""
        taken = 0
        for rx_queue, io in enumerate(self.queues):
            started = time.thread_time_ns()
            frames = io.receive(limit)
            if not frames:
                continue
            self.steps[rx_queue] += 1
            if isinstance(frames, FrameRows):
                self.from_socket += int((udp_dports(frames) == DTA_PORT).sum())
                self._publish_count(TranslatorCounter.RX_FROM_SOCKET, self.from_socket)
            out = self.batch.process_batch(frames, time.monotonic_ns(), rx_queue)
            self.deferred += [(rx_queue, frames[position]) for position in out.deferred]
            self._transmit(io, [*out.runs, out.to_reporter])
            self.run_time_ns += time.thread_time_ns() - started
            self.runs += len(frames)
            taken += len(frames)
        if taken:  # a sender that paces by them (the lab's demo) must not wait for the next full publication
            self._publish_counters(PROGRESS_COUNTERS)
        return taken

    def tick(self, now: int | None = None) -> None:
        """Flush idle Append batches and Postcarding paths, retry deferred essential reports, publish stats."""
        now = time.monotonic_ns() if now is None else now
        started = time.thread_time_ns()
        # the flush writes only QPs idle for flush_idle_ns: nothing of theirs is still queued on another socket
        frames = self.translator.flush_idle(now, self.flush_idle_ns)
        waiting, self.deferred = self.deferred, []
        for rx_queue, frame in waiting:
            out = self.translator.process(frame, now, rx_queue)
            if out.deferred:
                self.deferred.append((rx_queue, frame))
            frames += out.frames + out.to_reporter
        if frames:
            self._transmit(self.queues[0], [frames])
        for io in self.queues:  # what a full ring on the way held up past a send's wait
            if isinstance(io, XskSocket):
                io.transmit_pending()
        self.run_time_ns += time.thread_time_ns() - started
        if now - self._published_ns >= PUBLISH_INTERVAL_NS:
            self._follow_transmit_path()
            self.publish()
            self._published_ns = now

    def _transmit(self, io: XskSocket | PacketRing, runs: list[Sequence[bytes]]) -> None:
        """Runs of frames, in order: from XDP when the interface takes frames from it; else, or when a frame is
        too long for a transmit slot (a plug-in's), through the queue's socket. The QPs' PSNs are pinned first:
        an engine killed while they leave restarts at or past every PSN it sent, never re-using one (which an RC
        responder would take for a duplicate, and acknowledge without writing)."""
        runs = [run for run in runs if len(run)]
        if runs:
            self._publish_qp_state()
        if self.transmit_path == "XDP" and all(frame_lengths(run).max() <= TRANSMIT_FRAME_MAX for run in runs):
            for run in runs:
                cast(XdpTransmitter, self.transmitter).send(run)
        elif runs:
            io.send([frame for run in runs for frame in run])

    @property
    def transmit_path(self) -> str:
        if self.transmitter is not None and not self.transmit_reason:
            return "XDP"
        return "AF_PACKET TX ring" if isinstance(self.queues[0] if self.queues else None, PacketRing) \
            else "AF_XDP socket"

    def _follow_transmit_path(self) -> None:
        """Whether frames can leave from XDP: the kernel says so per interface, and a veth's answer changes as
        its peer loads or unloads XDP; asked at attach and then at every stats publication."""
        if self.transmitter is None:
            return
        try:
            takes = self.transmitter.interface_takes_frames()
            self.transmit_reason = "" if takes else \
                f"{self.interfaces[0]} takes no frames from XDP (a veth does only while its peer runs XDP)"
        except NetdevError as error:
            self.transmit_reason = f"the kernel does not say whether {self.interfaces[0]} takes frames from XDP " \
                f"({error.strerror})"

    def serve(self, stop: Stop, updates: queue.Queue[Tables] | None = None) -> None:
        """Translate until `stop` is set; when the ring is empty, ticks at half the idle-flush time (at least
        100 µs, at most the stats' publication interval) and applies new tables from `updates`; sees `stop`
        within 100 ms. On AF_XDP the thread stays on the CPU its frames leave from (`XdpTransmitter.pinned`)."""
        interval = min(max(self.flush_idle_ns // 2, 100_000), PUBLISH_INTERVAL_NS)
        with self.transmitter.pinned() if self.transmitter is not None else nullcontext():
            self._serve(stop, updates, interval)

    def _serve(self, stop: Stop, updates: queue.Queue[Tables] | None, interval: int) -> None:
        next_tick = time.monotonic_ns() + interval
        while not stop.is_set():
            if self._wait(min(max(1, interval // 1_000_000), 100)):
                self.wakeups += 1
                # Drain the ring before flushing: a path's last hops may be waiting in it, and the idle flush
                # must judge idleness by what has been translated, not by the clock alone.
                deadline = time.monotonic_ns() + MAX_DRAIN_NS
                while True:
                    self._gather(stop)
                    if not self.step() or time.monotonic_ns() >= deadline:
                        break
            now = time.monotonic_ns()
            if now >= next_tick:
                while updates is not None and not updates.empty():
                    self.apply(updates.get_nowait())
                self.tick(now)
                next_tick = now + interval

    def _gather(self, stop: Stop) -> None:
        """Until a whole step waits on some queue, gather_ns passes (GATHER_NS), or nothing more came for
        GATHER_IDLE_NS: a burst that ended is a step, and a sender that waits for it to be taken (the lab's demo)
        is not kept waiting."""
        if not self.gather_ns:
            return
        now = time.monotonic_ns()
        until, waiting, changed = now + self.gather_ns, max(io.available() for io in self.queues), now
        while waiting < BATCH and now < until and now - changed < GATHER_IDLE_NS and not stop.is_set():
            time.sleep(GATHER_POLL_S)
            now, before, waiting = time.monotonic_ns(), waiting, max(io.available() for io in self.queues)
            if waiting != before:
                changed = now

    def _wait(self, timeout_ms: int) -> bool:
        """Whether frames wait on some queue, within `timeout_ms`."""
        if len(self.queues) == 1:
            return self.queues[0].wait(timeout_ms)
        return any(io.wait(0) for io in self.queues) or \
            bool(select.select([io.fd for io in self.queues], [], [], timeout_ms / 1000)[0])

    # ----------------------------------------------------------------------------------------------
    # stats, in the XDP engine's maps

    def _publish_counters(self, which: Iterable[TranslatorCounter]) -> None:
        tally = self.translator.counters
        for counter in which:
            self._publish_count(counter, tally[counter])

    def _publish_count(self, counter: TranslatorCounter, value: int) -> None:
        self.maps["counters"].update_percpu(int(counter).to_bytes(4, "little"), [value.to_bytes(8, "little")])

    def publish(self) -> None:
        """Counters, QP state and CPU time into the pinned maps, where `engine_stats` reads them."""
        # every slot: a reused pin directory may hold another engine's counts
        self._publish_counters(counter for counter in TranslatorCounter if counter not in SOCKET_COUNTERS)
        self._publish_count(TranslatorCounter.RX_FROM_SOCKET, self.from_socket)
        self._publish_qp_state()
        value = record("python_engine_value").pack(run_time_ns=self.run_time_ns, runs=self.runs,
                                                   io=IO_CODES.get(self.io_name, 0),
                                                   transmit=int(self.transmit_path == "XDP"))
        self.maps["python_engine"].update(bytes(4), value)
        for rx_queue, io in enumerate(self.queues):
            counts = io.statistics()
            self.maps["xsk_io"].update(rx_queue.to_bytes(4, "little"), _IO_RECORD.pack(
                **counts, steps=self.steps[rx_queue], wakeups=self.wakeups))

    def _publish_qp_state(self) -> None:
        """Each QP's state into the pinned map where it differs from what the map holds."""
        layout = map_layout("qp_state")
        for index, runtime in self.translator.qp_state.items():
            # unacked_psn is set by QpRuntime.__post_init__
            state = (runtime.next_psn, int(runtime.state), runtime.grace_until_ns, runtime.flush_mark_ns,
                     runtime.frames_sent & 0xFFFFFFFF, runtime.flush_mark & 0xFFFFFFFF, cast(int, runtime.unacked_psn))
            if self._published_qps.get(index) == state:
                continue
            next_psn, code, grace_until_ns, flush_mark_ns, frames_sent, flush_mark, unacked_psn = state
            self.maps["qp_state"].update(layout.key.pack(qp_index=index), layout.value.pack(
                next_psn=next_psn, state=code, grace_until_ns=grace_until_ns, flush_mark_ns=flush_mark_ns,
                frames_sent=frames_sent, flush_mark=flush_mark, unacked_psn=unacked_psn))
            self._published_qps[index] = state


class EngineInfo(TypedDict):
    name: str  # "python" or "xdp"
    io: NotRequired[str]  # the python engine's packet I/O (an IO_CODES name) or "not attached"
    transmit: NotRequired[str]  # where its frames leave: "XDP" or "packet I/O"
    # its packet I/O's drops by reason, steps and wake-ups (IO_STATS), summed over its RX queues; the drops happen
    # in the kernel's receive path, and the interface counts them too, as rx_dropped
    io_stats: NotRequired[dict[str, int]]


class EngineStats(TypedDict):
    counters: dict[str, int]
    qps: list[QpStats]
    cpu: dict[str, CpuTime]
    engine: EngineInfo


def engine_stats(pin_dir: Path) -> EngineStats:
    """`pinned_stats` for either engine: the python engine adds its CPU time and which packet I/O it used."""
    pinned = pinned_stats(pin_dir)
    path = pin_dir / "python_engine"
    if not path.exists():
        return EngineStats(counters=pinned["counters"], qps=pinned["qps"], cpu=pinned["cpu"],
                           engine=EngineInfo(name="xdp"))
    with Map.from_pinned(path) as engine:
        raw = engine.lookup(bytes(4))
    assert raw is not None  # an array map always has its entry
    value = record("python_engine_value").unpack(raw)
    names = {code: name for name, code in IO_CODES.items()}
    info = EngineInfo(name="python", io=names.get(value["io"], "not attached"),
                      transmit="XDP" if value["transmit"] else "packet I/O")
    if (pin_dir / "xsk_io").exists():
        info["io_stats"] = io_stats(pin_dir)
    return EngineStats(counters=pinned["counters"], qps=pinned["qps"],
                       cpu={"python_engine": CpuTime(run_time_ns=value["run_time_ns"], runs=value["runs"])},
                       engine=info)


def io_stats(pin_dir: Path) -> dict[str, int]:
    """The python engine's IO_STATS from its pinned map `xsk_io`: drops by reason and steps summed over its RX
    queues, its wake-ups."""
    totals = dict.fromkeys(IO_STATS, 0)
    with Map.from_pinned(pin_dir / "xsk_io") as queues:
        for _, raw in queues.items():
            for name, count in _IO_RECORD.unpack(raw).items():
                totals[name] = max(totals[name], count) if name == "wakeups" else totals[name] + count
    return totals
