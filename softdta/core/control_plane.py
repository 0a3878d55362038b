"""The translator control plane, computed once for every data plane (sans-IO).

`plan()` is a pure function from `Tables` and the slot allocation already in force to the table entries a
translator needs. `apply_plan()` writes them through a `Target`: the XDP maps (`softdta.engines.xdp`) or P4 tables and
registers over P4Runtime (`softdta.targets.p4runtime`). Both receive the same entries through the same calls.

Values are logical: integers for integer fields, and `bytes` for addresses. A field the spec stores "network
order" (an IPv4 address in a 32-bit field) holds the address's four bytes, and each target encodes it as its
data plane reads it (a __u32 in memory order for BPF, a big-endian bitstring for P4).
"""

from __future__ import annotations

import hashlib
import io
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, cast

from softdta.core import registry
from softdta.core.settings import TableError
from softdta.core.tables import QueuePair, Tables
from softdta.spec import (
    ETHERNET,
    ICRC_LEN,
    MAX_REDUNDANCY,
    MAX_RX_QUEUES,
    P4_TABLES,
    PSN_MASK,
    ROCE_PORT,
    TRANSLATOR_MAPS,
    Field,
    Map,
    QpState,
    Raw,
    RoceOpcode,
    Transport,
)
from softdta.wire import icrc_split
from softdta.wire.frames import UdpEndpoints, build_udp_frame
from softdta.wire.roce import transport_payload

# How long a partial Append batch or Postcarding path waits before it is written out, by default.
DEFAULT_FLUSH_IDLE_NS = 1_000_000
# Written by the control plane; the data plane only reads them.
CONFIG_TABLES = ("translator_config", "qp", "collector", "qp_by_local_qpn", "structure", "append_list", "queue_qp",
                 "fleet_slot", "fleet_config")
# Entries only the P4 data planes take (iCRC constants, packet replication groups); see spec.P4_TABLES.
P4_ONLY_TABLES = tuple(t.name for t in P4_TABLES)
# Entries that stop existing when the tables no longer name them (the qp array is zeroed instead, by the
# `retire` entries of a plan, because its index is a slot that a later QP may reuse).
PRUNED_TABLES = ("structure", "append_list", "qp_by_local_qpn", "collector") + P4_ONLY_TABLES


@dataclass(frozen=True)
class Entry:
    """One table entry: `value` empty means all zeros (a retired array slot, a reset state entry)."""

    table: str
    key: Mapping[str, int | bytes]
    value: Mapping[str, int | bytes] = field(default_factory=dict)

    def key_tuple(self) -> tuple[int | bytes, ...]:
        return tuple(self.key[f.name] for f in map_spec(self.table).key)


@dataclass
class Slots:
    """Indexes the control plane hands out; kept across table updates so live state stays put."""

    qp: dict[int, int] = field(default_factory=dict)  # local QPN -> qp index
    append: dict[int, int] = field(default_factory=dict)  # list id -> append_state index
    append_qp: dict[int, int] = field(default_factory=dict)  # list id -> the qp index it writes through
    # (list id, qp index) -> the append_state index of a ring the list left (a fleet moved it): its head, should
    # the list come back
    parked: dict[tuple[int, int], int] = field(default_factory=dict)
    # (primitive, collector ip, entries) -> the first of a structure's entries in its primitive's `state_map`
    state: dict[tuple[int, bytes, int], int] = field(default_factory=dict)

    def remember_structure(self, collector_ip: bytes, primitive: int, fields: Mapping[str, int]) -> None:
        """Take a structure entry a data plane holds (`fields`: its value) into the allocation."""
        kind = registry.by_opcode(primitive)
        if kind.state_map is not None:
            self.state[(primitive, collector_ip, kind.state_size(fields))] = fields["state_index"]

    def state_of(self, primitive: int) -> dict[tuple[bytes, int], int]:
        """(collector ip, entries) -> first entry, of the structures of one primitive."""
        return {(ip, size): first for (kind, ip, size), first in self.state.items() if kind == primitive}


@dataclass(frozen=True)
class LiveQp:
    """A queue pair as a data plane holds it: the remote QPN and start PSN it was installed with, and its PSNs
    now (None where the data plane cannot be read back, as over P4Runtime)."""

    remote_qpn: int
    start_psn: int
    next_psn: int | None = None
    unacked_psn: int | None = None


@dataclass(frozen=True)
class PsnRestart:
    """A QP whose PSN state a plan sets anew: at `psn`, from `live_psn` (None: the QP is new to the data plane)."""

    qp: str
    local_qpn: int
    psn: int
    live_psn: int | None


def restart_psn(qp: QueuePair, live: LiveQp | None) -> int | None:
    """The PSN a QP of new tables starts over at, or None when it keeps its live PSN state.

    The collector's responder is the one truth (docs/protocol.md, "Queue-pair PSNs"): an advertisement carries
    the PSN the collector expects next. A QP new to the data plane, or towards another remote QPN, starts there.
    An advertisement that repeats the installed one says nothing new. Any other PSN is adopted unless it lies in
    [unacked_psn, next_psn], where frames the collector has not executed yet explain it.
    """
    if live is None or live.remote_qpn != qp.remote_qpn:
        return qp.start_psn
    if qp.start_psn == live.start_psn:
        return None
    if live.next_psn is None or live.unacked_psn is None:
        return qp.start_psn
    in_flight = (qp.start_psn - live.unacked_psn) & PSN_MASK <= (live.next_psn - live.unacked_psn) & PSN_MASK
    return None if in_flight else qp.start_psn


@dataclass
class Plan:
    """What one application of the tables writes, in order: `state` (initial values for state that is new or
    whose QP changed, before any entry leads traffic to it), then `entries`; then entries of `PRUNED_TABLES`
    whose keys are not in `keep` are deleted, and last the QP slots in `retire` are freed, once nothing refers
    to them. Traffic for what stays never sees a gap. The very last write is the `generation` of the entries,
    which changes with them: a data plane that keeps copies of entries (the XDP translator keeps each CPU's last
    structure) uses a copy only while the generation it was made in lasts. `restarts` names the QPs whose PSN
    state `state` sets anew."""

    entries: list[Entry]
    state: list[Entry]
    retire: list[Entry]
    keep: dict[str, set[tuple[int | bytes, ...]]]
    slots: Slots
    generation: Entry
    restarts: list[PsnRestart] = field(default_factory=list)


class Target(Protocol):
    """A data plane the control plane writes to; it receives the entries of the tables it has."""

    tables: frozenset[str]

    def write(self, entry: Entry) -> None: ...

    def delete(self, entry: Entry) -> None: ...

    def installed(self, table: str) -> Iterable[Entry]:
        """Entries of a pruned table that the data plane holds now (keys are enough)."""
        ...


def map_spec(name: str) -> Map:
    for table in TRANSLATOR_MAPS + P4_TABLES:
        if table.name == name:
            return table
    raise KeyError(f"no translator table named {name!r} in spec.TRANSLATOR_MAPS or spec.P4_TABLES")


def address_fields(name: str) -> frozenset[str]:
    """Integer fields of a table that the spec stores in network order: the control plane passes them as bytes."""
    table = map_spec(name)
    return frozenset(f.name for f in table.key + table.value
                     if isinstance(f, Field) and not isinstance(f, Raw) and f.doc.startswith("network order"))


def capacity(name: str) -> int:
    return map_spec(name).max_entries


def _free_index(used: set[int], limit: int, what: str) -> int:
    for index in range(limit):
        if index not in used:
            used.add(index)
            return index
    raise TableError(f"the translator holds at most {limit} {what}; split the tables over translators")


def _free_range(ranges: list[tuple[int, int]], size: int, limit: int, what: str, fix: str) -> int:
    start = 0
    for first, length in sorted(ranges):
        if first - start >= size:
            break
        start = max(start, first + length)
    if start + size > limit:
        raise TableError(f"the translator holds at most {limit} {what} in total; {fix}")
    ranges.append((start, size))
    return start


def plan(tables: Tables, slots: Slots, *, flush_idle_ns: int, egress: Callable[[QueuePair], int],
         installed_qps: Mapping[int, LiveQp] = {}) -> Plan:
    """The entries for `tables`, reusing the indexes of `slots` (not modified; the plan carries the new ones).

    `egress` names the port towards a QP's collector (an ifindex for XDP, a device port for P4, 0 = the port
    the report came in on). `installed_qps` maps qp index -> the QP the data plane holds there
    (leave out failed ones): `restart_psn` says which QPs keep their PSN state.
    """
    tables.validate()
    if len(tables.ip) != 4:
        raise TableError("the translator data planes work over IPv4; give the translator an IPv4 address")
    new = Slots(qp=dict(slots.qp), append=dict(slots.append), append_qp=dict(slots.append_qp),
                parked=dict(slots.parked), state=dict(slots.state))
    entries = [Entry("translator_config", {"index": 0}, {
        "src_mac": tables.mac, "udp_sport": tables.udp_sport, "src_ip": tables.ip, "dscp": tables.dscp,
        "ttl": tables.ttl, "profile": 0 if tables.profile.value == "dta-v1" else 1,
        "ack_req_interval": tables.ack_request_interval, "grace_ns": tables.grace_ns,
        "flush_idle_ns": flush_idle_ns})]
    state: list[Entry] = []
    restarted: set[int] = set()  # QP indexes whose PSN state starts over: a new peer, maybe a new region
    restarts: list[PsnRestart] = []
    used = set(slots.qp.values())
    qp_index: dict[str, int] = {}
    collectors: set[bytes] = set()
    for qp in tables.qps:
        index = slots.qp.get(qp.local_qpn)
        if index is None:
            index = _free_index(used, capacity("qp"), "queue pairs")
        new.qp[qp.local_qpn] = qp_index[qp.name] = index
        entries.append(Entry("qp", {"qp_index": index}, {
            "remote_qpn": qp.remote_qpn, "local_qpn": qp.local_qpn, "rkey": qp.rkey,
            "collector_ip": qp.collector_ip, "collector_mac": qp.collector_mac, "transport": int(qp.transport),
            "start_psn": qp.start_psn, "ifindex": egress(qp), "base_va": qp.base_va, "length": qp.length}))
        held = installed_qps.get(index)
        psn = restart_psn(qp, held)
        if psn is not None:
            restarted.add(index)
            restarts.append(PsnRestart(qp.name, qp.local_qpn, psn, held.next_psn if held else None))
            state.append(Entry("qp_state", {"qp_index": index},
                               {"next_psn": psn, "unacked_psn": psn, "state": int(QpState.ACTIVE)}))
        entries.append(Entry("qp_by_local_qpn", {"local_qpn": qp.local_qpn}, {"qp_index": index}))
        if qp.collector_ip not in collectors:
            collectors.add(qp.collector_ip)
            entries.append(Entry("collector", {"ip": qp.collector_ip}, {"mac": qp.collector_mac}))
    entries += queue_qps(tables, qp_index)  # before the entries that lead traffic to them
    state_ranges: dict[str, list[tuple[int, int]]] = {}  # per state map: the (first, entries) ranges taken
    for (kind, _, size), first in slots.state.items():
        state_ranges.setdefault(cast(str, registry.by_opcode(kind).state_map), []).append((first, size))
    live_state = set()
    for structure in tables.structures:
        ip, primitive = structure.qp.collector_ip, registry.by_opcode(structure.primitive)
        fields = {
            "qp_index": qp_index[structure.qp.name], "queues": len(structure.qps), "slot_count": structure.slot_count,
            "slot_size": structure.slot_size, "key_len": structure.key_len, "data_len": structure.data_len,
            "hops": structure.hops, "merge": int(structure.merge), "key_hash": int(structure.key_hash),
            "redundancy": structure.redundancy,
            "rows": structure.rows, "reporters": structure.reporters, "columns": structure.columns,
            "cache_entries": structure.cache_entries, "batch": structure.batch, "state_index": 0}
        if primitive.state_map is not None:
            key = (structure.primitive, ip, primitive.state_size(fields))
            if key not in new.state:
                what, fix = primitive.state_limit
                new.state[key] = _free_range(state_ranges.setdefault(primitive.state_map, []), key[2],
                                             capacity(primitive.state_map), what, fix)
            live_state.add(key)
            fields["state_index"] = new.state[key]
        entries.append(Entry("structure", {"collector_ip": ip, "primitive": int(structure.primitive)}, fields))
    list_ids = set()
    append_used = set(slots.append.values()) | set(slots.parked.values())
    list_ids_held = {lists.first_list + offset for lists in tables.append_lists for offset in range(lists.lists)}
    for list_id in sorted(list_ids_held):
        owner = tables.append_range(list_id)  # with a fleet, the range of its slot's first replica that has it
        if owner is None:
            continue
        through = qp_index[owner.qp.name]
        list_ids.add(list_id)
        left = new.append_qp.get(list_id, through)
        if list_id in new.append and left != through:
            # a fleet moved the list to another collector: each ring keeps its own head, for when it comes back
            new.parked[(list_id, left)] = new.append.pop(list_id)
            returning = new.parked.pop((list_id, through), None)
            if returning is not None:
                new.append[list_id] = returning
        if list_id not in new.append:
            new.append[list_id] = _free_index(append_used, capacity("append_state"), "Append lists")
            state.append(Entry("append_state", {"state_index": new.append[list_id]}))
        elif through in restarted:
            # a re-created collector QP (a restarted collector) comes with a fresh region, read from entry 0
            state.append(Entry("append_state", {"state_index": new.append[list_id]}))
        new.append_qp[list_id] = through
        entries.append(Entry("append_list", {"list_id": list_id}, {
            "qp_index": through, "queues": len(owner.qps),
            "first_slot": (list_id - owner.first_list) * owner.entries, "slot_count": owner.entries,
            "entry_size": owner.data_len, "batch": owner.batch, "state_index": new.append[list_id]}))
    entries += fleet_entries(tables)
    new.state = {key: first for key, first in new.state.items() if key in live_state}
    new.append = {list_id: index for list_id, index in new.append.items() if list_id in list_ids}
    new.append_qp = {list_id: index for list_id, index in new.append_qp.items() if list_id in list_ids}
    live_qps = set(qp_index.values())
    new.parked = {key: index for key, index in new.parked.items() if key[1] in live_qps and key[0] in list_ids_held}
    live_qpns = {qp.local_qpn for qp in tables.qps}
    retire = [Entry("qp", {"qp_index": new.qp.pop(local_qpn)}) for local_qpn in sorted(set(new.qp) - live_qpns)]
    entries += icrc_constants(tables, qp_index) + multicast_groups(tables, egress)
    keep = {name: {entry.key_tuple() for entry in entries if entry.table == name} for name in PRUNED_TABLES}
    return Plan(entries, state, retire, keep, new, generation_of(entries), restarts)


def fleet_entries(tables: Tables) -> list[Entry]:
    """The slot map, then the fleet's settings that lead reports to it; all zeros without a fleet."""
    fleet = tables.fleet
    if fleet is None:
        return [Entry("fleet_config", {"index": 0})]
    width = map_spec("fleet_slot").value[1].bits // 8
    return [Entry("fleet_slot", {"slot": slot}, {"replicas": len(replicas),
                                                 "collector_ip": b"".join(replicas).ljust(width, b"\0")})
            for slot, replicas in enumerate(fleet.slots)] + \
        [Entry("fleet_config", {"index": 0}, {"address": fleet.address, "slot_bits": fleet.slot_bits,
                                              "across": int(fleet.across), "epoch": fleet.epoch})]


def generation_of(entries: list[Entry]) -> Entry:
    """A 64-bit digest of the entries, never 0 (a data plane's "no generation yet"). It hashes their pickle
    without the memo, which spells out every value in full, so equal entries give equal digests."""
    serialized = io.BytesIO()
    pickler = pickle.Pickler(serialized, protocol=5)
    pickler.fast = True
    pickler.dump([(entry.table, entry.key, entry.value) for entry in entries])
    digest = hashlib.blake2b(serialized.getbuffer(), digest_size=8).digest()
    return Entry("tables_generation", {"index": 0}, {"generation": int.from_bytes(digest, "little") or 1})


def deletions(plan: Plan, installed: Mapping[str, Iterable[Entry]]) -> list[Entry]:
    """Entries of the pruned tables that the data plane holds and the plan no longer names."""
    return [Entry(name, entry.key) for name in PRUNED_TABLES for entry in installed.get(name, ())
            if entry.key_tuple() not in plan.keep[name]]


def apply_plan(target: Target, plan: Plan) -> None:
    """Write a plan to a data plane: initial state, entries, deletions, retired slots, and last the generation."""
    for entry in plan.state + plan.entries:
        if entry.table in target.tables:
            target.write(entry)
    pruned = [name for name in PRUNED_TABLES if name in target.tables]
    for entry in deletions(plan, {name: list(target.installed(name)) for name in pruned}):
        target.delete(entry)
    for entry in plan.retire:
        target.write(entry)
    if plan.generation.table in target.tables:
        target.write(plan.generation)


def queue_qps(tables: Tables, qp_index: Mapping[str, int]) -> list[Entry]:
    """The QP of each RX queue after the first, for every structure and Append range."""
    return [Entry("queue_qp", {"slot": qp_index[owner.qp.name] * MAX_RX_QUEUES + queue},
                  {"qp_index": qp_index[qp.name]})
            for owner in [*tables.structures, *tables.append_lists] for queue, qp in enumerate(owner.qps) if queue]


def frame_shapes(tables: Tables) -> dict[str, set[tuple[RoceOpcode, int]]]:
    """Every (opcode, payload length) each QP can send, by QP name."""
    shapes: dict[str, set[tuple[RoceOpcode, int]]] = {qp.name: set() for qp in tables.qps}

    def writes(qp: QueuePair, lengths: Iterable[int]) -> None:
        rc = qp.transport is Transport.RC
        for opcode in ((RoceOpcode.RC_WRITE_ONLY, RoceOpcode.RC_WRITE_ONLY_IMM) if rc
                       else (RoceOpcode.UC_WRITE_ONLY, RoceOpcode.UC_WRITE_ONLY_IMM)):
            shapes[qp.name].update((opcode, length) for length in lengths)

    for structure in tables.structures:
        primitive = registry.by_opcode(structure.primitive)
        if primitive.atomics:
            shapes[structure.qp.name].add((RoceOpcode.RC_FETCH_ADD, 0))
        writes(structure.qp, primitive.write_lengths(structure))
    for lists in tables.append_lists:
        writes(lists.qp, [count * lists.data_len for count in range(1, lists.batch + 1)])  # idle flushes too
    return shapes


def icrc_constants(tables: Tables, qp_index: Mapping[str, int]) -> list[Entry]:
    """The per-QP iCRC parts (`icrc_split.constant`) of every frame shape, from a frame with zeroed variables."""
    entries, shapes = [], frame_shapes(tables)
    for qp in tables.qps:
        ends = UdpEndpoints(src_mac=tables.mac, dst_mac=qp.collector_mac, src_ip=tables.ip, dst_ip=qp.collector_ip,
                            sport=tables.udp_sport, dport=ROCE_PORT, dscp=tables.dscp, ttl=tables.ttl)
        for opcode, length in sorted(shapes[qp.name]):
            headers = {"reth": {"rkey": qp.rkey, "dma_length": length}, "atomic_eth": {"rkey": qp.rkey}}
            transport = transport_payload(opcode, qp.remote_qpn, 0, headers, bytes(length))
            packet = build_udp_frame(ends, transport + bytes(ICRC_LEN))[ETHERNET.size:-ICRC_LEN]
            entries.append(Entry("icrc_constant", {"qp_index": qp_index[qp.name], "opcode": int(opcode),
                                                   "ip_length": len(packet) + ICRC_LEN},
                                 {"constant": icrc_split.constant(packet)}))
    return entries


def multicast_groups(tables: Tables, egress: Callable[[QueuePair], int]) -> list[Entry]:
    """Replication groups for the primitives whose reports ask for copies: one per egress port and count 1..N."""
    ports = sorted({egress(s.qp) for s in tables.structures if registry.by_opcode(s.primitive).redundant})
    return [Entry("multicast_group", {"group": port * MAX_REDUNDANCY + copies}, {"port": port, "copies": copies})
            for port in ports for copies in range(1, MAX_REDUNDANCY + 1)]
