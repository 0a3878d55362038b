"""The `xdp` backend: the XDP responder as the collector's RDMA NIC, the embedded default where no RDMA device
exists. Regions live in the responder's mmapable arena; each is saved to `data_dir/<name>.region` when the
collector stops and restored when it starts, so data survives a restart."""

from __future__ import annotations

import secrets
from pathlib import Path

import numpy as np

from ..responder import Completion
from ..spec import ARENA_PAGE, Access, Transport
from ..xdp import EngineError
from ..xdp_responder import ArenaRegion, XdpResponder
from .backend import BackendError, Peer, QpInfo, Region

# Regions appear to translators at this address plus their arena offset: page-aligned (atomics need 8 bytes),
# far from zero so that a stray small address never lands in a region.
BASE_VA = 0x7F00_0000_0000
FIRST_QPN = 0x100


class XdpBackend:
    name = "xdp"

    def __init__(self, mac: bytes, ip: bytes, *, arena_bytes: int, data_dir: Path | None = None,
                 interface: str | None = None):
        try:
            self.responder = XdpResponder(mac, ip, arena_bytes=arena_bytes)
            if interface:
                self.responder.attach(interface)
        except EngineError as error:
            raise BackendError(str(error)) from None
        self.data_dir = data_dir
        self.regions: dict[str, tuple[Region, ArenaRegion]] = {}
        self.qps: dict[int, tuple[Region, Transport, Peer]] = {}
        self._next_qpn = FIRST_QPN

    def register(self, name: str, length: int, access: Access) -> Region:
        if name in self.regions:
            raise BackendError(f"region {name!r} is already registered")
        try:
            slot = self.responder.allocate(length)
        except EngineError as error:
            raise BackendError(str(error)) from None
        region = Region(name, slot.view, BASE_VA + slot.offset, secrets.randbits(32) or 1, access)
        self.regions[name] = (region, slot)
        saved = self._saved(name)
        if saved is not None and saved.is_file() and saved.stat().st_size == length:
            region.view[:] = np.fromfile(saved, dtype=np.uint8)
        return region

    def connect(self, region: Region, transport: Transport, peer: Peer) -> QpInfo:
        qpn = self._next_qpn
        self._next_qpn += 1
        self.qps[qpn] = (region, transport, peer)
        self._bring_up(qpn, peer.psn)
        return QpInfo(qpn, peer.psn, transport, region.name)

    def _bring_up(self, qpn: int, psn: int) -> None:
        region, transport, peer = self.qps[qpn]
        self.responder.add_qp(qpn, transport, remote_ip=peer.ip, remote_mac=peer.mac, remote_qpn=peer.qpn,
                              region=self.regions[region.name][1], base_va=region.base_va, rkey=region.rkey,
                              expected_psn=psn, access=region.access)

    def expected_psn(self, qpn: int) -> int:
        return self.responder.qp_state(qpn)["expected_psn"]

    def failed(self) -> list[int]:
        return [qpn for qpn in self.qps if self.responder.qp_state(qpn)["error"]]

    def reconnect(self, qpn: int) -> QpInfo:
        """The same QPN, out of ERROR, expecting the PSN where it stopped: the translator resumes there."""
        if qpn not in self.qps:
            raise BackendError(f"no queue pair {qpn:#x}")
        psn = self.responder.qp_state(qpn)["expected_psn"]
        self.responder.reset_qp(qpn, psn)
        region, transport, _ = self.qps[qpn]
        return QpInfo(qpn, psn, transport, region.name)

    def completions(self) -> list[Completion]:
        return self.responder.completions()

    def counters(self) -> dict[str, int]:
        return {counter.name.lower(): value for counter, value in self.responder.counters().items()}

    def checkpoint(self) -> None:
        """Save every region to its file (atomically), if the backend has a data directory."""
        for name, (region, _) in self.regions.items():
            saved = self._saved(name)
            if saved is not None:
                partial = saved.with_suffix(".partial")
                region.view.tofile(partial)
                partial.replace(saved)

    def close(self) -> None:
        self.checkpoint()
        self.responder.close()

    def _saved(self, name: str) -> Path | None:
        if self.data_dir is None:
            return None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return self.data_dir / f"{name}.region"


def arena_bytes_for(lengths: list[int]) -> int:
    """Arena size for regions of these lengths (each starts on a page)."""
    return sum(-(-length // ARENA_PAGE) * ARENA_PAGE for length in lengths)
