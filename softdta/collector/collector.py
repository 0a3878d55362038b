"""A collector: its structures registered on a backend, queue pairs for translators, and typed views for queries."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from softdta.collector.backend import Backend, BackendError, Peer, QpInfo, Region
from softdta.collector.config import AppendSpec, CollectorConfig, StructureSpec
from softdta.core import regions, registry
from softdta.core.primitives.append.region import AppendRegion
from softdta.core.responder import CompletionLog
from softdta.core.tables import AppendLists, Tables
from softdta.etcd.lease import KeptKey
from softdta.wire.frames import ip_str, mac_str

RELEASE_GRACE_S = 30.0  # how long a translator whose session ended keeps its queue pairs: reconnects find them
OWNERS_FILE = "queue-pairs.json"  # in data_dir: each queue pair's translator and secret digest, for adoption


def _now(now: float | None) -> float:
    return time.monotonic() if now is None else now


@dataclass(eq=False)
class Session:
    """One authenticated control connection, for the translator it names. It holds the queue pairs it created or
    reclaimed; `secret`, given to the translator in `welcome`, lets a later session reclaim them."""

    ip: bytes
    mac: bytes
    secret: str


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class Collector:
    """Hosts the configured structures on `backend` and connects translators to them.

    `connect` gives a translator a queue pair into one structure and returns the advertisement it needs: the QPN,
    PSN, R_Key, address and size, and the structure's layout. `repair` re-creates queue pairs that fell into
    ERROR and returns the advertisements that replace the old ones.

    Queue pairs are held for as long as the session that created them lasts. `release` marks those of a session
    that ended; a session of the same translator that presents the ended one's secret gets them back within
    RELEASE_GRACE_S, else `repair` frees them, and a `connect` that finds the table full frees them at once.
    Queue pairs adopted from a killed collector's pinned table start out released; the secret digests saved in
    data_dir (OWNERS_FILE) let their translator reclaim them.
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
        self.owners: dict[int, Session] = {}  # collector QPN -> the open session holding it
        self.secrets: dict[int, bytes] = {}  # collector QPN -> digest of the secret that reclaims it
        saved = self._saved_owners()
        for peer, qp in backend.adopted():
            self.connections[qp.qpn] = (qp.region, peer, qp)
            self.released[qp.qpn] = _now(now)
            owner = saved.get(str(qp.qpn), {})
            if (owner.get("structure"), owner.get("ip"), owner.get("qpn")) == (qp.region, ip_str(peer.ip), peer.qpn):
                self.secrets[qp.qpn] = bytes.fromhex(owner["secret_sha256"])
        self._save_owners()
        self.tables = tables_for(config, self.regions)
        self.completion_log = CompletionLog()
        self.registration: KeptKey | None = None  # its fleet membership (softdta collector up --fleet)
        self.fleet_epoch = 0  # the fleet's slot-map epoch, while it is in one (stamped on exported telemetry)

    def poll_completions(self) -> None:
        self.completion_log.add(self.backend.completions())

    def close(self) -> None:
        self.backend.close()

    def open_session(self, translator_ip: bytes, translator_mac: bytes, secret: str | None = None) -> Session:
        """A session for this translator: it keeps `secret` if some queue pair is held by it, else gets a new
        one."""
        if secret is None or _digest(secret) not in self.secrets.values():
            secret = secrets.token_urlsafe(24)
        return Session(translator_ip, translator_mac, secret)

    def connect(self, structure: str, peer: Peer, session: Session | None = None) -> dict[str, Any]:
        """A new queue pair for `peer` into `structure`, held by `session` (None: held until the collector
        stops)."""
        if structure not in self.specs:
            raise BackendError(f"no structure {structure!r} here; this collector hosts {sorted(self.specs)}")
        if len(self.connections) >= self.config.max_qps:
            self._free(list(self.released))
        if len(self.connections) >= self.config.max_qps:
            raise BackendError(f"collector {self.config.name} is full: all {self.config.max_qps} queue pairs are "
                               "held by connected translators; raise [collector] max_qps or stop unused translators")
        qp = self.backend.connect(self.regions[structure], self.specs[structure].transport, peer)
        self.connections[qp.qpn] = (structure, peer, qp)
        if session is not None:
            self.owners[qp.qpn], self.secrets[qp.qpn] = session, _digest(session.secret)
            try:
                self._save_owners()
            except BackendError:
                del self.connections[qp.qpn], self.owners[qp.qpn], self.secrets[qp.qpn]
                self.backend.release(qp.qpn)
                raise
        return self.advertisement(structure, qp, peer)

    def connection_of(self, session: Session, structure: str, translator_qpn: int) -> dict[str, Any] | None:
        """The advertisement of the queue pair the session's translator already has into `structure` for its QP
        `translator_qpn` (after a reconnect; a translator has one per RX queue), if the session holds it or
        proves with its secret to be the translator that does; it is the session's then."""
        digest = _digest(session.secret)
        for qpn, (name, peer, qp) in self.connections.items():
            if (name, peer.ip, peer.qpn) == (structure, session.ip, translator_qpn) and \
                    (self.owners.get(qpn) is session or self.secrets.get(qpn) == digest):
                self.owners[qpn] = session
                self.released.pop(qpn, None)
                return self.advertisement(name, qp, peer)
        return None

    def release(self, session: Session, now: float | None = None) -> None:
        """The session ended: the queue pairs it holds go after RELEASE_GRACE_S unless reclaimed."""
        for qpn in [qpn for qpn, owner in self.owners.items() if owner is session]:
            del self.owners[qpn]
            self.released.setdefault(qpn, _now(now))

    def _free(self, qpns: list[int]) -> None:
        for qpn in qpns:
            self.backend.release(qpn)
            self.connections.pop(qpn, None)
            self.released.pop(qpn, None)
            self.owners.pop(qpn, None)
            self.secrets.pop(qpn, None)
        if qpns:
            self._save_owners()

    def _renumber(self, old: int, qp: QpInfo, structure: str, peer: Peer) -> None:
        """A re-created queue pair keeps its holder, secret and release time under its (maybe new) QPN."""
        del self.connections[old]
        self.connections[qp.qpn] = (structure, peer, qp)
        if old in self.released:
            self.released[qp.qpn] = self.released.pop(old)
        if old in self.owners:
            self.owners[qp.qpn] = self.owners.pop(old)
        if old in self.secrets:
            self.secrets[qp.qpn] = self.secrets.pop(old)
        if qp.qpn != old:
            self._save_owners()

    def _saved_owners(self) -> dict[str, Any]:
        path = self._owners_path()
        try:
            saved = json.loads(path.read_text()) if path is not None else {}
        except (OSError, ValueError):
            return {}  # none saved, or torn: adopted queue pairs then go after the grace period
        return saved if isinstance(saved, dict) else {}

    def _save_owners(self) -> None:
        """Saved atomically before a queue pair is advertised, so a kill -9 never loses a translator's claim."""
        path = self._owners_path()
        if path is None:
            return
        owners = {str(qpn): {"structure": self.connections[qpn][0], "ip": ip_str(self.connections[qpn][1].ip),
                             "qpn": self.connections[qpn][1].qpn, "secret_sha256": digest.hex()}
                  for qpn, digest in self.secrets.items()}
        partial = path.with_suffix(".partial")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(owners))
            partial.chmod(0o600)
            partial.replace(path)
        except OSError as error:
            raise BackendError(f"cannot save the queue pairs' owners to {path}: {error.strerror}; make data_dir "
                               "writable") from None

    def _owners_path(self) -> Path | None:
        return None if self.config.data_dir is None else self.config.data_dir / OWNERS_FILE

    def recreate(self, session: Session, structure: str, translator_qpn: int | None = None
                 ) -> tuple[Session | None, dict[str, Any]]:
        """The session's translator reports that its queue pair into `structure` (the one of its QP
        `translator_qpn`, else the first) failed (a fatal NAK, real or forged, that this end may never have sent):
        re-create this end. Only a queue pair the session holds, or one held under its secret (the same
        translator on another connection), which stays where it is held. Returns (the session holding it, None
        if none does; the advertisement that replaces the old)."""
        digest = _digest(session.secret)
        for qpn, (name, peer, _) in self.connections.items():
            if name == structure and translator_qpn in (None, peer.qpn) and (self.owners.get(qpn) is session or (
                    peer.ip == session.ip and self.secrets.get(qpn) == digest)):
                qp = self.backend.reconnect(qpn)
                self._renumber(qpn, qp, structure, peer)
                return self.owners.get(qp.qpn), self.advertisement(structure, qp, peer)
        raise BackendError(f"this session holds no queue pair into {structure!r}; connect first, or say hello "
                           "with the secret of the session that does")

    def repair(self, now: float | None = None) -> list[tuple[Session | None, dict[str, Any]]]:
        """Frees queue pairs released more than RELEASE_GRACE_S ago, and re-creates those in ERROR: (the session
        holding it, None if none does; new advertisement) for each re-created one."""
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
            structure, peer, _ = self.connections[qpn]
            self._renumber(qpn, qp, structure, peer)
            repaired.append((self.owners.get(qp.qpn), self.advertisement(structure, qp, peer)))
        return repaired

    def advertisement(self, structure: str, qp: QpInfo, peer: Peer) -> dict[str, Any]:
        region, spec = self.regions[structure], self.specs[structure]
        return {"structure": structure, **spec.advertised(),
                "qp": {"remote_qpn": qp.qpn, "local_qpn": peer.qpn, "rkey": region.rkey, "base": region.base_va,
                       "length": region.view.size, "start_psn": self.backend.expected_psn(qp.qpn),
                       "transport": qp.transport.name.lower()}}

    # ----------------------------------------------------------------------------------------------
    # what the query service reads (service.QuerySource)

    def structure_region(self, primitive: int, collector_ip: bytes) -> regions.Region:
        """The view of the memory of this collector's structure of `primitive` (an opcode), as its primitive lays
        it out."""
        kind = registry.by_opcode(primitive)
        structure = self.tables.structure(collector_ip, primitive)
        if structure is None:
            raise KeyError(f"no {kind.name} structure on this collector")
        return kind.region(self.regions[self.specs_by_primitive(primitive).name].view, structure)

    def specs_by_primitive(self, primitive: int) -> StructureSpec:
        return next(spec for spec in self.config.structures if spec.primitive == primitive)

    def append_region(self, lists: AppendLists) -> AppendRegion:
        return AppendRegion(self.regions[f"append{lists.first_list}"].view, lists)

    def append_ring_writes(self, lists: AppendLists) -> np.ndarray | None:
        """WRITEs executed into each of the range's rings, where the backend counts them (xdp), else None."""
        return self.regions[f"append{lists.first_list}"].ring_writes

    def counters(self) -> dict[str, int]:
        return self.backend.counters()

    def health(self) -> dict[str, Any]:
        failed = set(self.backend.failed())
        fleet = {"fleet": self.registration.status()} if self.registration is not None else {}
        return {"backend": self.backend.name, "collector": self.config.name, "max_qps": self.config.max_qps, **fleet,
                "qps": {f"{qpn:#x}": {"structure": structure, "translator": ip_str(peer.ip),
                                      "state": "error" if qpn in failed else "ready",
                                      "session": "ended" if qpn in self.released else "open",
                                      "expected_psn": self.backend.expected_psn(qpn)}
                        for qpn, (structure, peer, _) in self.connections.items()}}


def tables_document(translator: dict[str, Any], collector: Mapping[str, object],
                    advertisements: list[dict[str, Any]]) -> dict[str, Any]:
    """Translator tables (the TOML of docs/tables.md, as a dict) from a collector's advertisements.

    `translator` is the [translator] section and `collector` is {"name", "ip", "mac"}.
    `advertisements` may hold several per structure, one per RX queue of the translator (their "queue"): the
    structure gets a QP for each, queue 0's first.
    """
    by_structure: dict[str, list[dict[str, Any]]] = {}
    for advert in sorted(advertisements, key=lambda advert: advert.get("queue", 0)):
        by_structure.setdefault(advert["structure"], []).append(advert)
    structures: list[dict[str, Any]] = []
    append: list[dict[str, Any]] = []
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
