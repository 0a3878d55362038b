"""`softdta translator up --engine python` under a storm of SIGHUPs while reports pour in: the kernel ends the
engine's live-frames transmit early when a signal comes between two bursts (docs/primitives.md), and the daemon
must go on, translating every report it took in into its frame, as a user's `kill -HUP` during traffic does."""

import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

from softdta.engines.python import BATCH, engine_stats
from softdta.kernel.bpf import ensure_bpffs
from softdta.kernel.generator import KernelReporter
from softdta.links.control import secrets_file_for
from tests.common import ROOT, SOFTDTA, generator_wire
from tests.kernel.test_report_generator import key_write_plan

pytestmark = pytest.mark.privileged

PREFIX = f"sdta-sig{os.getpid()}-"
TRANSLATOR_MAC = "02:5d:7a:00:00:01"  # examples/tables.toml's
REPORTS = 200_000
STORM_EVERY_S = 0.0005  # several signals in each transmit of a full step (4096 frames, a few ms)


def counters(pin) -> dict[str, int]:
    return engine_stats(pin)["counters"]


def test_a_sighup_storm_while_frames_leave_stops_nothing_and_loses_no_frame(tables, tmp_path):
    pin = ensure_bpffs() / f"softdta-signals-{os.getpid()}"
    shutil.rmtree(pin, ignore_errors=True)
    out, err = tmp_path / "translator.out", tmp_path / "translator.err"
    with generator_wire(PREFIX, TRANSLATOR_MAC) as (generator_ns, far), open(out, "w") as out_file, \
            open(err, "w") as err_file:
        translator = subprocess.Popen(SOFTDTA + [
            "translator", "up", "--tables", str(ROOT / "examples" / "tables.toml"), "-i", "t0", "--engine", "python",
            "--netns", far.name, "--pin", str(pin)], stdout=out_file, stderr=err_file, text=True)
        try:
            deadline = time.monotonic() + 30
            while "translator up on t0" not in out.read_text():
                assert translator.poll() is None and time.monotonic() < deadline, err.read_text()
                time.sleep(0.05)
            assert "frames out XDP" in out.read_text(), out.read_text()
            done, sent = threading.Event(), [0]

            def storm() -> None:
                while not done.wait(STORM_EVERY_S) and translator.poll() is None:
                    translator.send_signal(signal.SIGHUP)
                    sent[0] += 1
            storming = threading.Thread(target=storm)
            storming.start()
            try:
                with KernelReporter(key_write_plan(tables), "g0", generator_ns.name) as reporter:
                    reporter.run(count=REPORTS)
                # until the engine has taken in what its ring held, and sent it
                deadline, last = time.monotonic() + 30, None
                while (now := counters(pin)) != last or now.get("rx_key_write") != now.get("tx_frames"):
                    assert translator.poll() is None and time.monotonic() < deadline, \
                        f"{now}; the translator said: {err.read_text()[-1000:]}"
                    last = now
                    time.sleep(0.3)
            finally:
                done.set()
                storming.join()
            assert translator.poll() is None, f"the translator exited: {err.read_text()[-1000:]}"
            reloads = out.read_text().count("tables reloaded")
            assert sent[0] > 100 and reloads > 10, (sent[0], reloads)
            final = counters(pin)
            # whole steps of frames, each sent in many bursts; the ring drops what comes faster than the engine
            assert final["rx_key_write"] >= 2 * BATCH, final
            assert final["tx_frames"] == final["rx_key_write"], final
            translator.send_signal(signal.SIGTERM)
            assert translator.wait(20) == 0, err.read_text()
            assert "Traceback" not in err.read_text() and "error" not in err.read_text(), err.read_text()
        finally:
            if translator.poll() is None:
                translator.kill()
                translator.wait(10)
            shutil.rmtree(pin, ignore_errors=True)
            secrets_file_for(pin).unlink(missing_ok=True)
