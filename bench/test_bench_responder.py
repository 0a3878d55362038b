"""The XDP responder per frame (BPF_PROG_TEST_RUN), next to the reference responder in the same run.

The harness (bench/bpf/responder_bench.bpf.c) restores the request before every run, since a reply overwrites
the packet, and sets the QP to expect its PSN; `bench_restore` alone measures that, and is subtracted.
"""

import statistics
import time
from pathlib import Path

import pytest

from softdta.frames import UdpEndpoints, ip_bytes, mac_bytes
from softdta.responder import MemoryRegion, Responder, ResponderQp
from softdta.roce import build_roce_frame, transport_payload
from softdta.spec import ROCE_PORT, ResponderCounter, RoceOpcode, Transport
from softdta.xdp_responder import XdpResponder

from conftest import benchmarks_disabled

pytestmark = pytest.mark.privileged

HARNESS = Path(__file__).resolve().parent / "bpf" / "responder_bench.bpf.c"
ROUNDS = 7
COLLECTOR_MAC, COLLECTOR_IP = mac_bytes("02:5d:7a:00:01:01"), ip_bytes("10.77.1.1")
TRANSLATOR_MAC, TRANSLATOR_IP = mac_bytes("02:5d:7a:00:00:01"), ip_bytes("10.77.0.1")
QPN, BASE, RKEY, LENGTH = 0x101, 0x7F0000000000, 0x1234, 1 << 20

CASES = {  # name: (transport, opcode, payload bytes)
    "uc-write-8": (Transport.UC, RoceOpcode.UC_WRITE_ONLY, 8),
    "uc-write-64": (Transport.UC, RoceOpcode.UC_WRITE_ONLY, 64),
    "rc-write-64-acked": (Transport.RC, RoceOpcode.RC_WRITE_ONLY, 64),
    "rc-fetch-add": (Transport.RC, RoceOpcode.RC_FETCH_ADD, 0),
}


def request(opcode: RoceOpcode, size: int, psn: int) -> bytes:
    ends = UdpEndpoints(TRANSLATOR_MAC, COLLECTOR_MAC, TRANSLATOR_IP, COLLECTOR_IP, 49152, ROCE_PORT)
    headers = {"reth": {"va": BASE + 4096, "rkey": RKEY, "dma_length": size},
               "atomic_eth": {"va": BASE + 4096, "rkey": RKEY, "swap_add": 1}}
    ack_req = opcode is RoceOpcode.RC_WRITE_ONLY
    return build_roce_frame(ends, transport_payload(opcode, QPN, psn, headers, bytes(range(size)), ack_req=ack_req))


@pytest.mark.parametrize("case", CASES)
def test_xdp_responder_ns_per_frame(benchmark, pytestconfig, case):
    transport, opcode, size = CASES[case]
    frame = request(opcode, size, 7)
    repeat = 1000 if benchmarks_disabled(pytestconfig) else 1_000_000
    with XdpResponder(COLLECTOR_MAC, COLLECTOR_IP, arena_bytes=LENGTH, source=HARNESS) as responder:
        region = responder.allocate(LENGTH)
        responder.add_qp(QPN, transport, remote_ip=TRANSLATOR_IP, remote_mac=TRANSLATOR_MAC, remote_qpn=0x201,
                         region=region, base_va=BASE, rkey=RKEY)
        value = len(frame).to_bytes(4, "little") + QPN.to_bytes(4, "little") + (7).to_bytes(4, "little") + bytes(4)
        responder.maps["bench_request"].update(bytes(4), (value + frame).ljust(responder.maps["bench_request"].value_size,
                                                                              b"\0"))
        restore, respond = responder.object.programs["bench_restore"], responder.object.programs["bench_respond"]
        restore_ns = statistics.median(restore.test_run(frame, repeat=repeat).duration_ns for _ in range(ROUNDS))
        durations: list[int] = []

        def run():
            durations.append(respond.test_run(frame, repeat=repeat).duration_ns)

        benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
        assert responder.counters()[ResponderCounter.EXECUTED] == repeat * len(durations)
        if opcode is RoceOpcode.RC_FETCH_ADD:
            assert int.from_bytes(region.view[4096:4104].tobytes(), "little") == repeat * len(durations)

    reference = Responder(COLLECTOR_MAC, COLLECTOR_IP, [ResponderQp(
        QPN, transport, TRANSLATOR_IP, TRANSLATOR_MAC, MemoryRegion(BASE, RKEY, bytearray(LENGTH)), remote_qpn=0x201)])
    frames = [request(opcode, size, psn) for psn in range(300)]
    start = time.perf_counter_ns()
    for each in frames:
        reference.process(each)
    reference_ns = (time.perf_counter_ns() - start) / len(frames)
    kernel_ns = statistics.median(durations) - restore_ns
    benchmark.extra_info.update(kernel_ns_per_frame=kernel_ns, restore_ns=restore_ns, repeat=repeat,
                                reference_ns_per_frame=reference_ns, reference_over_kernel=reference_ns / max(kernel_ns, 1))
    print(f"\n{case}: kernel {kernel_ns:.0f} ns/frame (restore {restore_ns:.0f} subtracted), reference "
          f"{reference_ns:.0f} ns, ratio {reference_ns / max(kernel_ns, 1):.0f}x")
