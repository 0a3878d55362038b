"""What every collector backend offers: registered regions and queue pairs towards translators.

Two backends implement it: `xdp` (the XDP responder: no RDMA hardware needed, the embedded default) and `verbs`
(pyverbs on any RDMA device, soft-RoCE or a real NIC). Queries read `Region.view` the same way over both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from softdta.core.responder import Completion
from softdta.errors import SoftdtaError
from softdta.spec import Access, Transport


class BackendError(SoftdtaError, RuntimeError):
    """A backend cannot do what was asked; the message names the problem and the fix."""


@dataclass(frozen=True)
class Peer:
    """The translator's end of a queue pair, as the translator announces it."""

    ip: bytes  # IPv4, 4 bytes
    mac: bytes
    qpn: int  # the translator's (virtual) QPN: DestQP of the collector's ACKs
    psn: int  # the first PSN the translator sends


@dataclass
class Region:
    """Registered memory: `view` is live (the backend's writes show up in it), `base_va` and `rkey` are what
    the translator puts in its RETH / AtomicETH."""

    name: str
    view: np.ndarray  # uint8
    base_va: int
    rkey: int
    access: Access
    ring_writes: np.ndarray | None = None  # Append rings: WRITEs executed into each, where the backend counts them


@dataclass(frozen=True)
class QpInfo:
    """A queue pair of the collector, ready to receive (RTR or beyond)."""

    qpn: int
    psn: int  # the PSN it expects first
    transport: Transport
    region: str


class Backend(Protocol):
    name: str

    def register(self, name: str, length: int, access: Access, ring_bytes: int = 0) -> Region:
        """Memory for one structure, registered for remote access (page-aligned, zeroed unless restored).
        `ring_bytes` marks Append rings of that many bytes: a backend that sees each write (xdp) counts the
        writes per ring in `Region.ring_writes`, so that readers detect laps."""

    def connect(self, region: Region, transport: Transport, peer: Peer) -> QpInfo:
        """A queue pair that accepts `peer`'s requests into `region`, brought up to receive."""

    def release(self, qpn: int) -> None:
        """Take a queue pair down and free its entry (its translator is gone); unknown QPNs are ignored."""

    def adopted(self) -> list[tuple[Peer, QpInfo]]:
        """Queue pairs a killed collector left running (xdp with pinned maps), to be taken over; call it once,
        after every region is registered."""

    def expected_psn(self, qpn: int) -> int:
        """The PSN the queue pair expects next (rxe's rq_psn): the translator's next PSN, when both agree."""

    def failed(self) -> list[int]:
        """QPNs of queue pairs in ERROR (after an access violation); `reconnect` brings them back."""

    def reconnect(self, qpn: int) -> QpInfo:
        """Replace a failed queue pair; the new one may have another QPN, which must be re-advertised."""

    def completions(self) -> list[Completion]:
        """WRITE with Immediate completions since the last call, oldest first; call it often, since a verbs
        device has only so many receive WRs posted."""

    def counters(self) -> dict[str, int]:
        """Responder counters by rxe hw_counters name where one exists."""

    def close(self) -> None:
        """Release queue pairs and registrations; memory backed by a file stays on disk."""
