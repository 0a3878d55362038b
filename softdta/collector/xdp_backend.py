"""The `xdp` backend: the XDP responder as the collector's RDMA NIC, the embedded default where no RDMA device
exists.

Regions live in the responder's mmapable arena, laid out in configuration order, each on its own page. They are
saved to `data_dir/<name>.region` every minute and when the collector stops, and restored when it starts.

With a pin directory (`softdta collector up` pins under /sys/fs/bpf/softdta-collector/) the arena, the
queue-pair tables and the counters outlive the process. A collector killed with kill -9 leaves its program
attached, still executing and acknowledging writes into the pinned arena; the next collector of the same
configuration adopts that arena and its queue pairs instead of loading the (older) region files, so no
acknowledged write is lost. A clean stop saves the regions and removes the pins; a start that fails removes
what it pinned (`discard`). One collector at a time owns a pin directory (`lock_pin_dir`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import secrets
from pathlib import Path

import numpy as np

from softdta.collector.backend import BackendError, Peer, QpInfo, Region
from softdta.collector.config import CollectorConfig
from softdta.collector.xdp_responder import RESPONDER_QP_CAPACITY, ArenaRegion, XdpResponder
from softdta.core.responder import Completion
from softdta.kernel.bpf import BpfError, ensure_bpffs
from softdta.kernel.owner import AlreadyOwned, own
from softdta.kernel.programs import EngineError
from softdta.spec import ARENA_PAGE, Access, Transport

# Regions appear to translators at this address plus their arena offset: page-aligned (atomics need 8 bytes),
# far from zero so that a stray small address never lands in a region.
BASE_VA = 0x7F00_0000_0000
FIRST_QPN = 0x100
QPN_LIMIT = 1 << 24
PIN_ROOT = Path("/sys/fs/bpf/softdta-collector")
LOCK_ROOT = Path("/run/softdta-collector")  # bpffs holds no regular files: the pin directories' locks live here


class XdpBackend:
    name = "xdp"

    def __init__(self, mac: bytes, ip: bytes, *, regions: list[tuple[str, int]], data_dir: Path | None = None,
                 interface: str | None = None, xdp_mode: str = "native", qp_capacity: int = RESPONDER_QP_CAPACITY,
                 pin_dir: Path | None = None) -> None:
        """`regions` are (name, length) in the order `register` will be called, so the arena's layout is known
        before it is loaded (and can be checked against a pinned one)."""
        arena = arena_bytes_for([length for _, length in regions])
        if pin_dir is None or not (pin_dir / "arena").exists():
            _check_memory(regions, arena)
        layout = hashlib.blake2b(json.dumps([regions, qp_capacity]).encode(), digest_size=8).digest()
        try:
            if pin_dir is not None:
                ensure_bpffs()
            self.responder = XdpResponder(mac, ip, arena_bytes=arena, qp_capacity=qp_capacity, pin_dir=pin_dir,
                                          layout=int.from_bytes(layout, "little"))
        except (EngineError, BpfError) as error:
            if pin_dir is not None and not (pin_dir / "arena").exists():
                with contextlib.suppress(OSError):
                    pin_dir.rmdir()  # made for the load that failed
            raise BackendError(str(error)) from None
        try:
            if interface:
                self.responder.attach(interface, xdp_mode)
        except (EngineError, BpfError) as error:
            self.discard()
            raise BackendError(str(error)) from None
        self.data_dir = data_dir
        self.capacity = qp_capacity
        self.regions: dict[str, tuple[Region, ArenaRegion]] = {}
        self.rings: dict[str, tuple[int, int]] = {}  # region -> (bytes of one ring, its first ring_writes index)
        self.qps: dict[int, tuple[Region, Transport, Peer]] = {}
        self._adopted = self.responder.qp_entries() if self.responder.adopted else {}
        # a fresh start numbers its queue pairs from a random QPN, as an RDMA device does not hand a restarted
        # process the numbers of its last run: a translator sees a new queue pair, not an old one gone back in PSN
        self._next_qpn = max(self._adopted) + 1 if self._adopted else FIRST_QPN + secrets.randbelow(QPN_LIMIT // 2)

    @classmethod
    def for_config(cls, config: CollectorConfig, pin_dir: Path | None = None) -> XdpBackend:
        return cls(config.mac, config.ip, regions=[(spec.name, spec.length) for spec in config.regions()],
                   data_dir=config.data_dir, interface=config.interface or None, xdp_mode=config.xdp_mode,
                   qp_capacity=config.max_qps, pin_dir=pin_dir)

    @property
    def adopted_memory(self) -> bool:
        return self.responder.adopted

    def register(self, name: str, length: int, access: Access, ring_bytes: int = 0) -> Region:
        if name in self.regions:
            raise BackendError(f"region {name!r} is already registered")
        try:
            slot = self.responder.allocate(length)
            first_ring = self.responder.allocate_rings(length // ring_bytes) if ring_bytes else 0
        except EngineError as error:
            raise BackendError(str(error)) from None
        # an adopted region keeps the R_Key its queue pairs carry, so translators keep writing with it
        rkeys = {qp.rkey for qp in self._adopted.values() if qp.arena_offset == slot.offset}
        region = Region(name, slot.view, BASE_VA + slot.offset, rkeys.pop() if rkeys else secrets.randbits(32) or 1,
                        access, self.responder.ring_writes[first_ring:first_ring + length // ring_bytes]
                        if ring_bytes else None)
        self.regions[name] = (region, slot)
        self.rings[name] = (ring_bytes, first_ring)
        saved = self._saved(name)
        if not self.responder.adopted and saved is not None and saved.is_file() and saved.stat().st_size == length:
            region.view[:] = np.fromfile(saved, dtype=np.uint8)
        return region

    def adopted(self) -> list[tuple[Peer, QpInfo]]:
        """The queue pairs found in a pinned table, as the collector that was killed left them."""
        by_offset = {slot.offset: region for region, slot in self.regions.values()}
        found = []
        for qpn, qp in sorted(self._adopted.items()):
            region = by_offset.get(qp.arena_offset)
            if region is None or qp.rkey != region.rkey:
                self.responder.remove_qp(qpn)
                continue
            peer = Peer(qp.remote_ip.to_bytes(4, "little"), qp.remote_mac, qp.remote_qpn, qp.start_psn)
            self.qps[qpn] = (region, Transport(qp.transport), peer)
            found.append((peer, QpInfo(qpn, qp.start_psn, Transport(qp.transport), region.name)))
        self._adopted = {}
        return found

    def connect(self, region: Region, transport: Transport, peer: Peer) -> QpInfo:
        if len(peer.ip) != 4:
            raise BackendError("the xdp responder answers IPv4 translators only; give the translator an IPv4 address")
        if len(self.qps) >= self.capacity:
            raise BackendError(f"the queue-pair table is full ({self.capacity} queue pairs)")
        qpn = self._free_qpn()
        self.qps[qpn] = (region, transport, peer)
        try:
            self._bring_up(qpn, peer.psn)
        except Exception as error:
            del self.qps[qpn]  # whatever failed, the table keeps no half-made queue pair (add_qp removes its own)
            if isinstance(error, EngineError):
                raise BackendError(str(error)) from None
            raise
        return QpInfo(qpn, peer.psn, transport, region.name)

    def _free_qpn(self) -> int:
        """The next unused QPN after the last one given whose slot is free: a released QPN is reused as late as
        possible."""
        qpn = self._next_qpn
        while qpn >= QPN_LIMIT or qpn in self.qps or not self.responder.slot_free(qpn):
            qpn = FIRST_QPN if qpn >= QPN_LIMIT else qpn + 1
        self._next_qpn = qpn + 1
        return qpn

    def _bring_up(self, qpn: int, psn: int) -> None:
        region, transport, peer = self.qps[qpn]
        self.responder.add_qp(qpn, transport, remote_ip=peer.ip, remote_mac=peer.mac, remote_qpn=peer.qpn,
                              region=self.regions[region.name][1], base_va=region.base_va, rkey=region.rkey,
                              expected_psn=psn, access=region.access, ring_bytes=self.rings[region.name][0],
                              ring_index=self.rings[region.name][1])

    def release(self, qpn: int) -> None:
        if self.qps.pop(qpn, None) is not None:
            self.responder.remove_qp(qpn)

    def expected_psn(self, qpn: int) -> int:
        state = self.responder.qp_state(qpn)
        if state is None:
            raise BackendError(f"no queue pair {qpn:#x} on this collector")
        return state.expected_psn

    def failed(self) -> list[int]:
        states = {qpn: self.responder.qp_state(qpn) for qpn in self.qps}
        return [qpn for qpn, state in states.items() if state is not None and state.error]

    def reconnect(self, qpn: int) -> QpInfo:
        """The same QPN, out of ERROR, expecting the PSN where it stopped: the translator resumes there."""
        if qpn not in self.qps:
            raise BackendError(f"no queue pair {qpn:#x}")
        psn = self.expected_psn(qpn)
        self.responder.reset_qp(qpn, psn)
        region, transport, _ = self.qps[qpn]
        return QpInfo(qpn, psn, transport, region.name)

    def completions(self) -> list[Completion]:
        return self.responder.completions()

    def counters(self) -> dict[str, int]:
        return {counter.name.lower(): value for counter, value in self.responder.counters().items()}

    def checkpoint(self) -> None:
        """Save every region to its file (atomically), if the backend has a data directory. A save that fails
        (a full or read-only disk) raises OSError and leaves the files as they were, with no partial one."""
        for name, (region, _) in self.regions.items():
            saved = self._saved(name)
            if saved is not None:
                partial = saved.with_suffix(".partial")
                try:
                    partial.write_bytes(region.view.data)  # not ndarray.tofile, whose error on a full disk has no errno
                    partial.replace(saved)
                except OSError:
                    with contextlib.suppress(OSError):  # a read-only file system refuses even this
                        partial.unlink(missing_ok=True)
                    raise

    def close(self) -> None:
        """A clean stop: detach (no more writes), save the regions, then unpin, so the next start restores the
        files. If the save fails, the pins stay, the next start adopts the memory, and BackendError says so."""
        self.responder.detach()
        try:
            self.checkpoint()
        except OSError as error:
            self.responder.close()
            kept = (f"the memory stays pinned in {self.responder.pin_dir} and the next start adopts it, so no write "
                    "is lost" if self.responder.pin_dir else "what was written since the last save is lost")
            raise BackendError(f"saving the regions to {self.data_dir} failed ({error.strerror or error}): {kept}; "
                               "make data_dir writable (or free space on it), then start the collector again and "
                               "stop it") from None
        self.responder.unpin()
        self.responder.close()

    def discard(self) -> None:
        """A start that failed. Fresh memory goes unsaved with its pins and program: no queue pair was ever
        advertised into it, so nothing was acknowledged. Adopted memory, a killed collector's, is left as found:
        pinned, and served by the attached program (the same maps), since it holds acknowledged writes."""
        if self.responder.adopted:
            self.responder.attached.clear()
        else:
            self.responder.detach()
            self.responder.unpin()
        self.responder.close()

    def _saved(self, name: str) -> Path | None:
        if self.data_dir is None:
            return None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return self.data_dir / f"{name}.region"


def pin_dir_for(name: str, ip: bytes) -> Path:
    """Where `softdta collector up` pins a collector's maps: one directory per collector name and IP (bpffs
    refuses names with dots)."""
    return PIN_ROOT / f"{re.sub(r'[^A-Za-z0-9_-]', '_', name)}-{'-'.join(map(str, ip))}"


def lock_pin_dir(pin_dir: Path) -> int:
    """Make this process the only collector on `pin_dir` for as long as it lives (or until the returned file
    descriptor is closed; `kernel.owner`). A second collector of the same configuration is refused before it
    touches the first one's program or pins."""
    try:
        return own(LOCK_ROOT / f"{pin_dir.name}.lock", "collector")
    except AlreadyOwned as error:
        raise BackendError(f"a collector of this name and IP is already running (pid {error.owner}, pins in "
                           f"{pin_dir}); stop it first, or give this one another [collector] name or ip") from None


def arena_bytes_for(lengths: list[int]) -> int:
    """Arena size for regions of these lengths (each starts on a page)."""
    return sum(-(-length // ARENA_PAGE) * ARENA_PAGE for length in lengths)


def _check_memory(regions: list[tuple[str, int]], arena: int) -> None:
    """Refuse regions the kernel cannot hold in one line naming the largest, not libbpf's log of a failed load."""
    available = _available_memory()
    if available is None or arena <= available:
        return
    name, length = max(regions, key=lambda region: region[1])
    raise BackendError(f"structure {name} needs {length:,} bytes and all regions {arena:,}, but this machine has "
                       f"{available:,} bytes of memory available: lower its slots (or lists/entries) in the collector "
                       "configuration")


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
