"""`softdta bench`: softdta against the alternatives a user would pick, measured side by side in one run.

Every comparison runs its contenders in the same process, one after the other, on the same reports, so the
ratios hold even though absolute times on a shared machine drift. Each timing is the median of several rounds,
kept with its min and max. See docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import json
import platform
import socket
import statistics
import subprocess
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from softdta.core import workload
from softdta.core.analysis import (
    key_write_empty_return_bound,
    key_write_wrong_output_bound,
    simulate_query_success_curve,
)
from softdta.core.offline import OfflineCollector
from softdta.core.regions import KeyWriteRegion
from softdta.core.tables import Tables, with_queue_qps
from softdta.core.translator import Translator
from softdta.spec import MAX_REDUNDANCY, ROCE_PORT, DtaOpcode, KeyHash, RoceOpcode, Transport
from softdta.wire import dta
from softdta.wire.frames import UdpEndpoints, ip_bytes, mac_bytes, parse_udp_frame
from softdta.wire.hashing import key_hashes_rows
from softdta.wire.roce import build_roce_frame, transport_payload

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "bench" / "bpf" / "translator_bench.bpf.c"
FLOOR = ROOT / "bench" / "bpf" / "floor.bpf.c"
C_COLLECTOR = ROOT / "bench" / "c_collector.c"
RESULTS = ROOT / "bench" / "results"
COLLECTOR_IP = ip_bytes("10.77.1.1")
ROUNDS = 5
WINDOW = 64  # reports in flight to a userspace contender, well within its socket buffer


def _stats(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "rounds": len(samples)}


def example_tables() -> Tables:
    """The example tables (examples/tables.toml), which every benchmark translates with."""
    return Tables.from_toml(ROOT / "examples" / "tables.toml")


def example_reporter(tables: Tables) -> workload.ReporterAddress:
    """A reporter that sends to the example tables' collector."""
    return workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac, COLLECTOR_IP)


def primitive_workloads(tables: Tables, count: int) -> dict[str, list[dta.Report]]:
    """Reports per primitive, as the example tables hold them."""
    lists = tables.append_lists[0]
    sketch = tables.structure(COLLECTOR_IP, DtaOpcode.SKETCH_MERGE)
    return {
        "key-write": workload.key_write(count, 1, 2),
        "key-increment": workload.key_increment(count, 2, 2, flows=200),
        "append": workload.append(count, 3, lists.lists, lists.first_list),
        "postcarding": workload.postcards(max(1, count // 5), 4, 5),
        "sketch-merge": workload.sketch_epoch(sketch.reporters, sketch.columns, sketch.rows, 5),
    }


# --------------------------------------------------------------------------------------------------
# Key-Write stores, filled with numpy exactly where the translator would have written

KEY_WRITE_SLOT_SIZE = 8  # u32 key checksum + 4 bytes of data
KEY_WRITE_DATA_LEN = 4
KEY_WRITE_LOAD = 0.1  # keys written per slot (each key writes N copies)


@dataclass
class KeyWriteStore:
    region: KeyWriteRegion
    redundancy: int
    scheme: KeyHash
    keys_written: int
    query_rows: np.ndarray  # (batch, 4) uint8 wire-order keys, a random sample of the written keys
    query_truth: np.ndarray  # their data as big-endian u32 (what key_write_query returns)


def _distinct_keys(rng: np.random.Generator, count: int) -> np.ndarray:
    keys = np.unique(rng.integers(0, 1 << 32, size=count + count // 8 + 1024, dtype=np.uint64).astype(np.uint32))
    rng.shuffle(keys)
    assert keys.size >= count
    return keys[:count]


def _key_rows(keys: np.ndarray) -> np.ndarray:
    """u32 keys to (count, 4) uint8 wire (big-endian) rows, as `hashing.keys_to_rows` but without u64 shifts."""
    return np.ascontiguousarray(keys.astype(">u4")).view(np.uint8).reshape(keys.size, 4)


def fill_key_write_store(slot_bits: int, redundancy: int, scheme: KeyHash, batch: int, seed: int = 24) -> KeyWriteStore:
    """A store of 2^slot_bits slots after LOAD * slots keys were each written N times, in arrival order.

    Per key, the translator writes (checksum, data) to the N slots of its copies; a later key overwrites an
    earlier one in a shared slot. A single numpy scatter over the key-major (key, copy) order reproduces that:
    for repeated indices the last assignment wins.
    """
    slot_count = 1 << slot_bits
    rng = np.random.default_rng(seed)
    count = int(KEY_WRITE_LOAD * slot_count)
    keys = _distinct_keys(rng, count)
    rows = _key_rows(keys)
    data = rng.integers(1, 1 << 32, size=count, dtype=np.uint64).astype(np.uint32)
    region = KeyWriteRegion(bytearray(slot_count * KEY_WRITE_SLOT_SIZE), KEY_WRITE_SLOT_SIZE, KEY_WRITE_DATA_LEN)
    checksums, hashes = key_hashes_rows(rows, redundancy, scheme)
    slots = (hashes & np.uint32(slot_count - 1)).T.ravel()  # key-major: key 0 copy 0..N-1, key 1, ...
    region.checksums[slots] = np.repeat(checksums, redundancy)
    words = region.data.view(">u4").reshape(slot_count)  # data as reported: big-endian on the wire
    words[slots] = np.repeat(data, redundancy)
    sample = rng.choice(count, size=min(batch, count), replace=False)
    return KeyWriteStore(region, redundancy, scheme, count, np.ascontiguousarray(rows[sample]), data[sample])


# --------------------------------------------------------------------------------------------------
# translator per report


def translator_kernel(count: int, repeat: int, cases: dict[str, list[dta.Report]] | None = None) -> dict:
    """ns per report of the XDP program (BPF_PROG_TEST_RUN, restore subtracted), per primitive (or `cases`)."""
    from softdta.engines.xdp import XdpTranslator
    results = {}
    tables = example_tables()
    reporter = example_reporter(tables)
    cases = cases or {"key-write": [dta.key_write(k, k, 2) for k in range(1, 17)],
                      "key-increment": [dta.key_increment(k, 1, 2) for k in range(1, 17)],
                      "append": [dta.append(tables.append_lists[0].first_list, v) for v in range(16)],
                      "postcarding": [dta.postcard(0x0A000001, hop, hop) for hop in range(1, 6)],
                      "sketch-merge": [dta.sketch_column(r, c, [c, r, 1, 2]) for c in range(8) for r in range(2)]}
    for name, reports in cases.items():
        frames = [reporter.frame(report) for report in reports]
        with XdpTranslator(example_tables(), source=HARNESS, flush_idle_ns=0) as kernel:
            load_reports(kernel, frames)
            restore = kernel.object.programs["bench_restore"]
            translate = kernel.object.programs["bench_translate"]
            restore_ns = statistics.median(restore.test_run(frames[0], repeat=repeat).duration_ns
                                           for _ in range(ROUNDS))
            kernel.maps["bench_cursor"].update(bytes(4), bytes(64))
            samples = [translate.test_run(frames[0], repeat=repeat).duration_ns - restore_ns for _ in range(ROUNDS)]
        results[name] = _stats(samples)
    return results


def translator_queue_scaling(repeat: int, rounds: int = ROUNDS, cases: dict[str, list[dta.Report]] | None = None
                             ) -> dict:
    """Reports/s of the XDP program on one RX queue against two at once, each on its own CPU with its own QPs
    (BPF_PROG_TEST_RUN on a two-queue veth, one thread per queue, pinned). Rounds alternate one and two queues;
    the scaling is the median of the paired rounds' ratios. The empty program, run the same way, is the
    machine's own scaling."""
    import os

    from softdta.engines.xdp import XdpTranslator
    from softdta.kernel.bpf import BpfObject, xdp_md
    from softdta.kernel.netns import Namespace, in_netns
    from softdta.kernel.programs import build_object

    tables = with_queue_qps(example_tables(), 2)
    reporter = example_reporter(tables)
    cases = cases or {"key-write N=1": [dta.key_write(k, k, 1) for k in range(1, 17)],
                      "key-increment N=1": [dta.key_increment(k, 1, 1) for k in range(1, 17)],
                      "append, one list shared by the queues": [dta.append(tables.append_lists[0].first_list, v)
                                                                for v in range(16)]}
    namespace = Namespace.create(f"sdta-scale-{os.getpid()}")
    results = {}
    try:
        namespace.run("ip", "link", "add", "q0", "numrxqueues", "2", "numtxqueues", "2", "type", "veth", "peer", "q1")
        with in_netns(namespace.name):
            contexts = [xdp_md(socket.if_nametoindex("q0"), queue) for queue in range(2)]
            for name, reports in cases.items():
                with XdpTranslator(tables, source=HARNESS, flush_idle_ns=0) as kernel:
                    frames = [reporter.frame(report) for report in reports]
                    load_reports(kernel, frames)
                    results[name] = _paired_scaling(kernel.object.programs["bench_translate"], frames[0], contexts,
                                                    repeat, rounds)
                    results[name]["drops"] = sum(n for counter, n in kernel.counters().items()
                                                 if counter.name.startswith("DROP_"))
            with BpfObject(build_object(FLOOR)) as floor:
                results["empty program"] = _paired_scaling(floor.programs["floor_empty"], bytes(80), contexts,
                                                           repeat, rounds)
    finally:
        namespace.delete()
    return results


def _paired_scaling(program, frame: bytes, contexts: list[bytes], repeat: int, rounds: int) -> dict:
    """Runs/s of `program` in one thread, and in two at once (thread q on CPU q, with context q)."""
    import os
    import threading

    cpus = sorted(os.sched_getaffinity(0))  # with one CPU, the two threads share it, and the figure says so

    def run(queue: int) -> None:
        os.sched_setaffinity(0, {cpus[queue % len(cpus)]})
        program.test_run(frame, repeat=repeat, ctx=contexts[queue])

    def rate(queues: int) -> float:
        threads = [threading.Thread(target=run, args=(queue,)) for queue in range(queues)]
        started = time.perf_counter_ns()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return queues * repeat / (time.perf_counter_ns() - started) * 1e9

    pairs = [(rate(1), rate(2)) for _ in range(rounds)]
    return {"one_queue_reports_per_s": round(statistics.median(one for one, _ in pairs)),
            "two_queues_reports_per_s": round(statistics.median(two for _, two in pairs)),
            "scaling": round(statistics.median(two / one for one, two in pairs), 2)}


def load_reports(kernel, frames: list[bytes]) -> None:
    """The harness's report set (bench/bpf/translator_bench.bpf.c: count, lengths, frames)."""
    reports = kernel.maps["bench_reports"]
    value = len(frames).to_bytes(4, "little")
    value += b"".join(len(f).to_bytes(4, "little") for f in frames).ljust(16 * 4, b"\0")
    value += b"".join(f.ljust(256, b"\0") for f in frames)
    reports.update(bytes(4), value.ljust(reports.value_size, b"\0"))


def translator_reference(count: int) -> dict:
    """ns per report of the pure-Python reference translator, per primitive."""
    tables = example_tables()
    reporter = example_reporter(tables)
    return {name: _reference_ns_per_frame([reporter.frame(report) for report in reports], time.perf_counter_ns)
            for name, reports in primitive_workloads(tables, count).items()}


def _reference_ns_per_frame(frames: list[bytes], clock) -> dict:
    """ROUNDS runs of a fresh reference translator over `frames`, timed with `clock`."""
    samples = []
    for _ in range(ROUNDS):
        translator = Translator(example_tables())
        started = clock()
        for frame in frames:
            translator.process(frame)
        samples.append((clock() - started) / len(frames))
    return _stats(samples)


def translator_userspace_udp(count: int) -> dict:
    """A translator written the usual userspace way: an asyncio (uvloop) UDP server that runs the reference
    translator on every datagram and sends the RoCEv2 payloads on with sendto. Reports/s over loopback."""
    import uvloop
    tables = example_tables()
    reports = workload.key_write(count, 1, 2)
    reporter = example_reporter(tables)
    payloads = [parse_udp_frame(reporter.frame(report)).payload for report in reports]
    samples = []
    for _ in range(ROUNDS):
        samples.append(uvloop.run(_udp_translator_round(payloads)))
    return {"key-write": _stats(samples)}


async def _udp_translator_round(payloads: list[bytes]) -> float:
    """ns per report, from the first datagram sent to the last RoCEv2 payload the sink receives. The sender keeps
    at most WINDOW reports in flight, so no socket buffer overflows and every report is translated."""
    loop = asyncio.get_running_loop()
    progress = _Progress(loop)
    sink_transport, _ = await loop.create_datagram_endpoint(lambda: _Sink(progress), local_addr=("127.0.0.1", 0))
    sink = sink_transport.get_extra_info("sockname")
    translator = Translator(example_tables())
    template = example_reporter(translator.tables)
    out_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    class Translate(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, address) -> None:
            frame = template.frame(dta.decode(data))  # what the kernel would hand an XDP program
            for emitted in translator.process(frame).frames:
                out_sock.sendto(parse_udp_frame(emitted).payload, sink)

    server, _ = await loop.create_datagram_endpoint(Translate, local_addr=("127.0.0.1", 0))
    target = server.get_extra_info("sockname")
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    started = time.perf_counter_ns()
    for index, payload in enumerate(payloads):
        await progress.at_least(2 * (index - WINDOW))  # two writes per report (N = 2)
        sender.sendto(payload, target)
    await progress.at_least(2 * len(payloads))
    elapsed = time.perf_counter_ns() - started
    server.close()
    sink_transport.close()
    sender.close()
    out_sock.close()
    return elapsed / len(payloads)


class _Progress:
    """A count that coroutines can wait on."""

    def __init__(self, loop):
        self.count, self.changed = 0, asyncio.Event()

    def add(self) -> None:
        self.count += 1
        self.changed.set()

    async def at_least(self, target: int, timeout: float = 10.0) -> None:
        while self.count < target:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), timeout)


class _Sink(asyncio.DatagramProtocol):
    def __init__(self, progress: _Progress):
        self.progress = progress

    def datagram_received(self, data: bytes, address) -> None:
        self.progress.add()


def _lab_reporter(state) -> tuple[dict, workload.ReporterAddress]:
    """The lab's first reporter: its namespace and interface, and the addresses its reports carry."""
    from softdta.lab import topology as lab
    address = state.reporter(1)
    return address, workload.ReporterAddress(mac_bytes(address["mac"]), ip_bytes(address["ip"]),
                                             mac_bytes(lab.TRANSLATOR_MAC), ip_bytes(lab.COLLECTOR_IP))


def translator_live(reports_per_step: int, rates: list[float]) -> dict:
    """The XDP translator live in the lab (reporter -> bridge -> translator -> collector): at each offered rate,
    Key-Write N=2 reports from one TX-ring reporter, and whether all of them were translated without loss."""
    from softdta.engines.xdp import pinned_stats
    from softdta.kernel.tx_ring import RingReporter
    from softdta.lab import topology as lab
    from softdta.lab.demo import link_drops
    steps = []
    state = lab.up(1)
    try:
        address, sender = _lab_reporter(state)
        frames = [sender.frame(report) for report in workload.key_write(reports_per_step, 9, 2, 13, 20)]
        with RingReporter(address["interface"], address["netns"], 256) as ring:
            for rate in rates:
                before = pinned_stats(lab.PIN_DIR)["counters"].get("rx_reports", 0)
                drops_before = sum(link_drops().values())
                started = time.perf_counter()
                for first in range(0, len(frames), 64):
                    ring.send(frames[first:first + 64])
                    ahead = (first + 64) / rate - (time.perf_counter() - started)
                    if ahead > 0:
                        time.sleep(ahead)
                elapsed = time.perf_counter() - started
                deadline = time.monotonic() + 3.0  # the last reports may still be on their way
                while True:
                    received = pinned_stats(lab.PIN_DIR)["counters"].get("rx_reports", 0) - before
                    if received >= len(frames) or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
                lost = sum(link_drops().values()) - drops_before
                # lossless: every report translated, and no link (reporter, translator or collector side) dropped
                # anything: a dropped RoCEv2 write or ACK is a loss too
                steps.append({"offered": rate, "achieved": round(len(frames) / elapsed), "sent": len(frames),
                              "translated": received, "link_drops": lost,
                              "lossless": received == len(frames) and lost == 0})
    finally:
        lab.down()
    lossless = [step["achieved"] for step in steps if step["lossless"]]
    return {"steps": steps, "max_lossless_reports_per_s": max(lossless) if lossless else 0}


def translator_live_kernel(rates: list[float], seconds: float = 1.0, keys: int = 4096) -> dict:
    """The lab at kernel speed: Key-Write N=1 from the kernel report generator (reporter -> bridge -> XDP
    translator -> XDP responder). Each step offers `seconds` of reports at a rate, and is lossless when every report
    was translated and executed at the collector, and no link dropped a frame. The rate rises until the first
    lossy step, which says where the loss began."""
    from softdta.core.generator import plan
    from softdta.engines.xdp import pinned_stats
    from softdta.kernel.generator import KernelReporter
    from softdta.lab import topology as lab
    from softdta.lab.demo import collector_http, link_drops
    from softdta.lab.direct import losses

    def counts() -> dict:
        translator = pinned_stats(lab.PIN_DIR)["counters"]
        responder = collector_http("/stats").get("responder", {})
        return {"translated": translator.get("rx_reports", 0), "emitted": translator.get("tx_frames", 0),
                "translator_drops": sum(n for name, n in translator.items() if name.startswith("drop_")),
                "executed": responder.get("executed", 0), "links": link_drops()}

    steps = []
    state = lab.up(1)
    try:
        address, sender = _lab_reporter(state)
        # the lab's Key-Write structure holds 13-byte keys and 20-byte data (the demo's INT path tracing)
        template = dta.key_write(bytes(range(13)), bytes(20), 1, extended=True)
        with KernelReporter(plan(template, sender.frame(template), key_span=keys), address["interface"],
                            address["netns"]) as reporter:
            for rate in rates:
                before = counts()
                sent = reporter.run(rate=rate, seconds=seconds)
                deadline = time.monotonic() + 3.0  # the last reports may still be on their way
                while True:
                    after = counts()
                    done = after["executed"] - before["executed"] >= sent.frames
                    if done or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
                lost = losses(before, after, sent.frames)
                steps.append({"offered": rate, "achieved": round(sent.rate), "sent": sent.frames,
                              "executed": after["executed"] - before["executed"], "lost": lost,
                              "lossless": not lost})
                if lost:
                    break
    finally:
        lab.down()
    lossless = [step["achieved"] for step in steps if step["lossless"]]
    return {"primitive": "key-write N=1", "generator": "kernel", "seconds_per_step": seconds, "steps": steps,
            "max_lossless_reports_per_s": max(lossless) if lossless else 0}


def translator_live_direct(rates: list[float], seconds: float = 1.0, queues: int = 2, keys: int = 4096,
                           redundancy: int = 1) -> dict:
    """Key-Write N=1 at kernel speed on the direct path (softdta.lab.direct: generators -> veth -> XDP translator
    -> veth -> XDP responder, no bridge). Each step offers `seconds` of reports at a rate (0: as fast as the
    generators go), and is lossless when every report was translated and executed and no link dropped a frame.
    The rate rises until the first lossy step, which says where the loss began; one more step at the highest
    lossless rate says where the CPU goes.

    The Key-Write structure takes `redundancy` copies at most: at 1 its frames leave from XDP, above that every
    frame goes through the tc stage (docs/translator.md)."""
    from softdta.lab.direct import DirectPath

    steps: list[dict] = []
    profile = None
    with DirectPath(queues, keys, redundancy) as direct:
        for rate in rates:
            steps.append(direct.step(rate, seconds))
            if not steps[-1]["lossless"]:
                break
        lossless = [each["achieved"] for each in steps if each["lossless"]]
        if lossless:
            profile = direct.step(max(lossless), seconds, profiled=True)
    lossless = [each["achieved"] for each in steps if each["lossless"]]
    path = "XDP translator" if redundancy == 1 else "XDP translator -> tc stage"
    return {"primitive": "key-write N=1", "structure_redundancy": redundancy,
            "path": f"generator -> veth -> {path} -> veth -> XDP responder",
            "rx_queues": queues, "seconds_per_step": seconds, "steps": steps,
            "max_lossless_reports_per_s": max(lossless) if lossless else 0,
            "profiled_step": profile}


def translator_python_engine(count: int) -> dict:
    """Reports/s per core of the python engine (Key-Write N=1, 4-byte keys and data) over AF_XDP and over the
    AF_PACKET fallback, and on the demo's mix of every primitive over AF_XDP, beside the XDP engine on the same
    Key-Writes: CPU time of the engine's thread per report (take the batch from the ring, translate, transmit),
    live on a veth pair between two namespaces. The far end runs XDP, so on AF_XDP frames leave from XDP; the
    thread stays on the transmitting CPU, as `serve` keeps it."""
    import os

    from softdta.engines.python import BATCH, PythonEngine
    from softdta.kernel.bpf import BpfObject, attach_xdp
    from softdta.kernel.netns import Namespace, cleanup_prefix, in_netns, veth_pair
    from softdta.kernel.programs import VETH_PEER_SOURCE, build_object
    from softdta.kernel.tx_ring import RingReporter
    tables = example_tables()
    reporter = example_reporter(tables)
    key_writes = [reporter.frame(report) for report in workload.key_write(count, 11, redundancy=1)]
    mixed = [reporter.frame(report) for report in
             workload.interleave(list(primitive_workloads(tables, count // 5).values()), 7)]
    prefix = f"sdta-bench{os.getpid()}-"
    cleanup_prefix(prefix)
    results: dict = {}
    try:
        far, near = Namespace.create(prefix + "r"), Namespace.create(prefix + "t")
        veth_pair(far, "r0", near, "t0", mac_b=":".join(f"{b:02x}" for b in tables.mac))
        with BpfObject(build_object(VETH_PEER_SOURCE)) as passer, in_netns(far.name):
            attach_xdp(socket.if_nametoindex("r0"), passer.programs["softdta_pass"].fd)
        for case, io, frames in (("af_xdp", "af_xdp", key_writes), ("af_packet", "af_packet", key_writes),
                                 ("af_xdp_mixed", "af_xdp", mixed)):
            samples = []
            for _ in range(ROUNDS):
                with in_netns(near.name):
                    engine = PythonEngine(example_tables(), io=io, flush_idle_ns=10**12)
                    engine.attach(["t0"])
                pinned = engine.transmitter.pinned() if engine.transmitter is not None else nullcontext()
                with engine, RingReporter("r0", far.name, 256) as ring, pinned:
                    for first in range(0, len(frames), BATCH):  # a burst of what one step takes
                        for chunk in range(first, min(first + BATCH, len(frames)), 128):
                            ring.send(frames[chunk:chunk + 128])
                        time.sleep(0.003)  # the kernel moves the burst into the engine's ring (AF_PACKET: 1 ms)
                        while engine.step():
                            pass
                    samples.append(engine.run_time_ns / max(engine.runs, 1))
                    received, transmit = engine.runs, engine.transmit_path
            results[case] = {**_stats(samples), "received": received, "sent": len(frames), "transmit": transmit,
                             "reports_per_s_per_core": round(1e9 / statistics.median(samples))}
    finally:
        cleanup_prefix(prefix)
    reference = translator_reference_cases({"key-write-n1": workload.key_write(count, 11, redundancy=1)},
                                           count)["key-write-n1"]
    kernel = translator_kernel(count, 100_000, {"key-write-n1": [dta.key_write(k, k, 1) for k in range(1, 17)]})
    results["reference_translator_alone"] = {**reference, "reports_per_s_per_core": round(1e9 / reference["median"])}
    results["xdp"] = {**kernel["key-write-n1"], "reports_per_s_per_core": round(1e9 / kernel["key-write-n1"]["median"])}
    return results


def translator_batch(count: int) -> dict:
    """Reports/s per core of translation alone (no packet I/O; thread CPU time), side by side: the oracle a frame
    at a time, and the batch translator (core/batch.py) at the python engine's step and at 1024 frames, a batch
    that amortizes numpy's per-call cost. On Key-Write N=1, on each other primitive as the example tables hold it
    (Sketch-Merge: whole epochs, one after another), and on a mix of every primitive in the demo's proportions."""
    from softdta.core.batch import BatchTranslator
    from softdta.engines.python import BATCH
    tables = example_tables()
    reporter = example_reporter(tables)
    mixed = workload.interleave(list(primitive_workloads(tables, count // 5).values()), 7)
    lists = tables.append_lists[0]
    sketch = tables.structure(COLLECTOR_IP, DtaOpcode.SKETCH_MERGE)
    epoch = sketch.reporters * sketch.columns
    cases = {"key-write-n1": workload.key_write(count, 11, redundancy=1),
             "key-increment": workload.key_increment(count, 12, redundancy=1, flows=200),
             "append": workload.append(count, 13, lists.lists, lists.first_list),
             "postcarding": workload.postcards(count // 5, 14, 5),
             "sketch-merge": [report for seed in range(max(1, count // epoch)) for report in
                              workload.sketch_epoch(sketch.reporters, sketch.columns, sketch.rows, seed)],
             "mixed": mixed}
    results: dict = {}
    for name, reports in cases.items():
        frames = [reporter.frame(report) for report in reports]
        oracle = _reference_ns_per_frame(frames, time.thread_time_ns)
        results[name] = {"oracle": {**oracle, "reports_per_s_per_core": round(1e9 / oracle["median"])}}
        for size in (BATCH, 1024):
            samples = []
            for _ in range(ROUNDS):
                batch = BatchTranslator(Translator(example_tables()))
                started = time.thread_time_ns()
                for first in range(0, len(frames), size):
                    batch.process_batch(frames[first:first + size])
                samples.append((time.thread_time_ns() - started) / len(frames))
            stats = _stats(samples)
            results[name][f"batch_{size}"] = {**stats, "reports_per_s_per_core": round(1e9 / stats["median"]),
                                              "times_the_oracle": round(oracle["median"] / stats["median"], 1)}
    return results


def translator_reference_cases(cases: dict[str, list[dta.Report]], count: int) -> dict:
    """ns per report of the reference translator alone (no packet I/O) over `count` frames of each case."""
    reporter = example_reporter(example_tables())
    return {name: _reference_ns_per_frame([reporter.frame(reports[i % len(reports)]) for i in range(count)],
                                          time.thread_time_ns)
            for name, reports in cases.items()}


# --------------------------------------------------------------------------------------------------
# collector CPU per report


def collector_python(count: int) -> dict:
    """A conventional collector: an asyncio (uvloop) UDP server that parses each report and stores it (dict for
    Key-Write, counters for Key-Increment, lists for Append). CPU ns per report, from process time."""
    import uvloop
    reports = workload.key_write(count, 1, 2) + workload.key_increment(count, 2, 2) + workload.append(count, 3, 64)
    payloads = [dta.encode(report) for report in reports]
    samples = [uvloop.run(_python_collector_round(payloads)) for _ in range(ROUNDS)]
    return _stats(samples)


async def _python_collector_round(payloads: list[bytes]) -> float:
    loop = asyncio.get_running_loop()
    progress = _Progress(loop)
    stored: dict = {"kw": {}, "ki": {}, "append": {}}

    class Collect(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, address) -> None:
            report = dta.decode(data)
            if report.opcode is dta.DtaOpcode.KEY_WRITE:
                stored["kw"][report.key] = report.data
            elif report.opcode is dta.DtaOpcode.KEY_INCREMENT:
                stored["ki"][report.key] = stored["ki"].get(report.key, 0) + report.counter
            else:
                stored["append"].setdefault(report.list_id, []).append(report.data)
            progress.add()

    transport, _ = await loop.create_datagram_endpoint(Collect, local_addr=("127.0.0.1", 0))
    target = transport.get_extra_info("sockname")
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    cpu = time.process_time_ns()
    for index, payload in enumerate(payloads):
        await progress.at_least(index - WINDOW)
        sender.sendto(payload, target)
    await progress.at_least(len(payloads))
    spent = time.process_time_ns() - cpu
    transport.close()
    sender.close()
    # process time covers the sender too; the sender alone is measured and taken off
    return (spent - _sender_cost_ns(payloads)) / len(payloads)


def _sender_cost_ns(payloads: list[bytes]) -> int:
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.setblocking(False)
    target = sink.getsockname()
    cpu = time.process_time_ns()
    for index, payload in enumerate(payloads):
        sender.sendto(payload, target)
        if index % 64 == 63:
            try:
                while True:
                    sink.recv(2048)
            except BlockingIOError:
                pass
    spent = time.process_time_ns() - cpu
    sender.close()
    sink.close()
    return spent


def collector_c(count: int) -> dict | None:
    """The same collector in C (epoll, a hash table): CPU ns per report. None without a C compiler."""
    with tempfile.TemporaryDirectory() as scratch:
        binary = Path(scratch) / "c_collector"
        built = subprocess.run(["gcc", "-O2", "-o", str(binary), str(C_COLLECTOR)], capture_output=True, text=True)
        if built.returncode:
            return None
        reports = workload.key_write(count, 1, 2) + workload.key_increment(count, 2, 2) + workload.append(count, 3, 64)
        payloads = [dta.encode(report) for report in reports]
        samples = []
        for _ in range(ROUNDS):
            process = subprocess.Popen([str(binary), str(len(payloads))], stdout=subprocess.PIPE, text=True)
            port = int(process.stdout.readline())
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for index, payload in enumerate(payloads):
                sender.sendto(payload, ("127.0.0.1", port))
                if index % 64 == 63:
                    time.sleep(0)
            sender.close()
            out = json.loads(process.communicate(timeout=30)[0])
            samples.append(out["cpu_ns"] / max(out["received"], 1))
        return _stats(samples)


RESPONDER_HARNESS = ROOT / "bench" / "bpf" / "responder_bench.bpf.c"
RESPONDER_CASES = {  # name: (transport, opcode, payload bytes)
    "uc-write-8": (Transport.UC, RoceOpcode.UC_WRITE_ONLY, 8),
    "uc-write-64": (Transport.UC, RoceOpcode.UC_WRITE_ONLY, 64),
    "rc-write-64-acked": (Transport.RC, RoceOpcode.RC_WRITE_ONLY, 64),
    "rc-fetch-add": (Transport.RC, RoceOpcode.RC_FETCH_ADD, 0),
}
RESPONDER_COLLECTOR = (mac_bytes("02:5d:7a:00:01:01"), ip_bytes("10.77.1.1"))
RESPONDER_TRANSLATOR = (mac_bytes("02:5d:7a:00:00:01"), ip_bytes("10.77.0.1"))
RESPONDER_QPN, RESPONDER_BASE, RESPONDER_RKEY, RESPONDER_LENGTH = 0x101, 0x7F0000000000, 0x1234, 1 << 20


def responder_request(opcode: RoceOpcode, size: int, psn: int) -> bytes:
    """A translator's request to the benchmark QP (an ACK is asked for on RC WRITEs)."""
    ends = UdpEndpoints(RESPONDER_TRANSLATOR[0], RESPONDER_COLLECTOR[0], RESPONDER_TRANSLATOR[1],
                        RESPONDER_COLLECTOR[1], 49152, ROCE_PORT)
    headers = {"reth": {"va": RESPONDER_BASE + 4096, "rkey": RESPONDER_RKEY, "dma_length": size},
               "atomic_eth": {"va": RESPONDER_BASE + 4096, "rkey": RESPONDER_RKEY, "swap_add": 1}}
    return build_roce_frame(ends, transport_payload(opcode, RESPONDER_QPN, psn, headers, bytes(range(size)),
                                                    ack_req=opcode is RoceOpcode.RC_WRITE_ONLY))


@contextmanager
def responder_harness(case: str):
    """The XDP responder with the benchmark harness (bench/bpf/responder_bench.bpf.c) and one QP for `case`:
    yields (responder, region, request frame)."""
    from softdta.collector.xdp_responder import XdpResponder
    transport, opcode, size = RESPONDER_CASES[case]
    frame = responder_request(opcode, size, 7)
    with XdpResponder(*RESPONDER_COLLECTOR, arena_bytes=RESPONDER_LENGTH, source=RESPONDER_HARNESS) as responder:
        region = responder.allocate(RESPONDER_LENGTH)
        responder.add_qp(RESPONDER_QPN, transport, remote_ip=RESPONDER_TRANSLATOR[1],
                         remote_mac=RESPONDER_TRANSLATOR[0], remote_qpn=0x201, region=region,
                         base_va=RESPONDER_BASE, rkey=RESPONDER_RKEY)
        value = len(frame).to_bytes(4, "little") + RESPONDER_QPN.to_bytes(4, "little") + (7).to_bytes(4, "little")
        table = responder.maps["bench_request"]
        table.update(bytes(4), (value + bytes(4) + frame).ljust(table.value_size, b"\0"))
        yield responder, region, frame


def collector_xdp_responder(repeat: int) -> dict:
    """The xdp responder: kernel ns per request (BPF_PROG_TEST_RUN, restore subtracted); the collector's
    userspace does nothing per report."""
    results = {}
    for case in RESPONDER_CASES:
        with responder_harness(case) as (responder, _, frame):
            restore = responder.object.programs["bench_restore"]
            respond = responder.object.programs["bench_respond"]
            restore_ns = statistics.median(restore.test_run(frame, repeat=repeat).duration_ns for _ in range(ROUNDS))
            results[case] = _stats([respond.test_run(frame, repeat=repeat).duration_ns - restore_ns
                                    for _ in range(ROUNDS)])
    return results


# --------------------------------------------------------------------------------------------------
# memory writes per report, query success


def memory_writes_per_report(count: int) -> dict:
    """RDMA requests the collector executed per report, per primitive, counted by the reference responder."""
    results = {}
    for name, reports in primitive_workloads(example_tables(), count).items():
        tables = example_tables()
        translator, collector, reporter = Translator(tables), OfflineCollector(tables), example_reporter(tables)
        for report in reports:
            for frame in translator.process(reporter.frame(report)).frames:
                collector.deliver(frame)
        for frame in translator.flush_idle(0):
            collector.deliver(frame)
        results[name] = collector.counters().get("executed", 0) / len(reports)
    return results


def query_success(slots: int, queries: int) -> list[dict]:
    """Key-Write query success against load, simulated and bounded, for N = 1, 2, 4 (the paper's Figure 12)."""
    rows = simulate_query_success_curve(slots, [0.05, 0.1, 0.2, 0.4, 0.7, 1.0], [1, 2, 4], queries=queries)
    for row in rows:
        row["bound"] = 1 - key_write_empty_return_bound(row["alpha"], row["n"]) - \
            key_write_wrong_output_bound(row["alpha"], row["n"])
    return rows


def query_rate(slot_bits: int, batch: int) -> dict:
    """Key-Write queries per second per core at N = 1, 2, 4 (numpy engine), against the paper's 1.8 M/s (C++)."""
    from softdta.core.query import key_write_query
    results = {}
    for n in (1, 2, 4):
        store = fill_key_write_store(slot_bits, n, KeyHash.INDEPENDENT, batch)
        samples = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            key_write_query(store.region, store.query_rows, n, key_hash=KeyHash.INDEPENDENT)
            samples.append(len(store.query_rows) / (time.perf_counter() - started))
        results[f"n{n}"] = _stats(samples)
    return results


# --------------------------------------------------------------------------------------------------
# the run


def run(quick: bool = False, out: Path = RESULTS) -> dict:
    count = 300 if quick else 3000
    repeat = 10_000 if quick else 1_000_000
    started = time.time()
    results = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": _cores(),
                    "kernel": platform.release(), "python": platform.python_version(), "quick": quick},
        "translator_ns_per_report": {"xdp": translator_kernel(count, repeat),
                                     "reference_python": translator_reference(count),
                                     "userspace_udp_python": translator_userspace_udp(count)},
        "translator_rx_queue_scaling": translator_queue_scaling(repeat // 10 if quick else repeat),
        "translator_python_engine": translator_python_engine(1000 if quick else 16384),
        "translator_batch": translator_batch(2000 if quick else 20000),
        "translator_live_lab": translator_live(2000 if quick else 20000,
                                               [20_000, 100_000] if quick else [25_000, 50_000, 100_000, 200_000,
                                                                                400_000, 800_000]),
        "translator_live_lab_kernel_generator": translator_live_kernel(
            [50_000, 100_000] if quick else [25_000, 50_000, 100_000, 200_000, 400_000, 800_000, 0],
            seconds=0.3 if quick else 1.0),
        "translator_live_direct": {
            f"{queues}_rx_queues" + ("_tc_stage" if redundancy > 1 else ""): translator_live_direct(
                [100_000, 400_000] if quick else [200_000, 400_000, 800_000, 1_000_000, 1_200_000, 1_600_000,
                                                  2_000_000, 0],
                seconds=0.3 if quick else 1.0, queues=queues, redundancy=redundancy)
            for queues, redundancy in ((1, 1), (2, 1), (1, MAX_REDUNDANCY), (2, MAX_REDUNDANCY))},
        "collector_cpu_ns_per_report": {"xdp_responder_kernel": collector_xdp_responder(repeat),
                                        "python_asyncio": collector_python(count),
                                        "c_epoll": collector_c(count)},
        "memory_writes_per_report": memory_writes_per_report(count),
        "query_rate_per_core": query_rate(16 if quick else 22, 1 << (12 if quick else 18)),
        "query_success": query_success(1 << (14 if quick else 18), 2000 if quick else 20000),
    }
    results["seconds"] = round(time.time() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.json").write_text(json.dumps(results, indent=2))
    plot(results, out)
    return results


def _cores() -> int:
    import os
    return os.cpu_count() or 1


def plot(results: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for n in (1, 2, 4):
        rows = [row for row in results["query_success"] if row["n"] == n]
        alphas = [row["alpha"] for row in rows]
        axis.plot(alphas, [row["success"] for row in rows], marker="o", label=f"N={n} simulated")
        axis.plot(alphas, [row["bound"] for row in rows], linestyle="--", label=f"N={n} bound")
    axis.set_xlabel("load: keys written after the queried one, per slot")
    axis.set_ylabel("Key-Write query success")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "query_success.png", dpi=120)
    plt.close(figure)

    translator = results["translator_ns_per_report"]
    names = list(translator["xdp"])
    figure, axis = plt.subplots(figsize=(7, 4))
    width = 0.4
    positions = np.arange(len(names))
    axis.bar(positions - width / 2, [translator["xdp"][n]["median"] for n in names], width, label="XDP (kernel)")
    axis.bar(positions + width / 2, [translator["reference_python"][n]["median"] for n in names], width,
             label="reference (Python)")
    axis.set_yscale("log")
    axis.set_xticks(positions, names, rotation=20)
    axis.set_ylabel("ns per report (log)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "translator.png", dpi=120)
    plt.close(figure)
