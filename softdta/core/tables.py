"""Translator tables: which collector structures exist, their queue pairs and regions (schema in docs/tables.md).

Loaded from TOML or dicts and validated up front, so the data path never needs to guess: every QP has a
non-zero remote QPN, every hashed structure has a power-of-two slot count, and every structure fits its region.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from softdta.core import registry
from softdta.core.settings import Settings, TableError, tables_of
from softdta.spec import (
    DEFAULT_ACK_REQUEST_INTERVAL,
    DEFAULT_GRACE_NS,
    DEFAULT_SLOT_BITS,
    DTA_V1_POSTCARD_HOPS,
    MAX_ACK_REQUEST_INTERVAL,
    MAX_APPEND_BATCH,
    MAX_DATA_LEN,
    MAX_KEY_LEN,
    MAX_REDUNDANCY,
    MAX_REPLICAS,
    MAX_RX_QUEUES,
    MAX_SLOT_BITS,
    MAX_WRITE_PAYLOAD,
    POSTCARD_CACHE_ENTRIES,
    PSN_MASK,
    KeyHash,
    MergeFunction,
    Transport,
)
from softdta.wire.dta import Profile
from softdta.wire.frames import ip_bytes, ip_str, mac_bytes
from softdta.wire.hashing import partition_slot

APPEND_OWNER_CACHE = 1 << 16  # Append lists whose owning range a fleet's tables remember
KEY_HASH_NAMES = {"dta-v1": KeyHash.DTA_V1, "independent": KeyHash.INDEPENDENT}


class Shape(Protocol):
    """What a primitive's slot size depends on: a translator's `Structure` or a collector's configuration of one."""

    data_len: int
    hops: int
    rows: int


def _check_queue_qps(where: str, qps: list[QueuePair]) -> None:
    """The QPs of one structure, one per RX queue, write one region: they differ only in QPNs and PSNs."""
    if len(qps) > MAX_RX_QUEUES:
        raise TableError(f"{where}: {len(qps)} qps, one per RX queue, exceed {MAX_RX_QUEUES}; use fewer RX queues")
    region = (qps[0].collector_ip, qps[0].rkey, qps[0].base_va, qps[0].length, qps[0].transport, qps[0].interface)
    for queue, qp in enumerate(qps[1:], 1):
        if (qp.collector_ip, qp.rkey, qp.base_va, qp.length, qp.transport, qp.interface) != region:
            raise TableError(f"{where}: the qp of RX queue {queue} ({qp.name!r}) must write queue 0's region: the "
                             "same collector, rkey, base, length and transport; only QPNs and start_psn differ")


class PerQueue:
    """A structure or Append range writes through one QP per RX queue of the translator (`qp` is queue 0's, and
    keys the structure's state), all into one region, so that each queue orders its own PSNs without a lock."""

    qp: QueuePair
    queue_qps: list[QueuePair]

    @property
    def qps(self) -> list[QueuePair]:
        return [self.qp, *self.queue_qps]

    def qp_on(self, queue: int) -> QueuePair | None:
        """The QP of reports that arrive on RX `queue`; None if there is none."""
        return self.qps[queue] if queue < len(self.qps) else None


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
class Structure(PerQueue):
    """Where one primitive's reports land on one collector; its primitive (`registry`) lays it out."""

    primitive: int  # an opcode in softdta.core.registry
    qp: QueuePair
    key_len: int = 4
    data_len: int = 4
    hops: int = DTA_V1_POSTCARD_HOPS
    cache_entries: int = POSTCARD_CACHE_ENTRIES
    columns: int = 0
    rows: int = 0
    reporters: int = 1
    merge: MergeFunction = MergeFunction.SUM
    batch: int = 1
    key_hash: KeyHash = KeyHash.DTA_V1
    redundancy: int = MAX_REDUNDANCY  # Key-Write, Key-Increment: the most copies a report may ask for
    slot_size: int = 0
    slot_count: int = 0

    queue_qps: list[QueuePair] = field(default_factory=list)  # the QPs of RX queues 1..

    def __post_init__(self) -> None:
        self.slot_size = registry.by_opcode(self.primitive).slot_size(self)
        self.slot_count = self.qp.length // self.slot_size if self.slot_size else 0

    @property
    def name(self) -> str:
        return f"{registry.by_opcode(self.primitive).name.replace('-', '_')}@{ip_str(self.qp.collector_ip)}"

    def validate(self) -> None:
        where = f"structure {self.name}"
        _check_queue_qps(where, self.qps)
        if not 1 <= self.key_len <= MAX_KEY_LEN:
            raise TableError(f"{where}: key_len {self.key_len} must be 1..{MAX_KEY_LEN}")
        if not 1 <= self.data_len <= MAX_DATA_LEN:
            raise TableError(f"{where}: data_len {self.data_len} must be 1..{MAX_DATA_LEN}")
        if not 1 <= self.redundancy <= MAX_REDUNDANCY:
            raise TableError(f"{where}: redundancy {self.redundancy} must be 1..{MAX_REDUNDANCY}")
        registry.by_opcode(self.primitive).check_structure(self, where)


@dataclass
class AppendLists(PerQueue):
    """A range of Append lists sharing one region: list `first_list + i` is ring i of `entries` entries."""

    qp: QueuePair
    first_list: int
    lists: int
    entries: int
    data_len: int = 4
    batch: int = 4
    queue_qps: list[QueuePair] = field(default_factory=list)  # the QPs of RX queues 1..

    def validate(self) -> None:
        where = f"append lists {self.first_list}..{self.first_list + self.lists - 1}"
        _check_queue_qps(where, self.qps)
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
class Fleet:
    """Reports addressed to the fleet `address` go to the collectors of their slot (docs/fleet.md): slot s of the
    partition hash has the replica set `slots[s]`, collector IPs in order, from the slot map of `epoch`."""

    address: bytes
    epoch: int
    slot_bits: int
    slots: tuple[tuple[bytes, ...], ...]
    across: bool = False  # copy n of a Key-Write or Key-Increment report goes to replica n of its slot

    def validate(self, collector_ips: frozenset[bytes]) -> None:
        if not 1 <= self.slot_bits <= MAX_SLOT_BITS:
            raise TableError(f"[fleet]: slot_bits {self.slot_bits} must be 1..{MAX_SLOT_BITS}")
        if len(self.slots) != 1 << self.slot_bits:
            raise TableError(f"[fleet]: {len(self.slots)} slots given, slot_bits {self.slot_bits} needs "
                             f"{1 << self.slot_bits}")
        if self.epoch < 0:
            raise TableError(f"[fleet]: epoch {self.epoch} must not be negative")
        if self.address in collector_ips:
            raise TableError(f"[fleet]: address {ip_str(self.address)} is a collector's; give the fleet its own "
                             "address")
        for slot, replicas in enumerate(self.slots):
            if len(replicas) > MAX_REPLICAS or len(set(replicas)) != len(replicas):
                raise TableError(f"[fleet]: slot {slot} needs at most {MAX_REPLICAS} distinct collectors")
            for ip in replicas:
                if ip not in collector_ips:
                    raise TableError(f"[fleet]: slot {slot} names collector {ip_str(ip)}, which has no structure or "
                                     "append lists here; connect it first or leave it out of the slot")

    def slot(self, partition_key: bytes) -> int:
        return partition_slot(partition_key, self.slot_bits)

    def replicas(self, partition_key: bytes) -> tuple[bytes, ...]:
        return self.slots[self.slot(partition_key)]


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
    ack_request_interval: int = DEFAULT_ACK_REQUEST_INTERVAL
    qps: list[QueuePair] = field(default_factory=list)
    structures: list[Structure] = field(default_factory=list)
    append_lists: list[AppendLists] = field(default_factory=list)
    fleet: Fleet | None = None
    # Lookup indexes, rebuilt by validate() so that per-report lookups are dictionary hits.
    _structure_index: dict[tuple[bytes, int], Structure] = field(default_factory=dict, init=False, repr=False)
    _local_qpn_index: dict[int, QueuePair] = field(default_factory=dict, init=False, repr=False)
    _append_owner: dict[int, AppendLists | None] = field(default_factory=dict, init=False, repr=False)
    collector_ips: frozenset[bytes] = field(default=frozenset(), init=False, repr=False)

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
        remote_qpns: dict[tuple[bytes, int], str] = {}
        for qp in self.qps:
            other = remote_qpns.setdefault((qp.collector_ip, qp.remote_qpn), qp.name)
            if other != qp.name:
                raise TableError(f"qp {qp.name!r}: remote_qpn {qp.remote_qpn:#x} is already qp {other!r}'s at "
                                 f"{ip_str(qp.collector_ip)}; each structure has its own queue pair at the collector")
        # one memory region is one R_Key at one collector; other regions may reuse its addresses (other processes).
        # The QPs of one structure's RX queues share its region (checked with the structure).
        owners = {id(qp): owner.qp.name for owner in [*self.structures, *self.append_lists] for qp in owner.qps}
        by_region = sorted(self.qps, key=lambda qp: (qp.collector_ip, qp.rkey, qp.base_va))
        for first, second in zip(by_region, by_region[1:]):
            if (first.collector_ip, first.rkey) == (second.collector_ip, second.rkey) and \
                    second.base_va < first.base_va + first.length and \
                    owners.get(id(first), first.name) != owners.get(id(second), second.name):
                raise TableError(f"qp {second.name!r}: its region (base {second.base_va:#x}) overlaps qp "
                                 f"{first.name!r}'s (base {first.base_va:#x}, length {first.length}); give each "
                                 "structure its own memory")
        seen: set[tuple[bytes, int]] = set()
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
        for lists in self.append_lists:
            lists.validate()
        self._append_owner = {}
        if self.fleet is not None:
            self.fleet.validate(self.collector_ips)
            by_collector: dict[bytes, list[AppendLists]] = {}
            for lists in self.append_lists:
                by_collector.setdefault(lists.qp.collector_ip, []).append(lists)
            groups = list(by_collector.values())  # with a fleet, each collector's ranges are one list space
        else:
            groups = [self.append_lists]
        for group in groups:
            ranges = sorted((lists.first_list, lists.first_list + lists.lists) for lists in group)
            for (_, end), (start, _) in zip(ranges, ranges[1:]):
                if start < end:
                    raise TableError(f"append lists overlap at list id {start}; each list id belongs to one range"
                                     + (" of a collector" if self.fleet else ""))

    def structure(self, collector_ip: bytes, primitive: int) -> Structure | None:
        return self._structure_index.get((collector_ip, primitive))

    def append_range(self, list_id: int) -> AppendLists | None:
        """The range that list `list_id` is written through: the only one holding it, or with a fleet, the one of
        the first collector of the list's replica set that holds it."""
        if list_id in self._append_owner:
            return self._append_owner[list_id]
        holders = [lists for lists in self.append_lists if lists.first_list <= list_id < lists.first_list + lists.lists]
        if self.fleet is not None:
            by_ip = {lists.qp.collector_ip: lists for lists in holders}
            holders = [by_ip[ip] for ip in self.fleet.replicas(list_id.to_bytes(4, "big")) if ip in by_ip]
        owner = holders[0] if holders else None
        if len(self._append_owner) < APPEND_OWNER_CACHE:
            self._append_owner[list_id] = owner
        return owner

    def queue_limit(self) -> tuple[int, str]:
        """How many RX queues every structure and Append range has a QP for, and the first that sets the limit."""
        owners = [(len(s.qps), f"structure {s.name}") for s in self.structures] + \
            [(len(lists.qps), f"append lists from {lists.first_list}") for lists in self.append_lists]
        return min(owners, key=lambda owner: owner[0], default=(MAX_RX_QUEUES, ""))

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
    def from_dict(cls, document: dict[str, Any], source: str = "tables") -> "Tables":
        try:
            return _from_dict(document)
        except KeyError as error:
            raise TableError(f"{source}: missing required setting {error}; see docs/tables.md") from None
        except (TypeError, ValueError) as error:
            if isinstance(error, TableError):
                raise
            raise TableError(f"{source}: {error}; see docs/tables.md") from None


def with_queue_qps(tables: Tables, queues: int) -> Tables:
    """A copy of `tables` whose structures and Append ranges have a QP per RX queue, for labs and benchmarks
    with static tables: queue q's QPNs are queue 0's plus 0x100 q, its start PSN 0x1000 q further."""
    tables = copy.deepcopy(tables)
    for owner in [*tables.structures, *tables.append_lists]:
        qp = owner.qp
        owner.queue_qps = [replace(qp, name=f"{qp.name}/q{queue}", remote_qpn=qp.remote_qpn + 0x100 * queue,
                                   local_qpn=qp.local_qpn + 0x100 * queue,
                                   start_psn=(qp.start_psn + 0x1000 * queue) & PSN_MASK)
                           for queue in range(1, queues)]
    tables.qps = [qp for owner in [*tables.structures, *tables.append_lists] for qp in owner.qps]
    tables.validate()
    return tables


TRANSLATOR_KEYS = ("profile", "mac", "ip", "udp_sport", "dscp", "ttl", "grace_ms", "ack_request_interval")
COLLECTOR_KEYS = ("name", "ip", "mac", "interface")
QP_KEYS = ("remote_qpn", "local_qpn", "rkey", "base", "length", "start_psn", "transport", "name")
STRUCTURE_KEYS = ("primitive", "collector", "qp", "hash", "key_len", "data_len", "hops", "cache_entries", "columns",
                  "rows", "reporters", "merge", "batch", "redundancy")
FLEET_KEYS = ("address", "epoch", "slot_bits", "slots", "across")
APPEND_KEYS = ("collector", "qp", "first_list", "lists", "entries", "data_len", "batch")


def _address(settings: Settings, key: str, parse: Callable[[str], bytes]) -> bytes:
    value = settings.text(key)
    try:
        return parse(value)
    except (OSError, ValueError):
        raise TableError(f"{settings.where}: {key} = {value!r} is not a valid address") from None


def _qps_from(entry: Settings, collector: Settings, default_name: str,
              default_transport: Transport) -> list[QueuePair]:
    """`qp`: one inline table, or an array of them, one per RX queue of the translator (queue 0's first)."""
    value = entry.value.get("qp")
    tables = value if isinstance(value, list) and value else [value]
    qps = []
    for queue, raw in enumerate(tables):
        qp = Settings(f"{entry.where} qp" + (f" of RX queue {queue}" if len(tables) > 1 else ""), raw, QP_KEYS)
        name = qp.text("name", default_name if queue == 0 else f"{default_name}/q{queue}")
        qp.where = f"qp {name!r}"
        transport = qp.text("transport", default_transport.name.lower(), ("rc", "uc"))
        qps.append(QueuePair(name=name, collector_ip=_address(collector, "ip", ip_bytes),
                             collector_mac=_address(collector, "mac", mac_bytes),
                             remote_qpn=qp.integer("remote_qpn"), local_qpn=qp.integer("local_qpn"),
                             rkey=qp.integer("rkey"), base_va=qp.integer("base"), length=qp.integer("length"),
                             start_psn=qp.integer("start_psn", 0), transport=Transport[transport.upper()],
                             interface=collector.text("interface", "")))
    return qps


def _from_dict(document: dict[str, Any]) -> Tables:
    Settings("the tables", document, ("translator", "collectors", "structures", "append", "fleet"))
    translator = Settings("[translator]", document.get("translator"), TRANSLATOR_KEYS)
    collectors = {c.text("name"): c for c in tables_of(document, "collectors", COLLECTOR_KEYS, "[[collectors]]")}
    qps: list[QueuePair] = []
    structures: list[Structure] = []
    append_lists: list[AppendLists] = []

    def collector_of(entry: Settings, what: str) -> Settings:
        name = entry.text("collector")
        if name not in collectors:
            raise TableError(f"{what}: collector {name!r} is not defined under [[collectors]]")
        return collectors[name]

    for entry in tables_of(document, "structures", STRUCTURE_KEYS, "[[structures]]"):
        kind = entry.text("primitive")
        kinds = registry.structure_kinds()
        if kind not in kinds:
            raise TableError(f"structure: primitive {kind!r} must be one of {sorted(kinds)} "
                             "(Append lists are declared under [[append]])")
        primitive = kinds[kind]
        entry.where = f"{kind} structure"
        collector = collector_of(entry, f"{kind} structure")
        qp, *queue_qps = _qps_from(entry, collector, f"{kind}@{collector.text('name')}", primitive.default_transport)
        qps += [qp, *queue_qps]
        key_hash = entry.text("hash", "dta-v1", tuple(KEY_HASH_NAMES))
        merge = entry.text("merge", "sum", ("sum", "max"))
        structures.append(Structure(
            primitive=primitive.opcode, qp=qp, key_len=entry.integer("key_len", 4),
            data_len=entry.integer("data_len", 4),
            hops=entry.integer("hops", DTA_V1_POSTCARD_HOPS),
            cache_entries=entry.integer("cache_entries", POSTCARD_CACHE_ENTRIES),
            columns=entry.integer("columns", 0), rows=entry.integer("rows", 0),
            reporters=entry.integer("reporters", 1), merge=MergeFunction[merge.upper()],
            batch=entry.integer("batch", 1, 1), key_hash=KEY_HASH_NAMES[key_hash],
            redundancy=entry.integer("redundancy", MAX_REDUNDANCY, 1, MAX_REDUNDANCY), queue_qps=queue_qps))
    for entry in tables_of(document, "append", APPEND_KEYS, "[[append]]"):
        collector = collector_of(entry, "append lists")
        first = entry.integer("first_list", 0, 0)
        entry.where = f"append lists from {first}"
        qp, *queue_qps = _qps_from(entry, collector, f"append{first}@{collector.text('name')}", Transport.UC)
        qps += [qp, *queue_qps]
        append_lists.append(AppendLists(qp=qp, first_list=first, lists=entry.integer("lists", 1, 1),
                                        entries=entry.integer("entries", minimum=1),
                                        data_len=entry.integer("data_len", 4), batch=entry.integer("batch", 4, 1),
                                        queue_qps=queue_qps))
    profile = translator.text("profile", Profile.DTA_V1.value, tuple(p.value for p in Profile))
    return Tables(mac=_address(translator, "mac", mac_bytes), ip=_address(translator, "ip", ip_bytes),
                  profile=Profile(profile), udp_sport=translator.integer("udp_sport", 49152),
                  dscp=translator.integer("dscp", 0), ttl=translator.integer("ttl", 64),
                  grace_ns=int(translator.number("grace_ms", DEFAULT_GRACE_NS / 1e6) * 1_000_000),
                  ack_request_interval=translator.integer("ack_request_interval", DEFAULT_ACK_REQUEST_INTERVAL, 1,
                                                             MAX_ACK_REQUEST_INTERVAL),
                  qps=qps, structures=structures, append_lists=append_lists,
                  fleet=_fleet_from(document, collectors))


def _fleet_from(document: dict[str, Any], collectors: dict[str, Settings]) -> Fleet | None:
    if "fleet" not in document:
        return None
    fleet = Settings("[fleet]", document["fleet"], FLEET_KEYS)
    slots = fleet.value.get("slots")
    if not isinstance(slots, list) or not all(isinstance(names, list) for names in slots):
        raise TableError("[fleet]: slots must be an array of 2^slot_bits arrays of [[collectors]] names")
    replica_sets = []
    ips: dict[str, bytes] = {}  # each collector's address, parsed once for its thousands of slots
    for slot, names in enumerate(slots):
        for name in names:
            if name not in collectors:
                raise TableError(f"[fleet]: slot {slot} names collector {name!r}, which is not defined under "
                                 "[[collectors]]")
            if name not in ips:
                ips[name] = _address(collectors[name], "ip", ip_bytes)
        replica_sets.append(tuple(ips[name] for name in names))
    return Fleet(address=_address(fleet, "address", ip_bytes), epoch=fleet.integer("epoch", 0, 0),
                 slot_bits=fleet.integer("slot_bits", DEFAULT_SLOT_BITS, 1, MAX_SLOT_BITS),
                 slots=tuple(replica_sets), across=fleet.boolean("across", False))
