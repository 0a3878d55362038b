"""The collector's CPU per report: the XDP responder in the kernel (BPF_PROG_TEST_RUN through the harness
bench/bpf/responder_bench.bpf.c; its userspace does nothing per report) against a conventional collector in
Python (asyncio) and in C (epoll); and the RDMA requests the collector executes per report."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from softdta.core import workload
from softdta.core.offline import OfflineCollector
from softdta.core.translator import Translator
from softdta.lab.benchmarks.udp import WINDOW, Progress
from softdta.lab.benchmarks.workloads import (
    ROOT,
    ROUNDS,
    Stats,
    example_reporter,
    example_tables,
    primitive_workloads,
    stats,
)
from softdta.spec import ROCE_PORT, RoceOpcode, Transport
from softdta.wire import dta
from softdta.wire.frames import UdpEndpoints, ip_bytes, mac_bytes
from softdta.wire.roce import build_roce_frame, transport_payload

if TYPE_CHECKING:
    from softdta.collector.xdp_responder import ArenaRegion, XdpResponder

C_COLLECTOR = ROOT / "bench" / "c_collector.c"
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
def responder_harness(case: str) -> Iterator[tuple[XdpResponder, ArenaRegion, bytes]]:
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


def collector_xdp_responder(repeat: int, cases: list[str] | None = None) -> dict[str, Stats]:
    """The xdp responder: kernel ns per request (BPF_PROG_TEST_RUN, restore subtracted), for every case of
    RESPONDER_CASES or those named; the collector's userspace does nothing per report."""
    results = {}
    for case in cases or RESPONDER_CASES:
        with responder_harness(case) as (responder, _, frame):
            restore = responder.object.programs["bench_restore"]
            respond = responder.object.programs["bench_respond"]
            restore_ns = statistics.median(restore.test_run(frame, repeat=repeat).duration_ns for _ in range(ROUNDS))
            results[case] = stats([respond.test_run(frame, repeat=repeat).duration_ns - restore_ns
                                   for _ in range(ROUNDS)])
    return results


def _collector_payloads(count: int) -> list[bytes]:
    """What the userspace collectors receive: Key-Write, Key-Increment and Append reports, encoded."""
    reports = workload.key_write(count, 1, 2) + workload.key_increment(count, 2, 2) + workload.append(count, 3, 64)
    return [dta.encode(report) for report in reports]


def collector_python(count: int) -> Stats:
    """A conventional collector: an asyncio (uvloop) UDP server that parses each report and stores it (dict for
    Key-Write, counters for Key-Increment, lists for Append). CPU ns per report, from process time."""
    import uvloop
    payloads = _collector_payloads(count)
    samples = [uvloop.run(_python_collector_round(payloads)) for _ in range(ROUNDS)]
    return stats(samples)


async def _python_collector_round(payloads: list[bytes]) -> float:
    loop = asyncio.get_running_loop()
    progress = Progress()
    # what a CPU collector keeps: the latest data per key, a running sum per key, and appended entries per list
    latest: dict[tuple[int, bytes], bytes] = {}
    sums: dict[tuple[int, bytes], int] = {}
    appended: dict[tuple[int, int], list[bytes]] = {}

    class Collect(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
            report = dta.decode(data)
            if report.counter:
                sums[report.opcode, report.key] = sums.get((report.opcode, report.key), 0) + report.counter
            elif report.key:
                latest[report.opcode, report.key] = report.data
            else:
                appended.setdefault((report.opcode, report.list_id), []).append(report.data)
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


def collector_c(count: int) -> Stats | None:
    """The same collector in C (epoll, a hash table): CPU ns per report. None without a C compiler."""
    with tempfile.TemporaryDirectory() as scratch:
        binary = Path(scratch) / "c_collector"
        built = subprocess.run(["gcc", "-O2", "-o", str(binary), str(C_COLLECTOR)], capture_output=True, text=True)
        if built.returncode:
            return None
        payloads = _collector_payloads(count)
        samples = []
        for _ in range(ROUNDS):
            process = subprocess.Popen([str(binary), str(len(payloads))], stdout=subprocess.PIPE, text=True)
            assert process.stdout is not None  # stdout=PIPE
            port = int(process.stdout.readline())
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for index, payload in enumerate(payloads):
                sender.sendto(payload, ("127.0.0.1", port))
                if index % 64 == 63:
                    time.sleep(0)
            sender.close()
            out = json.loads(process.communicate(timeout=30)[0])
            samples.append(out["cpu_ns"] / max(out["received"], 1))
        return stats(samples)


def memory_writes_per_report(count: int) -> dict[str, float]:
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
