"""Local translation: the collector's CPU per report when it runs the translator's program on its own memory
(bpf/local.bpf.c), beside what the same report costs through the XDP translator and then the XDP responder, once
per frame, and beside an empty XDP program. All BPF_PROG_TEST_RUN.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, TypedDict

from softdta.lab.benchmarks.collector import collector_xdp_responder
from softdta.lab.benchmarks.translator import empty_program, load_reports, translator_kernel
from softdta.lab.benchmarks.workloads import COLLECTOR_IP, ROOT, ROUNDS, Stats, example_reporter, example_tables, stats
from softdta.spec import ARENA_PAGE
from softdta.wire import dta

if TYPE_CHECKING:
    from softdta.collector.xdp_responder import XdpResponder
    from softdta.core.tables import Tables

LOCAL_HARNESS = ROOT / "bench" / "bpf" / "local_bench.bpf.c"
RESPONDER_CASE = "uc-write-8"  # what the responder executes per frame of an example Key-Write (UC, 8 bytes)


def responder_for(tables: Tables, collector_ip: bytes) -> XdpResponder:
    """An XDP responder holding the queue pairs `tables` write to at `collector_ip`, as the collector that
    advertised them holds them (the tests and benchmarks compare local translation with the translator's on it)."""
    from softdta.collector.xdp_responder import XdpResponder
    qps = [qp for qp in tables.qps if qp.collector_ip == collector_ip]
    rings = {lists.qp.remote_qpn: lists for lists in tables.append_lists}
    responder = XdpResponder(qps[0].collector_mac, collector_ip,
                             arena_bytes=sum(-(-qp.length // ARENA_PAGE) * ARENA_PAGE for qp in qps))
    for qp in qps:
        lists = rings.get(qp.remote_qpn)
        region = responder.allocate(qp.length)
        responder.add_qp(qp.remote_qpn, qp.transport, remote_ip=tables.ip, remote_mac=tables.mac,
                         remote_qpn=qp.local_qpn, region=region, base_va=qp.base_va, rkey=qp.rkey,
                         expected_psn=qp.start_psn, ring_bytes=lists.entries * lists.data_len if lists else 0,
                         ring_index=responder.allocate_rings(lists.lists) if lists else 0)
    return responder


class LocalCase(TypedDict):
    """ns per report: local translation alone (harness, restore subtracted), local translation entered through
    the responder's program (its parse and tail call included, one report repeated), the XDP translator, and the
    translator plus the responder's cost per WRITE times the report's frames."""

    local: Stats
    local_via_responder: Stats
    translator: Stats
    responder_per_write: Stats
    translator_plus_responder: float


class LocalTranslation(TypedDict):
    cases: dict[str, LocalCase]
    empty_xdp_program: Stats


def local_translation(repeat: int) -> LocalTranslation:
    from softdta.engines.local import LocalTranslator
    tables = example_tables()
    reporter = example_reporter(tables)
    responder_ns = collector_xdp_responder(repeat, [RESPONDER_CASE])[RESPONDER_CASE]
    cases: dict[str, LocalCase] = {}
    for frames_per_report in (1, 2):
        name = f"key-write N={frames_per_report}"
        reports = [dta.key_write(k, k, frames_per_report) for k in range(1, 17)]
        frames = [reporter.frame(report) for report in reports]
        with responder_for(tables, COLLECTOR_IP) as responder, \
                LocalTranslator(responder, tables, flush_idle_ns=0, source=LOCAL_HARNESS) as local:
            load_reports(local, frames)
            restore = local.object.programs["bench_restore"]
            translate = local.object.programs["bench_translate"]
            restore_ns = statistics.median(restore.test_run(frames[0], repeat=repeat).duration_ns
                                           for _ in range(ROUNDS))
            local_ns = stats([translate.test_run(frames[0], repeat=repeat).duration_ns - restore_ns
                              for _ in range(ROUNDS)])
            local.install()
            via_ns = stats([responder.program.test_run(frames[0], repeat=repeat).duration_ns for _ in range(ROUNDS)])
        translator_ns = translator_kernel(repeat, {name: reports})[name]
        cases[name] = LocalCase(local=local_ns, local_via_responder=via_ns, translator=translator_ns,
                                responder_per_write=responder_ns,
                                translator_plus_responder=translator_ns["median"]
                                + frames_per_report * responder_ns["median"])
    return LocalTranslation(cases=cases, empty_xdp_program=empty_program(repeat))
