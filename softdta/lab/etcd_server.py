"""A local etcd process for the lab, the demos and the tests (Debian's etcd-server; never a stand-in)."""

from __future__ import annotations

import shutil
import subprocess
import time
from contextlib import nullcontext
from pathlib import Path

from softdta.errors import SoftdtaError
from softdta.etcd.client import Etcd, EtcdUnavailable
from softdta.kernel.netns import in_netns
from softdta.lab.local_server import LocalServer, free_port


class EtcdServer(LocalServer):
    """One etcd member on `host` (in network namespace `netns`, if given), its data in `directory`. `stop`/`kill`
    and `start` again keep data and ports, as an operator's restart does."""

    def __init__(self, directory: Path, host: str = "127.0.0.1", client_port: int = 0, peer_port: int = 0,
                 netns: str | None = None):
        binary = shutil.which("etcd")
        if binary is None:
            raise SoftdtaError("etcd is not installed; run scripts/setup.sh (it installs Debian's etcd-server)")
        self.binary, self.directory, self.host, self.netns = binary, Path(directory), host, netns
        self.client_port = client_port or free_port(host)
        self.peer_port = peer_port or free_port(host)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    def client(self, timeout: float = 2.0) -> Etcd:
        return Etcd(self.endpoint, timeout)

    def start(self, ready_within: float = 20.0) -> EtcdServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        peer = f"http://{self.host}:{self.peer_port}"
        log = open(self.directory / "etcd.log", "ab")
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.process = subprocess.Popen(
            inside + [self.binary, "--name", "softdta", "--data-dir", str(self.directory / "data"),
             "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"softdta={peer}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + ready_within
        client = self.client(timeout=0.5)
        while True:
            if self.process.poll() is not None:
                raise SoftdtaError(f"etcd exited with status {self.process.returncode} at start; see "
                                   f"{self.directory / 'etcd.log'}")
            try:
                with in_netns(self.netns) if self.netns else nullcontext():
                    client.get("/softdta/")
                return self
            except EtcdUnavailable:
                if time.monotonic() > deadline:
                    self.kill()
                    raise SoftdtaError(f"etcd did not answer within {ready_within} s; see "
                                       f"{self.directory / 'etcd.log'}") from None
                time.sleep(0.05)
