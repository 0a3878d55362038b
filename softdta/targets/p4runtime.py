"""The control plane's P4 back end: the entries of `control_plane.plan` as P4Runtime updates, and a client.

`P4RuntimeTarget` turns control-plane entries into `p4.v1.Update` messages (table entries for the control
tables, register entries for initial state) with the IDs of the generated P4Info (p4/softdta.p4info.txtpb);
building the messages is pure. `P4RuntimeClient` carries them to a switch over gRPC: stream arbitration with
an election ID, optional SetForwardingPipelineConfig, Write and Read. `P4Translator.apply` is the P4
counterpart of `XdpTranslator.apply`: the same plan, the same calls, another target.

`softdta p4 entries|push|build|run` is its command line (docs/p4.md).
"""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from softdta.core import registry
from softdta.core.control_plane import (
    DEFAULT_FLUSH_IDLE_NS,
    Entry,
    LiveQp,
    Plan,
    Slots,
    address_fields,
    apply_plan,
    map_spec,
    plan,
)
from softdta.core.settings import TableError
from softdta.core.tables import QueuePair, Tables
from softdta.errors import SoftdtaError
from softdta.kernel.resources import P4_DIR
from softdta.spec import (
    TNA_APPEND_STATE_ENTRIES,
    TNA_MAX_APPEND_BATCH,
    Raw,
)
from softdta.targets.p4info import parse_p4info
from softdta.targets.p4names import FLEET_HOLDER_BITS, P4_REPLICATION, p4_control_tables, p4_registers
from softdta.wire.dta import Profile

# isort: split
import grpc  # noqa: E402  (after .p4info, which selects the protobuf runtime the p4runtime wheel needs)
from google.rpc import code_pb2  # noqa: E402
from p4.config.v1 import p4info_pb2  # noqa: E402
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc  # noqa: E402

P4INFO_FILE = P4_DIR / "softdta.p4info.txtpb"
P4_TABLE_SPECS = {t.name: t for t in p4_control_tables()}
P4_TABLE_NAMES = tuple(P4_TABLE_SPECS)
HELD_TABLES = P4_TABLE_NAMES + P4_REPLICATION  # what a switch holds and the control plane reads back


class P4RuntimeError(SoftdtaError, RuntimeError):
    """The switch refused or could not be reached; the message says what to check."""


def load_p4info(path: Path = P4INFO_FILE) -> p4info_pb2.P4Info:
    return parse_p4info(path.read_text())


def encode_value(value: int | bytes, bits: int) -> bytes:
    """A P4Runtime bitstring in canonical form: big-endian, no leading zero bytes, at least one byte."""
    number = int.from_bytes(value, "big") if isinstance(value, bytes) else value
    if not 0 <= number < 1 << bits:
        raise ValueError(f"{value!r} does not fit in bit<{bits}>")
    return number.to_bytes(max(1, (number.bit_length() + 7) // 8), "big")


def _number(values: Mapping[str, int | bytes], name: str) -> int:
    """A field the control plane holds as an int (every field but addresses and byte fields)."""
    value = values[name]
    if not isinstance(value, int):
        raise TypeError(f"{name} holds {value!r}, not a number")
    return value


def _logical(table: str, name: str, data: bytes) -> int | bytes:
    """A bitstring as the control plane holds the field: bytes for addresses and byte fields, else an int."""
    spec_field = next(f for f in P4_TABLE_SPECS[table].key + P4_TABLE_SPECS[table].value if f.name == name)
    number = int.from_bytes(data, "big")
    if isinstance(spec_field, Raw):
        return number.to_bytes(spec_field.size, "big")
    if name in address_fields(table):
        return number.to_bytes(spec_field.bits // 8, "big")
    return number


class P4Names:
    """IDs of the P4Info objects by name."""

    def __init__(self, info: p4info_pb2.P4Info):
        self.info = info
        self.tables = {t.preamble.name: t for t in info.tables}
        self.actions = {a.preamble.name: a for a in info.actions}
        self.registers = {r.preamble.name: r for r in info.registers}
        self.table_by_id = {t.preamble.id: t for t in info.tables}
        self.action_by_id = {a.preamble.id: a for a in info.actions}


def table_entry(entry: Entry, names: P4Names) -> p4runtime_pb2.TableEntry:
    """A control-table entry as a P4Runtime TableEntry (the action only when the entry has a value)."""
    table = names.tables[entry.table]
    message = p4runtime_pb2.TableEntry(table_id=table.preamble.id)
    for match in table.match_fields:
        field = message.match.add(field_id=match.id)
        field.exact.value = encode_value(entry.key[match.name], match.bitwidth)
    if entry.value:
        action = names.actions[f"set_{entry.table}"]
        message.action.action.action_id = action.preamble.id
        for param in action.params:
            message.action.action.params.add(param_id=param.id,
                                             value=encode_value(entry.value.get(param.name, 0), param.bitwidth))
    return message


def decode_table_entry(message: p4runtime_pb2.TableEntry, names: P4Names) -> Entry:
    table = names.table_by_id[message.table_id]
    name = table.preamble.name
    match_names = {m.id: m.name for m in table.match_fields}
    key = {match_names[m.field_id]: _logical(name, match_names[m.field_id], m.exact.value) for m in message.match}
    value = {}
    if message.action.action.action_id:
        action = names.action_by_id[message.action.action.action_id]
        param_names = {p.id: p.name for p in action.params}
        value = {param_names[p.param_id]: _logical(name, param_names[p.param_id], p.value)
                 for p in message.action.action.params}
    return Entry(name, key, value)


def multicast_group_entry(entry: Entry) -> p4runtime_pb2.MulticastGroupEntry:
    """Copies of a report to one port, each with its replication ID (egress rid = the copy index)."""
    group = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=entry.key["group"])
    for copy in range(_number(entry.value, "copies") if entry.value else 0):
        group.replicas.add(egress_port=entry.value["port"], instance=copy)
    return group


def decode_multicast_group(group: p4runtime_pb2.MulticastGroupEntry) -> Entry:
    ports = {replica.egress_port for replica in group.replicas}
    value = {"port": ports.pop(), "copies": len(group.replicas)} if ports else {}
    return Entry("multicast_group", {"group": group.multicast_group_id}, value)


def _entity(entry: Entry, names: P4Names) -> dict[str, object]:
    if entry.table in P4_REPLICATION:
        replication = p4runtime_pb2.PacketReplicationEngineEntry()
        replication.multicast_group_entry.CopyFrom(multicast_group_entry(entry))
        return {"packet_replication_engine_entry": replication}
    return {"table_entry": table_entry(entry, names)}


def register_entries(entry: Entry, names: P4Names) -> list[p4runtime_pb2.RegisterEntry]:
    """Initial state as register writes at the entry's index. Byte-array registers are left alone: the data
    plane reads them only up to the counts these writes reset (an Append batch's `pending`)."""
    (index,) = entry.key.values()
    messages = []
    for register in p4_registers():
        if register.table != entry.table or register.size != map_spec(entry.table).max_entries:
            continue
        message = p4runtime_pb2.RegisterEntry(register_id=names.registers[register.name].preamble.id)
        message.index.index = index
        message.data.bitstring = encode_value(entry.value.get(register.field, 0), register.bits)
        messages.append(message)
    return messages


class RegisterRouter:
    """`send` for a switch that takes register writes elsewhere (bmv2: `softdta.targets.bmv2.ThriftRegisters`). Runs
    of register writes travel together, in their place among the other updates: each run goes out before the
    next table update, or at `flush`."""

    def __init__(self, send: Callable[[list[p4runtime_pb2.Update]], None],
                 write_registers: Callable[[list[p4runtime_pb2.RegisterEntry]], None]):
        self.send, self.write_registers = send, write_registers
        self.pending: list[p4runtime_pb2.RegisterEntry] = []

    def __call__(self, updates: list[p4runtime_pb2.Update]) -> None:
        others = [u for u in updates if not u.entity.HasField("register_entry")]
        if others:
            self.flush()
            self.send(others)
        self.pending += [u.entity.register_entry for u in updates if u.entity.HasField("register_entry")]

    def flush(self) -> None:
        if self.pending:
            pending, self.pending = self.pending, []
            self.write_registers(pending)


class P4RuntimeTarget:
    """A P4 switch as a control-plane target. `send` carries one list of updates (one WriteRequest) at a time,
    so the order the control plane writes in is the order the switch applies."""

    tables = frozenset(HELD_TABLES + tuple({r.table for r in p4_registers()}))

    def __init__(self, names: P4Names, send: Callable[[list[p4runtime_pb2.Update]], None],
                 present: dict[str, dict[tuple[int | bytes, ...], Entry]] | None = None):
        self.names = names
        self.send = send
        self.present = present if present is not None else {name: {} for name in HELD_TABLES}

    def write(self, entry: Entry) -> None:
        if entry.table not in HELD_TABLES:
            self.send([_update(p4runtime_pb2.Update.MODIFY, register_entry=message)
                       for message in register_entries(entry, self.names)])
            return
        held = self.present[entry.table]
        if not entry.value:  # a retired slot: the P4 table has no entry where the BPF array holds zeros
            if entry.key_tuple() in held:
                self.delete(entry)
            return
        kind = p4runtime_pb2.Update.MODIFY if entry.key_tuple() in held else p4runtime_pb2.Update.INSERT
        self.send([_update(kind, **_entity(entry, self.names))])
        held[entry.key_tuple()] = entry

    def delete(self, entry: Entry) -> None:
        self.send([_update(p4runtime_pb2.Update.DELETE, **_entity(Entry(entry.table, entry.key), self.names))])
        self.present[entry.table].pop(entry.key_tuple(), None)

    def installed(self, table: str) -> list[Entry]:
        return list(self.present[table].values())


def _update(kind: int, **entity: object) -> p4runtime_pb2.Update:
    return p4runtime_pb2.Update(type=kind, entity=p4runtime_pb2.Entity(**entity))


class P4RuntimeClient:
    """A P4Runtime controller session with one device: primary by election ID, then writes and reads."""

    def __init__(self, address: str, *, device_id: int = 1, election_id: int = 1, timeout: float = 10.0):
        self.device_id = device_id
        self.election_id = p4runtime_pb2.Uint128(high=election_id >> 64, low=election_id & (1 << 64) - 1)
        self.timeout = timeout
        self.channel = grpc.insecure_channel(address)
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise P4RuntimeError(f"P4Runtime at {address}: UNAVAILABLE after {timeout:g} s; check the address and "
                                 "that the switch's P4Runtime server runs") from None
        self.stub = p4runtime_pb2_grpc.P4RuntimeStub(self.channel)
        self._outbox: queue.Queue[p4runtime_pb2.StreamMessageRequest | None] = queue.Queue()
        self._stream = self.stub.StreamChannel(iter(self._outbox.get, None))
        arbitration = p4runtime_pb2.StreamMessageRequest()
        arbitration.arbitration.device_id = device_id
        arbitration.arbitration.election_id.CopyFrom(self.election_id)
        self._outbox.put(arbitration)
        try:
            reply = next(self._stream)
        except grpc.RpcError as error:
            self.close()
            raise P4RuntimeError(f"P4Runtime at {address}: {error.code().name} {error.details()}; check the "
                                 "address and that the switch's P4Runtime server runs") from None
        if reply.arbitration.status.code != code_pb2.OK:
            self.close()
            raise P4RuntimeError(f"P4Runtime at {address}: not primary for device {device_id} "
                                 f"({reply.arbitration.status.message}); use a higher --election-id")

    def close(self) -> None:
        self._outbox.put(None)
        self.channel.close()

    def __enter__(self) -> P4RuntimeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_pipeline(self, info: p4info_pb2.P4Info, device_config: bytes) -> None:
        request = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, election_id=self.election_id,
            action=p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT)
        request.config.p4info.CopyFrom(info)
        request.config.p4_device_config = device_config
        self._call(self.stub.SetForwardingPipelineConfig, request)

    def write(self, updates: list[p4runtime_pb2.Update]) -> None:
        if updates:
            self._call(self.stub.Write, p4runtime_pb2.WriteRequest(device_id=self.device_id,
                                                                   election_id=self.election_id, updates=updates))

    def read_table(self, table_id: int) -> list[p4runtime_pb2.TableEntry]:
        request = p4runtime_pb2.ReadRequest(device_id=self.device_id)
        request.entities.add().table_entry.table_id = table_id
        return [entity.table_entry for entity in self._read(request)]

    def read_multicast_groups(self) -> list[p4runtime_pb2.MulticastGroupEntry]:
        """Every multicast group (group ID 0 reads them all)."""
        request = p4runtime_pb2.ReadRequest(device_id=self.device_id)
        request.entities.add().packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0
        return [entity.packet_replication_engine_entry.multicast_group_entry for entity in self._read(request)]

    def _read(self, request: p4runtime_pb2.ReadRequest) -> list[p4runtime_pb2.Entity]:
        try:
            return [entity for reply in self.stub.Read(request, timeout=self.timeout) for entity in reply.entities]
        except grpc.RpcError as error:
            raise P4RuntimeError(f"P4Runtime Read: {error.code().name} {error.details()}") from None

    def _call(self, method: Callable[..., object], request: object) -> None:
        try:
            method(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise P4RuntimeError(f"P4Runtime {type(request).__name__}: {error.code().name} "
                                 f"{error.details()}") from None


ARCHITECTURES = ("v1model", "tna")


def unsupported(tables: Tables, planned: Plan, architecture: str) -> list[str]:
    """What in `tables` the P4 program of `architecture` cannot translate (docs/p4.md); empty when it can."""
    problems = []
    users: dict[str, list[str]] = {qp.name: [] for qp in tables.qps}
    for structure in tables.structures:
        users[structure.qp.name].append(structure.name)
    for lists in tables.append_lists:
        users[lists.qp.name].append(f"append lists from {lists.first_list}")
    if tables.profile is not Profile.DTA_V1:
        problems.append(f"profile {tables.profile.value!r}: the P4 programs parse the 3-byte dta-v1 base header")
    if tables.fleet is not None and tables.fleet.across:
        problems.append("[fleet] across = true: the P4 translators send copies to one collector; use the XDP or "
                        "python engine for copies across collectors")
    for structure in tables.structures:
        sharing = [other for other in users[structure.qp.name] if other != structure.name]
        problems += registry.by_opcode(structure.primitive).p4_problems(structure, architecture, sharing)
    problems += [f"append lists from {lists.first_list}: dta-v1 Append data is 4 bytes"
                 for lists in tables.append_lists if lists.data_len != 4]
    for primitive in registry.registered():
        problems += primitive.p4_state_problems(planned.slots.state_of(primitive.opcode), architecture)
    if architecture == "tna":
        problems += tna_build_problems(tables, planned)
    return problems


def tna_build_problems(tables: Tables, planned: Plan) -> list[str]:
    """What the default TNA build (the spec's TNA_* limits, sized for one Tofino-1 pipe) cannot hold."""
    problems = [f"append lists from {lists.first_list}: batch {lists.batch} is more than the tna build's "
                f"TNA_MAX_APPEND_BATCH ({TNA_MAX_APPEND_BATCH})"
                for lists in tables.append_lists if lists.batch > TNA_MAX_APPEND_BATCH]
    if len(planned.slots.append) > TNA_APPEND_STATE_ENTRIES or \
            any(index >= TNA_APPEND_STATE_ENTRIES for index in planned.slots.append.values()):
        problems.append(f"{len(planned.slots.append)} Append lists: the tna build holds TNA_APPEND_STATE_ENTRIES "
                        f"({TNA_APPEND_STATE_ENTRIES})")
    return problems


def with_fleet_holders(tables: Tables, planned: Plan) -> Plan:
    """The plan as a switch takes it: each slot of the fleet's slot map also says which of its replicas hold a
    structure of each primitive (`has_structure`, bit FLEET_HOLDER_BITS x opcode + replica), since a switch
    looks one structure up per report: the first replica holding one, as `Translator.replica_structures` finds."""
    if tables.fleet is None:
        return planned
    held: dict[bytes, int] = {}
    for structure in tables.structures:
        if FLEET_HOLDER_BITS * (structure.primitive + 1) <= 32:  # others have no P4 program (p4_problems)
            ip = structure.qp.collector_ip
            held[ip] = held.get(ip, 0) | 1 << FLEET_HOLDER_BITS * structure.primitive
    slots = tables.fleet.slots
    entries = [Entry(entry.table, entry.key, {**entry.value, "has_structure": sum(
                   held.get(ip, 0) << replica for replica, ip in enumerate(slots[_number(entry.key, "slot")]))})
               if entry.table == "fleet_slot" else entry for entry in planned.entries]
    return dataclasses.replace(planned, entries=entries)


def require_supported(tables: Tables, planned: Plan, architecture: str) -> None:
    problems = unsupported(tables, planned, architecture)
    if problems:
        raise TableError(f"the {architecture} P4 translator cannot take these tables: {'; '.join(problems)} "
                         "(docs/p4.md; the XDP translator takes them)")


class P4Translator:
    """A P4 translator on a switch, driven like `XdpTranslator`: `apply(tables)` re-applies live, keeping
    slots (and so register state) for entries that stay. What the switch holds is read back first, so a
    restarted control plane finds its slots again."""

    def __init__(self, client: P4RuntimeClient, *, architecture: str = "v1model",
                 info: p4info_pb2.P4Info | None = None, egress: Callable[[QueuePair], int] = lambda qp: 0,
                 flush_idle_ns: int = DEFAULT_FLUSH_IDLE_NS,
                 write_registers: Callable[[list[p4runtime_pb2.RegisterEntry]], None] | None = None):
        """`write_registers` takes the register writes where the switch's P4Runtime does not (bmv2)."""
        if architecture not in ARCHITECTURES:
            raise ValueError(f"architecture {architecture!r} must be one of {ARCHITECTURES}")
        self.client = client
        self.architecture = architecture
        self.names = P4Names(info or load_p4info())
        self.egress = egress
        self.flush_idle_ns = flush_idle_ns
        present: dict[str, dict[tuple[int | bytes, ...], Entry]] = {name: {} for name in HELD_TABLES}
        held = [decode_table_entry(message, self.names) for name in P4_TABLE_NAMES
                for message in client.read_table(self.names.tables[name].preamble.id)]
        held += [decode_multicast_group(group) for group in client.read_multicast_groups()]
        for entry in held:
            present[entry.table][entry.key_tuple()] = entry
        self.send = client.write if write_registers is None else RegisterRouter(client.write, write_registers)
        self.target = P4RuntimeTarget(self.names, self.send, present)
        self.slots = slots_of(present)

    def apply(self, tables: Tables) -> None:
        installed = {_number(entry.key, "qp_index"): LiveQp(_number(entry.value, "remote_qpn"),
                                                            _number(entry.value, "start_psn"))
                     for key, entry in self.target.present["qp"].items()}
        planned = plan(tables, self.slots, flush_idle_ns=self.flush_idle_ns, egress=self.egress,
                       installed_qps=installed)
        require_supported(tables, planned, self.architecture)
        apply_plan(self.target, with_fleet_holders(tables, planned))
        if isinstance(self.send, RegisterRouter):
            self.send.flush()
        self.slots = planned.slots


def slots_of(present: dict[str, dict[tuple[int | bytes, ...], Entry]]) -> Slots:
    """The slot allocation that entries held by a switch imply (as `XdpTranslator` rebuilds it from maps)."""
    slots = Slots()
    for key, entry in present["qp"].items():
        slots.qp[_number(entry.value, "local_qpn")] = _number(entry.key, "qp_index")
    for key, entry in present["append_list"].items():
        slots.append[_number(entry.key, "list_id")] = _number(entry.value, "state_index")
    for entry in present["structure"].values():
        ip = entry.key["collector_ip"]
        if not isinstance(ip, bytes):
            raise TypeError(f"collector_ip holds {ip!r}, not an address")
        numbers = {name: value for name, value in entry.value.items() if isinstance(value, int)}
        slots.remember_structure(ip, _number(entry.key, "primitive"), numbers)
    return slots


def planned_updates(tables: Tables, *, egress: Callable[[QueuePair], int] = lambda qp: 0,
                    flush_idle_ns: int = DEFAULT_FLUSH_IDLE_NS,
                    info: p4info_pb2.P4Info | None = None) -> list[p4runtime_pb2.Update]:
    """Every update a first push of `tables` to an empty switch sends, in order (pure)."""
    updates: list[p4runtime_pb2.Update] = []
    target = P4RuntimeTarget(P4Names(info or load_p4info()), updates.extend)
    apply_plan(target, with_fleet_holders(tables, plan(tables, Slots(), flush_idle_ns=flush_idle_ns, egress=egress)))
    return updates


def egress_ports(pairs: Iterable[str]) -> Callable[[QueuePair], int]:
    """QP_OR_INTERFACE=PORT pairs as the `egress` of a plan: the device port towards a QP's collector (0, the
    ingress port, for the others). TableError on a malformed pair."""
    ports = {}
    for pair in pairs:
        name, _, port = pair.partition("=")
        if not name or not port.isdigit():
            raise TableError(f"--port {pair!r}: give QP_OR_INTERFACE=PORT, for example kw-qp=4")
        ports[name] = int(port)
    return lambda qp: ports.get(qp.name, ports.get(qp.interface, 0))
