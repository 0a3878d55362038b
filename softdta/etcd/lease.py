"""A key kept in etcd under a lease, from a thread: a collector's fleet registration (docs/fleet.md)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from softdta.etcd.client import Etcd, EtcdUnavailable, LeaseExpired

RETRY_FIRST_S = 0.2
RETRY_MOST_S = 5.0


def log_to_stderr(line: str) -> None:
    print(f"softdta: {line}", file=sys.stderr, flush=True)


class KeptKey:
    """Keeps `key` = `value` in etcd under a lease of `ttl` seconds while the process runs.

    The lease is renewed every ttl/3 s, so the key vanishes within `ttl` s of a crash. When the lease expired
    anyway (etcd was away longer than the TTL, the process was paused, or it expired between the grant and the
    write), the key is written again under a new lease. etcd unreachable never stops the caller: it is logged once
    per outage, counted, and retried with a growing delay. `close` revokes the lease, so the key goes at once."""

    def __init__(self, etcd: Etcd, key: str, value: str | bytes, ttl: int, *, what: str,
                 log: Callable[[str], None] = log_to_stderr):
        self.etcd, self.key, self.value, self.ttl, self.what, self.log = etcd, key, value, ttl, what, log
        self.lease = 0
        self.registrations = 0  # writes of the key under a new lease
        self.lease_expiries = 0  # leases found expired while the process ran
        self.etcd_failures = 0  # calls etcd did not answer
        self.etcd_reachable = True
        self.last_error = ""
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"etcd-lease {key}", daemon=True)

    def start(self) -> KeptKey:
        self.thread.start()
        return self

    @property
    def registered(self) -> bool:
        return bool(self.lease) and self.etcd_reachable

    def status(self) -> dict[str, Any]:
        return {"key": self.key, "endpoint": self.etcd.endpoint, "registered": self.registered,
                "lease": f"{self.lease:x}" if self.lease else "", "lease_ttl_s": self.ttl,
                "registrations": self.registrations, "lease_expiries": self.lease_expiries,
                "etcd_failures": self.etcd_failures, "etcd_reachable": self.etcd_reachable,
                "last_error": self.last_error}

    def _run(self) -> None:
        retry = RETRY_FIRST_S
        while not self.stop.is_set():
            try:
                self._renew_or_register()
                wait = self.ttl / 3
                retry = RETRY_FIRST_S
            except LeaseExpired:
                self.lease_expiries += 1
                self.lease = 0
                self.log(f"{self.what}: the lease of {self.key} expired while this process ran (etcd away or the "
                         "process paused for longer than the TTL); registering again")
                wait = 0
            except EtcdUnavailable as error:
                self.etcd_failures += 1
                self.last_error = str(error)
                if self.etcd_reachable:
                    self.log(f"{self.what}: {error}; running on, retrying in the background")
                    self.etcd_reachable = False
                wait, retry = retry, min(retry * 2, RETRY_MOST_S, max(self.ttl / 3, RETRY_FIRST_S))
            self.stop.wait(wait)

    def _renew_or_register(self) -> None:
        if self.lease and self.etcd.keepalive(self.lease) == 0:
            raise LeaseExpired(f"lease {self.lease:x} of {self.key} expired")
        if not self.lease:
            lease = self.etcd.grant(self.ttl)
            self.etcd.put(self.key, self.value, lease=lease)
            self.lease = lease
            self.registrations += 1
            self.log(f"{self.what}: registered {self.key} in etcd at {self.etcd.endpoint} (lease {lease:x}, TTL "
                     f"{self.ttl} s)")
        if not self.etcd_reachable:
            self.log(f"{self.what}: etcd at {self.etcd.endpoint} answers again")
            self.etcd_reachable = True

    def close(self) -> None:
        """Stop renewing and revoke the lease (the key goes now, not after the TTL)."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=self.etcd.timeout * 3)
        if self.lease:
            try:
                self.etcd.revoke(self.lease)
            except EtcdUnavailable:
                pass  # the key goes when the lease runs out
            self.lease = 0
