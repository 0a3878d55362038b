"""One daemon per pinned state (softdta.kernel.owner): a live owner is named, a killed one's lock is free."""

import os
import signal
import subprocess
import sys

import pytest

from softdta.kernel.owner import AlreadyOwned, LockUnavailable, own

HOLD = "import sys, time; from pathlib import Path; from softdta.kernel.owner import own; " \
       "own(Path(sys.argv[1]), 'collector'); print('owned', flush=True); time.sleep(60)"


def test_a_second_owner_is_refused_with_the_first_ones_pid_until_the_first_is_killed(tmp_path):
    lock = tmp_path / "run" / "pins.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "owned"
        with pytest.raises(AlreadyOwned) as refused:
            own(lock)
        assert (refused.value.owner, refused.value.role) == (str(holder.pid), "collector")
    finally:
        holder.send_signal(signal.SIGKILL)  # no chance to let go: the kernel drops the lock with the process
        holder.wait(10)
    fd = own(lock)
    try:
        assert lock.read_text() == f"{os.getpid()}\n"  # no role: the pid alone
    finally:
        os.close(fd)


def test_a_lock_that_cannot_be_opened_is_one_line_naming_it(tmp_path):
    """Not a traceback: where /run is not writable (no root), the daemon says which file and why."""
    (tmp_path / "run").write_text("a file where the lock directory should be")
    with pytest.raises(LockUnavailable) as refused:
        own(tmp_path / "run" / "pins.lock")
    assert str(tmp_path / "run" / "pins.lock") in refused.value.line() and "root" in refused.value.line()
