"""The XDP responder per frame (BPF_PROG_TEST_RUN), next to the reference responder in the same run.

The harness (bench/bpf/responder_bench.bpf.c) restores the request before every run, since a reply overwrites
the packet, and sets the QP to expect its PSN; `bench_restore` alone measures that, and is subtracted.
"""

import statistics
import time

import pytest

from conftest import benchmarks_disabled
from softdta.core.responder import MemoryRegion, Responder, ResponderQp
from softdta.lab.benchmarks.collector import (
    RESPONDER_BASE,
    RESPONDER_CASES,
    RESPONDER_COLLECTOR,
    RESPONDER_LENGTH,
    RESPONDER_QPN,
    RESPONDER_RKEY,
    RESPONDER_TRANSLATOR,
    responder_harness,
    responder_request,
)
from softdta.spec import ResponderCounter, RoceOpcode

pytestmark = pytest.mark.privileged

ROUNDS = 7


@pytest.mark.parametrize("case", RESPONDER_CASES)
def test_xdp_responder_ns_per_frame(benchmark, pytestconfig, case):
    transport, opcode, size = RESPONDER_CASES[case]
    repeat = 1000 if benchmarks_disabled(pytestconfig) else 1_000_000
    with responder_harness(case) as (responder, region, frame):
        restore, respond = responder.object.programs["bench_restore"], responder.object.programs["bench_respond"]
        restore_ns = statistics.median(restore.test_run(frame, repeat=repeat).duration_ns for _ in range(ROUNDS))
        durations: list[int] = []

        def run():
            durations.append(respond.test_run(frame, repeat=repeat).duration_ns)

        benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
        assert responder.counters()[ResponderCounter.EXECUTED] == repeat * len(durations)
        if opcode is RoceOpcode.RC_FETCH_ADD:
            assert int.from_bytes(region.view[4096:4104].tobytes(), "little") == repeat * len(durations)

    reference = Responder(*RESPONDER_COLLECTOR, [ResponderQp(
        RESPONDER_QPN, transport, RESPONDER_TRANSLATOR[1], RESPONDER_TRANSLATOR[0],
        MemoryRegion(RESPONDER_BASE, RESPONDER_RKEY, bytearray(RESPONDER_LENGTH)), remote_qpn=0x201)])
    frames = [responder_request(opcode, size, psn) for psn in range(300)]
    start = time.perf_counter_ns()
    for each in frames:
        reference.process(each)
    reference_ns = (time.perf_counter_ns() - start) / len(frames)
    kernel_ns = statistics.median(durations) - restore_ns
    benchmark.extra_info.update(kernel_ns_per_frame=kernel_ns, restore_ns=restore_ns, repeat=repeat,
                                reference_ns_per_frame=reference_ns,
                                reference_over_kernel=reference_ns / max(kernel_ns, 1))
    print(f"\n{case}: kernel {kernel_ns:.0f} ns/frame (restore {restore_ns:.0f} subtracted), reference "
          f"{reference_ns:.0f} ns, ratio {reference_ns / max(kernel_ns, 1):.0f}x")
