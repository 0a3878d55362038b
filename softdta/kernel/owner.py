"""One daemon per pinned state: an flock on a lock file that holds the owner's pid, taken before the daemon
touches its programs, pins or sessions, and held until it exits (kill -9 included: the kernel drops the lock).
bpffs holds no regular files, so the lock files live under /run."""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

from softdta.errors import SoftdtaError


class AlreadyOwned(SoftdtaError):
    """Another live process holds the lock."""

    def __init__(self, owner: str):
        super().__init__(f"held by pid {owner}")
        self.owner = owner


def flat_name(path: Path) -> str:
    """A file name that stands for `path` (absolute) alone."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", str(path.absolute()).strip("/"))


def own(lock_file: Path) -> int:
    """Make this process the owner of `lock_file` for as long as it lives, or until the returned file descriptor is
    closed; raises AlreadyOwned, naming the owner's pid, while another process holds it."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise AlreadyOwned(owner) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
