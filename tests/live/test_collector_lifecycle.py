"""`softdta collector up` owns its program and pins: a second instance, a start that fails late, SIGHUP and a save
that fails at stop each leave the running collector, or the memory of a killed one, intact. Live, on veth pairs
in network namespaces, with RC WRITEs acknowledged by the collector's XDP program."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from softdta.collector.config import CollectorConfig
from softdta.collector.xdp_backend import pin_dir_for
from softdta.engines.python import STEER_SOURCE
from softdta.engines.xdp import build_object
from softdta.kernel.bpf import BpfObject, attach_xdp
from softdta.kernel.netns import Namespace, cleanup_prefix, in_netns
from tests.common import ROOT, wait_for_line
from tests.kernel.test_bpf_binding import TINY, compile_bpf
from tests.live.test_collector import RcWriter, _start_collector, rc_collector_link

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-l{os.getpid()}-"
COLLECTOR_UP = [sys.executable, "-m", "softdta.cli", "collector", "up", "--config"]


@dataclass
class Lab:
    """A collector namespace and a translator namespace joined by a veth pair, and a configuration for them."""

    collector_ns: Namespace
    translator_ns: Namespace
    tmp_path: Path
    text: str  # the working configuration, `interface = "c0"`

    def configure(self, text: str | None = None) -> Path:
        path = self.tmp_path / "collector.toml"
        path.write_text(self.text if text is None else text)
        return path

    @property
    def config(self) -> CollectorConfig:
        return CollectorConfig.from_toml(self.configure())

    @property
    def pins(self) -> Path:
        return pin_dir_for(self.config.name, self.config.ip)

    def start(self) -> subprocess.Popen:
        return _start_collector(self.configure(), self.collector_ns.name)

    def start_failing(self, text: str) -> str:
        """The one error line of a start with this configuration."""
        result = subprocess.run(COLLECTOR_UP + [str(self.configure(text)), "--netns", self.collector_ns.name],
                                capture_output=True, text=True, timeout=60)
        return one_line_error(result)

    def xdp_attached(self) -> bool:
        return "prog/xdp" in self.collector_ns.run("ip", "-d", "link", "show", "c0").stdout

    def writer(self) -> RcWriter:
        return RcWriter(self.translator_ns.name, "t0", self.config)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("softdta: error: "), result.stderr
    return lines[0]


def stop(collector: subprocess.Popen) -> None:
    collector.send_signal(signal.SIGTERM)
    assert collector.wait(20) == 0, collector.stderr.read()


@pytest.fixture
def lab(tmp_path, request):
    collector_ns, translator_ns, text = rc_collector_link(PREFIX, f"life-{os.getpid()}")
    setup = Lab(collector_ns, translator_ns, tmp_path, text)
    (tmp_path / "regions").mkdir()
    steer = BpfObject(build_object(STEER_SOURCE))  # lets the collector's XDP_TX replies into the translator's end
    with in_netns(translator_ns.name):
        attach_xdp(socket.if_nametoindex("t0"), steer.programs["softdta_xsk"].fd)
    try:
        yield setup
    finally:
        cleanup_prefix(PREFIX)
        steer.close()
        shutil.rmtree(setup.pins, ignore_errors=True)


def test_a_second_collector_of_the_same_configuration_is_refused_and_the_first_keeps_serving(lab):
    first = lab.start()
    try:
        writer = lab.writer()
        qp = writer.connect()
        assert writer.write(qp, 10, wait_s=5) == 10
        line = lab.start_failing(lab.text)
        assert f"already running (pid {first.pid}" in line and "stop it first" in line
        assert first.poll() is None and lab.xdp_attached() and (lab.pins / "arena").exists()
        assert writer.write(qp, 10, wait_s=5) == 10, "the first collector still acknowledges writes"
        stop(first)
        assert not lab.pins.exists() and not lab.xdp_attached()
    finally:
        first.kill()
        first.wait(10)


def test_no_second_softdta_daemon_takes_the_collectors_interface(lab, tmp_path):
    """A collector of another name, or a translator, on c0 would replace the responder there: each is refused in
    one line naming the collector's pid, and the collector goes on acknowledging writes."""
    first = lab.start()
    try:
        writer = lab.writer()
        qp = writer.connect()
        assert writer.write(qp, 10, wait_s=5) == 10
        other = lab.config.name + "-other"
        elsewhere = lab.text.replace(f'name = "{lab.config.name}"', f'name = "{other}"')  # ports of its own too
        line = lab.start_failing(elsewhere.replace("control_port = 40050", "control_port = 40051")
                                 .replace("query_port = 8040", "query_port = 8041"))
        assert f"a softdta collector is already running on c0 (pid {first.pid})" in line, line
        assert "another [collector] interface" in line and not pin_dir_for(other, lab.config.ip).exists()
        translator = subprocess.run(
            [sys.executable, "-m", "softdta.cli", "translator", "up", "--tables",
             str(ROOT / "examples" / "tables.toml"), "-i", "c0", "--netns", lab.collector_ns.name,
             "--pin", str(tmp_path / "translator-pins")], capture_output=True, text=True, timeout=60)
        assert f"a softdta collector is already running on c0 (pid {first.pid})" in one_line_error(translator)
        assert first.poll() is None and lab.xdp_attached()
        assert writer.write(qp, 10, wait_s=5) == 10, "the collector still acknowledges writes"
    finally:
        first.kill()
        first.wait(10)


def test_an_operators_xdp_program_is_neither_replaced_nor_detached(lab, tmp_path):
    """A program softdta did not attach (an operator's filter, here `pass`) stays where it is: `collector up`,
    `translator up` and `translator down -i` on its interface each exit 2 in one line naming it and the fix."""
    with BpfObject(compile_bpf(TINY, tmp_path / "operator.o")) as operator, in_netns(lab.collector_ns.name):
        attach_xdp(socket.if_nametoindex("c0"), operator.programs["pass"].fd)
    line = lab.start_failing(lab.text)
    assert "c0 runs the XDP program pass (id " in line and "the collector's responder would replace" in line, line
    assert "`ip link set dev c0 xdp off`" in line and not lab.pins.exists()
    translator = [sys.executable, "-m", "softdta.cli", "translator"]
    up = subprocess.run(translator + ["up", "--tables", str(ROOT / "examples" / "tables.toml"), "-i", "c0", "--netns",
                                      lab.collector_ns.name, "--pin", str(tmp_path / "pins")],
                        capture_output=True, text=True, timeout=60)
    assert "which this translator would replace" in one_line_error(up)
    down = subprocess.run(["ip", "netns", "exec", lab.collector_ns.name, *translator, "down", "-i", "c0", "--pin",
                           str(tmp_path / "pins")], capture_output=True, text=True, timeout=60)
    assert "which `translator down` would detach" in one_line_error(down)
    assert "name pass" in lab.collector_ns.run("ip", "-d", "link", "show", "c0").stdout


def _late_failures(tmp_path: Path, text: str) -> dict[str, str]:
    """Configurations that pass validation but fail at start: once the program is loaded (and attached), but for
    the missing interface, refused before."""
    (tmp_path / "not.pem").write_text("not a certificate\n")
    port_line = "query_port = 8040"
    return {
        "control port in use": text.replace("control_port = 40050", "control_port = 40999"),
        "query port in use": text.replace(port_line, "query_port = 8999"),
        "no such interface": text.replace('interface = "c0"', 'interface = "nope0"'),
        "TLS files that hold no key": text.replace(port_line,
                                                   f'{port_line}\ntls_cert = "not.pem"\ntls_key = "not.pem"'),
        "a sketch batch the columns do not divide": text.replace("batch = 8", "batch = 7"),
    }


LATE_WORDS = {"control port in use": "control_port", "query port in use": "query_port",
              "no such interface": "'nope0' does not exist", "TLS files that hold no key": "tls_cert and tls_key",
              "a sketch batch the columns do not divide": "batch 7 must divide"}


def _ports_taken(lab: Lab) -> list[socket.socket]:
    """Listeners on the collector namespace's 40999 and 127.0.0.1:8999, for the 'in use' failures."""
    with in_netns(lab.collector_ns.name):
        taken = [socket.create_server(("0.0.0.0", 40999)), socket.create_server(("127.0.0.1", 8999))]
    return taken


def test_a_start_that_fails_late_leaves_nothing_attached_or_pinned(lab):
    taken = _ports_taken(lab)
    try:
        for failure, text in _late_failures(lab.tmp_path, lab.text).items():
            line = lab.start_failing(text)
            assert LATE_WORDS[failure] in line, line
            assert not lab.pins.exists(), f"{failure}: pins left behind"
            assert not lab.xdp_attached(), f"{failure}: the program is left attached"
    finally:
        for listener in taken:
            listener.close()
    stop(lab.start())  # the corrected configuration starts


def test_a_start_that_fails_late_leaves_a_killed_collectors_memory_as_found(lab):
    killed = lab.start()
    writer = lab.writer()
    qp = writer.connect()
    assert writer.write(qp, 10, wait_s=5) == 10
    killed.kill()
    killed.wait(10)
    taken = _ports_taken(lab)
    try:
        for failure, text in _late_failures(lab.tmp_path, lab.text).items():
            lab.start_failing(text)
            assert (lab.pins / "arena").exists(), f"{failure}: the killed collector's memory was unpinned"
            assert lab.xdp_attached() and writer.write(qp, 2, wait_s=5) == 2, f"{failure}: writes are not served"
    finally:
        for listener in taken:
            listener.close()
    collector = lab.start()
    stop(collector)
    memory = (lab.tmp_path / "regions" / "key-write.region").read_bytes()
    lost = [offset for offset, payload in writer.acknowledged.items()
            if memory[offset:offset + len(payload)] != payload]
    assert len(writer.acknowledged) == 20 and not lost, f"{len(lost)} acknowledged writes lost"


def test_sighup_is_logged_and_ignored(lab):
    collector = lab.start()
    try:
        writer = lab.writer()
        qp = writer.connect()
        collector.send_signal(signal.SIGHUP)
        assert "SIGHUP ignored" in wait_for_line(collector, "SIGHUP", 30, stream="stderr")
        assert lab.xdp_attached() and writer.write(qp, 5, wait_s=5) == 5
        stop(collector)
        assert not lab.pins.exists()
    finally:
        collector.kill()
        collector.wait(10)


# The data directory turns read-only, or full (a tmpfs too small for the regions: the Key-Write region fits, the
# Key-Increment one does not), once the collector is up: only in its own mount namespace, where a shell lists the
# directory after the collector is gone.
UNWRITABLE = {
    "read-only": ('mount --bind "$DATA" "$DATA" && mount -o remount,bind,ro "$DATA"', "Read-only file system"),
    "full": ('mount -t tmpfs -o size=64k softdta-full "$DATA"', "No space left on device"),
}


@pytest.mark.parametrize("kind", sorted(UNWRITABLE))
def test_a_save_that_fails_at_stop_keeps_the_memory_pinned_for_the_next_start(lab, kind):
    mount, reason = UNWRITABLE[kind]
    data = lab.tmp_path / "regions"
    script = '"$@"; status=$?; echo "left: $(ls -A "$DATA")"; exit $status'
    environment = {**os.environ, "DATA": str(data)}
    shell = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", *COLLECTOR_UP,
                              str(lab.configure()), "--netns", lab.collector_ns.name],
                             env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while " up: " not in shell.stdout.readline():
            assert shell.poll() is None and time.monotonic() < deadline, shell.stderr.read()
        writer = lab.writer()
        qp = writer.connect()
        assert writer.write(qp, 20, wait_s=5) == 20
        subprocess.run(["nsenter", "-t", str(shell.pid), "-m", "sh", "-c", mount], env=environment, check=True)
        children = Path(f"/proc/{shell.pid}/task/{shell.pid}/children").read_text().split()
        assert len(children) == 1
        os.kill(int(children[0]), signal.SIGTERM)
        stdout, stderr = shell.communicate(timeout=30)
    finally:
        shell.kill()
        shell.wait(10)
    # the log has a line for each control connection the writer opened, and one for the failed save
    assert shell.returncode == 2 and "Traceback" not in stderr, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("softdta: error: ") and stderr.count("saving the regions") == 1, stderr
    assert f"saving the regions to {data} failed ({reason})" in line and str(lab.pins) in line
    assert ".partial" not in stdout, stdout
    assert (lab.pins / "arena").exists(), "the memory stays pinned"
    collector = lab.start()  # adopts it
    adopted = writer.connect()
    assert (adopted["remote_qpn"], adopted["rkey"]) == (qp["remote_qpn"], qp["rkey"]), "the queue pair was adopted"
    assert writer.write(adopted, 10, wait_s=5) == 10
    stop(collector)
    memory = (data / "key-write.region").read_bytes()
    lost = [offset for offset, payload in writer.acknowledged.items()
            if memory[offset:offset + len(payload)] != payload]
    assert len(writer.acknowledged) == 30 and not lost, f"{len(lost)} acknowledged writes lost"
