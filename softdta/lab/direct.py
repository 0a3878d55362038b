"""The direct path: kernel report generators -> veth -> the XDP translator, with a QP per RX queue -> veth -> the
XDP responder, in namespaces of its own and without the lab's bridge. It is the fastest live path this machine
has: `softdta bench` climbs a ladder of rates on it, and `softdta demo` runs a few seconds at a high rate on it
and reads the collector's memory back.

`bare=True` is the floor the same generators, veth pairs and CPUs reach: a forwarder in the translator's place that
only rewrites the MACs, sizes the frame as the translator's WRITE for the report and redirects it, and a sink in the
responder's place that counts and drops (bpf/floor.bpf.c). `softdta bench` gives every live figure as a fraction
of it.

Generator q runs in a thread pinned to CPU q: veth hands a frame to the RX queue of the CPU that sends it, so
queue q takes generator q's reports. Its keys are its own (`keys` of them from q x `keys` on, in the last four
key bytes), and report i of it writes data i, so the collector's memory is predictable key by key.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import NotRequired, TypedDict

import numpy as np

from softdta.collector.backend import Peer
from softdta.collector.collector import Collector, tables_document
from softdta.collector.config import CollectorConfig
from softdta.collector.control import QUEUE_QPN_STRIDE
from softdta.collector.xdp_backend import XdpBackend
from softdta.core.analysis import expected_success, key_write_success_chances
from softdta.core.generator import plan
from softdta.core.primitives.key_write.queries import key_write_query
from softdta.core.primitives.key_write.region import KeyWriteRegion
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.core.workload import ReporterAddress
from softdta.engines.xdp import XdpTranslator
from softdta.kernel.bpf import BpfObject, attach_xdp, enable_run_stats, run_stats
from softdta.kernel.generator import KernelReporter
from softdta.kernel.maps import map_layout
from softdta.kernel.netns import Namespace, address, cleanup_prefix, in_netns, link_drops, veth_pair
from softdta.kernel.programs import FLOOR_SOURCE, build_object
from softdta.lab import topology as lab
from softdta.spec import DtaOpcode, FloorCounter, TranslatorCounter
from softdta.wire import dta
from softdta.wire.frames import ip_bytes, mac_bytes

KEY_LEN, DATA_LEN = 13, 20
SLOTS = 1 << 16  # of the Key-Write structure
SETTLE_S = 3.0  # how long the last reports of a step may still be on their way


class HopCounts(TypedDict):
    """Counters along a live path, each a total since its start."""

    translated: int  # reports the translator took
    emitted: int  # RoCEv2 frames it sent
    translator_drops: int
    executed: int  # requests the collector executed
    links: dict[str, int]  # frames each link dropped ("namespace/interface")


class PathCounts(HopCounts):
    run_ns: dict[str, int]  # CPU time of each stage's program, while run-time statistics are on


class StepResult(TypedDict):
    offered: float  # reports/s (0: as fast as the generators go)
    achieved: int
    sent: int
    executed: int
    lost: dict[str, int]  # by where (`losses`)
    lossless: bool
    cpu_ns_per_report: NotRequired[dict[str, int]]  # by stage, in a profiled step


class KeyWriteCheck(TypedDict):
    keys: int
    correct: int  # keys answered with their last report's data
    success: float
    expected: float  # the success the analysis expects, and its standard deviation
    spread: float
    load: float  # keys per slot


def losses(before: HopCounts, after: HopCounts, sent: int) -> dict[str, int]:
    """Where `sent` reports went missing between two readings of a live path, hop by hop (nonzero hops only):
    before the translator took them, dropped in it, between it and the collector, and on each link."""
    lost = {"before_translator": sent - (after["translated"] - before["translated"]),
            "in_translator": after["translator_drops"] - before["translator_drops"],
            "before_collector": (after["emitted"] - before["emitted"]) - (after["executed"] - before["executed"]),
            **{f"link {name}": n - before["links"].get(name, 0) for name, n in after["links"].items()}}
    return {where: n for where, n in lost.items() if n}


class DirectPath:
    """Key-Write N=`copies` reports (13-byte keys, 20-byte data) over the direct path. The Key-Write structure
    takes `redundancy` copies at most (at least `copies`): at 1 its frames leave with a redirect; above that as
    one broadcast to the translator's `copies` devmap, or with `via_tc` through the tc stage. `bare`: the floor,
    with the forwarder and the sink in the translator's and the responder's places (N=1)."""

    def __init__(self, queues: int = 2, keys: int = 4096, redundancy: int = 1, bare: bool = False,
                 copies: int = 1, via_tc: bool = False):
        if copies > redundancy or (bare and copies > 1):
            raise ValueError(f"direct path: {copies} copies need the translator (not the bare floor) and a "
                             f"structure of redundancy {copies} or more, not {redundancy}")
        self.queues, self.keys, self.redundancy, self.bare = queues, keys, redundancy, bare
        self.copies, self.via_tc = copies, via_tc
        self.prefix = f"sdta-direct{os.getpid()}-"
        cleanup_prefix(self.prefix)
        self.collector: Collector | None = None
        self.kernel: XdpTranslator | None = None
        self.floor: BpfObject | None = None
        self.write_len = 0  # bare: the length the forwarder gives each frame, the translator's WRITE's
        self.generators: list[KernelReporter] = []
        try:
            self._up()
        except BaseException:
            self.close()
            raise

    def _up(self) -> None:
        reporter_ns, translator_ns, collector_ns = (Namespace.create(self.prefix + name) for name in "rtc")
        self.namespaces = (reporter_ns.name, translator_ns.name, collector_ns.name)
        queues = self.queues
        veth_pair(reporter_ns, "r0", translator_ns, "t0", mac_b=lab.TRANSLATOR_MAC, queues=queues)
        # as many queues towards the collector: a frame keeps the queue its report came in on, so each responder
        # queue takes the QPs of one translator queue, in order, on that queue's CPU
        veth_pair(translator_ns, "t1", collector_ns, "c0", mac_a=lab.TRANSLATOR_MAC, mac_b=lab.COLLECTOR_MAC,
                  queues=queues)
        self.cpus = sorted(os.sched_getaffinity(0))
        # XPS: what CPU q sends leaves on TX queue q (the flow hash would put every RoCE frame on one queue, and
        # both CPUs would fill its ring); a single queue takes no XPS map
        for queue in range(queues) if queues > 1 else ():
            translator_ns.run("sh", "-c", f"echo {1 << self.cpus[queue % len(self.cpus)]:x} > "
                                          f"/sys/class/net/t1/queues/tx-{queue}/xps_cpus")
        address(translator_ns, "t1", f"{lab.TRANSLATOR_IP}/16")
        address(collector_ns, "c0", f"{lab.COLLECTOR_IP}/16")
        config = CollectorConfig.from_dict({
            "collector": {"name": "direct", "ip": lab.COLLECTOR_IP, "mac": lab.COLLECTOR_MAC,
                          "interface": "" if self.bare else "c0"},
            "structures": [{"primitive": "key-write", "slots": SLOTS, "key_len": KEY_LEN, "data_len": DATA_LEN,
                            "redundancy": self.redundancy}]})
        with in_netns(collector_ns.name):
            backend = XdpBackend.for_config(config)
            self.collector = Collector(config, backend)
        translator = {"mac": lab.TRANSLATOR_MAC, "ip": lab.TRANSLATOR_IP}
        peer_of = [Peer(ip_bytes(lab.TRANSLATOR_IP), mac_bytes(lab.TRANSLATOR_MAC), 0x1000 + q * QUEUE_QPN_STRIDE, 0)
                   for q in range(queues)]
        adverts = [{**self.collector.connect("key-write", peer), "queue": queue} for queue, peer in enumerate(peer_of)]
        self.tables = Tables.from_dict(tables_document(translator, {"name": "direct", "ip": lab.COLLECTOR_IP,
                                                                    "mac": lab.COLLECTOR_MAC}, adverts))
        sender = ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), mac_bytes(lab.TRANSLATOR_MAC),
                                 ip_bytes(lab.COLLECTOR_IP))
        if self.bare:
            self._floor(sender)
        else:
            with in_netns(translator_ns.name):
                self.kernel = XdpTranslator(self.tables)
                self.kernel.attach(["t0", "t1"], copies_from_xdp=not self.via_tc)
        for queue in range(1, queues):  # where the generators after the first stay dispatched (lo holds one)
            reporter_ns.run("ip", "link", "add", f"hold{queue}", "type", "veth", "peer", f"hold{queue}p")
        for queue in range(queues):
            key = bytes(KEY_LEN - 4) + (queue * self.keys).to_bytes(4, "big")
            template = dta.key_write(key, bytes(DATA_LEN), self.copies, extended=True)
            self.generators.append(KernelReporter(plan(template, sender.frame(template), key_span=self.keys), "r0",
                                                  reporter_ns.name, holder=f"hold{queue}" if queue else "lo"))
        # where the CPU goes, per report: the translator's XDP, devmap and tc stages, and the responder
        if self.floor is not None:
            self.stages = {"floor_forward": self.floor.programs["softdta_floor_forward"].fd,
                           "floor_sink": self.floor.programs["softdta_floor_sink"].fd}
        else:
            assert self.kernel is not None
            self.stages = {"translator_xdp": self.kernel.xdp.fd, "translator_copy": self.kernel.copy.fd,
                           "translator_tc": self.kernel.fanout.fd, "responder_xdp": backend.responder.program.fd}

    def _floor(self, sender: ReporterAddress) -> None:
        """The forwarder on t0, giving each report the length of the WRITE the translator makes of it, and the sink
        on c0."""
        template = dta.key_write(bytes(KEY_LEN), bytes(DATA_LEN), 1, extended=True)
        write = Translator(self.tables).process(sender.frame(template)).frames[0]
        self.floor = BpfObject(build_object(FLOOR_SOURCE))
        _, translator_ns, collector_ns = self.namespaces
        with in_netns(translator_ns):
            self.floor.maps["floor_config"].update(bytes(4), map_layout("floor_config").value.pack(
                src_mac=mac_bytes(lab.TRANSLATOR_MAC), dst_mac=mac_bytes(lab.COLLECTOR_MAC), frame_len=len(write),
                ifindex=socket.if_nametoindex("t1")))
            attach_xdp(socket.if_nametoindex("t0"), self.floor.programs["softdta_floor_forward"].fd)
        with in_netns(collector_ns):
            attach_xdp(socket.if_nametoindex("c0"), self.floor.programs["softdta_floor_sink"].fd)
        self.write_len = len(write)

    def floor_counts(self) -> dict[FloorCounter, int]:
        assert self.floor is not None
        return {counter: self.floor.maps["floor_counters"].counter_total(counter) for counter in FloorCounter}

    def counts(self) -> PathCounts:
        assert self.collector is not None
        if self.floor is not None:
            floor = self.floor_counts()
            return {"translated": floor[FloorCounter.FORWARDED], "emitted": floor[FloorCounter.FORWARDED],
                    "translator_drops": 0, "executed": floor[FloorCounter.SUNK], "links": link_drops(self.namespaces),
                    "run_ns": {stage: run_stats(fd)[0] for stage, fd in self.stages.items()}}
        assert self.kernel is not None
        with in_netns(self.namespaces[1]):
            counters = self.kernel.counters()
        return {"translated": counters[TranslatorCounter.RX_REPORTS], "emitted": counters[TranslatorCounter.TX_FRAMES],
                "translator_drops": sum(n for counter, n in counters.items() if counter.name.startswith("DROP_")),
                "executed": self.collector.counters().get("executed", 0), "links": link_drops(self.namespaces),
                "run_ns": {stage: run_stats(fd)[0] for stage, fd in self.stages.items()}}

    def _generate(self, queue: int, rate: float, seconds: float, sent: list[int]) -> None:
        os.sched_setaffinity(0, {self.cpus[queue % len(self.cpus)]})
        sent[queue] = self.generators[queue].run(rate=rate / self.queues, seconds=seconds).frames

    def step(self, rate: float, seconds: float, profiled: bool = False) -> StepResult:
        """`seconds` of reports at `rate` over all generators (0: as fast as they go); lossless when every report
        was translated and executed and no link dropped a frame. `profiled` adds the CPU per report of each
        stage (run-time statistics cost two clock reads per program run: keep them for one step)."""
        stats = enable_run_stats() if profiled else None
        try:
            before, sent = self.counts(), [0] * self.queues
            threads = [threading.Thread(target=self._generate, args=(queue, rate, seconds, sent))
                       for queue in range(self.queues)]
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            elapsed = time.perf_counter() - started
            deadline = time.monotonic() + SETTLE_S
            while (after := self.counts())["executed"] - before["executed"] < self.copies * sum(sent) and \
                    time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            if stats is not None:
                os.close(stats)
        lost = losses(before, after, sum(sent))
        result: StepResult = {"offered": rate, "achieved": round(sum(sent) / elapsed), "sent": sum(sent),
                              "executed": after["executed"] - before["executed"], "lost": lost, "lossless": not lost}
        if profiled:
            result["cpu_ns_per_report"] = {stage: round((after["run_ns"][stage] - before["run_ns"][stage])
                                                        / max(1, sum(sent))) for stage in self.stages}
        return result

    def key_write_check(self) -> KeyWriteCheck:
        """Every key the generators sent, looked up in the collector's memory: how many give the data of their
        last report, beside the expected rate and its standard deviation at the store's load (N=1; a key loses only
        to a later key in its slot)."""
        assert self.collector is not None
        keys, data = [], []
        for generator in self.generators:
            for index in range(max(0, generator.sent - self.keys), generator.sent):  # each key's last report
                report = generator.plan.report_at(index)
                keys.append(report.key)
                data.append(report.data)
        if not keys:
            return {"keys": 0, "correct": 0, "success": 1.0, "expected": 1.0, "spread": 0.0, "load": 0.0}
        structure = self.tables.structure(ip_bytes(lab.COLLECTOR_IP), DtaOpcode.KEY_WRITE)
        assert structure is not None
        region = self.collector.structure_region(DtaOpcode.KEY_WRITE, ip_bytes(lab.COLLECTOR_IP))
        assert isinstance(region, KeyWriteRegion)  # Key-Write's region
        answer = key_write_query(region, np.frombuffer(b"".join(keys), np.uint8).reshape(len(keys), KEY_LEN),
                                 self.copies,
                                key_hash=structure.key_hash)
        expected = np.frombuffer(b"".join(data), np.uint8).reshape(len(keys), DATA_LEN)
        stored = answer.values.view(np.uint8).reshape(len(keys), -1)[:, :DATA_LEN]
        correct = int(np.count_nonzero(answer.found & (stored == expected).all(axis=1)))
        # keys written later fill the store further: each key's chance depends on the load after it
        later = np.arange(len(keys) - 1, -1, -1) / structure.slot_count
        rate, spread = expected_success(key_write_success_chances(later.tolist(), self.copies))
        return {"keys": len(keys), "correct": correct, "success": round(correct / len(keys), 4),
                "expected": round(rate, 4), "spread": round(spread, 4),
                "load": round(len(keys) / structure.slot_count, 4)}

    def close(self) -> None:
        for generator in self.generators:
            generator.close()
        self.generators = []
        if self.kernel is not None:
            with in_netns(self.namespaces[1]):
                self.kernel.close()
            self.kernel = None
        if self.floor is not None:  # its programs leave with the namespaces
            self.floor.close()
            self.floor = None
        if self.collector is not None:
            self.collector.close()
            self.collector = None
        cleanup_prefix(self.prefix)

    def __enter__(self) -> DirectPath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
