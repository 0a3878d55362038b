"""A collector: its structures registered on a backend, queue pairs for translators, and typed views for queries."""

from __future__ import annotations

import time

import numpy as np

from softdta.collector.backend import Backend, BackendError, Peer, QpInfo, Region
from softdta.collector.config import AppendSpec, CollectorConfig, StructureSpec
from softdta.core.regions import AppendRegion, CounterRegion, KeyWriteRegion, PostcardRegion, SketchRegion
from softdta.core.responder import CompletionLog
from softdta.core.tables import AppendLists, Tables
from softdta.spec import DtaOpcode
from softdta.wire.frames import ip_str, mac_str

RELEASE_GRACE_S = 30.0  # how long a translator whose session ended keeps its queue pairs: reconnects find them


def _now(now: float | None) -> float:
    return time.monotonic() if now is None else now


class Collector:
    """Hosts the configured structures on `backend` and connects translators to them.

    `connect` gives a translator a queue pair into one structure and returns the advertisement it needs: the QPN,
    PSN, R_Key, address and size, and the structure's layout. `repair` re-creates queue pairs that fell into
    ERROR and returns the advertisements that replace the old ones.

    Queue pairs are held for as long as their translator's session lasts. `release` marks those of a translator
    whose session ended; it gets them back if it reconnects within RELEASE_GRACE_S, else `repair` frees them, and
    a `connect` that finds the table full frees them at once. Queue pairs adopted from a killed collector's
    pinned table start out released.
    """

    def __init__(self, config: CollectorConfig, backend: Backend, now: float | None = None):
        config.validate()
        self.config = config
        self.backend = backend
        self.specs: dict[str, StructureSpec | AppendSpec] = {spec.name: spec for spec in config.regions()}
        self.regions: dict[str, Region] = {name: backend.register(name, spec.length, spec.access, spec.ring_bytes)
                                           for name, spec in self.specs.items()}
        self.connections: dict[int, tuple[str, Peer, QpInfo]] = {}  # collector QPN -> (structure, translator, QP)
        self.released: dict[int, float] = {}  # collector QPN -> when its translator's session ended
        for peer, qp in backend.adopted():
            self.connections[qp.qpn] = (qp.region, peer, qp)
            self.released[qp.qpn] = _now(now)
        self.tables = tables_for(config, self.regions)
        self.completion_log = CompletionLog()

    def poll_completions(self) -> None:
        self.completion_log.add(self.backend.completions())

    def close(self) -> None:
        self.backend.close()

    def connect(self, structure: str, peer: Peer) -> dict:
        if structure not in self.specs:
            raise BackendError(f"no structure {structure!r} here; this collector hosts {sorted(self.specs)}")
        if len(self.connections) >= self.config.max_qps:
            self._free(list(self.released))
        if len(self.connections) >= self.config.max_qps:
            raise BackendError(f"collector {self.config.name} is full: all {self.config.max_qps} queue pairs are "
                               "held by connected translators; raise [collector] max_qps or stop unused translators")
        qp = self.backend.connect(self.regions[structure], self.specs[structure].transport, peer)
        self.connections[qp.qpn] = (structure, peer, qp)
        return self.advertisement(structure, qp, peer)

    def connection_of(self, translator_ip: bytes, structure: str, translator_qpn: int) -> dict | None:
        """The advertisement of the queue pair this translator already has into `structure` for its QP
        `translator_qpn` (after a reconnect; a translator has one per RX queue); it is the translator's again."""
        for qpn, (name, peer, qp) in self.connections.items():
            if name == structure and peer.ip == translator_ip and peer.qpn == translator_qpn:
                self.released.pop(qpn, None)
                return self.advertisement(name, qp, peer)
        return None

    def release(self, translator_ip: bytes, now: float | None = None) -> None:
        """The translator's session ended: its queue pairs go after RELEASE_GRACE_S unless it comes back."""
        for qpn, (_, peer, _) in self.connections.items():
            if peer.ip == translator_ip:
                self.released.setdefault(qpn, _now(now))

    def _free(self, qpns: list[int]) -> None:
        for qpn in qpns:
            self.backend.release(qpn)
            self.connections.pop(qpn, None)
            self.released.pop(qpn, None)

    def recreate(self, translator_ip: bytes, structure: str, translator_qpn: int | None = None) -> dict:
        """The translator reports that its queue pair into `structure` (the one of its QP `translator_qpn`, else
        the first) failed (a fatal NAK, real or forged, that this end may never have sent): re-create this end and
        return the advertisement that replaces the old."""
        for qpn, (name, peer, _) in self.connections.items():
            if name == structure and peer.ip == translator_ip and translator_qpn in (None, peer.qpn):
                qp = self.backend.reconnect(qpn)
                del self.connections[qpn]
                self.connections[qp.qpn] = (structure, peer, qp)
                if qpn in self.released:
                    self.released[qp.qpn] = self.released.pop(qpn)
                return self.advertisement(structure, qp, peer)
        raise BackendError(f"this translator has no queue pair into {structure!r}; connect first")

    def repair(self, now: float | None = None) -> list[tuple[Peer, dict]]:
        """Frees queue pairs released more than RELEASE_GRACE_S ago, and re-creates those in ERROR: (translator
        end, new advertisement) for each re-created one."""
        now = _now(now)
        self._free([qpn for qpn, since in self.released.items() if now - since >= RELEASE_GRACE_S])
        repaired = []
        for qpn in self.backend.failed():
            if qpn not in self.connections:
                continue
            try:
                qp = self.backend.reconnect(qpn)
            except BackendError:
                continue  # tried again on the next pass
            structure, peer, _ = self.connections.pop(qpn)
            self.connections[qp.qpn] = (structure, peer, qp)
            if qpn in self.released:
                self.released[qp.qpn] = self.released.pop(qpn)
            repaired.append((peer, self.advertisement(structure, qp, peer)))
        return repaired

    def advertisement(self, structure: str, qp: QpInfo, peer: Peer) -> dict:
        region, spec = self.regions[structure], self.specs[structure]
        return {"structure": structure, **spec.advertised(),
                "qp": {"remote_qpn": qp.qpn, "local_qpn": peer.qpn, "rkey": region.rkey, "base": region.base_va,
                       "length": region.view.size, "start_psn": qp.psn, "transport": qp.transport.name.lower()}}

    # ----------------------------------------------------------------------------------------------
    # what the query service reads (service.QuerySource)

    def structure_region(self, primitive: DtaOpcode, collector_ip: bytes):
        structure = self.tables.structure(collector_ip, primitive)
        if structure is None:
            raise KeyError(f"no {primitive.name} structure on this collector")
        view = self.regions[self.specs_by_primitive(primitive).name].view
        return {DtaOpcode.KEY_WRITE: lambda: KeyWriteRegion.for_structure(view, structure),
                DtaOpcode.KEY_INCREMENT: lambda: CounterRegion(view),
                DtaOpcode.POSTCARDING: lambda: PostcardRegion.for_structure(view, structure),
                DtaOpcode.SKETCH_MERGE: lambda: SketchRegion.for_structure(view, structure)}[primitive]()

    def specs_by_primitive(self, primitive: DtaOpcode) -> StructureSpec:
        return next(spec for spec in self.config.structures if spec.primitive is primitive)

    def append_region(self, lists: AppendLists) -> AppendRegion:
        return AppendRegion(self.regions[f"append{lists.first_list}"].view, lists)

    def append_ring_writes(self, lists: AppendLists) -> np.ndarray | None:
        """WRITEs executed into each of the range's rings, where the backend counts them (xdp), else None."""
        return self.regions[f"append{lists.first_list}"].ring_writes

    def counters(self) -> dict[str, int]:
        return self.backend.counters()

    def health(self) -> dict:
        failed = set(self.backend.failed())
        return {"backend": self.backend.name, "collector": self.config.name, "max_qps": self.config.max_qps,
                "qps": {f"{qpn:#x}": {"structure": structure, "translator": ip_str(peer.ip),
                                      "state": "error" if qpn in failed else "ready",
                                      "session": "ended" if qpn in self.released else "open",
                                      "expected_psn": self.backend.expected_psn(qpn)}
                        for qpn, (structure, peer, _) in self.connections.items()}}


def tables_document(translator: dict, collector: dict, advertisements: list[dict]) -> dict:
    """Translator tables (the TOML of docs/tables.md, as a dict) from a collector's advertisements.

    `translator` is the [translator] section and `collector` is {"name", "ip", "mac"}.
    `advertisements` may hold several per structure, one per RX queue of the translator (their "queue"): the
    structure gets a QP for each, queue 0's first.
    """
    by_structure: dict[str, list[dict]] = {}
    for advert in sorted(advertisements, key=lambda advert: advert.get("queue", 0)):
        by_structure.setdefault(advert["structure"], []).append(advert)
    structures, append = [], []
    for name, adverts in by_structure.items():
        entry = {key: value for key, value in adverts[0].items() if key not in ("structure", "queue")}
        entry["collector"] = collector["name"]
        qps = [{**advert["qp"], "name": f"{name}@{collector['name']}" + (f"/q{queue}" if queue else "")}
               for queue, advert in enumerate(adverts)]
        entry["qp"] = qps if len(qps) > 1 else qps[0]
        (append if "first_list" in entry else structures).append(entry)
    return {"translator": translator, "collectors": [collector], "structures": structures, "append": append}


def tables_for(config: CollectorConfig, regions: dict[str, Region]) -> Tables:
    """The collector's structures as translator tables, so region views and queries share one description.

    The queue-pair numbers in it are placeholders: a collector serves any number of translators."""
    adverts = []
    for index, spec in enumerate(config.regions()):
        region = regions[spec.name]
        adverts.append({"structure": spec.name, **spec.advertised(),
                        "qp": {"remote_qpn": 2 + index, "local_qpn": 2 + index, "rkey": region.rkey,
                               "base": region.base_va, "length": region.view.size,
                               "transport": spec.transport.name.lower()}})
    collector = {"name": config.name, "ip": ip_str(config.ip), "mac": mac_str(config.mac)}
    return Tables.from_dict(tables_document({"mac": mac_str(config.mac), "ip": ip_str(config.ip)}, collector, adverts))
