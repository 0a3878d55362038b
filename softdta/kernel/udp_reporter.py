"""The small Python reporter: DTA reports in UDP datagrams from an ordinary socket, each to port 40040 of its
collector; in a fleet, its slot's collector (core.fleet_reporter, docs/fleet.md). No root: the kernel
routes each datagram, and the route to a collector passes its translator.

A new slot map applies live (`update`, from any thread, e.g. a watch of the fleet's etcd key): only a later epoch
replaces the map in use.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import Iterable

from softdta.core.fleet import SlotMap, check_successor
from softdta.core.fleet_reporter import Addressed, address
from softdta.errors import SoftdtaError
from softdta.spec import DTA_PORT
from softdta.wire import dta
from softdta.wire.dta import Profile, Report
from softdta.wire.frames import ip_bytes, ip_str


class ReporterError(SoftdtaError, OSError):
    """A report the socket could not send; the message names the collector."""


class UdpReporter:
    """Sends reports to their collectors: with `slot_map`, each to its slot's (with `copies_across`, Key-Write and
    Key-Increment to every replica holding a copy); without, all to `collector`. `sent` counts the datagrams
    sent to each collector IP."""

    def __init__(self, *, slot_map: SlotMap | None = None, collector: str | None = None,
                 profile: Profile = Profile.DTA_V1, copies_across: bool = False, source: str | None = None):
        """`source`: the IP to send from (default: the kernel's choice for each collector's route)."""
        if (slot_map is None) == (collector is None):
            raise ReporterError("give the reporter a slot map or a collector, not both or neither")
        self._slot_map, self.profile, self.copies_across = slot_map, profile, copies_across
        self._collector = ip_bytes(collector) if collector is not None else b""
        self._update_lock = threading.Lock()
        self.sent: Counter[str] = Counter()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        if source is not None:
            try:
                self._socket.bind((source, 0))
            except OSError as error:
                self._socket.close()
                raise ReporterError(f"cannot send from {source}: {error.strerror}; give an address of this "
                                    "host") from None

    @property
    def slot_map(self) -> SlotMap | None:
        return self._slot_map

    def update(self, slot_map: SlotMap) -> None:
        """Address the next reports by `slot_map`; FleetError if its epoch does not follow the current one's."""
        with self._update_lock:
            check_successor(self._slot_map, slot_map)
            self._slot_map = slot_map

    def addressed(self, report: Report) -> tuple[Addressed, ...]:
        slot_map = self._slot_map  # one map for all copies of a report, whatever an update does meanwhile
        if slot_map is None:
            return (Addressed(self._collector, report),)
        return address(slot_map, report, copies_across=self.copies_across)

    def send(self, report: Report) -> int:
        """Send `report` (its copies, across replicas); returns the datagrams sent."""
        sent = 0
        for each in self.addressed(report):
            collector = ip_str(each.collector)
            try:
                self._socket.sendto(dta.encode(each.report, self.profile), (collector, DTA_PORT))
            except OSError as error:
                raise ReporterError(f"cannot send a report to collector {collector}: {error.strerror}; check the "
                                    "route to it") from None
            self.sent[collector] += 1
            sent += 1
        return sent

    def send_all(self, reports: Iterable[Report]) -> int:
        return sum(self.send(report) for report in reports)

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> UdpReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
