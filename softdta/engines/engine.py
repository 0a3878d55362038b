"""What every translator engine offers: the reference translator (softdta.core.translator), the XDP fast path
(engines/xdp.py) and the python engine on AF_XDP (engines/python.py) all implement `Engine`; the two that run on
interfaces implement `LiveEngine` as well."""

from __future__ import annotations

import queue
from collections import Counter
from typing import Protocol, TypedDict

from softdta.core.control_plane import PsnRestart
from softdta.core.primitives import Output
from softdta.core.tables import QueuePair, Tables
from softdta.spec import TranslatorCounter


class Engine(Protocol):
    """Frames in, frames out. `now_ns` is the caller's clock; an engine in the kernel reads the kernel's."""

    def process(self, frame: bytes, now_ns: int = 0) -> Output: ...

    def flush_idle(self, now_ns: int = 0) -> list[bytes]: ...

    def counts(self) -> Counter[TranslatorCounter]: ...


class QpStatus(TypedDict):
    """A QP's place in its PSN sequence and its state, as both live engines report it."""

    next_psn: int
    unacked_psn: int  # the oldest PSN not acknowledged yet
    state: int  # a spec.QpState
    grace_until_ns: int
    frames_sent: int


class Stop(Protocol):
    """What `serve` runs until: a threading.Event, or the command line's signal-safe flag (cli.common.Signals)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class LiveEngine(Engine, Protocol):
    """An engine on interfaces: tables applied live, attached, served until `stop`, then closed."""

    @property
    def tables(self) -> Tables: ...

    def apply(self, tables: Tables) -> None: ...

    def qp_state(self, qp: QueuePair) -> QpStatus: ...

    def attach(self, interfaces: list[str], mode: str = "native") -> None: ...

    def serve(self, stop: Stop, updates: queue.Queue[Tables] | None = None) -> None: ...

    def close(self) -> None: ...


def report_adoptions(restarts: list[PsnRestart]) -> int:
    """Log each QP that takes over its collector's PSN in place of its own; returns how many did."""
    adopted = [restart for restart in restarts if restart.live_psn is not None and restart.live_psn != restart.psn]
    for restart in adopted:
        print(f"softdta: QP {restart.qp} ({restart.local_qpn:#x}) adopts its collector's PSN {restart.psn} "
              f"(it was at {restart.live_psn})", flush=True)
    return len(adopted)
