"""Send DTA reports on the wire: at kernel speed (BPF_PROG_TEST_RUN live frames), or one socket call each."""

from __future__ import annotations

import socket
import time
from contextlib import nullcontext
from dataclasses import dataclass

from .bpf import BpfError, BpfObject
from .netns import in_netns
from .xdp import BPF_DIR, EngineError, build_object

SOURCE = BPF_DIR / "reporter.bpf.c"
FRAME_MAX = 256
LIVE_BATCH = 64  # frames the kernel prepares per batch in live mode (at most 256)


@dataclass(frozen=True)
class SendResult:
    frames: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0


def send_kernel(frames: list[bytes], interface: str, netns: str | None = None) -> SendResult:
    """Transmit `frames` in order out of `interface` from the kernel, without a system call per frame.

    The frames are loaded into a map; one BPF_PROG_TEST_RUN in live-frames mode runs the reporter program once per
    frame, and each run transmits the next one. On veth, the peer must run an XDP program (the translator does).
    """
    if not frames:
        return SendResult(0, 0.0)
    too_long = [len(f) for f in frames if len(f) > FRAME_MAX]
    if too_long:
        raise EngineError(f"report frames are at most {FRAME_MAX} bytes; got one of {too_long[0]}")
    try:
        with BpfObject(build_object(SOURCE), map_sizes={"reporter_frames": len(frames)}) as reporter:
            table = reporter.maps["reporter_frames"]
            for index, frame in enumerate(frames):
                value = len(frame).to_bytes(4, "little") + frame.ljust(FRAME_MAX, b"\0")
                table.update(index.to_bytes(4, "little"), value.ljust(table.value_size, b"\0"))
            reporter.maps["reporter_cursor"].update(bytes(4), bytes(4))
            program = reporter.programs["softdta_reporter"]
            with in_netns(netns) if netns else nullcontext():
                ifindex = socket.if_nametoindex(interface)
                started = time.perf_counter()
                program.test_run_live(bytes(FRAME_MAX), ifindex=ifindex, repeat=len(frames), batch_size=LIVE_BATCH)
                return SendResult(len(frames), time.perf_counter() - started)
    except OSError:
        raise EngineError(f"interface {interface!r} does not exist{' in ' + netns if netns else ''}") from None
    except BpfError as error:
        raise EngineError(f"kernel reporter: {error}") from None


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
