"""Any frames at kernel speed: a batch of frames written into an mmapped map and sent out of an interface by one
BPF_PROG_TEST_RUN in live-frames mode of bpf/frame_sender.bpf.c, the way the python engine transmits
(softdta.kernel.xdp_transmit). No socket buffer per frame, and no Python step per frame: where the AF_PACKET TX
ring (softdta.kernel.tx_ring) costs about 5 us a frame of the sender's CPU, this costs well under one. The kernel
report generator (softdta.kernel.generator) sends variations of one template; this sends whatever it is given,
in order, such as the demo's mix of every primitive.

Like any XDP transmit, it needs an interface that takes frames from XDP: a veth whose peer runs XDP (the lab's
bridge ports do).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext

import numpy as np

from softdta.kernel.bpf import BpfError, BpfObject, link_xdp
from softdta.kernel.netns import in_netns
from softdta.kernel.programs import EngineError, build_object
from softdta.kernel.resources import BPF_DIR
from softdta.kernel.xdp_transmit import XdpTransmitter
from softdta.wire.columns import FrameRows

FRAME_SENDER_SOURCE = BPF_DIR / "frame_sender.bpf.c"


def as_rows(frames: Sequence[bytes]) -> FrameRows:
    """Frames as the rows of one array, which the sender copies into its slots without a Python step per frame:
    build them once, send slices of them."""
    if isinstance(frames, FrameRows):
        return frames
    lengths = np.fromiter(map(len, frames), dtype=np.int64, count=len(frames))
    rows = np.zeros((len(frames), int(lengths.max()) if len(frames) else 0), dtype=np.uint8)
    for length in np.unique(lengths).tolist():
        positions = np.flatnonzero(lengths == length)
        rows[positions, :length] = np.frombuffer(b"".join(frames[at] for at in positions.tolist()),
                                                 dtype=np.uint8).reshape(-1, length)
    return FrameRows(rows, lengths)


class FrameSender:
    """Sends frames out of `interface` (in namespace `netns`) from XDP, each call's frames in order, from CPU `cpu`
    (default: the last this process may use)."""

    def __init__(self, interface: str, netns: str | None = None, cpu: int | None = None):
        self.netns = netns
        self._link = -1
        with self._inside():
            try:
                ifindex = socket.if_nametoindex(interface)
            except OSError:
                raise EngineError(f"interface {interface!r} does not exist{' in ' + netns if netns else ''}") \
                    from None
            self._object = BpfObject(build_object(FRAME_SENDER_SOURCE))
            try:
                # linked where it sends from, where it passes every frame: in the dispatcher, a call costs no
                # RCU grace period (see softdta.kernel.generator); the link ends with this object or the process
                self._link = link_xdp(ifindex, self._object.programs["softdta_send"].fd)
                self._transmitter = XdpTransmitter(self._object, ifindex, "softdta_send")
            except (BpfError, EngineError) as error:
                self.close()
                raise EngineError(f"cannot send frames from XDP on {interface}: {error}") from None
        self._transmitter.cpu = max(os.sched_getaffinity(0)) if cpu is None else cpu

    def _inside(self) -> AbstractContextManager[None]:
        return in_netns(self.netns) if self.netns else nullcontext()

    @property
    def sent(self) -> int:
        return self._transmitter.sent

    def pinned(self) -> AbstractContextManager[None]:
        """The calling thread on the sender's CPU until the block ends: a thread that sends often spares two
        migrations per call (see XdpTransmitter.pinned)."""
        return self._transmitter.pinned()

    def send(self, frames: Sequence[bytes]) -> None:
        """Send `frames` (best as FrameRows: see `as_rows`) in order."""
        self._transmitter.send(frames)

    def close(self) -> None:
        if hasattr(self, "_transmitter"):
            self._transmitter.close()
        if self._link >= 0:
            os.close(self._link)
            self._link = -1
        self._object.close()

    def __enter__(self) -> FrameSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

