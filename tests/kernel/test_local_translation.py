"""Local translation against the translator + responder path, byte for byte.

The same reports go (a) through the XDP translator, whose frames the XDP responder executes (its replies going
back to the translator), and (b) through the responder's program of another collector, which hands them to the
local program (bpf/local.bpf.c) by its tail call. Both collectors' arenas, Append ring counts, completions and
executed counts must come out the same.
"""

import random
from dataclasses import replace

import pytest

from softdta.collector.xdp_responder import XdpResponder
from softdta.core import workload
from softdta.core.tables import Tables
from softdta.core.workload import ReporterAddress
from softdta.engines.local import LocalTranslator
from softdta.engines.xdp import XdpTranslator
from softdta.kernel.programs import XDP_DROP, XDP_PASS
from softdta.lab.benchmarks.local import responder_for
from softdta.spec import ResponderCounter, Transport
from softdta.wire.frames import ip_bytes, mac_bytes
from tests.common import COLLECTOR_IP, EXAMPLE_TABLES

pytestmark = pytest.mark.privileged


def collector_of(tables: Tables) -> XdpResponder:
    return responder_for(tables, COLLECTOR_IP)


def reporter_of(tables: Tables) -> ReporterAddress:
    return ReporterAddress(mac=mac_bytes("02:00:00:00:09:01"), ip=ip_bytes("10.77.9.1"), translator_mac=tables.mac,
                           collector_ip=COLLECTOR_IP)


def mix(seed: int, redundancy: int) -> list:
    reports = (workload.key_write(300, seed, redundancy=redundancy) + workload.key_increment(80, seed)
               + workload.append(150, seed) + workload.postcards(40, seed) + workload.sketch_epoch(2, 64, 4, seed))
    random.Random(seed).shuffle(reports)
    return [replace(report, immediate=index % 5 == 0) for index, report in enumerate(reports)]


def assert_same_memory(remote: XdpResponder, local: XdpResponder) -> None:
    assert local.memory.tobytes() == remote.memory.tobytes(), "arenas differ"
    assert local.ring_writes.tolist() == remote.ring_writes.tolist(), "WRITEs per Append ring differ"


@pytest.mark.parametrize("rc", [False, True], ids=["as-configured", "all-rc"])
@pytest.mark.parametrize("redundancy", [1, 2])
@pytest.mark.parametrize("seed", range(2))
def test_local_translation_leaves_the_arena_the_translator_and_responder_leave(seed, redundancy, rc):
    tables = Tables.from_toml(EXAMPLE_TABLES)
    if rc:  # ACKs requested every 3 frames go back to the translator; locally there are none
        tables.ack_request_interval = 3
        for qp in tables.qps:
            qp.transport = Transport.RC
    reporter = reporter_of(tables)
    with collector_of(tables) as remote, collector_of(tables) as local, \
            XdpTranslator(tables, flush_idle_ns=0) as translator, \
            LocalTranslator(local, tables, flush_idle_ns=0) as local_translator:
        local_translator.install()
        remote_completions, local_completions = [], []
        for report in mix(seed, redundancy):
            frame = reporter.frame(report)
            translated = translator.process(frame)
            for roce in translated.frames:
                out = remote.process(roce)
                remote_completions += out.completions
                for reply in out.replies:
                    translator.process(reply)
            out = local.process(frame)
            assert out.replies == translated.to_reporter and not out.passed  # NACKs to the reporter still go
            local_completions += out.completions
        for roce in translator.flush():
            remote_completions += remote.process(roce).completions
        assert local_translator.flush() == []  # written out in place
        local_completions += local.completions()
        assert_same_memory(remote, local)
        assert local_completions == remote_completions
        assert local.counters()[ResponderCounter.EXECUTED] == remote.counters()[ResponderCounter.EXECUTED] > 500
        assert local.ring_writes.sum() > 0 and local_completions
        assert local.memory.any()


@pytest.mark.parametrize("redundancy", [1, 2])
def test_each_primitive_alone(redundancy):
    """One primitive at a time, through the local program directly (BPF_PROG_TEST_RUN of softdta_xdp)."""
    tables = Tables.from_toml(EXAMPLE_TABLES)
    reporter = reporter_of(tables)
    batches = {"key-write": workload.key_write(64, 3, redundancy=redundancy),
               "key-increment": workload.key_increment(64, 3, redundancy=redundancy),
               "append": workload.append(64, 3), "postcarding": workload.postcards(16, 3),
               "sketch-merge": workload.sketch_epoch(2, 64, 4, 3)}
    for name, reports in batches.items():
        with collector_of(tables) as remote, collector_of(tables) as local, \
                XdpTranslator(tables, flush_idle_ns=0) as translator, \
                LocalTranslator(local, tables, flush_idle_ns=0) as local_translator:
            for report in reports:
                frame = reporter.frame(report)
                for roce in translator.process(frame).frames:
                    for reply in remote.process(roce).replies:
                        translator.process(reply)
                run = local_translator.xdp.test_run(frame)
                assert run.retval == XDP_DROP, name
            for roce in translator.flush():
                remote.process(roce)
            local_translator.flush()
            assert remote.memory.any(), name
            assert_same_memory(remote, local)
            assert local.completions() == remote.completions(), name
            assert local.counters()[ResponderCounter.EXECUTED] == remote.counters()[ResponderCounter.EXECUTED], name


def test_without_local_translation_the_responder_passes_reports_up():
    tables = Tables.from_toml(EXAMPLE_TABLES)
    frame = reporter_of(tables).frame(workload.key_write(1, 0)[0])
    with collector_of(tables) as responder:
        assert responder.program.test_run(frame).retval == XDP_PASS
        with LocalTranslator(responder, tables) as local_translator:
            local_translator.install()
            assert responder.program.test_run(frame).retval == XDP_DROP
            local_translator.uninstall()
            assert responder.program.test_run(frame).retval == XDP_PASS
