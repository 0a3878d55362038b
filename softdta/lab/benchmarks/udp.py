"""The datagram plumbing the userspace contenders share: a count of what arrived that a sender can wait on, so it
keeps at most WINDOW reports in flight, and a sink that counts datagrams."""

from __future__ import annotations

import asyncio
from typing import Any

WINDOW = 64  # reports in flight to a userspace contender, well within its socket buffer


class Progress:
    """A count that coroutines can wait on."""

    def __init__(self) -> None:
        self.count, self.changed = 0, asyncio.Event()

    def add(self) -> None:
        self.count += 1
        self.changed.set()

    async def at_least(self, target: int, timeout: float = 10.0) -> None:
        while self.count < target:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), timeout)


class Sink(asyncio.DatagramProtocol):
    """Counts the datagrams it receives."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.progress.add()
