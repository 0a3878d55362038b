"""A collector: its structures registered on a backend, queue pairs for translators, and typed views for queries."""

from __future__ import annotations

from ..frames import ip_str, mac_str
from ..regions import AppendRegion, CounterRegion, KeyWriteRegion, PostcardRegion, SketchRegion
from ..responder import CompletionLog
from ..spec import Primitive
from ..tables import AppendLists, Tables
from .backend import Backend, BackendError, Peer, QpInfo, Region
from .config import AppendSpec, CollectorConfig, StructureSpec


class Collector:
    """Hosts the configured structures on `backend` and connects translators to them.

    `connect` gives a translator a queue pair into one structure and returns the advertisement it needs: the QPN,
    PSN, R_Key, address and size, and the structure's layout. `repair` re-creates queue pairs that fell into
    ERROR and returns the advertisements that replace the old ones.
    """

    def __init__(self, config: CollectorConfig, backend: Backend):
        config.validate()
        self.config = config
        self.backend = backend
        self.specs: dict[str, StructureSpec | AppendSpec] = {spec.name: spec for spec in config.regions()}
        self.regions: dict[str, Region] = {name: backend.register(name, spec.length, spec.access)
                                           for name, spec in self.specs.items()}
        self.connections: dict[int, tuple[str, Peer, QpInfo]] = {}  # collector QPN -> (structure, translator, QP)
        self.tables = tables_for(config, self.regions)
        self.completion_log = CompletionLog()

    def poll_completions(self) -> None:
        self.completion_log.add(self.backend.completions())

    def close(self) -> None:
        self.backend.close()

    def connect(self, structure: str, peer: Peer) -> dict:
        if structure not in self.specs:
            raise BackendError(f"no structure {structure!r} here; this collector hosts {sorted(self.specs)}")
        qp = self.backend.connect(self.regions[structure], self.specs[structure].transport, peer)
        self.connections[qp.qpn] = (structure, peer, qp)
        return self.advertisement(structure, qp, peer)

    def connection_of(self, translator_ip: bytes, structure: str) -> dict | None:
        """The advertisement of a queue pair this translator already has into `structure` (after a reconnect)."""
        for name, peer, qp in self.connections.values():
            if name == structure and peer.ip == translator_ip:
                return self.advertisement(name, qp, peer)
        return None

    def repair(self) -> list[tuple[Peer, dict]]:
        """Queue pairs in ERROR, re-created: (translator end, new advertisement) for each."""
        repaired = []
        for qpn in self.backend.failed():
            structure, peer, _ = self.connections.pop(qpn)
            qp = self.backend.reconnect(qpn)
            self.connections[qp.qpn] = (structure, peer, qp)
            repaired.append((peer, self.advertisement(structure, qp, peer)))
        return repaired

    def advertisement(self, structure: str, qp: QpInfo, peer: Peer) -> dict:
        region, spec = self.regions[structure], self.specs[structure]
        return {"structure": structure, **spec.advertised(),
                "qp": {"remote_qpn": qp.qpn, "local_qpn": peer.qpn, "rkey": region.rkey, "base": region.base_va,
                       "length": region.view.size, "start_psn": qp.psn, "transport": qp.transport.name.lower()}}

    # ----------------------------------------------------------------------------------------------
    # what the query service reads (service.QuerySource)

    def structure_region(self, primitive: Primitive, collector_ip: bytes):
        structure = self.tables.structure(collector_ip, primitive)
        if structure is None:
            raise KeyError(f"no {primitive.name} structure on this collector")
        view = self.regions[self.specs_by_primitive(primitive).name].view
        return {Primitive.KEY_WRITE: lambda: KeyWriteRegion.for_structure(view, structure),
                Primitive.KEY_INCREMENT: lambda: CounterRegion(view),
                Primitive.POSTCARDING: lambda: PostcardRegion.for_structure(view, structure),
                Primitive.SKETCH_MERGE: lambda: SketchRegion.for_structure(view, structure)}[primitive]()

    def specs_by_primitive(self, primitive: Primitive) -> StructureSpec:
        return next(spec for spec in self.config.structures if spec.primitive is primitive)

    def append_region(self, lists: AppendLists) -> AppendRegion:
        return AppendRegion(self.regions[f"append{lists.first_list}"].view, lists)

    def counters(self) -> dict[str, int]:
        return self.backend.counters()

    def health(self) -> dict:
        failed = set(self.backend.failed())
        return {"backend": self.backend.name, "collector": self.config.name,
                "qps": {f"{qpn:#x}": {"structure": structure, "translator": ip_str(peer.ip),
                                      "state": "error" if qpn in failed else "ready",
                                      "expected_psn": self.backend.expected_psn(qpn)}
                        for qpn, (structure, peer, _) in self.connections.items()}}


def tables_document(translator: dict, collector: dict, advertisements: list[dict]) -> dict:
    """Translator tables (the TOML of docs/tables.md, as a dict) from a collector's advertisements.

    `translator` is the [translator] section and `collector` is {"name", "ip", "mac"}.
    """
    structures, append = [], []
    for advert in advertisements:
        entry = {key: value for key, value in advert.items() if key != "structure"}
        entry["collector"] = collector["name"]
        entry["qp"] = {**advert["qp"], "name": f"{advert['structure']}@{collector['name']}"}
        (append if "first_list" in advert else structures).append(entry)
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
