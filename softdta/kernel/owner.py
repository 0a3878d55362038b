"""One daemon per pinned state, and one per interface: an flock on a lock file that holds the owner's pid and role,
taken before the daemon touches its programs, pins or sessions, and held until it exits (kill -9 included: the
kernel drops the lock). bpffs holds no regular files, so the lock files live under /run."""

from __future__ import annotations

import fcntl
import os
import re
import socket
from pathlib import Path

from softdta.errors import SoftdtaError
from softdta.kernel.bpf import attached_xdp

INTERFACE_LOCKS = Path("/run/softdta/interfaces")


class LockUnavailable(SoftdtaError):
    """The lock file cannot be made or opened (no root, a read-only /run)."""


class InterfaceUnavailable(SoftdtaError):
    """The interface is missing, another softdta daemon runs on it, or an XDP program softdta did not attach is
    there."""


class AlreadyOwned(SoftdtaError):
    """Another live process holds the lock."""

    def __init__(self, owner: str, role: str):
        super().__init__(f"held by pid {owner}" + (f" ({role})" if role else ""))
        self.owner, self.role = owner, role


def flat_name(path: Path) -> str:
    """A file name that stands for `path` (absolute) alone."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", str(path.absolute()).strip("/"))


def interface_lock(index: int) -> Path:
    """The lock that makes one softdta daemon (translator or collector) the only one with its XDP program on the
    interface with `index` in the calling thread's network namespace: an interface runs one XDP program, and
    attaching a second replaces the first. Indexes repeat across namespaces, so the name holds the namespace's."""
    namespace = os.stat("/proc/thread-self/ns/net").st_ino
    return INTERFACE_LOCKS / f"netns{namespace}-if{index}.lock"


def own_interface(interface: str, role: str, doing: str, fix: str) -> int:
    """Make this process, a softdta `role` ("translator", "collector"), the only softdta daemon on `interface` in
    the calling thread's network namespace until it exits or closes the returned descriptor. Raises
    InterfaceUnavailable, in one line ending with `fix`, where the interface is missing, another softdta daemon
    holds it, or it runs an XDP program softdta did not attach (each of softdta's is named softdta_*), an
    operator's, which the caller is `doing` something to ("would replace")."""
    try:
        index = socket.if_nametoindex(interface)
    except OSError:
        raise InterfaceUnavailable(f"interface {interface!r} does not exist in this network namespace; check "
                                   "`ip link`") from None
    for prog_id, name in attached_xdp(index):
        if not name.startswith("softdta_"):
            raise InterfaceUnavailable(f"{interface} runs the XDP program {name or 'with no name'} (id {prog_id}), "
                                       f"which is not softdta's and which {doing}; detach it first (`ip link set dev "
                                       f"{interface} xdp off`), {fix}")
    try:
        return own(interface_lock(index), role)
    except AlreadyOwned as error:
        raise InterfaceUnavailable(f"a softdta {error.role or 'daemon'} is already running on {interface} (pid "
                                   f"{error.owner}); stop it first (SIGTERM), {fix}") from None


def own(lock_file: Path, role: str = "") -> int:
    """Make this process the owner of `lock_file` for as long as it lives, or until the returned file descriptor is
    closed; raises AlreadyOwned, naming the owner's pid and `role`, while another process holds it, and
    LockUnavailable where the file cannot be opened."""
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise LockUnavailable(f"cannot open the lock {lock_file} ({error.strerror}); softdta daemons run as root")\
            from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held = os.pread(fd, 128, 0).decode(errors="replace").split(maxsplit=1)
        os.close(fd)
        raise AlreadyOwned(held[0] if held else "unknown", held[1].strip() if len(held) > 1 else "") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {role}".strip().encode() + b"\n", 0)
    return fd
