"""Translator tables: which collector structures exist, their queue pairs and regions (schema in docs/tables.md).

Loaded from TOML or dicts and validated up front, so the data path never needs to guess: every QP has a
non-zero remote QPN, every hashed structure has a power-of-two slot count, and every structure fits its region.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .dta import Profile
from .frames import ip_bytes, ip_str, mac_bytes
from .spec import (DEFAULT_GRACE_NS, DTA_V1_POSTCARD_HOPS, KEY_CHECKSUM_LEN, MAX_APPEND_BATCH, MAX_DATA_LEN,
                   MAX_KEY_LEN, MAX_POSTCARD_HOPS, MAX_WRITE_PAYLOAD, MAX_SKETCH_ROWS, POSTCARD_CACHE_ENTRIES, KeyHash, Primitive,
                   SketchMerge, Transport)

PRIMITIVE_NAMES = {"key-write": Primitive.KEY_WRITE, "key-increment": Primitive.KEY_INCREMENT,
                   "postcarding": Primitive.POSTCARDING,
                   "sketch-merge": Primitive.SKETCH_MERGE}


KEY_HASH_NAMES = {"dta-v1": KeyHash.DTA_V1, "independent": KeyHash.INDEPENDENT}


class TableError(ValueError):
    """A translator table that cannot work; the message names the entry, the problem and the fix."""


def _power_of_two_at_least(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def slot_size_of(primitive: Primitive, *, data_len: int = 4, hops: int = DTA_V1_POSTCARD_HOPS, rows: int = 0) -> int:
    """Bytes per slot of a structure: per key (Key-Write, Key-Increment, Postcarding) or per sketch column."""
    if primitive is Primitive.KEY_WRITE:
        return _power_of_two_at_least(KEY_CHECKSUM_LEN + data_len)
    if primitive is Primitive.KEY_INCREMENT:
        return 8
    if primitive is Primitive.POSTCARDING:
        return _power_of_two_at_least(4 * hops)
    return 4 * rows


@dataclass
class QueuePair:
    """The translator's end of one RDMA queue pair, and the memory region it writes."""

    name: str
    collector_ip: bytes
    collector_mac: bytes
    remote_qpn: int
    local_qpn: int
    rkey: int
    base_va: int
    length: int
    start_psn: int = 0
    transport: Transport = Transport.UC
    interface: str = ""  # egress interface of the XDP engine; "" = the one the reports arrive on
    index: int = 0

    def validate(self) -> None:
        where = f"qp {self.name!r}"
        if self.remote_qpn in (0, 1) or not 0 < self.remote_qpn < 1 << 24:
            raise TableError(f"{where}: remote_qpn {self.remote_qpn} is reserved or out of range; use the QPN "
                             "the collector advertised (2..2^24-1)")
        if not 0 < self.local_qpn < 1 << 24:
            raise TableError(f"{where}: local_qpn {self.local_qpn} must be in 1..2^24-1")
        if not 0 <= self.start_psn < 1 << 24:
            raise TableError(f"{where}: start_psn {self.start_psn} must be a 24-bit PSN")
        if not 0 <= self.rkey < 1 << 32:
            raise TableError(f"{where}: rkey {self.rkey} must be a 32-bit key")
        if self.length <= 0 or self.base_va < 0 or self.base_va + self.length > 1 << 64:
            raise TableError(f"{where}: region base 0x{self.base_va:x} length {self.length} is empty or "
                             "beyond 64-bit addresses")


@dataclass
class Structure:
    """A hashed structure (Key-Write, Key-Increment, Postcarding) or a Sketch-Merge area on one collector."""

    primitive: Primitive
    qp: QueuePair
    key_len: int = 4
    data_len: int = 4
    hops: int = DTA_V1_POSTCARD_HOPS
    cache_entries: int = POSTCARD_CACHE_ENTRIES
    columns: int = 0
    rows: int = 0
    reporters: int = 1
    merge: SketchMerge = SketchMerge.SUM
    batch: int = 1
    key_hash: KeyHash = KeyHash.DTA_V1
    slot_size: int = 0
    slot_count: int = 0

    def __post_init__(self) -> None:
        self.slot_size = slot_size_of(self.primitive, data_len=self.data_len, hops=self.hops, rows=self.rows)
        self.slot_count = self.qp.length // self.slot_size if self.slot_size else 0

    @property
    def name(self) -> str:
        return f"{self.primitive.name.lower()}@{ip_str(self.qp.collector_ip)}"

    def validate(self) -> None:
        where = f"structure {self.name}"
        if not 1 <= self.key_len <= MAX_KEY_LEN:
            raise TableError(f"{where}: key_len {self.key_len} must be 1..{MAX_KEY_LEN}")
        if not 1 <= self.data_len <= MAX_DATA_LEN:
            raise TableError(f"{where}: data_len {self.data_len} must be 1..{MAX_DATA_LEN}")
        if self.primitive is Primitive.KEY_INCREMENT:
            if self.qp.transport is not Transport.RC:
                raise TableError(f"{where}: Key-Increment uses Fetch&Add, which needs an RC queue pair "
                                 "(set transport = \"rc\")")
            if self.qp.base_va % 8:
                raise TableError(f"{where}: atomics need an 8-byte aligned region; base 0x{self.qp.base_va:x}")
        if self.primitive is Primitive.SKETCH_MERGE:
            if not 1 <= self.rows <= MAX_SKETCH_ROWS or self.columns <= 0:
                raise TableError(f"{where}: needs 1..{MAX_SKETCH_ROWS} rows and at least one column")
            if self.columns % self.batch:
                raise TableError(f"{where}: batch {self.batch} must divide the column count {self.columns}")
            if self.batch * self.slot_size > MAX_WRITE_PAYLOAD:
                raise TableError(f"{where}: a write of {self.batch} columns x {self.rows} rows x 4 B exceeds "
                                 f"{MAX_WRITE_PAYLOAD} B; lower batch or rows")
            if self.columns * self.slot_size > self.qp.length:
                raise TableError(f"{where}: {self.columns} columns x {self.rows} rows x 4 B need "
                                 f"{self.columns * self.slot_size} B, the region has {self.qp.length}")
            if self.reporters <= 0 or self.reporters >= 1 << 16:
                raise TableError(f"{where}: reporters must be 1..65535")
            return
        if self.primitive is Primitive.POSTCARDING:
            if not 1 <= self.hops <= MAX_POSTCARD_HOPS:
                raise TableError(f"{where}: hops {self.hops} must be 1..{MAX_POSTCARD_HOPS}")
            if not _is_power_of_two(self.cache_entries):
                raise TableError(f"{where}: cache_entries {self.cache_entries} must be a power of two")
        if not _is_power_of_two(self.slot_count) or self.slot_count < 2 or self.slot_count > 1 << 31:
            raise TableError(f"{where}: region length {self.qp.length} gives {self.slot_count} slots of "
                             f"{self.slot_size} B; the hash needs a power of two between 2 and 2^31 "
                             f"(e.g. length {_power_of_two_at_least(max(2, self.slot_count)) * self.slot_size})")


@dataclass
class AppendLists:
    """A range of Append lists sharing one region: list `first_list + i` is ring i of `entries` entries."""

    qp: QueuePair
    first_list: int
    lists: int
    entries: int
    data_len: int = 4
    batch: int = 4

    def validate(self) -> None:
        where = f"append lists {self.first_list}..{self.first_list + self.lists - 1}"
        if not 1 <= self.batch <= MAX_APPEND_BATCH:
            raise TableError(f"{where}: batch {self.batch} must be 1..{MAX_APPEND_BATCH}")
        if self.entries <= 0 or self.entries % self.batch:
            raise TableError(f"{where}: entries per list ({self.entries}) must be a positive multiple of the "
                             f"batch ({self.batch}) so that batches never straddle the ring's end")
        if self.lists <= 0 or self.first_list < 0 or self.first_list + self.lists > 1 << 32:
            raise TableError(f"{where}: list ids must be 32-bit")
        if not 1 <= self.data_len <= MAX_DATA_LEN:
            raise TableError(f"{where}: data_len {self.data_len} must be 1..{MAX_DATA_LEN}")
        if self.batch * self.data_len > MAX_WRITE_PAYLOAD:
            raise TableError(f"{where}: a batch of {self.batch} x {self.data_len} B exceeds {MAX_WRITE_PAYLOAD} B; "
                             "lower batch or data_len")
        needed = self.lists * self.entries * self.data_len
        if needed > self.qp.length:
            raise TableError(f"{where}: {self.lists} lists x {self.entries} entries x {self.data_len} B need "
                             f"{needed} B, the region of qp {self.qp.name!r} has {self.qp.length}")

    def ring_offset(self, list_id: int) -> int:
        return (list_id - self.first_list) * self.entries * self.data_len


@dataclass
class Tables:
    """Everything the translator needs: its own addresses, QPs, structures and Append lists."""

    mac: bytes
    ip: bytes
    profile: Profile = Profile.DTA_V1
    udp_sport: int = 49152
    dscp: int = 0
    ttl: int = 64
    grace_ns: int = DEFAULT_GRACE_NS
    ack_request_interval: int = 0
    qps: list[QueuePair] = field(default_factory=list)
    structures: list[Structure] = field(default_factory=list)
    append_lists: list[AppendLists] = field(default_factory=list)
    # Lookup indexes, rebuilt by validate() so that per-report lookups are dictionary hits.
    _structure_index: dict = field(default_factory=dict, init=False, repr=False)
    _local_qpn_index: dict = field(default_factory=dict, init=False, repr=False)
    collector_ips: frozenset = field(default=frozenset(), init=False, repr=False)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not 0 <= self.dscp < 64:
            raise TableError(f"translator: dscp {self.dscp} must be 0..63")
        if not 1 <= self.ttl <= 255:
            raise TableError(f"translator: ttl {self.ttl} must be 1..255")
        if self.grace_ns < 0:
            raise TableError("translator: grace_ms must not be negative")
        if not 0 < self.udp_sport < 1 << 16:
            raise TableError(f"translator: udp_sport {self.udp_sport} must be 1..65535")
        local_qpns: dict[int, str] = {}
        for index, qp in enumerate(self.qps):
            qp.index = index
            qp.validate()
            if qp.local_qpn in local_qpns:
                raise TableError(f"qp {qp.name!r}: local_qpn {qp.local_qpn} is already used by qp "
                                 f"{local_qpns[qp.local_qpn]!r}; replies could not be told apart")
            local_qpns[qp.local_qpn] = qp.name
        seen: set[tuple[bytes, Primitive]] = set()
        for structure in self.structures:
            structure.validate()
            key = (structure.qp.collector_ip, structure.primitive)
            if key in seen:
                raise TableError(f"structure {structure.name}: a collector IP has at most one structure per "
                                 "primitive; give the second one its own collector IP")
            seen.add(key)
        self._structure_index = {(s.qp.collector_ip, s.primitive): s for s in self.structures}
        self._local_qpn_index = {qp.local_qpn: qp for qp in self.qps}
        self.collector_ips = frozenset(qp.collector_ip for qp in self.qps)
        ranges = sorted((lists.first_list, lists.first_list + lists.lists) for lists in self.append_lists)
        for lists in self.append_lists:
            lists.validate()
        for (_, end), (start, _) in zip(ranges, ranges[1:]):
            if start < end:
                raise TableError(f"append lists overlap at list id {start}; each list id belongs to one range")

    def structure(self, collector_ip: bytes, primitive: Primitive) -> Structure | None:
        return self._structure_index.get((collector_ip, primitive))

    def append_range(self, list_id: int) -> AppendLists | None:
        for lists in self.append_lists:
            if lists.first_list <= list_id < lists.first_list + lists.lists:
                return lists
        return None

    def qp_by_local_qpn(self, local_qpn: int) -> QueuePair | None:
        return self._local_qpn_index.get(local_qpn)

    @classmethod
    def from_toml(cls, path: str | Path) -> "Tables":
        try:
            with open(path, "rb") as handle:
                document = tomllib.load(handle)
        except tomllib.TOMLDecodeError as error:
            raise TableError(f"{path}: not valid TOML: {error}") from None
        return cls.from_dict(document, source=str(path))

    @classmethod
    def from_dict(cls, document: dict, source: str = "tables") -> "Tables":
        try:
            return _from_dict(document)
        except KeyError as error:
            raise TableError(f"{source}: missing required setting {error}; see docs/tables.md") from None
        except (TypeError, ValueError) as error:
            if isinstance(error, TableError):
                raise
            raise TableError(f"{source}: {error}; see docs/tables.md") from None


def _qp_from(entry: dict, collector: dict, name: str, default_transport: Transport) -> QueuePair:
    transport = entry.get("transport", default_transport.name.lower())
    if transport not in ("rc", "uc"):
        raise TableError(f"qp {name!r}: transport {transport!r} must be \"rc\" or \"uc\"")
    return QueuePair(name=name, collector_ip=ip_bytes(collector["ip"]), collector_mac=mac_bytes(collector["mac"]),
                     remote_qpn=int(entry["remote_qpn"]), local_qpn=int(entry["local_qpn"]),
                     rkey=int(entry["rkey"]), base_va=int(entry["base"]), length=int(entry["length"]),
                     start_psn=int(entry.get("start_psn", 0)), transport=Transport[transport.upper()],
                     interface=str(collector.get("interface", "")))


def _from_dict(document: dict) -> Tables:
    translator = document["translator"]
    collectors = {c["name"]: c for c in document.get("collectors", [])}
    qps: list[QueuePair] = []
    structures: list[Structure] = []
    append_lists: list[AppendLists] = []

    def collector_of(entry: dict, what: str) -> dict:
        name = entry["collector"]
        if name not in collectors:
            raise TableError(f"{what}: collector {name!r} is not defined under [[collectors]]")
        return collectors[name]

    for entry in document.get("structures", []):
        kind = entry["primitive"]
        if kind not in PRIMITIVE_NAMES:
            raise TableError(f"structure: primitive {kind!r} must be one of {sorted(PRIMITIVE_NAMES)} "
                             "(Append lists are declared under [[append]])")
        primitive = PRIMITIVE_NAMES[kind]
        collector = collector_of(entry, f"{kind} structure")
        default_transport = Transport.RC if primitive is Primitive.KEY_INCREMENT else Transport.UC
        qp = _qp_from(entry["qp"], collector, entry["qp"].get("name", f"{kind}@{collector['name']}"),
                      default_transport)
        qps.append(qp)
        key_hash = entry.get("hash", "dta-v1")
        if key_hash not in KEY_HASH_NAMES:
            raise TableError(f"{kind} structure: hash {key_hash!r} must be one of {sorted(KEY_HASH_NAMES)}")
        merge = entry.get("merge", "sum")
        if merge not in ("sum", "max"):
            raise TableError(f"{kind} structure: merge {merge!r} must be \"sum\" or \"max\"")
        structures.append(Structure(
            primitive=primitive, qp=qp, key_len=int(entry.get("key_len", 4)),
            data_len=int(entry.get("data_len", 4)), hops=int(entry.get("hops", DTA_V1_POSTCARD_HOPS)),
            cache_entries=int(entry.get("cache_entries", POSTCARD_CACHE_ENTRIES)),
            columns=int(entry.get("columns", 0)), rows=int(entry.get("rows", 0)),
            reporters=int(entry.get("reporters", 1)), merge=SketchMerge[merge.upper()],
            batch=int(entry.get("batch", 1)), key_hash=KEY_HASH_NAMES[key_hash]))
    for entry in document.get("append", []):
        collector = collector_of(entry, "append lists")
        first = int(entry.get("first_list", 0))
        qp = _qp_from(entry["qp"], collector, entry["qp"].get("name", f"append{first}@{collector['name']}"),
                      Transport.UC)
        qps.append(qp)
        append_lists.append(AppendLists(qp=qp, first_list=first, lists=int(entry.get("lists", 1)),
                                        entries=int(entry["entries"]), data_len=int(entry.get("data_len", 4)),
                                        batch=int(entry.get("batch", 4))))
    profile = translator.get("profile", Profile.DTA_V1.value)
    if profile not in {p.value for p in Profile}:
        raise TableError(f"translator: profile {profile!r} must be one of {[p.value for p in Profile]}")
    return Tables(mac=mac_bytes(translator["mac"]), ip=ip_bytes(translator["ip"]), profile=Profile(profile),
                  udp_sport=int(translator.get("udp_sport", 49152)), dscp=int(translator.get("dscp", 0)),
                  ttl=int(translator.get("ttl", 64)),
                  grace_ns=int(float(translator.get("grace_ms", DEFAULT_GRACE_NS / 1e6)) * 1_000_000),
                  ack_request_interval=int(translator.get("ack_request_interval", 0)),
                  qps=qps, structures=structures, append_lists=append_lists)
