"""A local nats-server with JetStream for the lab, the demos, the benchmarks and the tests (Debian's
nats-server; never a stand-in)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

from softdta.errors import SoftdtaError
from softdta.lab.local_server import LocalServer, free_port


class NatsServer(LocalServer):
    """One nats-server on `host` with JetStream, its store in `directory`. `stop`/`kill` and `start` again keep
    the store and the port, as an operator's restart does."""

    def __init__(self, directory: Path, host: str = "127.0.0.1", port: int = 0):
        binary = shutil.which("nats-server")
        if binary is None:
            raise SoftdtaError("nats-server is not installed; run scripts/setup.sh (it installs Debian's nats-server)")
        self.binary, self.directory, self.host = binary, Path(directory), host
        self.port = port or free_port(host)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self, ready_within: float = 20.0) -> NatsServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        log = open(self.directory / "nats-server.log", "ab")
        self.process = subprocess.Popen(
            [self.binary, "--jetstream", "--store_dir", str(self.directory / "store"), "--addr", self.host,
             "--port", str(self.port)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + ready_within
        while not self._jetstream_ready():
            if self.process.poll() is not None:
                raise SoftdtaError(f"nats-server exited with status {self.process.returncode} at start; see "
                                   f"{self.directory / 'nats-server.log'}")
            if time.monotonic() > deadline:
                self.kill()
                raise SoftdtaError(f"nats-server did not answer within {ready_within} s; see "
                                   f"{self.directory / 'nats-server.log'}")
            time.sleep(0.05)
        return self

    def _jetstream_ready(self) -> bool:
        """The server's INFO line says it runs JetStream."""
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as connection:
                line = connection.makefile("rb").readline()
        except OSError:
            return False
        if not line.startswith(b"INFO "):
            return False
        return bool(json.loads(line[5:]).get("jetstream"))
