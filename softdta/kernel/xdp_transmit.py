"""Transmitting through XDP: the python engine's frames leave the way the kernel report generator's reports do.

The engine's XDP program (bpf/xsk_steer.bpf.c) sends slot i of the mmapped map `transmit_frames` on the i-th run
of a BPF_PROG_TEST_RUN in live-frames mode on the loopback: one system call hands a whole batch to the
interface's `ndo_xdp_xmit`, with no socket buffer per frame. Copy-mode AF_XDP on veth builds an skb per frame,
and that cost about 2.9 us a frame, against about 0.5 us here (1 us with the far end's receive, which runs on
the same CPU; docs/benchmarks.md).

Like any XDP transmit, this needs an interface that takes frames from XDP (`ndo_xdp_xmit`); a veth does only
while its peer runs XDP (or has GRO on). `interface_takes_frames` asks the kernel, and the engine sends through
its AF_XDP socket while the answer is no.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from softdta.kernel.bpf import BpfError, BpfObject
from softdta.kernel.maps import record
from softdta.kernel.netdev import XDP_ACT_NDO_XMIT, xdp_features
from softdta.kernel.netns import in_netns_of
from softdta.kernel.programs import EngineError
from softdta.spec import ETHERNET, LOOPBACK_IFINDEX, TRANSMIT_FRAME_MAX, TRANSMIT_SLOTS
from softdta.wire.columns import FrameRows, frame_lengths, stack

BURST = 64  # frames the kernel sends before it flushes them to the interface: a quarter of a veth ring
_CONTROL = record("transmit_control")
_SLOT = record("transmit_frame")
_RUN_FRAME = bytes(ETHERNET.size)  # what each run starts from; the program writes the frame over it


class XdpTransmitter:
    """Sends frames of at most TRANSMIT_FRAME_MAX bytes out of interface `ifindex` (of the network namespace the
    transmitter is made in, whichever namespace the caller is in later) through `program` of `bpf_object`, in
    order.

    Every call leaves from one CPU, whichever thread calls: veth hands a frame from XDP to the peer's RX queue
    of the sending CPU, and frames of one queue pair on two queues could overtake each other."""

    def __init__(self, bpf_object: BpfObject, ifindex: int, program: str = "softdta_xsk"):
        self.ifindex = ifindex
        self._program = bpf_object.programs[program]
        self._control_mapping = bpf_object.maps["transmit_control"].mmap()
        self._mapping = bpf_object.maps["transmit_frames"].mmap()
        slots = np.frombuffer(self._mapping, dtype=np.uint8).reshape(TRANSMIT_SLOTS, _SLOT.size)
        slots[:] = 0  # fault every page in now, not in the first calls (20 us a frame)
        length_at, frame_at = _SLOT.offsets["len"], _SLOT.offsets["frame"]
        self._lengths = slots[:, length_at:length_at + 4].view(np.uint32).reshape(-1)
        self._bytes = slots[:, frame_at:frame_at + TRANSMIT_FRAME_MAX]
        self._netns = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        self.cpu = min(os.sched_getaffinity(0))
        self.sent = 0
        self.resumed = 0  # runs a signal ended early, each resumed from the first frame not sent (test_run_live)

    def close(self) -> None:
        if self._netns >= 0:
            del self._lengths, self._bytes
            self._mapping.close()
            self._control_mapping.close()
            os.close(self._netns)
            self._netns = -1

    def interface_takes_frames(self) -> bool:
        """Whether the interface takes frames from XDP now (raises NetdevError when the kernel does not say)."""
        with in_netns_of(self._netns, "the network namespace of the engine's interface"):
            return bool(xdp_features(self.ifindex) & XDP_ACT_NDO_XMIT)

    def send(self, frames: Sequence[bytes]) -> None:
        """Transmit `frames` in order, TRANSMIT_SLOTS a call; FrameRows are copied into the slots row by row."""
        for first in range(0, len(frames), TRANSMIT_SLOTS):
            chunk = frames[first:first + TRANSMIT_SLOTS]
            self._place(chunk)
            self._run(len(chunk))

    def _place(self, frames: Sequence[bytes]) -> None:
        lengths = frame_lengths(frames)
        unfit = lengths[(lengths > TRANSMIT_FRAME_MAX) | (lengths < ETHERNET.size)]
        if len(unfit):
            raise EngineError(f"a frame of {int(unfit[0])} bytes does not fit a transmit slot "
                              f"({ETHERNET.size}..{TRANSMIT_FRAME_MAX}): send it through the socket")
        rows = (frames if isinstance(frames, FrameRows) else stack([frames])).rows
        width = min(rows.shape[1], TRANSMIT_FRAME_MAX)  # what is past a frame's length is not sent
        self._bytes[:len(frames), :width] = rows[:, :width]
        self._lengths[:len(frames)] = lengths

    def _run(self, count: int) -> None:
        self._control_mapping[:_CONTROL.size] = _CONTROL.pack(count=count, next=0, ifindex=self.ifindex)
        try:
            with self._placed():
                self.resumed += self._program.test_run_live(_RUN_FRAME, ifindex=LOOPBACK_IFINDEX, repeat=count,
                                                            batch_size=BURST, ran=self._next)
        except BpfError as error:
            raise EngineError(f"XDP transmit: {error}") from None
        sent = self._next()
        self.sent += sent
        if sent != count:
            raise EngineError(f"XDP transmit sent {sent} of {count} frames: the program refused a slot; this is a bug")

    def _next(self) -> int:
        """The slot the program sends next: how many of the call's frames it has sent."""
        return int(_CONTROL.unpack(self._control_mapping[:_CONTROL.size])["next"])

    @contextmanager
    def _placed(self) -> Iterator[None]:
        """The calling thread, for one call, on the transmitter's CPU and in its interface's network namespace
        (where the test run finds the loopback and `ifindex`)."""
        allowed = os.sched_getaffinity(0)
        if allowed != {self.cpu}:  # a thread pinned there already (`pinned`) moves nowhere
            os.sched_setaffinity(0, {self.cpu})
        try:
            with in_netns_of(self._netns, "the network namespace of the engine's interface"):
                yield
        finally:
            if allowed != {self.cpu}:
                os.sched_setaffinity(0, allowed)

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """The calling thread on the transmitter's CPU until the block ends: a thread that sends often then
        spares a migration per call (about 80 us on this VM)."""
        allowed = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.cpu})
        try:
            yield
        finally:
            os.sched_setaffinity(0, allowed)
