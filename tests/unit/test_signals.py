"""The signals of long-running commands (`translator up`, `p4 run`): a stop signal always ends the loop, and a
reload runs in the loop, not in a handler. Each case runs in a child process, so a hang is a timeout here."""

import subprocess
import sys
import textwrap

ROUNDS = 400  # with the old handler (threading.Event.set), a run of this hung within a few hundred

STOPS = textwrap.dedent(f"""
    import os, random, signal, threading, time
    from softdta.cli.common import Signals

    def kill_soon():
        time.sleep(random.random() * 0.002)
        os.kill(os.getpid(), signal.SIGTERM)

    for _ in range({ROUNDS}):
        stop = Signals()
        threading.Thread(target=kill_soon).start()
        while not stop.wait(0):  # a loop that waits briefly, then works
            pass
    print("stopped every time")
""")


def test_a_stop_signal_always_ends_a_loop_that_waits_on_it():
    """It once did not: a handler that called threading.Event.set while the main thread was inside Event.wait
    on that event waited for a lock its own thread held, and `softdta translator up` hung on SIGTERM."""
    result = subprocess.run([sys.executable, "-c", STOPS], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "stopped every time" in result.stdout, result.stderr


RELOADS = textwrap.dedent("""
    import os, signal, threading
    from softdta.cli.common import Signals

    reloads = []
    stop = Signals(lambda: reloads.append(threading.current_thread() is threading.main_thread()))
    os.kill(os.getpid(), signal.SIGHUP)
    assert not stop.wait(0.2) and reloads == [True], reloads  # one reload, in the loop's own thread
    os.kill(os.getpid(), signal.SIGHUP)
    os.kill(os.getpid(), signal.SIGINT)
    assert stop.wait(5) and len(reloads) == 2 and stop.is_set()
    print("reloaded and stopped")
""")


def test_a_reload_runs_in_the_loop_and_a_later_stop_still_stops():
    result = subprocess.run([sys.executable, "-c", RELOADS], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "reloaded and stopped" in result.stdout, result.stderr
