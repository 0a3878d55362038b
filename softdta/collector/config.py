"""The collector's configuration (TOML): its port, backend, and the structures it hosts.

See docs/collector.md and examples/collector.toml. A structure here carries what the translator needs besides
the queue pair (key and data sizes, hash, hops, sketch shape, Append rings), so the collector can advertise it.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from softdta.core import registry
from softdta.core.export import (
    DEFAULT_BACKLOG_ENTRIES,
    DEFAULT_STREAM,
    DEFAULT_SUBJECT_PREFIX,
    DUPLICATE_WINDOW_S,
    ExportSettings,
    Watch,
)
from softdta.core.primitives.base import is_power_of_two
from softdta.core.settings import Settings, TableError, tables_of
from softdta.core.tables import KEY_HASH_NAMES
from softdta.spec import (
    DTA_V1_POSTCARD_HOPS,
    MAX_REDUNDANCY,
    POSTCARD_CACHE_ENTRIES,
    Access,
    Transport,
)
from softdta.wire.frames import ip_bytes, mac_bytes

DEFAULT_CONTROL_PORT = 40050
DEFAULT_QUERY_PORT = 8040
DEFAULT_MAX_QPS = 1024
MAX_QPS_LIMIT = 1 << 20  # QPNs are 24-bit, and the xdp backend's queue-pair tables are kernel memory
BACKENDS = ("xdp", "verbs")
XDP_MODES = ("native", "generic")
COLLECTOR_KEYS = ("name", "ip", "mac", "backend", "interface", "xdp_mode", "data_dir", "token", "control_port",
                  "query_port", "max_qps", "tls_cert", "tls_key", "tls_client_ca", "translate_locally")
STRUCTURE_KEYS = ("primitive", "slots", "columns", "key_len", "data_len", "hash", "hops", "cache_entries", "rows",
                  "reporters", "merge", "batch", "transport", "redundancy")
APPEND_KEYS = ("first_list", "lists", "entries", "data_len", "batch", "transport")
SNAPSHOT_KEYS = ("dir", "every")
SNAPSHOTS_DIR = "snapshots"  # under data_dir, where [snapshot] dir names no other directory
EXPORT_KEYS = ("url", "stream", "subject_prefix", "backlog_entries", "duplicate_window", "watch")
WATCH_KEYS = ("primitive", "keys", "every", "fields")
NAME_LIMIT = 64  # the name is part of the pin directory's and of every queue pair's name
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class StructureFields(TypedDict):
    """A structure's fields in a translator-tables entry (docs/tables.md); the Sketch-Merge ones only for it."""

    primitive: str
    key_len: int
    data_len: int
    hash: str
    hops: int
    cache_entries: int
    merge: str
    batch: int
    redundancy: int
    columns: NotRequired[int]
    rows: NotRequired[int]
    reporters: NotRequired[int]


class AppendFields(TypedDict):
    """An Append range's fields in a translator-tables entry (docs/tables.md)."""

    first_list: int
    lists: int
    entries: int
    data_len: int
    batch: int


@dataclass
class StructureSpec:
    """Where one primitive's reports land (`softdta.core.registry` names it)."""

    primitive: int
    slots: int = 0  # keys (hashed structures) or columns (Sketch-Merge)
    key_len: int = 4
    data_len: int = 4
    hash: str = "dta-v1"
    hops: int = DTA_V1_POSTCARD_HOPS
    cache_entries: int = POSTCARD_CACHE_ENTRIES
    rows: int = 0
    reporters: int = 1
    merge: str = "sum"
    batch: int = 1
    transport: Transport = Transport.UC
    redundancy: int = MAX_REDUNDANCY  # Key-Write, Key-Increment: the most copies a report may ask for

    @property
    def name(self) -> str:
        return registry.by_opcode(self.primitive).name

    @property
    def slot_size(self) -> int:
        return registry.by_opcode(self.primitive).slot_size(self)

    @property
    def length(self) -> int:
        return self.slots * self.slot_size

    ring_bytes = 0  # no Append rings here

    @property
    def access(self) -> Access:
        atomic = Access.REMOTE_ATOMIC if registry.by_opcode(self.primitive).atomics else Access(0)
        return Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ | atomic

    def validate(self) -> None:
        where = f"{self.name} structure"
        primitive = registry.by_opcode(self.primitive)
        if primitive.hashed and not is_power_of_two(self.slots):
            raise TableError(f"{where}: slots {self.slots} must be a power of two (the slot hash is masked)")
        if not primitive.hashed and self.slots <= 0:
            raise TableError(f"{where}: set slots to the number of columns")
        if primitive.atomics and self.transport is not Transport.RC:
            raise TableError(f"{where}: Fetch&Add needs transport \"rc\"")
        if self.hash not in KEY_HASH_NAMES:
            raise TableError(f"{where}: hash {self.hash!r} must be one of {sorted(KEY_HASH_NAMES)}")

    def advertised(self) -> StructureFields:
        """The structure fields of a translator-tables entry (docs/tables.md), without the queue pair."""
        fields: StructureFields = {
            "primitive": self.name, "key_len": self.key_len, "data_len": self.data_len, "hash": self.hash,
            "hops": self.hops, "cache_entries": self.cache_entries, "merge": self.merge, "batch": self.batch,
            "redundancy": self.redundancy}
        if not registry.by_opcode(self.primitive).hashed:
            fields.update({"columns": self.slots, "rows": self.rows, "reporters": self.reporters})
        return fields


@dataclass
class AppendSpec:
    """A range of Append lists in one region: list `first_list + i` is ring i of `entries` entries."""

    first_list: int
    lists: int
    entries: int
    data_len: int = 4
    batch: int = 4
    transport: Transport = Transport.UC

    @property
    def name(self) -> str:
        return f"append{self.first_list}"

    @property
    def length(self) -> int:
        return self.lists * self.entries * self.data_len

    @property
    def ring_bytes(self) -> int:
        return self.entries * self.data_len

    access = Access.LOCAL_WRITE | Access.REMOTE_WRITE | Access.REMOTE_READ

    def validate(self) -> None:
        if self.lists <= 0 or self.entries <= 0 or self.entries % self.batch:
            raise TableError(f"{self.name}: lists and entries must be positive and entries a multiple of the batch "
                             f"({self.batch})")

    def advertised(self) -> AppendFields:
        return {"first_list": self.first_list, "lists": self.lists, "entries": self.entries,
                "data_len": self.data_len, "batch": self.batch}


@dataclass
class CollectorConfig:
    name: str
    ip: bytes
    mac: bytes
    backend: str = "xdp"
    interface: str = ""
    xdp_mode: str = "native"  # generic where the peer of a veth runs no XDP (docker's bridge ports)
    data_dir: Path | None = None
    token: str = ""
    control_port: int = DEFAULT_CONTROL_PORT
    query_port: int = DEFAULT_QUERY_PORT
    max_qps: int = DEFAULT_MAX_QPS
    tls_cert: Path | None = None  # the control protocol over TLS (docs/control.md)
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # translators must then present a certificate this CA signed
    translate_locally: bool = False  # run the translator's XDP program on the responder's memory (docs/collector.md)
    structures: list[StructureSpec] = field(default_factory=list)
    append: list[AppendSpec] = field(default_factory=list)
    snapshot_dir: Path | None = None  # [snapshot] dir: Parquet snapshots (docs/export.md); default data_dir/snapshots
    snapshot_every: float = 0.0  # [snapshot] every: seconds between the collector's own snapshots; 0: on request only
    export: ExportSettings | None = None  # [export]: Append entries to NATS JetStream (docs/export.md)

    def validate(self) -> None:
        if len(self.name) > NAME_LIMIT or not NAME_PATTERN.fullmatch(self.name):
            shown = self.name if len(self.name) <= 40 else f"{self.name[:40]}... ({len(self.name)} characters)"
            raise TableError(f"collector: name {shown!r} must be 1 to {NAME_LIMIT} letters, digits, '_', '-' or '.', "
                             "starting with a letter or digit")
        if self.backend not in BACKENDS:
            raise TableError(f"collector: backend {self.backend!r} must be one of {list(BACKENDS)}")
        if len(self.ip) != 4:
            raise TableError("collector: ip must be an IPv4 address (RoCEv2 over IPv4)")
        address = ipaddress.IPv4Address(self.ip)
        if address.is_multicast or address.is_unspecified or address.is_reserved or address.is_loopback:
            raise TableError(f"collector: ip {address} is a multicast, broadcast, loopback or unspecified address; "
                             "give the collector's own unicast address on the RoCE network")
        if len(self.mac) != 6 or self.mac[0] & 1 or not any(self.mac):
            raise TableError(f"collector: mac {self.mac.hex(':')} is a multicast, broadcast or all-zero address; "
                             "give the collector's own unicast MAC (the first octet even), e.g. 02:5d:7a:00:01:01")
        if isinstance(self.max_qps, bool) or not isinstance(self.max_qps, int) or \
                not 1 <= self.max_qps <= MAX_QPS_LIMIT:
            raise TableError(f"collector: max_qps {self.max_qps!r} must be a whole number from 1 to {MAX_QPS_LIMIT} "
                             f"(queue pairs for all translators; default {DEFAULT_MAX_QPS})")
        if self.translate_locally and self.backend != "xdp":
            raise TableError(f"collector: translate_locally needs backend = \"xdp\" (it runs the translator's XDP "
                             f"program on the xdp responder's memory), not {self.backend!r}; set backend = \"xdp\" "
                             "or translate_locally = false")
        seen: set[int] = set()
        for structure in self.structures:
            structure.validate()
            if structure.primitive in seen:
                raise TableError(f"collector: a second {structure.name} structure needs its own collector (IP)")
            seen.add(structure.primitive)
        for lists in self.append:
            lists.validate()
        if not self.structures and not self.append:
            raise TableError("collector: it hosts no structure; add a [[structures]] or an [[append]] table "
                             "(see examples/collector.toml)")
        if self.export is not None:
            self.export.naming(self.name)
            if self.data_dir is None:
                raise TableError("[export] needs [collector] data_dir: the export journal, which keeps entries until "
                                 "the broker acknowledges them, lives there; set data_dir")
        ranges = sorted(self.append, key=lambda lists: lists.first_list)
        for lower, upper in zip(ranges, ranges[1:]):
            if upper.first_list < lower.first_list + lower.lists:
                raise TableError(f"collector: the [[append]] ranges from first_list {lower.first_list} "
                                 f"({lower.lists} lists) and from first_list {upper.first_list} overlap; give each "
                                 f"range its own list ids (first_list {lower.first_list + lower.lists} or more)")

    def snapshots_dir(self) -> Path | None:
        """Where snapshots go: [snapshot] dir, else data_dir/snapshots; None if neither is set."""
        return self.snapshot_dir or (self.data_dir / SNAPSHOTS_DIR if self.data_dir else None)

    def regions(self) -> list[StructureSpec | AppendSpec]:
        return [*self.structures, *self.append]

    @classmethod
    def from_toml(cls, path: str | Path) -> CollectorConfig:
        try:
            document = tomllib.loads(Path(path).read_text())
        except tomllib.TOMLDecodeError as error:
            raise TableError(f"{path}: not valid TOML: {error}") from None
        try:
            return cls.from_dict(document, Path(path).parent)
        except KeyError as error:
            raise TableError(f"{path}: missing required setting {error}; see docs/collector.md") from None
        except (TypeError, ValueError) as error:
            if isinstance(error, TableError):
                raise
            raise TableError(f"{path}: {error}; see docs/collector.md") from None

    @classmethod
    def from_dict(cls, document: dict[str, Any], relative_to: Path = Path(".")) -> CollectorConfig:
        Settings("the configuration", document, ("collector", "structures", "append", "export", "snapshot"))
        collector = Settings("[collector]", document.get("collector"), COLLECTOR_KEYS)
        structures = []
        for entry in tables_of(document, "structures", STRUCTURE_KEYS, "[[structures]]"):
            kinds = registry.structure_kinds()
            primitive = kinds[entry.text("primitive", choices=tuple(sorted(kinds)))]
            default = primitive.default_transport.name.lower()
            slots_key = "columns" if "columns" in entry else "slots"
            structures.append(StructureSpec(
                primitive=primitive.opcode, slots=entry.integer(slots_key, minimum=1),
                key_len=entry.integer("key_len", 4, 1), data_len=entry.integer("data_len", 4, 1),
                hash=entry.text("hash", "dta-v1", tuple(KEY_HASH_NAMES)),
                hops=entry.integer("hops", DTA_V1_POSTCARD_HOPS, 1),
                cache_entries=entry.integer("cache_entries", POSTCARD_CACHE_ENTRIES, 1),
                rows=entry.integer("rows", 0, 0), reporters=entry.integer("reporters", 1, 1),
                merge=entry.text("merge", "sum", ("sum", "max")), batch=entry.integer("batch", 1, 1),
                transport=_transport(entry.text("transport", default, ("rc", "uc"))),
                redundancy=entry.integer("redundancy", MAX_REDUNDANCY, 1, MAX_REDUNDANCY)))
        append = [AppendSpec(first_list=e.integer("first_list", 0, 0), lists=e.integer("lists", 1, 1),
                             entries=e.integer("entries", minimum=1), data_len=e.integer("data_len", 4, 1),
                             batch=e.integer("batch", 4, 1),
                             transport=_transport(e.text("transport", "uc", ("rc", "uc"))))
                  for e in tables_of(document, "append", APPEND_KEYS, "[[append]]")]
        data_dir = collector.text("data_dir", "")
        if data_dir and (relative_to / data_dir).exists() and not (relative_to / data_dir).is_dir():
            raise TableError(f"[collector]: data_dir {str(relative_to / data_dir)!r} is a file; name a directory "
                             "(it is created if missing)")
        config = cls(name=collector.text("name", "collector", empty=False),
                     ip=_address(collector, "ip", ip_bytes), mac=_address(collector, "mac", mac_bytes),
                     backend=collector.text("backend", "xdp", BACKENDS), interface=collector.text("interface", ""),
                     xdp_mode=collector.text("xdp_mode", "native", XDP_MODES),
                     data_dir=(relative_to / data_dir) if data_dir else None,
                     token=collector.text("token", ""),
                     control_port=collector.integer("control_port", DEFAULT_CONTROL_PORT, 1, 65535),
                     query_port=collector.integer("query_port", DEFAULT_QUERY_PORT, 1, 65535),
                     max_qps=collector.integer("max_qps", DEFAULT_MAX_QPS, 1, MAX_QPS_LIMIT),
                     translate_locally=collector.boolean("translate_locally", False),
                     structures=structures, append=append)
        for key in ("tls_cert", "tls_key", "tls_client_ca"):
            path = collector.text(key, "")
            if path and not (relative_to / path).is_file():
                raise TableError(f"[collector]: {key} {str(relative_to / path)!r} is not a file; give the PEM file's "
                                 "path (relative to the configuration)")
            setattr(config, key, relative_to / path if path else None)
        if bool(config.tls_cert) != bool(config.tls_key) or (config.tls_client_ca and not config.tls_cert):
            raise TableError("[collector]: TLS needs both tls_cert and tls_key (and tls_client_ca only with them); "
                             "set both, or none for plain TCP")
        if "export" in document:
            config.export = _export(Settings("[export]", document["export"], EXPORT_KEYS), document["export"],
                                    relative_to)
        if "snapshot" in document:
            snapshot = Settings("[snapshot]", document["snapshot"], SNAPSHOT_KEYS)
            directory = snapshot.text("dir", "")
            config.snapshot_dir = relative_to / directory if directory else None
            config.snapshot_every = snapshot.number("every", 0.0)
            if config.snapshots_dir() is None:
                raise TableError("[snapshot]: no directory for the snapshots; set [snapshot] dir, or [collector] "
                                 "data_dir (they then go to data_dir/snapshots)")
        if config.control_port == config.query_port:
            raise TableError(f"[collector]: control_port and query_port are both {config.query_port}; give them "
                             "different ports")
        config.validate()
        return config


def _address(settings: Settings, key: str, parse: Callable[[str], bytes]) -> bytes:
    value = settings.text(key)
    try:
        return parse(value)
    except (OSError, ValueError):
        raise TableError(f"{settings.where}: {key} = {value!r} is not a valid address") from None


def _export(section: Settings, document: dict[str, Any], relative_to: Path) -> ExportSettings:
    watches = tuple(_watch(entry, relative_to) for entry in tables_of(document, "watch", WATCH_KEYS,
                                                                       "[[export.watch]]"))
    return ExportSettings(url=section.text("url"), stream=section.text("stream", DEFAULT_STREAM),
                          subject_prefix=section.text("subject_prefix", DEFAULT_SUBJECT_PREFIX),
                          backlog_entries=section.integer("backlog_entries", DEFAULT_BACKLOG_ENTRIES, 1),
                          duplicate_window_s=section.integer("duplicate_window", DUPLICATE_WINDOW_S, 1),
                          watches=watches)


def _watch(entry: Settings, relative_to: Path) -> Watch:
    """A watch's keys are hex strings, inline or in a file (one per line, '#' comments), relative to the
    configuration."""
    keys = entry.value.get("keys")
    if isinstance(keys, str):
        path = relative_to / keys
        try:
            lines = path.read_text().splitlines()
        except OSError as error:
            raise TableError(f"{entry.where}: keys file {str(path)!r} cannot be read ({error.strerror}); give a "
                             "file of hex keys, one per line") from None
        keys = [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]
    if not isinstance(keys, list) or not keys or not all(isinstance(key, str) for key in keys):
        raise TableError(f"{entry.where}: keys must be a non-empty list of hex keys, or the name of a file of them")
    fields = entry.value.get("fields", {})
    if not isinstance(fields, dict) or "keys" in fields:
        raise TableError(f"{entry.where}: fields must be a table of the query's other fields (keys has its own "
                         "setting), e.g. fields = { value_set = [1, 2, 3] }")
    return Watch(entry.text("primitive"), tuple(keys), tuple(sorted(fields.items())),
                 entry.number("every", 1.0, 0.01))


def _transport(name: str) -> Transport:
    if name not in ("rc", "uc"):
        raise TableError(f"transport {name!r} must be \"rc\" or \"uc\"")
    return Transport[name.upper()]
