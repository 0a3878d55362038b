"""Send DTA reports on the wire: at kernel speed (BPF_PROG_TEST_RUN live frames), or one socket call each."""

from __future__ import annotations

import mmap
import socket
import struct
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from .bpf import BpfError, BpfObject
from .netns import in_netns
from .xdp import BPF_DIR, EngineError, build_object

SOURCE = BPF_DIR / "reporter.bpf.c"
FRAME_MAX = 256
SLOT = 4 + FRAME_MAX  # struct report_frame
STRIDE = (SLOT + 7) & ~7  # array map values are 8-byte aligned in the mapping
LIVE_BATCH = 64  # frames the kernel prepares per batch in live mode (at most 256)
SOL_PACKET, PACKET_VERSION, PACKET_TX_RING, TPACKET_V2 = 263, 10, 13, 1
TP_STATUS_AVAILABLE, TP_STATUS_SEND_REQUEST = 0, 1
TX_DATA_OFFSET = 32  # TX_DATA_OFFSET - sizeof(struct sockaddr_ll): where a TX frame's bytes start


@dataclass(frozen=True)
class SendResult:
    frames: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0


class KernelReporter:
    """Transmits batches of report frames in order out of one interface, from the kernel.

    The frames go into an mmapable map with one copy; one BPF_PROG_TEST_RUN in live-frames mode runs the
    reporter program once per frame, and each run transmits the next one (the mechanism of xdp-trafficgen),
    with no system call per frame. On veth, the peer must run an XDP program (the translator does).
    """

    def __init__(self, interface: str, netns: str | None = None, capacity: int = 4096):
        self.interface, self.netns, self.capacity = interface, netns, capacity
        try:
            self.object = BpfObject(build_object(SOURCE), map_sizes={"reporter_frames": capacity})
        except BpfError as error:
            raise EngineError(f"kernel reporter: {error}") from None
        self._mapping = self.object.maps["reporter_frames"].mmap()
        self.slots = np.frombuffer(self._mapping, dtype=np.uint8).reshape(capacity, STRIDE)
        self.program = self.object.programs["softdta_reporter"]
        with in_netns(netns) if netns else nullcontext():
            try:
                self.ifindex = socket.if_nametoindex(interface)
            except OSError:
                raise EngineError(f"interface {interface!r} does not exist{' in ' + netns if netns else ''}") \
                    from None

    def close(self) -> None:
        self.object.close()  # the frame view keeps the mapping alive while it exists

    def __enter__(self) -> KernelReporter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, frames: list[bytes]) -> SendResult:
        if len(frames) > self.capacity:
            raise EngineError(f"a batch holds at most {self.capacity} frames, got {len(frames)}")
        if any(len(frame) > FRAME_MAX for frame in frames):
            raise EngineError(f"report frames are at most {FRAME_MAX} bytes")
        if not frames:
            return SendResult(0, 0.0)
        packed = b"".join(len(f).to_bytes(4, "little") + f.ljust(FRAME_MAX, b"\0") for f in frames)
        self.slots[:len(frames), :SLOT] = np.frombuffer(packed, dtype=np.uint8).reshape(len(frames), SLOT)
        self.object.maps["reporter_cursor"].update(bytes(4), bytes(4))
        with in_netns(self.netns) if self.netns else nullcontext():
            started = time.perf_counter()
            try:
                self.program.test_run_live(bytes(FRAME_MAX), ifindex=self.ifindex, repeat=len(frames),
                                           batch_size=LIVE_BATCH)
            except BpfError as error:
                raise EngineError(f"kernel reporter on {self.interface}: {error}") from None
            return SendResult(len(frames), time.perf_counter() - started)


def send_kernel(frames: list[bytes], interface: str, netns: str | None = None) -> SendResult:
    """Transmit `frames` in order from the kernel (see KernelReporter)."""
    with KernelReporter(interface, netns, capacity=max(1, len(frames))) as reporter:
        return reporter.send(frames)


def send_socket(frames: list[bytes], interface: str, netns: str | None = None) -> SendResult:
    """Transmit `frames` with one AF_PACKET send each: the slow path, for comparison and for any interface."""
    with in_netns(netns) if netns else nullcontext():
        sender = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        sender.bind((interface, 0))
    with sender:
        started = time.perf_counter()
        for frame in frames:
            sender.send(frame)
        return SendResult(len(frames), time.perf_counter() - started)


class RingReporter:
    """Transmits batches of report frames through an AF_PACKET TX ring (TPACKET_V2): the frames are written into
    memory shared with the kernel, and one send() transmits the whole batch, in order, as ordinary packets."""

    def __init__(self, interface: str, netns: str | None = None, capacity: int = 4096):
        self.capacity = capacity
        with in_netns(netns) if netns else nullcontext():
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            try:
                self.sock.bind((interface, 0))
            except OSError:
                self.sock.close()
                raise EngineError(f"interface {interface!r} does not exist{' in ' + netns if netns else ''}") \
                    from None
        self.sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
        # frames of 512 bytes, eight to a 4 KiB block
        self.sock.setsockopt(SOL_PACKET, PACKET_TX_RING, struct.pack("IIII", 4096, capacity // 8, 512, capacity))
        self.ring = mmap.mmap(self.sock.fileno(), capacity * 512)
        self.next = 0

    def close(self) -> None:
        self.ring.close()
        self.sock.close()

    def __enter__(self) -> RingReporter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, frames: list[bytes]) -> SendResult:
        if len(frames) > self.capacity:
            raise EngineError(f"a batch holds at most {self.capacity} frames, got {len(frames)}")
        started = time.perf_counter()
        for frame in frames:
            slot = self.next * 512
            while struct.unpack_from("I", self.ring, slot)[0] != TP_STATUS_AVAILABLE:
                self.sock.send(b"")  # the kernel is still sending the ring's previous round
            self.ring[slot + TX_DATA_OFFSET:slot + TX_DATA_OFFSET + len(frame)] = frame
            struct.pack_into("II", self.ring, slot + 4, len(frame), len(frame))  # tp_len, tp_snaplen
            struct.pack_into("I", self.ring, slot, TP_STATUS_SEND_REQUEST)
            self.next = (self.next + 1) % self.capacity
        self.sock.send(b"")
        return SendResult(len(frames), time.perf_counter() - started)
