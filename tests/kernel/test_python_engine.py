"""The python engine live on veth: AF_XDP (and the AF_PACKET fallback) around the reference translator.

A reporter namespace sends reports over a veth pair to the translator namespace and captures what comes back:
the frames on the wire must be exactly the reference translator's, and, for the built-in primitives, exactly
the XDP engine's for the same input.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from softdta.core import workload
from softdta.core.offline import OfflineCollector
from softdta.core.primitives.key_write.queries import key_write_query
from softdta.core.tables import Tables, with_queue_qps
from softdta.core.translator import Translator
from softdta.engines.python import PythonEngine, engine_stats
from softdta.engines.xdp import EngineError, XdpTranslator
from softdta.kernel import xsk as xsk_module
from softdta.kernel.bpf import BpfObject, Map, attach_xdp, detach_xdp, ensure_bpffs
from softdta.kernel.maps import map_layout
from softdta.kernel.netns import Namespace, address, cleanup_prefix, in_netns, veth_pair
from softdta.kernel.programs import VETH_PEER_SOURCE, build_object
from softdta.kernel.xsk import XskSocket
from softdta.plugins.latency_sum import LatencySum
from softdta.spec import ROCE_PORT, DtaOpcode, QpState, TranslatorCounter
from softdta.wire.frames import ip_bytes, mac_bytes
from tests.common import (
    COLLECTOR_IP,
    EXAMPLE_TABLES,
    assert_every_queue_wrote_in_psn_order,
    capture_on,
    eventually,
    hop_frames,
    processes,
    udp_frames,
)

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-py{os.getpid()}-"
NO_FLUSH = 10**12  # the inputs leave nothing to flush; pauses between bursts must not flush either


@pytest.fixture
def wire(request):
    """Namespaces r (reporter and collector side, r0) and t (translator, t0), joined by one veth pair (with
    `request.param` RX queues, when given)."""
    cleanup_prefix(PREFIX)
    far, translator = Namespace.create(PREFIX + "r"), Namespace.create(PREFIX + "t")
    veth_pair(far, "r0", translator, "t0", mac_b="02:5d:7a:00:00:01", queues=getattr(request, "param", 1))
    address(translator, "t0", "10.77.0.1/16")
    # XDP_TX'd frames enter r0 only if it runs XDP
    with BpfObject(build_object(VETH_PEER_SOURCE)) as passer, in_netns(far.name):
        attach_xdp(socket.if_nametoindex("r0"), passer.programs["softdta_pass"].fd)
    capture = capture_on(far.name, "r0")
    yield far, translator, capture
    capture.close()
    cleanup_prefix(PREFIX)


def send(far: Namespace, frames: list[bytes], pace: int = 64) -> None:
    with in_netns(far.name):
        sender = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        sender.bind(("r0", 0))
    with sender:
        for index, frame in enumerate(frames, 1):
            sender.send(frame)
            if index % pace == 0:
                time.sleep(0.002)  # stay within the veth's queue


def mixed_reports(tables):
    """Every built-in primitive, in amounts that leave nothing for the idle flush: full Append batches, complete
    Postcarding paths, whole Sketch-Merge epochs."""
    reporter = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac,
                                        COLLECTOR_IP)
    lists = tables.append_lists[0]
    reports = (workload.key_write(60, seed=1, redundancy=2) + workload.key_increment(60, seed=2, redundancy=2)
               + workload.append(lists.batch * 8, seed=3, lists=2)
               + workload.postcards(20, seed=4, hops=5)
               + workload.sketch_epoch(2, 64, 4, seed=5))
    return [reporter.frame(report) for report in reports]


def run_live(engine, translator_ns: Namespace, far: Namespace, capture, frames: list[bytes], attach) -> list[bytes]:
    stop = threading.Event()
    with in_netns(translator_ns.name):
        attach()
    server = threading.Thread(target=engine.serve, args=(stop,))
    server.start()
    try:
        send(far, frames)
        return udp_frames(capture, ROCE_PORT, quiet_s=0.5)
    finally:
        stop.set()
        server.join()


@pytest.mark.parametrize("io", ["af_xdp", "af_packet"])
def test_python_engine_puts_the_reference_translators_frames_on_the_wire(wire, tables, io, request):
    far, translator_ns, capture = wire
    frames = mixed_reports(tables)
    reference = Translator(tables)
    expected = [emitted for frame in frames for emitted in reference.process(frame).frames]
    pin = ensure_bpffs() / f"softdta-python-engine-{os.getpid()}"
    request.addfinalizer(lambda: shutil.rmtree(pin, ignore_errors=True))
    with PythonEngine(tables, pin_dir=pin, io=io, flush_idle_ns=NO_FLUSH) as engine:
        seen = run_live(engine, translator_ns, far, capture, frames, lambda: engine.attach(["t0"]))
        assert engine.io_name == ("AF_XDP copy" if io == "af_xdp" else "AF_PACKET TPACKET_V3")
        # r0 runs XDP, so t0 takes frames from XDP
        assert engine.transmit_path == ("XDP" if io == "af_xdp" else "AF_PACKET TX ring")
    assert len(seen) == len(expected), engine_stats(pin)
    assert seen == expected
    stats = engine_stats(pin)
    assert stats["engine"]["io"] == engine.io_name
    assert stats["engine"]["transmit"] == ("XDP" if io == "af_xdp" else "packet I/O")
    assert stats["counters"]["rx_reports"] == len(frames)
    # what its XDP program passed to the socket, left as it counted it by the engine's publications (a packet
    # ring takes the frames past it)
    assert stats["counters"].get("rx_to_socket", 0) == (len(frames) if io == "af_xdp" else 0)
    # and what the engine took off the socket
    assert stats["counters"].get("rx_from_socket", 0) == (len(frames) if io == "af_xdp" else 0)
    assert stats["counters"]["tx_frames"] == len(expected) == reference.counters[TranslatorCounter.TX_FRAMES]
    assert stats["cpu"]["python_engine"]["runs"] == len(frames)
    assert {qp["next_psn"] for qp in stats["qps"]} == {reference.qp_state[qp.index].next_psn for qp in tables.qps}


def test_python_and_xdp_engines_put_the_same_frames_on_the_wire(wire, tables):
    """Parity for every built-in primitive: the same reports through the kernel engine, then the python engine."""
    far, translator_ns, capture = wire
    frames = mixed_reports(tables)
    with in_netns(translator_ns.name):  # the kernel engine resolves each QP's egress interface here
        kernel = XdpTranslator(tables, flush_idle_ns=NO_FLUSH)
    with kernel:
        from_kernel = run_live(kernel, translator_ns, far, capture, frames, lambda: kernel.attach(["t0"]))
    with PythonEngine(tables, flush_idle_ns=NO_FLUSH) as engine:
        from_python = run_live(engine, translator_ns, far, capture, frames, lambda: engine.attach(["t0"]))
    assert len(from_kernel) == 275 and from_python == from_kernel


def test_frames_leave_from_xdp_only_while_the_interface_takes_them(wire, tables):
    """A veth takes frames from XDP only while its peer runs XDP: without, the engine sends through its AF_XDP
    socket and says why; once the peer loads XDP, the engine sees it at its next stats publication and sends
    from XDP. Nothing is lost either way."""
    far, translator_ns, capture = wire
    with in_netns(far.name):
        detach_xdp(socket.if_nametoindex("r0"))
    frames = mixed_reports(tables)
    reference = Translator(tables)
    first = [emitted for frame in frames[:100] for emitted in reference.process(frame).frames]
    rest = [emitted for frame in frames[100:] for emitted in reference.process(frame).frames]
    stop = threading.Event()
    with PythonEngine(tables, flush_idle_ns=NO_FLUSH) as engine:
        with in_netns(translator_ns.name):
            engine.attach(["t0"])
        assert engine.transmit_path == "AF_XDP socket"
        assert engine.transmit_reason == "t0 takes no frames from XDP (a veth does only while its peer runs XDP)"
        server = threading.Thread(target=engine.serve, args=(stop,))
        server.start()
        try:
            send(far, frames[:100])
            before = udp_frames(capture, ROCE_PORT, expected=len(first))
            with BpfObject(build_object(VETH_PEER_SOURCE)) as passer, in_netns(far.name):
                attach_xdp(socket.if_nametoindex("r0"), passer.programs["softdta_pass"].fd)
            deadline = time.monotonic() + 5
            while engine.transmit_path != "XDP" and time.monotonic() < deadline:
                time.sleep(0.01)
            assert engine.transmit_path == "XDP" and engine.transmit_reason == ""
            sent_from_xdp = engine.transmitter.sent
            send(far, frames[100:])
            after = udp_frames(capture, ROCE_PORT, quiet_s=0.5)
        finally:
            stop.set()
            server.join()
        assert engine.transmitter.sent - sent_from_xdp == len(rest)
    assert before == first and after == rest


def test_the_engine_refuses_the_loopback(tables):
    with PythonEngine(tables) as engine, pytest.raises(EngineError, match="does not translate on the loopback"):
        engine.attach(["lo"])


def test_a_plug_in_primitive_runs_live_and_lands_in_the_collectors_memory(wire, tables):
    """Latency-Sum in the python engine: the frames on the wire are the reference's, and delivered to a
    collector they put exactly the slow flows, with their latency sums, into its Key-Write store."""
    far, translator_ns, capture = wire
    slow = {(100 + i).to_bytes(4, "big"): [700_000, 400_000 + i, 5_000] for i in range(40)}
    fast = {(900 + i).to_bytes(4, "big"): [100_000, 200_000, 300_000 + i] for i in range(40)}
    frames = [frame for flow in (slow, fast) for key, latencies in flow.items() for frame in hop_frames(key, latencies)]
    reference = Translator(tables, plugins=[LatencySum])
    expected = [emitted for frame in frames for emitted in reference.process(frame).frames]
    with PythonEngine(tables, plugins=[LatencySum], flush_idle_ns=NO_FLUSH) as engine:
        seen = run_live(engine, translator_ns, far, capture, frames, lambda: engine.attach(["t0"]))
    assert len(seen) == len(slow) and seen == expected
    collector = OfflineCollector(tables)
    for frame in seen:
        collector.deliver(frame)
    structure = tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE)
    region = collector.structure_region(DtaOpcode.KEY_WRITE, COLLECTOR_IP)
    answer = key_write_query(region, np.array([int.from_bytes(k, "big") for k in slow], dtype=np.uint64), 1,
                            key_hash=structure.key_hash)
    assert answer.found.all() and list(answer.values) == [sum(v) for v in slow.values()]
    assert not key_write_query(region, np.array([int.from_bytes(k, "big") for k in fast], dtype=np.uint64), 1,
                              key_hash=structure.key_hash).found.any()


STEPS_FAULTS = """
import ctypes, resource, sys
import numpy as np
from softdta.core import workload
from softdta.core.batch import BatchTranslator
from softdta.core.translator import Translator
from softdta.engines.python import PythonEngine
from softdta.kernel.heap import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
from softdta.lab.benchmarks.workloads import example_reporter, example_tables
from softdta.wire.columns import FrameRows
# where glibc's own thresholds start, and may stay: what it then does depends on what the process did before
mallopt = ctypes.CDLL(None).mallopt
assert mallopt(M_MMAP_THRESHOLD, 128 << 10) and mallopt(M_TRIM_THRESHOLD, 128 << 10)
tables = example_tables()
if sys.argv[1] == "engine":
    batch = PythonEngine(tables).batch
else:
    batch = BatchTranslator(Translator(tables))
frames = [example_reporter(tables).frame(report) for report in workload.key_write(4096, 11, redundancy=1)]
rows = np.frombuffer(b"".join(frames), dtype=np.uint8).reshape(len(frames), -1)
faults = []
for step in range(8):
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    batch.process_batch(FrameRows(rows.copy(), np.full(len(frames), rows.shape[1])), step)
    faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
print(*faults)
"""


def test_the_engines_steps_reuse_their_memory_instead_of_faulting_it_in_again():
    """A step frees arrays of hundreds of kilobytes that glibc would return to the kernel: the next step faulted
    them in again (about 300 faults a step of 4,096 Key-Writes, about a tenth of the engine's CPU live). Both
    processes start with glibc's thresholds where its own start (128 KiB; whether they grow depends on the
    process's history): in the engine's, steps past the first few fault nothing; a bare batch translator's
    fault at every step."""
    def faults(variant: str) -> list[int]:
        result = subprocess.run([sys.executable, "-c", STEPS_FAULTS, variant], capture_output=True, text=True,
                                timeout=120, env={"PATH": os.environ["PATH"]}, check=True)
        return [int(count) for count in result.stdout.split()]
    assert faults("engine")[3:] == [0] * 5
    assert min(faults("bare")[3:]) > 100


def test_translator_up_names_the_problem_with_engine_options(request):
    pin = ensure_bpffs() / f"softdta-cli-{os.getpid()}"
    request.addfinalizer(lambda: shutil.rmtree(pin, ignore_errors=True))
    base = [sys.executable, "-m", "softdta.cli", "translator", "up", "--tables", str(EXAMPLE_TABLES), "-i", "lo",
            "--pin", str(pin)]
    for extra, message in [(["--primitive", "softdta.plugins.latency_sum:LatencySum"], "--engine python only"),
                           (["--transmit", "socket"], "--engine python only"),
                           (["--engine", "python", "--primitive", "nowhere"], "give MODULE:CLASS"),
                           (["--engine", "python", "--primitive", "softdta.nowhere:X"], "cannot be loaded")]:
        result = subprocess.run(base + extra, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and message in result.stderr, result.stderr


def test_new_tables_keep_the_psns_of_queue_pairs_that_stay(tables):
    """What SIGHUP and collector re-advertisements do: a QP that stays keeps its PSN, a changed one restarts."""
    from softdta.wire import dta
    reporter = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac,
                                        COLLECTOR_IP)
    with PythonEngine(tables) as engine:
        for key in range(5):
            engine.translator.process(reporter.frame(dta.key_write(key, key, 2)), 0)
        key_write = tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE).qp
        assert engine.translator.qp_state[key_write.index].next_psn == 10
        assert engine.qp_state(key_write)["next_psn"] == 10 and engine.qp_state(key_write)["state"] == QpState.ACTIVE
        reloaded = Tables.from_toml(EXAMPLE_TABLES)
        engine.apply(reloaded)
        assert engine.tables is reloaded and engine.translator.qp_state[key_write.index].next_psn == 10
        recreated = Tables.from_toml(EXAMPLE_TABLES)
        recreated.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE).qp.remote_qpn += 1  # the collector re-created it
        engine.apply(recreated)
        assert engine.translator.qp_state[key_write.index].next_psn == key_write.start_psn
        addresses = {bytes(key) for key in engine.maps["collector"].keys()}
        assert addresses == {COLLECTOR_IP}  # replies from exactly the tables' collectors reach the socket


def test_essential_reports_wait_out_the_grace_period_and_are_then_sent(wire, tables):
    """A QP in grace after a resync defers an essential report; the engine sends it once the QP may send."""
    from softdta.wire import dta
    far, translator_ns, capture = wire
    tables.grace_ns = 300_000_000
    reporter = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac,
                                        COLLECTOR_IP)
    essential = reporter.frame(dta.key_write(7, 8, essential=True, extended=True))
    with PythonEngine(tables, flush_idle_ns=2_000_000) as engine:
        qp = tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE).qp
        engine.translator.resync(qp, 100, time.monotonic_ns())
        seen = run_live(engine, translator_ns, far, capture, [essential], lambda: engine.attach(["t0"]))
        assert engine.translator.counters[TranslatorCounter.ESSENTIAL_DEFERRED] >= 1 and engine.deferred == []
    reference = Translator(tables)
    reference.resync(qp, 100, 0)
    assert seen == reference.process(essential, tables.grace_ns).frames  # PSN 100, as after the resync


def test_without_af_xdp_the_engine_falls_back_to_af_packet_and_says_why(wire, tables):
    """A queue already bound to another AF_XDP socket is one way AF_XDP is unavailable."""
    far, translator_ns, capture = wire
    frames = mixed_reports(tables)[:60]
    with in_netns(translator_ns.name):
        holder = XskSocket("t0")
    try:
        with PythonEngine(tables, flush_idle_ns=NO_FLUSH) as engine:
            seen = run_live(engine, translator_ns, far, capture, frames, lambda: engine.attach(["t0"]))
            assert engine.io_name == "AF_PACKET TPACKET_V3" and "Device or resource busy" in engine.fallback_reason
        reference = Translator(tables)
        assert seen == [emitted for frame in frames for emitted in reference.process(frame).frames]
    finally:
        holder.close()


@pytest.mark.parametrize("wire", [2], indirect=True)
def test_an_af_xdp_socket_per_rx_queue_and_each_queue_writes_through_its_own_qps(wire, tables):
    far, translator_ns, capture = wire
    with in_netns(translator_ns.name):  # one QP per structure: no AF_XDP on two queues, AF_PACKET takes both
        with PythonEngine(tables, flush_idle_ns=NO_FLUSH, io="af_xdp") as one_qp, \
                pytest.raises(EngineError, match="AF_XDP is unavailable on t0: t0 has 2 RX queues"):
            one_qp.attach(["t0"])
        with PythonEngine(tables, flush_idle_ns=NO_FLUSH) as one_qp:
            one_qp.attach(["t0"])
            assert one_qp.io_name == "AF_PACKET TPACKET_V3" and "t0 has 2 RX queues" in one_qp.fallback_reason
    tables = with_queue_qps(tables, 2)
    reporter = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac,
                                        COLLECTOR_IP)
    reports = workload.key_write(200, seed=1, redundancy=2) + workload.append(64, seed=3, lists=1)
    # a flow per key, and one for the Append list: each list's entries stay in order on one queue
    frames = [replace(reporter, sport=1024 + index if report.opcode is DtaOpcode.KEY_WRITE else 999).frame(report)
              for index, report in enumerate(reports)]
    reference = Translator(tables)
    expected = [emitted for frame in frames for emitted in reference.process(frame).frames]
    with PythonEngine(tables, flush_idle_ns=NO_FLUSH, io="af_xdp") as engine:
        seen = run_live(engine, translator_ns, far, capture, frames, lambda: engine.attach(["t0"]))
        assert len(engine.queues) == 2 and engine.io_name == "AF_XDP copy"
    assert len(seen) == len(expected)
    assert_every_queue_wrote_in_psn_order(tables, seen, expected)


def test_a_restarted_engine_continues_the_psns_it_left_pinned(tables, request):
    from softdta.wire import dta
    pin = ensure_bpffs() / f"softdta-python-restart-{os.getpid()}"
    request.addfinalizer(lambda: shutil.rmtree(pin, ignore_errors=True))
    reporter = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac,
                                        COLLECTOR_IP)
    key_write = tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE).qp
    with PythonEngine(tables, pin_dir=pin) as engine:
        for key in range(7):
            engine.translator.process(reporter.frame(dta.key_write(key, key, 2)), 0)
    with PythonEngine(Tables.from_toml(EXAMPLE_TABLES), pin_dir=pin) as engine:
        assert engine.translator.qp_state[key_write.index].next_psn == 14
    recreated = Tables.from_toml(EXAMPLE_TABLES)
    recreated.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE).qp.remote_qpn += 1
    with PythonEngine(recreated, pin_dir=pin) as engine:  # a different QP behind the same index starts afresh
        assert engine.translator.qp_state[key_write.index].next_psn == key_write.start_psn


def test_a_restarted_engine_adopts_the_psn_its_collector_expects_unless_its_frames_explain_it(tables, request):
    """The collector's advertisement is the one truth (docs/protocol.md, "Queue-pair PSNs"): compared with the
    start PSN the pinned state was made under, not with itself. A PSN past every frame the engine sent (written
    by another run, or the engine died before pinning) is adopted; one inside its unacknowledged frames is not."""
    from softdta.spec import PSN_MASK
    from softdta.wire import dta
    reporter = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac,
                                        COLLECTOR_IP)
    start = tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE).qp.start_psn

    def restarted_at(advertised: int) -> int:
        pin = ensure_bpffs() / f"softdta-python-adopt-{os.getpid()}-{advertised}"
        request.addfinalizer(lambda: shutil.rmtree(pin, ignore_errors=True))
        with PythonEngine(tables, pin_dir=pin) as engine:
            for key in range(7):  # 14 frames, none acknowledged
                engine.translator.process(reporter.frame(dta.key_write(key, key, 2)), 0)
        readvertised = Tables.from_toml(EXAMPLE_TABLES)
        qp = readvertised.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE).qp
        qp.start_psn = advertised
        with PythonEngine(readvertised, pin_dir=pin) as engine:
            return engine.translator.qp_state[qp.index].next_psn

    assert restarted_at((start + 10) & PSN_MASK) == (start + 14) & PSN_MASK  # frames 10..13 still on their way
    assert restarted_at((start + 20) & PSN_MASK) == (start + 20) & PSN_MASK


def test_the_psns_are_pinned_before_the_frames_that_use_them_leave(wire, tables, request):
    """A kill -9 leaves the engine no time to publish: its successor must find every QP's next PSN past every PSN
    sent, or an RC responder takes the successor's first writes for duplicates and acknowledges them unwritten."""
    from softdta.spec import PSN_MASK
    from softdta.wire import dta
    from softdta.wire.roce import parse_roce
    far, translator_ns, _ = wire
    pin = ensure_bpffs() / f"softdta-python-write-ahead-{os.getpid()}"
    request.addfinalizer(lambda: shutil.rmtree(pin, ignore_errors=True))
    reporter = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac,
                                        COLLECTOR_IP)
    key_write = tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE).qp
    layout = map_layout("qp_state")
    frames = [reporter.frame(dta.key_write(key, key, 2)) for key in range(300)]
    checked: list[tuple[int, int]] = []  # (the last PSN of a send, the next PSN pinned as it began)
    with PythonEngine(tables, pin_dir=pin, flush_idle_ns=NO_FLUSH) as engine, \
            Map.from_pinned(pin / "qp_state") as pinned:
        with in_netns(translator_ns.name):
            engine.attach(["t0"])
        assert engine.transmit_path == "XDP" and engine.transmitter is not None
        transmit = engine.transmitter.send

        def send_checked(run):
            state = layout.value.unpack(pinned.lookup(layout.key.pack(qp_index=key_write.index)))
            checked.append((parse_roce(run[-1]).bth["psn"], state["next_psn"]))
            transmit(run)
        engine.transmitter.send = send_checked
        send(far, frames)
        deadline = time.monotonic() + 10
        while engine.runs < len(frames) and time.monotonic() < deadline:  # steps only: no tick publishes
            engine.step()
    assert engine.runs == len(frames) and len(checked) >= 1
    assert all(0 < (pinned_psn - last) & PSN_MASK <= 2 * len(frames) for last, pinned_psn in checked), checked
    assert checked[-1][1] == (key_write.start_psn + 2 * len(frames)) & PSN_MASK


def test_an_engine_counts_the_reports_through_its_socket_from_zero_in_a_reused_pin_directory(tables, request):
    """The XDP program and the engine count them outside the translator, whose counts start empty anyway: a
    count left pinned by the engine before would make the demo's sender wait for reports that never come."""
    pin = ensure_bpffs() / f"softdta-python-socket-counts-{os.getpid()}"
    request.addfinalizer(lambda: shutil.rmtree(pin, ignore_errors=True))
    socket_counters = (TranslatorCounter.RX_TO_SOCKET, TranslatorCounter.RX_FROM_SOCKET)
    PythonEngine(tables, pin_dir=pin).close()
    with Map.from_pinned(pin / "counters") as counters:
        for counter in socket_counters:
            counters.update_percpu(int(counter).to_bytes(4, "little"), [(1000).to_bytes(8, "little")])
        assert all(counters.counter_total(counter) == 1000 for counter in socket_counters)
        with PythonEngine(tables, pin_dir=pin):
            assert [counters.counter_total(counter) for counter in socket_counters] == [0, 0]


def test_only_acks_from_collectors_reach_the_engine(wire, tables):
    """CM MADs and a collector's SENDs go up the stack to the control plane, as the XDP engine passes them."""
    from softdta.spec import RoceOpcode
    from softdta.wire.frames import UdpEndpoints
    from softdta.wire.roce import build_roce_frame, transport_payload
    far, translator_ns, capture = wire
    qp = tables.qps[0]
    ends = UdpEndpoints(src_mac=qp.collector_mac, dst_mac=tables.mac, src_ip=COLLECTOR_IP, dst_ip=tables.ip,
                        sport=49152, dport=ROCE_PORT)
    ack = build_roce_frame(ends, transport_payload(RoceOpcode.RC_ACK, qp.local_qpn, 0,
                                                   {"aeth": {"syndrome": 0x1F, "msn": 1}}))
    mad = build_roce_frame(ends, transport_payload(RoceOpcode.UD_SEND_ONLY, 1, 0,
                                                   {"deth": {"qkey": 0x80010000, "src_qp": 1}}, bytes(256)))
    with PythonEngine(tables, flush_idle_ns=NO_FLUSH) as engine:
        run_live(engine, translator_ns, far, capture, [mad, ack, mad], lambda: engine.attach(["t0"]))
        counters = engine.translator.counters  # the ACK reached the engine, which found nothing outstanding
        assert engine.runs == 1
        refused = (TranslatorCounter.DROP_REPLY_PSN_OUTSIDE_WINDOW, TranslatorCounter.DROP_REPLY_ON_UC)
        assert sum(counters[counter] for counter in refused) == 1


# Holds one CPU at a real-time priority above the NAPI thread pinned there, for the seconds given or until its
# stdin closes, whichever comes first.
CPU_HOLDER = """
import os, select, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(90))
print("holding", flush=True)
until = time.monotonic() + float(sys.argv[2])
while time.monotonic() < until and not select.select([sys.stdin], [], [], 0)[0]:
    pass
"""


def link_counts(namespace: Namespace, interface: str) -> dict[str, int]:
    stats = json.loads(namespace.run("ip", "-s", "-j", "link", "show", interface).stdout)[0]["stats64"]
    return {"rx": stats["rx"]["packets"], "rx_dropped": stats["rx"]["dropped"], "tx_dropped": stats["tx"]["dropped"]}


@pytest.mark.parametrize("stall_s", [1.0, 0.02])
def test_the_socket_waits_for_room_behind_a_full_ring_where_the_link_has_a_queueing_discipline(wire, monkeypatch,
                                                                                             stall_s):
    """`--transmit socket` in the lab: while the peer's NAPI cannot run, its 256-slot ring fills; with a qdisc on
    the link the socket's frames wait for room instead of being dropped, and all of them arrive. A send that
    gives up waiting (TX_STALL_S shorter than the stall) leaves the rest queued, for a later kick to send.

    The socket is made before the CPU is held, so that the hold covers the sends alone; a send that must give up
    finds the CPU held until it has (the holder lets go when its stdin closes)."""
    monkeypatch.setattr(xsk_module, "TX_STALL_S", stall_s)
    far, translator, _ = wire
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs: one held, one sending")
    held, sending = sorted(os.sched_getaffinity(0))[:2]
    translator.run("tc", "qdisc", "replace", "dev", "t0", "root", "pfifo", "limit", "1000")
    far.run("sh", "-c", "echo 1 > /sys/class/net/r0/threaded")
    napi = [pid for pid, comm in processes().items() if comm.startswith("napi/r0-")]
    assert napi
    for pid in napi:
        os.sched_setaffinity(pid, {held})
    toward_r0 = workload.ReporterAddress(mac_bytes("02:5d:7a:00:00:01"), ip_bytes("10.77.0.1"),
                                         mac_bytes("02:00:00:00:00:02"), ip_bytes("10.77.0.2"))
    frame = toward_r0.frame(workload.key_write(1, 1, redundancy=1)[0])
    before = link_counts(far, "r0")
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {sending})
    with in_netns(translator.name):
        xsk = XskSocket("t0", 0)
    hold_s = "0.3" if stall_s > 0.3 else "30"
    holder = subprocess.Popen([sys.executable, "-c", CPU_HOLDER, str(held), hold_s], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        started = time.monotonic()
        for _ in range(12):
            xsk.send([frame] * 250)
        waited = time.monotonic() - started
        left = xsk.tx_ring.available()
        assert holder.stdin is not None
        holder.stdin.close()  # the peer's NAPI runs again
        holder.wait(timeout=10)
        eventually(lambda: xsk.transmit_pending() == 0, 5, "the queued frames sent")
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)
        xsk.close()
        os.sched_setaffinity(0, affinity)
    # the ring filled: the send waited for the held CPU, or gave up with frames still queued
    assert (waited > 0.1 and left == 0) if stall_s > 0.3 else left > 0
    eventually(lambda: link_counts(far, "r0")["rx"] - before["rx"] == 3000, 5, "every frame arrived")
    after = link_counts(far, "r0")
    assert after["rx_dropped"] == before["rx_dropped"] and link_counts(translator, "t0")["tx_dropped"] == 0


def test_what_the_engines_socket_could_not_take_is_counted_by_reason(wire, tables, request, monkeypatch):
    """More reports than the AF_XDP rings hold while the engine takes none: the socket's drops, by reason, are the
    ones the interface counts (rx_dropped) and the reports that never reached the translator; the rest are
    translated in whole steps, each after a wake-up and a gather."""
    import softdta.kernel.xsk as xsk
    from softdta.kernel.netns import link_drops
    far, translator_ns, capture = wire
    monkeypatch.setattr(xsk, "RX_RING", 256)
    frames = [frame for frame in mixed_reports(tables) if frame[42] == DtaOpcode.KEY_WRITE][:60] * 10
    pin = ensure_bpffs() / f"softdta-python-drops-{os.getpid()}"
    request.addfinalizer(lambda: shutil.rmtree(pin, ignore_errors=True))
    with PythonEngine(tables, pin_dir=pin, flush_idle_ns=NO_FLUSH, gather_ns=50_000_000) as engine:
        with in_netns(translator_ns.name):
            engine.attach(["t0"])
        send(far, frames)  # nobody takes them yet
        time.sleep(0.2)
        engine.publish()
        waiting = engine_stats(pin)["engine"]["io_stats"]
        stop = threading.Event()
        server = threading.Thread(target=engine.serve, args=(stop,))
        server.start()
        try:
            deadline = time.monotonic() + 10
            while engine.runs < 256 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            stop.set()
            server.join()
    stats = engine_stats(pin)
    io = stats["engine"]["io_stats"]
    dropped = len(frames) - 256
    assert waiting["steps"] == 0 and waiting["rx_fill_ring_empty_descs"] + waiting["rx_ring_full"] == dropped
    link = link_drops([translator_ns.name])[f"{translator_ns.name}/t0"]  # the interface counts them too
    assert io["rx_dropped"] + io["rx_ring_full"] == dropped == link
    assert io["rx_fill_ring_empty_descs"] == io["rx_dropped"] and io["rx_invalid_descs"] == 0
    assert stats["counters"]["rx_reports"] == 256 and io["steps"] == 1 and io["wakeups"] == 1


def test_a_burst_that_ended_is_a_step_and_its_counts_are_published_at_once(wire, tables, request, monkeypatch):
    """With a gather of 30 s and no periodic publication, a burst is taken in one step soon after its last frame
    (GATHER_IDLE_NS, here longer than any pause of the sending loop), and the pinned counters a paced sender reads
    (the lab's demo) show it right after: what the step took off the socket before it translated a frame."""
    import softdta.engines.python as python_engine
    far, translator_ns, _ = wire
    monkeypatch.setattr(python_engine, "PUBLISH_INTERVAL_NS", 10**18)
    monkeypatch.setattr(python_engine, "GATHER_IDLE_NS", 50_000_000)
    frames = [frame for frame in mixed_reports(tables) if frame[42] == DtaOpcode.KEY_WRITE][:60]
    pin = ensure_bpffs() / f"softdta-python-burst-{os.getpid()}"
    request.addfinalizer(lambda: shutil.rmtree(pin, ignore_errors=True))
    with PythonEngine(tables, pin_dir=pin, flush_idle_ns=NO_FLUSH, gather_ns=30 * 10**9) as engine:
        with in_netns(translator_ns.name):
            engine.attach(["t0"])
        published_at_translation = []  # the pinned counts as each batch begins to be translated
        translate = engine.batch.process_batch

        def watched(*args, **kwargs):
            counters = engine_stats(pin)["counters"]
            published_at_translation.append((counters.get("rx_from_socket", 0), counters.get("rx_reports", 0)))
            return translate(*args, **kwargs)

        monkeypatch.setattr(engine.batch, "process_batch", watched)
        stop = threading.Event()
        server = threading.Thread(target=engine.serve, args=(stop,))
        server.start()
        try:
            send(far, frames)
            deadline = time.monotonic() + 10
            while engine_stats(pin)["counters"].get("rx_reports", 0) < len(frames):
                assert time.monotonic() < deadline, "the burst was not taken within 10 s of a 30 s gather"
                time.sleep(0.01)
        finally:
            stop.set()
            server.join()
        assert engine.runs == len(frames) and engine.steps == [1]
        assert published_at_translation == [(len(frames), 0)]
        assert engine_stats(pin)["counters"]["tx_frames"] == engine.translator.counters[TranslatorCounter.TX_FRAMES]
