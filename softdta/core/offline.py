"""An offline collector: the reference responder over in-memory regions that mirror the translator tables.

It shows what a collector would hold after a run, and connects the reference translator to the reference
responder in tests, the demo and `softdta translate --collector`.
"""

from __future__ import annotations

import numpy as np

from softdta.core import registry
from softdta.core.primitives.append.queries import AppendPoller
from softdta.core.primitives.append.region import AppendRegion
from softdta.core.regions import Region
from softdta.core.responder import CompletionLog, MemoryRegion, Responder, ResponderQp
from softdta.core.tables import AppendLists, QueuePair, Tables
from softdta.wire.codec import WireError
from softdta.wire.frames import parse_udp_frame


class OfflineCollector:
    def __init__(self, tables: Tables, collector_ip: bytes | None = None):
        qps = [qp for qp in tables.qps if collector_ip in (None, qp.collector_ip)]
        if not qps:
            raise ValueError("no queue pairs for that collector in the tables")
        self.tables = tables
        self.memory = {qp.index: bytearray(qp.length) for qp in qps}
        rings = {lists.qp.index: lists for lists in tables.append_lists}
        self.ring_writes = {index: np.zeros(lists.lists, dtype=np.uint64) for index, lists in rings.items()}
        self.responders: dict[bytes, Responder] = {}
        for qp in qps:
            responder = self.responders.setdefault(qp.collector_ip, Responder(qp.collector_mac, qp.collector_ip))
            lists = rings.get(qp.index)
            region = MemoryRegion(qp.base_va, qp.rkey, self.memory[qp.index],
                                  ring_bytes=lists.entries * lists.data_len if lists else 0,
                                  ring_writes=self.ring_writes.get(qp.index))
            responder.add_qp(ResponderQp(qpn=qp.remote_qpn, transport=qp.transport, remote_ip=tables.ip,
                                         remote_mac=tables.mac, region=region, expected_psn=qp.start_psn,
                                         remote_qpn=qp.local_qpn))
        self.completion_log = CompletionLog()
        self.append_pollers = [AppendPoller(AppendRegion(self.memory[lists.qp.index], lists),
                                            self.ring_writes[lists.qp.index])
                               for lists in tables.append_lists if lists.qp.index in self.memory]

    def deliver(self, frame: bytes) -> list[bytes]:
        """Hand one RoCEv2 frame to the responder of its destination; returns its replies."""
        try:
            responder = self.responders.get(parse_udp_frame(frame).dst_ip)
        except WireError:
            return []
        if responder is None:
            return []
        out = responder.process(frame)
        self.completion_log.add(out.completions)
        return out.replies

    def region_of(self, qp: QueuePair) -> bytearray:
        return self.memory[qp.index]

    def append_ring_writes(self, lists: AppendLists) -> np.ndarray:
        """WRITEs the reference responder executed into each of the range's rings."""
        return self.ring_writes[lists.qp.index]

    def structure_region(self, primitive: int, collector_ip: bytes) -> Region:
        """The view of the memory of the structure of `primitive` (an opcode) at `collector_ip`, as its primitive
        lays it out."""
        kind = registry.by_opcode(primitive)
        structure = self.tables.structure(collector_ip, primitive)
        if structure is None:
            raise KeyError(f"no {kind.name} structure for that collector")
        return kind.region(self.memory[structure.qp.index], structure)

    def counters(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for responder in self.responders.values():
            for counter, value in responder.counters.items():
                total[counter.name.lower()] = total.get(counter.name.lower(), 0) + value
        return total
