"""What the lab's local servers (etcd, nats-server) share: a free port, and a process that `stop` (SIGTERM) and
`kill` (kill -9) end as an operator would, and that a `with` block starts and kills."""

from __future__ import annotations

import signal
import socket
import subprocess
from typing import Self


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class LocalServer:
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        raise NotImplementedError

    def _end(self, how: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(how)
            self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """kill -9: what the server had not written to disk is gone with it."""
        self._end(signal.SIGKILL)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
