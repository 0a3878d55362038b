"""The collector linked to itself: local translation (docs/collector.md).

With [collector] translate_locally (or `softdta collector up --translate-locally`) an xdp collector connects a
queue pair into each of its structures for itself, one per RX queue of its interface, as a translator would
(Collector.connect, held until it stops), makes translator tables of those advertisements (tables_document) and
loads the translator's program built for local execution on its responder's memory (engines.local.LocalTranslator),
which the responder's program then hands every report to DTA_PORT. A control-plane thread flushes idle Append
batches and Postcarding paths into the memory as the translator's would.
"""

from __future__ import annotations

import socket
import threading
from typing import TYPE_CHECKING

from softdta.collector.backend import BackendError, Peer
from softdta.collector.collector import tables_document
from softdta.collector.xdp_backend import XdpBackend
from softdta.core.tables import Tables
from softdta.engines.local import LocalTranslator
from softdta.engines.xdp import rx_queues
from softdta.errors import SoftdtaError
from softdta.spec import MAX_RX_QUEUES
from softdta.wire.frames import ip_str, mac_str

if TYPE_CHECKING:
    from softdta.collector.collector import Collector

LOCAL_QPN = 0xF00000  # its own translator end: queue q of structure i is QPN LOCAL_QPN + MAX_RX_QUEUES i + q


class LocalLink:
    """A collector's own translator on its responder's memory, from `start` until `close`."""

    def __init__(self, collector: Collector) -> None:
        backend = collector.backend
        if not isinstance(backend, XdpBackend):
            raise BackendError("translate_locally needs the xdp backend (backend = \"xdp\")")
        config = collector.config
        queues = self._queues(config.interface)
        peer_ip, peer_mac = config.ip, config.mac
        adverts = [{**collector.connect(name, Peer(peer_ip, peer_mac, LOCAL_QPN + MAX_RX_QUEUES * index + queue, 0)),
                    "queue": queue}
                   for index, name in enumerate(collector.specs) for queue in range(queues)]
        document = tables_document({"mac": mac_str(peer_mac), "ip": ip_str(peer_ip)},
                                   {"name": config.name, "ip": ip_str(config.ip), "mac": mac_str(config.mac)},
                                   adverts)
        try:
            self.translator = LocalTranslator(backend.responder, Tables.from_dict(document))
        except SoftdtaError as error:
            raise BackendError(f"cannot translate locally: {error}") from None
        self.translator.install()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="softdta-local-flush", daemon=True)
        self._thread.start()

    @staticmethod
    def _queues(interface: str) -> int:
        if not interface:
            return 1
        try:
            return max(1, min(rx_queues(socket.if_nametoindex(interface)), MAX_RX_QUEUES))
        except OSError:
            return 1

    def _serve(self) -> None:
        interval = max(self.translator.flush_idle_ns / 2e9, 1e-4)
        while not self._stop.wait(interval):
            self.translator.tick()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.translator.close()
