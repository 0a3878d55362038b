"""The python engine live on veth: AF_XDP (and the AF_PACKET fallback) around the reference translator.

A reporter namespace sends reports over a veth pair to the translator namespace and captures what comes back:
the frames on the wire must be exactly the reference translator's, and, for the built-in primitives, exactly
the XDP engine's for the same input.
"""

import os
import socket
import threading
import time

import pytest

from softdta import workload
from softdta.bpf import BpfObject, attach_xdp, ensure_bpffs
from softdta.frames import ip_bytes, mac_bytes
from softdta.netns import Namespace, address, cleanup_prefix, in_netns, veth_pair
from softdta.python_engine import PythonEngine, engine_stats
from softdta.spec import ROCE_PORT, Counter
from softdta.translator import Translator
from softdta.xdp import XdpTranslator, build_object

from common import COLLECTOR_IP

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-py{os.getpid()}-"
ETH_P_ALL, SOL_PACKET, PACKET_IGNORE_OUTGOING, SO_RCVBUFFORCE = 0x0003, 263, 23, 33
NO_FLUSH = 10**12  # the inputs leave nothing to flush; pauses between bursts must not flush either


@pytest.fixture
def wire():
    """Namespaces r (reporter and collector side, r0) and t (translator, t0), joined by one veth pair."""
    cleanup_prefix(PREFIX)
    far, translator = Namespace.create(PREFIX + "r"), Namespace.create(PREFIX + "t")
    veth_pair(far, "r0", translator, "t0", mac_b="02:5d:7a:00:00:01")
    address(translator, "t0", "10.77.0.1/16")
    with BpfObject(build_object()) as passer, in_netns(far.name):  # XDP_TX'd frames enter r0 only if it runs XDP
        attach_xdp(socket.if_nametoindex("r0"), passer.programs["softdta_pass"].fd)
    with in_netns(far.name):
        capture = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        capture.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        capture.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 24)  # holds everything until it is read
        capture.bind(("r0", ETH_P_ALL))
        capture.settimeout(0.2)
    yield far, translator, capture
    capture.close()
    cleanup_prefix(PREFIX)


def roce_frames(capture: socket.socket, settle: float = 0.5) -> list[bytes]:
    frames, deadline = [], time.monotonic() + settle
    while time.monotonic() < deadline:
        try:
            frame = capture.recv(4096)
        except TimeoutError:
            continue
        if frame[12:14] == b"\x08\x00" and int.from_bytes(frame[36:38], "big") == ROCE_PORT:
            frames.append(frame)
            deadline = time.monotonic() + settle
    return frames


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
        return roce_frames(capture)
    finally:
        stop.set()
        server.join()


@pytest.mark.parametrize("io", ["af_xdp", "af_packet"])
def test_python_engine_puts_the_reference_translators_frames_on_the_wire(wire, tables, io):
    far, translator_ns, capture = wire
    frames = mixed_reports(tables)
    reference = Translator(tables)
    expected = [emitted for frame in frames for emitted in reference.process(frame).frames]
    pin = ensure_bpffs() / f"softdta-python-engine-{os.getpid()}"
    with PythonEngine(tables, pin_dir=pin, io=io, flush_idle_ns=NO_FLUSH) as engine:
        seen = run_live(engine, translator_ns, far, capture, frames, lambda: engine.attach(["t0"]))
        assert engine.io_name == ("AF_XDP copy" if io == "af_xdp" else "AF_PACKET TPACKET_V3")
    assert len(seen) == len(expected), engine_stats(pin)
    assert seen == expected
    stats = engine_stats(pin)
    assert stats["engine"]["io"] == engine.io_name
    assert stats["counters"]["rx_reports"] == len(frames)
    assert stats["counters"]["tx_frames"] == len(expected) == reference.counters[Counter.TX_FRAMES]
    assert stats["cpu"]["python_engine"]["runs"] == len(frames)
    assert {qp["next_psn"] for qp in stats["qps"]} == {reference.qp_state[qp.index].next_psn for qp in tables.qps}
    os.system(f"rm -rf {pin}")
