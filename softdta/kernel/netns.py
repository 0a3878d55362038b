"""Network namespaces and veth pairs for tests and the lab, driven through iproute2's `ip`.

Give every namespace a per-run prefix (e.g. "sdta-t-<pid>-") so `cleanup_prefix` can remove what a crashed run
left behind.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from softdta.errors import SoftdtaError

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
TC_ROOT = 0xFFFFFFFF  # the parent handle of an interface's root queueing discipline

_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(SoftdtaError, RuntimeError):
    """An `ip` command or setns(2) failed."""


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *argv], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise NetnsError(f"`ip {' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise NetnsError(f"setns into {what}: {os.strerror(ctypes.get_errno())}")


@contextmanager
def in_netns(name: str) -> Iterator[None]:
    """Move the calling thread into network namespace name; sockets opened inside belong to it."""
    try:
        target = os.open(NETNS_DIR / name, os.O_RDONLY)
    except FileNotFoundError:
        raise NetnsError(f"network namespace {name!r} does not exist") from None
    try:
        with in_netns_of(target, f"network namespace {name!r}"):
            yield
    finally:
        os.close(target)


@contextmanager
def in_netns_of(target: int, what: str) -> Iterator[None]:
    """Move the calling thread into the network namespace of file descriptor `target` (a /proc/.../ns/net), and
    back; no system call beyond a stat when it is there already."""
    if os.fstat(target).st_ino == os.stat("/proc/thread-self/ns/net").st_ino:
        yield
        return
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _setns(target, what)
        try:
            yield
        finally:
            _setns(original, "the original network namespace")
    finally:
        os.close(original)


@dataclass(frozen=True)
class Namespace:
    """A named network namespace (/run/netns/<name>)."""

    name: str

    @classmethod
    def create(cls, name: str) -> Namespace:
        """Create the namespace with IPv6 off (no router solicitations or DAD in captures) and lo up."""
        _ip("netns", "add", name)
        ns = cls(name)
        ns.run("sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
        _ip("-n", name, "link", "set", "lo", "up")
        return ns

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace; output is captured as text."""
        return _ip("netns", "exec", self.name, *argv, check=check)

    def delete(self) -> None:
        if (NETNS_DIR / self.name).exists():
            _ip("netns", "delete", self.name)


def cleanup_prefix(prefix: str) -> list[str]:
    """Delete every namespace whose name starts with prefix; return their names."""
    if not prefix:
        raise ValueError("cleanup_prefix needs a non-empty prefix")
    names = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]
    doomed = [name for name in names if name.startswith(prefix)]
    for name in doomed:
        Namespace(name).delete()
    return doomed


def veth_pair(ns_a: Namespace, name_a: str, ns_b: Namespace, name_b: str, *, mac_a: str | None = None,
              mac_b: str | None = None, mtu: int = 1500, queues: int = 1) -> None:
    """Create a veth pair with one end in each namespace, and bring both ends up.

    One queue by default (the kernel would otherwise give veth one per CPU): a translator on an interface with
    n RX queues needs n QPs per structure (docs/translator.md).
    """
    def end(ns: Namespace, name: str, mac: str | None) -> list[str]:
        return [name, *(["address", mac] if mac else []), "mtu", str(mtu), "numtxqueues", str(queues),
                "numrxqueues", str(queues), "netns", ns.name]

    # creating both ends directly in their namespaces avoids name clashes in the caller's namespace
    _ip("link", "add", *end(ns_a, name_a, mac_a), "type", "veth", "peer", "name", *end(ns_b, name_b, mac_b))
    for ns, name in ((ns_a, name_a), (ns_b, name_b)):
        _ip("-n", ns.name, "link", "set", name, "up")


def link_drops(namespaces: Iterable[str]) -> dict[str, int]:
    """Packets the links in `namespaces` dropped ("namespace/interface": rx and tx drops, full veth rings, and the
    drops of the interface's queueing disciplines), which no BPF counter sees."""
    from pyroute2 import IPRoute
    drops: dict[str, int] = {}
    for namespace in namespaces:
        with in_netns(namespace), IPRoute() as ipr:
            lost: Counter[int] = Counter()
            names = {}
            for link in ipr.get_links():
                stats = link.get_attr("IFLA_STATS64") or {}
                lost[link["index"]] += stats.get("rx_dropped", 0) + stats.get("tx_dropped", 0)
                names[link["index"]] = link.get_attr("IFLA_IFNAME")
            for qdisc in ipr.get_qdiscs():
                if qdisc["parent"] == TC_ROOT:  # a root's figures include its children's (mq)
                    lost[qdisc["index"]] += (qdisc.get_attr("TCA_STATS") or {}).get("drop", 0)
            drops.update({f"{namespace}/{names[index]}": count for index, count in lost.items()
                          if count and names.get(index, "lo") != "lo"})
    return drops


def address(ns: Namespace, ifname: str, cidr: str) -> None:
    _ip("-n", ns.name, "address", "replace", cidr, "dev", ifname)


def ifindex(ns: Namespace, ifname: str) -> int:
    index: int = json.loads(_ip("-n", ns.name, "-j", "link", "show", "dev", ifname).stdout)[0]["ifindex"]
    return index


def neighbour(ns: Namespace, ifname: str, ip: str, mac: str) -> None:
    """A permanent ARP entry, so tests do not depend on ARP resolution."""
    _ip("-n", ns.name, "neigh", "replace", ip, "lladdr", mac, "dev", ifname, "nud", "permanent")


def _napi_threads() -> set[int]:
    threads = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().startswith("napi/"):
                    threads.add(int(entry.name))
            except OSError:  # exited meanwhile
                pass
    return threads


def realtime_napi(ns: Namespace, ifname: str, priority: int = 50) -> int:
    """Run the interface's NAPI polls in kernel threads at SCHED_FIFO `priority`; returns how many threads.

    Softirq work that outlasts its budget moves to ksoftirqd, an ordinary thread: behind a busy user process it
    waits milliseconds while other CPUs keep filling the veth's 256-slot ring, and the ring drops. A real-time
    NAPI thread runs as soon as there is work, as a NIC's interrupt would. Interfaces without XDP are left
    alone: returns 0."""
    if "xdp" not in json.loads(_ip("-n", ns.name, "-j", "link", "show", "dev", ifname).stdout)[0]:
        return 0  # a veth has NAPI only while it runs XDP (or GRO)
    before = _napi_threads()
    ns.run("sh", "-c", f"echo 1 > /sys/class/net/{ifname}/threaded")
    created = _napi_threads() - before
    for pid in created:
        os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(priority))
    return len(created)
