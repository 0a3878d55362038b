"""The translator's rdma_cm links to collectors written for the original DTA (I/O around `softdta.core.cm`).

`--collector-cm 10.0.0.51:1337,kind=key-write` names one listening port and the structure behind it. `CmLinks`
connects to every port from the translator's interface (an AF_PACKET socket: the XDP program passes CM MADs and
the collector's SEND up the stack), keeps each connection up, and turns the connected ones into translator tables.
An original collector only says where its region is and how long it is; the layout comes from `kind` (and the
options): Key-Write and Key-Increment slots of 8 bytes, Postcarding slots of 32, Append rings of 4-byte entries.
"""

from __future__ import annotations

import queue
import random
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from softdta.collector.collector import tables_document
from softdta.collector.config import AppendSpec, StructureSpec
from softdta.collector.control import CollectorIdentity
from softdta.core import registry
from softdta.core.cm import CmConnection, CmEndpoint
from softdta.core.settings import TableError
from softdta.core.tables import Tables
from softdta.errors import SoftdtaError
from softdta.spec import DTA_V1_OPCODES, MAX_REDUNDANCY, PRIMITIVES, ROCE_PORT, Transport
from softdta.wire.codec import WireError
from softdta.wire.frames import ip_bytes, ip_str, mac_bytes, mac_str, parse_udp_frame

KINDS = tuple(PRIMITIVES[opcode].slug for opcode in DTA_V1_OPCODES)  # what original-DTA collectors hold
TICK_S = 0.05
ETH_P_IP = 0x0800


class CmError(SoftdtaError, RuntimeError):
    """A CM link cannot be set up; the message names the problem and the fix."""


@dataclass(frozen=True)
class CmTarget:
    """One listening port of an rdma_cm collector and the structure behind it."""

    ip: bytes
    port: int
    kind: str
    list_id: int = 0  # append: the list this port's ring holds
    batch: int = 4  # append: entries per write
    hash: str = "dta-v1"  # key-write, key-increment
    redundancy: int = MAX_REDUNDANCY  # key-write, key-increment: 1 sends their frames from XDP

    @classmethod
    def parse(cls, text: str) -> CmTarget:
        """`IP:PORT,kind=key-write[,list=N][,batch=B][,hash=H][,redundancy=N]`."""
        address, *options = text.split(",")
        host, _, port = address.rpartition(":")
        settings = dict(option.partition("=")[::2] for option in options)
        example = "for example 10.0.0.51:1337,kind=key-write or 10.0.0.51:1338,kind=append,list=0"
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise CmError(f"--collector-cm {text!r}: give the rdma_cm port after the IP; {example}")
        try:
            ip = ip_bytes(host)
        except ValueError:
            raise CmError(f"--collector-cm {text!r}: {host!r} is not an IP address; {example}") from None
        unknown = set(settings) - {"kind", "list", "batch", "hash", "redundancy"}
        if unknown:
            raise CmError(f"--collector-cm {text!r}: unknown option(s) {sorted(unknown)}; {example}")
        if settings.get("kind") not in KINDS:
            raise CmError(f"--collector-cm {text!r}: kind must be one of {', '.join(KINDS)}; {example}")
        try:
            target = cls(ip, int(port), settings["kind"], int(settings.get("list", 0)),
                         int(settings.get("batch", 4)), settings.get("hash", "dta-v1"),
                         int(settings.get("redundancy", MAX_REDUNDANCY)))
        except ValueError:
            raise CmError(f"--collector-cm {text!r}: list, batch and redundancy are integers; {example}") from None
        if not 1 <= target.redundancy <= MAX_REDUNDANCY:
            raise CmError(f"--collector-cm {text!r}: redundancy must be 1..{MAX_REDUNDANCY} (1: frames from XDP, "
                          f"no tc stage); {example}")
        return target

    @property
    def name(self) -> str:
        lists = not registry.by_name(self.kind).has_structure  # a ring of Append lists: which list it holds
        return f"{self.kind}{self.list_id if lists else ''}-{self.port}"

    def advertisement(self, connection: CmConnection) -> dict[str, Any]:
        """The structure entry of the translator tables, sized by the region the collector sent (an advertisement
        as the control protocol's collectors send it)."""
        metadata = connection.metadata
        assert metadata is not None  # a connected connection has the collector's region
        qp = {"remote_qpn": connection.remote_qpn, "local_qpn": connection.local.qpn, "rkey": metadata.key,
              "base": metadata.base_va, "length": metadata.length, "start_psn": connection.send_psn,
              "transport": Transport.RC.name.lower()}
        if not registry.by_name(self.kind).has_structure:
            ring = AppendSpec(first_list=self.list_id, lists=1, entries=metadata.length // 4, data_len=4,
                              batch=self.batch, transport=Transport.RC)
            entries = ring.entries - ring.entries % ring.batch
            return {"structure": self.name, **{**ring.advertised(), "entries": entries}, "qp": qp}
        structure = StructureSpec(registry.by_name(self.kind).opcode, hash=self.hash, transport=Transport.RC,
                                  redundancy=self.redundancy)
        slots = metadata.length // structure.slot_size
        usable = (1 << (slots.bit_length() - 1) if slots else 0) * structure.slot_size  # the slot hash is masked
        return {"structure": self.name, **structure.advertised(), "qp": {**qp, "length": usable}}


class CmLinks:
    """rdma_cm connections to collectors, kept up; `start()` waits for the first tables, later ones (a collector
    that restarted, a QP that failed) go on `updates`, which the translator applies between ticks.

    Create it in the translator's network namespace: its socket and neighbour lookups are made there.
    `report_failures` tells it how to find the translator's QPs (local QPNs) in ERROR, so it can start them over.
    """

    def __init__(self, translator: dict[str, Any], targets: list[CmTarget], interface: str, first_qpn: int = 0x2000,
                 log: Callable[[str], None] = print):
        if not targets:
            raise CmError("no rdma_cm collectors given")
        self.translator, self.targets, self.interface = translator, targets, interface
        self.failed_qpns: Callable[[], set[int]] = set
        self.log = log
        self.updates: queue.Queue[Tables] = queue.Queue()
        mac, ip = mac_bytes(translator["mac"]), ip_bytes(translator["ip"])
        rng = random.SystemRandom()
        self._collector_macs = {target.ip: resolve_mac(target.ip) for target in targets}
        self.connections = [
            CmConnection(CmEndpoint(mac, ip, first_qpn + index, receive_psn=rng.getrandbits(24), ca_guid=_eui64(mac),
                                    udp_sport=0xC000 | rng.getrandbits(14),
                                    traffic_class=int(translator.get("dscp", 0)) << 2),
                         target.ip, self._collector_macs[target.ip], target.port, comm_id=rng.getrandbits(32),
                         transaction_id=rng.getrandbits(63))
            for index, target in enumerate(targets)]
        self._socket = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_IP))
        try:
            self._socket.bind((interface, ETH_P_IP))
        except OSError as error:
            self._socket.close()
            raise CmError(f"cannot listen on {interface!r} for the collectors' CM replies: {error}") from None
        self._stop = threading.Event()
        self._connected: set[int] = set()
        self._first = threading.Event()
        self._problem = ""  # why the first tables are not there yet, besides a connection still waiting
        self._thread = threading.Thread(target=self._run, name="softdta-cm", daemon=True)

    def start(self, timeout: float = 30.0) -> Tables:
        self._thread.start()
        if not self._first.wait(timeout):
            waiting = [f"{ip_str(c.collector_ip)}:{c.port}" + (f" ({c.last_rejection})" if c.last_rejection else "")
                       for c in self.connections if not c.connected]
            self.close()
            if self._problem:
                raise CmError(self._problem)
            raise CmError(f"no rdma_cm connection to {', '.join(waiting)} within {timeout:.0f} s; is the collector "
                          "listening on that port, with a RoCE device on that address?")
        return self.tables()

    def report_failures(self, failed_qpns: Callable[[], set[int]]) -> None:
        self.failed_qpns = failed_qpns

    def report_psns(self, next_psns: Callable[[], dict[int, int]]) -> None:
        """Nothing to do: the collector's REP names the PSN its new QP expects, and the tables carry it."""

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        now = time.monotonic()
        for connection in self.connections:  # tell the collectors we leave, so they free their QPs
            for frame in connection.disconnect(now):
                self._send(frame)
        self._socket.close()

    def tables(self) -> Tables:
        return Tables.from_dict(self.document(), "rdma_cm collectors")

    def document(self) -> dict[str, Any]:
        """The translator tables (docs/tables.md) the connected collectors' regions make, as a dict."""
        document: dict[str, Any] = {"translator": self.translator, "collectors": [], "structures": [], "append": []}
        for ip in sorted({target.ip for target in self.targets}):
            adverts = [target.advertisement(connection) for target, connection in zip(self.targets, self.connections)
                       if target.ip == ip and connection.connected]
            collector = CollectorIdentity(name=f"cm-{ip_str(ip)}", ip=ip_str(ip), mac=mac_str(self._collector_macs[ip]))
            part = tables_document(self.translator, collector, adverts)
            for key in ("collectors", "structures", "append"):
                document[key] += part[key]
        return document

    def _run(self) -> None:
        try:
            self._serve()
        except Exception as error:  # said by start(), or in the log once running: never a silent dead thread
            self._problem = f"the rdma_cm connections stopped: {type(error).__name__}: {error}"
            self.log(f"softdta: error: {self._problem}")

    def _serve(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            failed = self.failed_qpns()
            for connection in self.connections:
                if connection.connected and connection.local.qpn in failed:
                    self.log(f"softdta: QP {connection.local.qpn:#x} to port {connection.port} failed; reconnecting")
                    for frame in connection.disconnect(now):
                        self._send(frame)
                for frame in connection.tick(now):
                    self._send(frame)
            if select.select([self._socket], [], [], TICK_S)[0]:
                self._receive(time.monotonic())
            self._publish()

    def _receive(self, now: float) -> None:
        while True:
            try:
                frame = self._socket.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            try:
                udp = parse_udp_frame(frame)
            except WireError:
                continue
            if udp.udp["dport"] != ROCE_PORT or udp.src_ip not in self._collector_macs:
                continue
            for connection in self.connections:
                if connection.collector_ip == udp.src_ip:
                    for reply in connection.receive(frame, now):
                        self._send(reply)

    def _publish(self) -> None:
        for connection in self.connections:
            while connection.events:
                self.log(f"softdta: cm {ip_str(connection.collector_ip)}: {connection.events.pop(0)}")
        connected = {index for index, connection in enumerate(self.connections) if connection.connected}
        if connected == self._connected:
            return
        self._connected = connected
        try:
            tables = self.tables()
        except TableError as error:
            self._problem = f"the rdma_cm collectors' regions make no valid tables: {error}"
            self.log(f"softdta: error: {self._problem}")
            return
        if len(connected) == len(self.connections) and not self._first.is_set():
            self._first.set()
        elif self._first.is_set():
            self.updates.put(tables)

    def _send(self, frame: bytes) -> None:
        try:
            self._socket.send(frame)
        except OSError as error:
            self.log(f"softdta: error: sending a CM frame on {self.interface}: {error}")


def resolve_mac(ip: bytes, timeout: float = 3.0) -> bytes:
    """The MAC of a neighbour, resolved by the kernel (ARP) in this thread's network namespace."""
    from pyroute2 import IPRoute
    target = ip_str(ip)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe, IPRoute() as ipr:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for neighbour in ipr.get_neighbours(dst=target):
                mac = neighbour.get_attr("NDA_LLADDR")
                if mac and neighbour["state"] not in (0x20, 0x01):  # NUD_FAILED, NUD_INCOMPLETE
                    return mac_bytes(mac)
            probe.sendto(b"", (target, 9))  # discard port: any datagram makes the kernel resolve the address
            time.sleep(0.1)
    raise CmError(f"{target} does not answer ARP; is the collector up and on this interface's network?")


def _eui64(mac: bytes) -> int:
    """A CA GUID from the MAC, as RoCE NICs derive theirs."""
    return int.from_bytes(bytes([mac[0] ^ 2]) + mac[1:3] + b"\xff\xfe" + mac[3:6], "big")
