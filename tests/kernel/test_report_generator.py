"""The kernel report generator live on veth: the reports on the wire are exactly the ones its plan predicts, also
when a translator down the line rewrites the generator's pages into RoCEv2 frames in place, and the CLI drives it.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from softdta.core import workload
from softdta.core.generator import plan
from softdta.core.translator import Translator
from softdta.engines.xdp import XdpTranslator
from softdta.kernel.bpf import BpfObject, attach_xdp
from softdta.kernel.generator import KernelReporter
from softdta.kernel.netns import Namespace, in_netns
from softdta.kernel.programs import VETH_PEER_SOURCE, EngineError, build_object
from softdta.spec import DTA_PORT, ROCE_PORT, TranslatorCounter
from softdta.wire import dta
from softdta.wire.dta import Profile
from softdta.wire.frames import ip_bytes, mac_bytes
from tests.common import COLLECTOR_IP, capture_on, generator_wire, signals_meanwhile, udp_frames

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-gen{os.getpid()}-"
TRANSLATOR_MAC = "02:5d:7a:00:00:01"


@pytest.fixture
def wire():
    with generator_wire(PREFIX, TRANSLATOR_MAC) as ends:
        yield ends


def loopback_has_xdp(namespace: Namespace) -> bool:
    return "xdp" in json.loads(namespace.run("ip", "-j", "link", "show", "dev", "lo").stdout)[0]


def key_write_plan(tables, redundancy: int = 1, key_span: int = 300):
    reporter = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"), tables.mac,
                                        COLLECTOR_IP)
    template = dta.key_write(0x01020304, 0x10, redundancy)
    return plan(template, reporter.frame(template), Profile.DTA_V1, key_span=key_span)


def test_the_reports_on_the_wire_are_the_plans(wire, tables):
    generator_ns, far = wire
    generator = key_write_plan(tables)
    with capture_on(far.name, "t0") as capture, KernelReporter(generator, "g0", generator_ns.name) as reporter:
        result = reporter.run(count=3000)
        seen = udp_frames(capture, DTA_PORT, 3000)
        assert result.frames == reporter.sent == 3000
    assert len(seen) == 3000
    assert seen == [generator.frame_at(index) for index in range(3000)]


def test_a_signal_in_a_run_loses_no_report_and_sends_none_twice(wire, tables):
    """A signal ends a live-frames run between bursts with EINTR; the generator sends the rest of the call, so the
    wire still carries the plan's reports, each once, in order."""
    generator_ns, far = wire
    generator = key_write_plan(tables)
    with capture_on(far.name, "t0") as capture, KernelReporter(generator, "g0", generator_ns.name) as reporter:
        calls, deadline = 0, time.monotonic() + 10
        with signals_meanwhile() as handled:
            while reporter.resumed == 0 and time.monotonic() < deadline:  # until a signal came inside a run
                reporter.send(2048)
                calls += 1
        assert reporter.resumed > 0 and handled, "no signal came during a run: the test proved nothing"
        assert reporter.sent == calls * 2048
        seen = udp_frames(capture, DTA_PORT, calls * 2048)
    assert seen == [generator.frame_at(index) for index in range(calls * 2048)]


def test_pages_a_translator_rewrote_in_place_come_back_as_correct_reports(wire, tables):
    """The XDP translator turns each report's page into a RoCEv2 frame in place; live-frames mode recycles that
    page for a later report. Every RoCEv2 frame must still be the reference translator's for the plan's reports."""
    generator_ns, far = wire
    generator = key_write_plan(tables)
    count = 4000
    with in_netns(far.name):
        translator = XdpTranslator(tables, flush_idle_ns=10**12)
    stop = threading.Event()
    with translator, capture_on(generator_ns.name, "g0") as capture:
        with in_netns(far.name):
            translator.attach(["t0"])
        server = threading.Thread(target=translator.serve, args=(stop,))
        server.start()
        try:
            with KernelReporter(generator, "g0", generator_ns.name) as reporter:
                for _ in range(count // 500):
                    reporter.send(500)
            seen = udp_frames(capture, ROCE_PORT, count)
        finally:
            stop.set()
            server.join()
        counters = translator.counters()
    reference = Translator(tables)
    expected = [out for index in range(count) for out in reference.process(generator.frame_at(index)).frames]
    assert counters[TranslatorCounter.RX_REPORTS] == count and counters[TranslatorCounter.TX_FRAMES] == count
    assert len(seen) == count and seen == expected


def test_the_generator_stays_in_the_xdp_dispatcher_only_while_it_lives(wire, tables):
    """Linked to the namespace's loopback (where it passes every frame), so that a call does not wait for two RCU
    grace periods; the link goes with the generator."""
    generator_ns, far = wire

    with KernelReporter(key_write_plan(tables), "g0", generator_ns.name) as reporter:
        assert reporter.linked and loopback_has_xdp(generator_ns)
        with in_netns(generator_ns.name):  # loopback traffic still passes
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver, \
                    socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
                receiver.bind(("127.0.0.1", 0))
                receiver.settimeout(5)
                sender.sendto(b"still here", receiver.getsockname())
                assert receiver.recv(64) == b"still here"
        reporter.send(10)
    assert not loopback_has_xdp(generator_ns)


def test_a_generator_killed_with_sigkill_leaves_nothing_attached(wire):
    generator_ns, _ = wire

    process = subprocess.Popen([sys.executable, "-m", "softdta.cli", "report", "key-write", "-i", "g0", "--netns",
                                generator_ns.name, "--duration", "60", "--rate", "1000"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not loopback_has_xdp(generator_ns):
            assert time.monotonic() < deadline and process.poll() is None, "the generator never linked to lo"
            time.sleep(0.05)
    finally:
        process.kill()
        process.wait(timeout=10)
    deadline = time.monotonic() + 10
    while loopback_has_xdp(generator_ns):  # the kernel releases the link with the process's last fd
        assert time.monotonic() < deadline, "lo kept the dead generator's XDP program"
        time.sleep(0.05)


def test_with_lo_taken_the_generator_still_sends_and_says_why_it_is_slower(wire):
    generator_ns, far = wire
    with BpfObject(build_object(VETH_PEER_SOURCE)) as passer, in_netns(generator_ns.name):
        attach_xdp(socket.if_nametoindex("lo"), passer.programs["softdta_pass"].fd, mode="generic")
    with capture_on(far.name, "t0") as capture:
        result = softdta("report", "key-write", "-i", "g0", "--netns", generator_ns.name, "--count", 200, "-n", 1)
        assert "could not link to lo" in result.stderr and "sent 200 key-write reports" in result.stdout
        assert len(udp_frames(capture, DTA_PORT, 200)) == 200


def test_a_missing_interface_is_named():
    with pytest.raises(EngineError, match="interface 'nowhere0' does not exist"):
        KernelReporter(key_write_plan_for_example(), "nowhere0")


def key_write_plan_for_example():
    template = dta.key_write(1, 2, 1)
    reporter = workload.ReporterAddress(mac_bytes("02:5d:7a:00:09:01"), ip_bytes("10.77.9.1"),
                                        mac_bytes(TRANSLATOR_MAC), COLLECTOR_IP)
    return plan(template, reporter.frame(template))


def softdta(*args, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "softdta.cli", *map(str, args)], capture_output=True, text=True,
                            timeout=120)
    assert not check or result.returncode == 0, result.stderr
    return result


def test_softdta_report_sends_at_kernel_speed_and_names_bad_options(wire):
    generator_ns, far = wire
    with capture_on(far.name, "t0") as capture:
        result = softdta("report", "key-write", "-i", "g0", "--netns", generator_ns.name, "--count", 2000, "-n", 1,
                         "--keys", 50)
        assert "sent 2000 key-write reports out of g0" in result.stdout and "kernel engine" in result.stdout
        seen = udp_frames(capture, DTA_PORT, 2000)
    assert len(seen) == 2000 and len({frame[46:50] for frame in seen}) == 50
    result = softdta("report", "append", "-i", "g0", "--netns", generator_ns.name, "--duration", 0.3,
                     "--rate", 20000)
    assert "append reports out of g0" in result.stdout
    for options, message in [(["--duration", -1], "--duration -1.0 must be positive"),
                             (["--rate", -5], "--rate -5.0 must be 0"),
                             (["--count", 0], "give at least 1 report"),
                             (["--keys", 0], "give 1 to"),
                             (["-i", "nowhere0"], "interface 'nowhere0' does not exist")]:
        base = ["report", "key-write", "--netns", generator_ns.name]
        result = softdta(*base, *(["-i", "g0"] if "-i" not in options else []), *options, check=False)
        assert result.returncode == 2 and message in result.stderr, (options, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
