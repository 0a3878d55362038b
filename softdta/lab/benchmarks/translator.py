"""The translator per report: the XDP program in the kernel (BPF_PROG_TEST_RUN through the harness
bench/bpf/translator_bench.bpf.c), on one RX queue against two, the reference translator in Python, and a
translator written the usual userspace way (a UDP server)."""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypedDict

from softdta.core import workload
from softdta.core.tables import Fleet, with_queue_qps
from softdta.core.translator import Translator
from softdta.errors import SoftdtaError
from softdta.lab.benchmarks.udp import WINDOW, Progress, Sink
from softdta.lab.benchmarks.workloads import (
    COLLECTOR_IP,
    ROOT,
    ROUNDS,
    Stats,
    example_reporter,
    example_tables,
    primitive_workloads,
    stats,
)
from softdta.spec import DEFAULT_SLOT_BITS, TranslatorCounter
from softdta.wire import dta
from softdta.wire.frames import ip_bytes, parse_udp_frame

if TYPE_CHECKING:
    from softdta.engines.xdp import XdpTranslator
    from softdta.kernel.bpf import Program

HARNESS = ROOT / "bench" / "bpf" / "translator_bench.bpf.c"
FLOOR = ROOT / "bench" / "bpf" / "floor.bpf.c"


class Scaling(TypedDict):
    """Runs/s of a program on one RX queue and on two at once, and the median of the paired rounds' ratios."""

    one_queue_reports_per_s: int
    two_queues_reports_per_s: int
    scaling: float


class TranslatorScaling(Scaling):
    drops: int


def translator_kernel(repeat: int, cases: dict[str, list[dta.Report]] | None = None) -> dict[str, Stats]:
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
        results[name] = stats(samples)
    return results


def empty_program(repeat: int) -> Stats:
    """ns per run of an XDP program that only passes the frame (BPF_PROG_TEST_RUN, a Key-Write report): the floor
    every ns/report figure is printed beside."""
    from softdta.kernel.bpf import BpfObject
    from softdta.kernel.programs import VETH_PEER_SOURCE, build_object
    frame = example_reporter(example_tables()).frame(dta.key_write(1, 1, 2))
    with BpfObject(build_object(VETH_PEER_SOURCE)) as empty:
        return stats([empty.programs["softdta_pass"].test_run(frame, repeat=repeat).duration_ns
                      for _ in range(ROUNDS)])


def translator_queue_scaling(repeat: int, rounds: int = ROUNDS, cases: dict[str, list[dta.Report]] | None = None
                             ) -> dict[str, Scaling]:
    """Reports/s of the XDP program on one RX queue against two at once, each on its own CPU with its own QPs
    (BPF_PROG_TEST_RUN on a two-queue veth, one thread per queue, pinned). Rounds alternate one and two queues;
    the scaling is the median of the paired rounds' ratios. The empty program, run the same way, is the
    machine's own scaling."""
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
    results: dict[str, Scaling] = {}
    try:
        namespace.run("ip", "link", "add", "q0", "numrxqueues", "2", "numtxqueues", "2", "type", "veth", "peer", "q1")
        with in_netns(namespace.name):
            contexts = [xdp_md(socket.if_nametoindex("q0"), queue) for queue in range(2)]
            for name, reports in cases.items():
                with XdpTranslator(tables, source=HARNESS, flush_idle_ns=0) as kernel:
                    frames = [reporter.frame(report) for report in reports]
                    load_reports(kernel, frames)
                    scaling = _paired_scaling(kernel.object.programs["bench_translate"], frames[0], contexts,
                                              repeat, rounds)
                    drops = sum(n for counter, n in kernel.counters().items() if counter.name.startswith("DROP_"))
                    results[name] = TranslatorScaling(**scaling, drops=drops)
            with BpfObject(build_object(FLOOR)) as floor:
                results["empty program"] = _paired_scaling(floor.programs["floor_empty"], bytes(80), contexts,
                                                           repeat, rounds)
    finally:
        namespace.delete()
    return results


class FleetLookupCost(TypedDict):
    """ns per report of the XDP program at a collector's IP and at the fleet address, and the median of the paired
    rounds' ratios (fleet over direct)."""

    direct_ns_per_report: float
    fleet_ns_per_report: float
    ratio: float


FLEET_ADDRESS = ip_bytes("10.77.0.100")


def translator_fleet_lookup(repeat: int, rounds: int = ROUNDS, cases: dict[str, list[dta.Report]] | None = None
                            ) -> dict[str, FleetLookupCost]:
    """The cost of the slot lookup: the same reports through the XDP program (BPF_PROG_TEST_RUN, restore
    subtracted), once to the collector's IP and once to a fleet address whose 4096 slots name that collector, on
    one loaded program, rounds alternating. Both go to the same structure, so the difference is the fleet
    resolution alone: the partition hash, the slot's entry and the replica's structure."""
    from softdta.engines.xdp import XdpTranslator
    tables = example_tables()
    tables.fleet = Fleet(address=FLEET_ADDRESS, epoch=1, slot_bits=DEFAULT_SLOT_BITS,
                         slots=((COLLECTOR_IP,),) * (1 << DEFAULT_SLOT_BITS))
    tables.validate()
    direct = example_reporter(tables)
    fleet = replace(direct, collector_ip=FLEET_ADDRESS)
    cases = cases or {"key-write N=1": [dta.key_write(k, k, 1) for k in range(1, 17)],
                      "key-increment N=1": [dta.key_increment(k, 1, 1) for k in range(1, 17)],
                      "postcarding": [dta.postcard(0x0A000001 + k // 5, k % 5 + 1, k) for k in range(15)]}
    results: dict[str, FleetLookupCost] = {}
    for name, reports in cases.items():
        frames = {"direct": [direct.frame(report) for report in reports],
                  "fleet": [fleet.frame(report) for report in reports]}
        with XdpTranslator(tables, source=HARNESS, flush_idle_ns=0) as kernel:
            restore = kernel.object.programs["bench_restore"]
            translate = kernel.object.programs["bench_translate"]
            load_reports(kernel, frames["direct"])
            restore_ns = statistics.median(restore.test_run(frames["direct"][0], repeat=repeat).duration_ns
                                           for _ in range(rounds))
            samples: dict[str, list[float]] = {"direct": [], "fleet": []}
            for _ in range(rounds):
                for way in samples:
                    load_reports(kernel, frames[way])
                    samples[way].append(translate.test_run(frames[way][0], repeat=repeat).duration_ns - restore_ns)
            counters = kernel.counters()
        if counters[TranslatorCounter.FLEET_RESOLVED] != rounds * repeat or \
                [counter for counter in counters if counter.name.startswith("DROP_")]:
            raise SoftdtaError(f"fleet lookup benchmark, {name}: the program did not translate every report "
                               f"({dict(counters)})", hint="run tests/kernel/test_xdp_fleet.py")
        results[name] = {"direct_ns_per_report": statistics.median(samples["direct"]),
                         "fleet_ns_per_report": statistics.median(samples["fleet"]),
                         "ratio": round(statistics.median(f / max(d, 1) for d, f in zip(samples["direct"],
                                                                                        samples["fleet"])), 3)}
    return results


def _paired_scaling(program: Program, frame: bytes, contexts: list[bytes], repeat: int, rounds: int) -> Scaling:
    """Runs/s of `program` in one thread, and in two at once (thread q on CPU q, with context q)."""
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


def load_reports(kernel: XdpTranslator, frames: list[bytes]) -> None:
    """The harness's report set (bench/bpf/translator_bench.bpf.c: count, lengths, frames)."""
    reports = kernel.maps["bench_reports"]
    value = len(frames).to_bytes(4, "little")
    value += b"".join(len(f).to_bytes(4, "little") for f in frames).ljust(16 * 4, b"\0")
    value += b"".join(f.ljust(256, b"\0") for f in frames)
    reports.update(bytes(4), value.ljust(reports.value_size, b"\0"))


def translator_reference(count: int) -> dict[str, Stats]:
    """ns per report of the pure-Python reference translator, per primitive."""
    tables = example_tables()
    reporter = example_reporter(tables)
    return {name: reference_ns_per_frame([reporter.frame(report) for report in reports], time.perf_counter_ns)
            for name, reports in primitive_workloads(tables, count).items()}


def reference_ns_per_frame(frames: list[bytes], clock: Callable[[], int]) -> Stats:
    """ROUNDS runs of a fresh reference translator over `frames`, timed with `clock`."""
    samples = []
    for _ in range(ROUNDS):
        translator = Translator(example_tables())
        started = clock()
        for frame in frames:
            translator.process(frame)
        samples.append((clock() - started) / len(frames))
    return stats(samples)


def translator_reference_cases(cases: dict[str, list[dta.Report]], count: int) -> dict[str, Stats]:
    """ns per report of the reference translator alone (no packet I/O) over `count` frames of each case."""
    reporter = example_reporter(example_tables())
    return {name: reference_ns_per_frame([reporter.frame(reports[i % len(reports)]) for i in range(count)],
                                         time.thread_time_ns)
            for name, reports in cases.items()}


def translator_userspace_udp(count: int) -> dict[str, Stats]:
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
    return {"key-write": stats(samples)}


async def _udp_translator_round(payloads: list[bytes]) -> float:
    """ns per report, from the first datagram sent to the last RoCEv2 payload the sink receives. The sender keeps
    at most WINDOW reports in flight, so no socket buffer overflows and every report is translated."""
    loop = asyncio.get_running_loop()
    progress = Progress()
    sink_transport, _ = await loop.create_datagram_endpoint(lambda: Sink(progress), local_addr=("127.0.0.1", 0))
    sink = sink_transport.get_extra_info("sockname")
    translator = Translator(example_tables())
    template = example_reporter(translator.tables)
    out_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    class Translate(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
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
