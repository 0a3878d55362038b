"""Send DTA reports on the wire from an AF_PACKET TX ring: the frames are written into memory shared with the
kernel, and one system call sends a whole batch, in order. Any frames, at Python speed; the kernel report
generator (softdta.kernel.generator) sends variations of one template at kernel speed.
"""

from __future__ import annotations

import mmap
import socket
import struct
import time
from contextlib import nullcontext
from dataclasses import dataclass

from softdta.kernel.netns import in_netns
from softdta.kernel.programs import EngineError

SOL_PACKET, PACKET_VERSION, PACKET_TX_RING, TPACKET_V2 = 263, 10, 13, 1
TP_STATUS_AVAILABLE, TP_STATUS_SEND_REQUEST = 0, 1
TX_DATA_OFFSET = 32  # TPACKET2_HDRLEN - sizeof(struct sockaddr_ll): where a TX frame's bytes start
SLOT_SIZE = 512  # ring frame: header and report; eight to a 4 KiB block


@dataclass(frozen=True)
class SendResult:
    frames: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0


class RingReporter:
    """Transmits batches of report frames through an AF_PACKET TX ring (TPACKET_V2): the frames are written into
    memory shared with the kernel, and one send() transmits the whole batch, in order, as ordinary packets."""

    def __init__(self, interface: str, netns: str | None = None, capacity: int = 4096):
        self.capacity = capacity = -(-capacity // 8) * 8  # whole 4 KiB blocks of eight frames
        with in_netns(netns) if netns else nullcontext():
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            try:
                self.sock.bind((interface, 0))
            except OSError:
                self.sock.close()
                raise EngineError(f"interface {interface!r} does not exist{' in ' + netns if netns else ''}") \
                    from None
        self.sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
        self.sock.setsockopt(SOL_PACKET, PACKET_TX_RING, struct.pack("IIII", 4096, capacity // 8, SLOT_SIZE, capacity))
        self.ring = mmap.mmap(self.sock.fileno(), capacity * SLOT_SIZE)
        self.next = 0

    def close(self) -> None:
        self.ring.close()
        self.sock.close()

    def __enter__(self) -> RingReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, frames: list[bytes]) -> SendResult:
        if len(frames) > self.capacity:
            raise EngineError(f"a batch holds at most {self.capacity} frames, got {len(frames)}")
        if any(len(frame) > SLOT_SIZE - TX_DATA_OFFSET for frame in frames):
            raise EngineError(f"report frames are at most {SLOT_SIZE - TX_DATA_OFFSET} bytes")
        started = time.perf_counter()
        for frame in frames:
            slot = self.next * SLOT_SIZE
            while struct.unpack_from("I", self.ring, slot)[0] != TP_STATUS_AVAILABLE:
                self.sock.send(b"")  # the kernel is still sending the ring's previous round
            self.ring[slot + TX_DATA_OFFSET:slot + TX_DATA_OFFSET + len(frame)] = frame
            struct.pack_into("II", self.ring, slot + 4, len(frame), len(frame))  # tp_len, tp_snaplen
            struct.pack_into("I", self.ring, slot, TP_STATUS_SEND_REQUEST)
            self.next = (self.next + 1) % self.capacity
        self.sock.send(b"")
        return SendResult(len(frames), time.perf_counter() - started)
