"""One control plane, two targets: the P4Runtime entries equal the XDP map entries, and a real gRPC round trip
to an in-process P4Runtime server carries them in the order the control plane writes them."""

import copy
import dataclasses
import threading
from concurrent import futures

import pytest

from softdta.targets import p4info  # noqa: F401  (selects the protobuf runtime before grpc and the p4 protos load)

# isort: split
import grpc
from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from softdta.core.control_plane import CONFIG_TABLES, P4_ONLY_TABLES, Slots, plan
from softdta.core.tables import Tables, with_queue_qps
from softdta.engines.xdp import map_entry, map_logical
from softdta.kernel.maps import map_layout
from softdta.spec import MAX_WRITE_PAYLOAD, DtaOpcode, QpState, RoceOpcode
from softdta.targets.p4names import FLEET_HOLDER_BITS, P4_EXTRA_VALUES, P4_WITHOUT
from softdta.targets.p4runtime import (
    P4Names,
    P4RuntimeClient,
    P4RuntimeError,
    P4Translator,
    decode_multicast_group,
    decode_table_entry,
    encode_value,
    load_p4info,
    planned_updates,
    table_entry,
)
from tests.common import EXAMPLE_TABLES, fleet_document, fleet_tables

NAMES = P4Names(load_p4info())


def egress(qp) -> int:
    return 7 if qp.local_qpn % 2 else 0


def without_padding(values: dict) -> dict:
    return {name: value for name, value in values.items() if name != "pad"}


def as_map_reads_it(entry) -> tuple[dict, dict]:
    """An entry packed into its BPF map layout and read back as control-plane values."""
    key, value = map_entry(entry)
    layout = map_layout(entry.table)
    return (map_logical(entry.table, layout.key.unpack(key)),
            without_padding(map_logical(entry.table, layout.value.unpack(value))))


def test_p4_entries_equal_map_entries_for_the_example_tables():
    """The example's collector three times over in a fleet: the P4 entries of every table are the map entries, but
    for the P4 slot map's has_structure."""
    planned = plan(with_queue_qps(fleet_tables(slot_bits=4)[0], 2), Slots(), flush_idle_ns=1_000_000, egress=egress)
    assert {entry.table for entry in planned.entries} == set(CONFIG_TABLES + P4_ONLY_TABLES)
    for entry in planned.entries:
        if entry.table in P4_ONLY_TABLES or entry.table in P4_WITHOUT:
            continue
        p4 = decode_table_entry(table_entry(entry, NAMES), NAMES)
        value = {name: v for name, v in p4.value.items() if name not in {f.name for f in P4_EXTRA_VALUES.get(
            entry.table, ())}}
        assert (dict(p4.key), value) == as_map_reads_it(entry), entry.table


def test_the_p4_slot_map_says_which_replicas_hold_each_primitive():
    """A switch looks one structure up per report: each slot's has_structure marks, per primitive, the replicas
    that hold one, so that the first of them is the reference translator's choice."""
    document, _ = fleet_document(slot_bits=4)
    document["structures"] = [s for s in document["structures"]
                              if (s["primitive"], s["collector"]) not in {("key-write", "c1"), ("postcarding", "c2")}]
    tables = Tables.from_dict(document)
    written = [decode_table_entry(u.entity.table_entry, NAMES) for u in planned_updates(tables)
               if u.entity.table_entry.table_id == NAMES.tables["fleet_slot"].preamble.id]
    assert len(written) == 16
    for entry in written:
        replicas = tables.fleet.slots[entry.key["slot"]]
        for primitive in (DtaOpcode.KEY_WRITE, DtaOpcode.KEY_INCREMENT, DtaOpcode.POSTCARDING, DtaOpcode.SKETCH_MERGE):
            holders = entry.value["has_structure"] >> FLEET_HOLDER_BITS * primitive & (1 << FLEET_HOLDER_BITS) - 1
            assert holders == sum(1 << n for n, ip in enumerate(replicas) if tables.structure(ip, primitive)), \
                (entry.key, primitive)
        assert entry.value["collector_ip"] == b"".join(replicas).ljust(16, b"\0")


def test_canonical_bitstrings():
    assert encode_value(0, 32) == b"\x00"
    assert encode_value(0x1234, 32) == b"\x12\x34"
    assert encode_value(bytes([10, 77, 1, 1]), 32) == bytes([10, 77, 1, 1])
    assert encode_value(bytes([0, 0, 0, 1]), 32) == b"\x01"
    with pytest.raises(ValueError):
        encode_value(1 << 32, 32)


def test_first_push_writes_state_then_entries_with_p4info_ids():
    tables = fleet_tables(slot_bits=4)[0]  # a fleet: every table has entries
    updates = planned_updates(tables)
    kinds = [u.entity.WhichOneof("entity") for u in updates]
    first_table = kinds.index("table_entry")
    assert set(kinds[:first_table]) == {"register_entry"}
    assert set(kinds[first_table:]) == {"table_entry", "packet_replication_engine_entry"}
    assert all(u.type == p4runtime_pb2.Update.INSERT for u in updates[first_table:])
    table_ids = {t.preamble.id for t in NAMES.info.tables}
    assert {u.entity.table_entry.table_id for u in updates[first_table:] if u.entity.HasField("table_entry")} \
        == table_ids
    groups = [u.entity.packet_replication_engine_entry.multicast_group_entry for u in updates
              if u.entity.HasField("packet_replication_engine_entry")]
    assert sorted((g.multicast_group_id, [(r.egress_port, r.instance) for r in g.replicas]) for g in groups) == \
        [(copies, [(0, rid) for rid in range(copies)]) for copies in range(1, 5)]
    next_psn = NAMES.registers["qp_state_next_psn"].preamble.id
    psns = {u.entity.register_entry.index.index: u.entity.register_entry.data.bitstring for u in updates
            if u.entity.register_entry.register_id == next_psn}
    assert len(psns) == len(tables.qps)


class RecordingP4Runtime(p4runtime_pb2_grpc.P4RuntimeServicer):
    """A P4Runtime server that holds table entries as a switch would and records every request."""

    def __init__(self, primary_election_id: int = 1):
        self.primary = primary_election_id
        self.writes: list[p4runtime_pb2.WriteRequest] = []
        self.pipelines: list[p4runtime_pb2.SetForwardingPipelineConfigRequest] = []
        self.entries: dict[bytes, p4runtime_pb2.TableEntry] = {}
        self.lock = threading.Lock()

    def StreamChannel(self, request_iterator, context):
        for request in request_iterator:
            reply = p4runtime_pb2.StreamMessageResponse()
            reply.arbitration.CopyFrom(request.arbitration)
            ok = request.arbitration.election_id.low >= self.primary
            reply.arbitration.status.code = code_pb2.OK if ok else code_pb2.ALREADY_EXISTS
            yield reply

    def SetForwardingPipelineConfig(self, request, context):
        self.pipelines.append(request)
        return p4runtime_pb2.SetForwardingPipelineConfigResponse()

    def Write(self, request, context):
        with self.lock:
            self.writes.append(copy.deepcopy(request))
            for update in request.updates:
                kind = update.entity.WhichOneof("entity")
                if kind == "table_entry":
                    entry = update.entity.table_entry
                    match = p4runtime_pb2.TableEntry(table_id=entry.table_id, match=entry.match).SerializeToString()
                elif kind == "packet_replication_engine_entry":
                    entry = update.entity.packet_replication_engine_entry
                    match = b"group %d" % entry.multicast_group_entry.multicast_group_id
                else:
                    continue
                exists = match in self.entries
                if (update.type == p4runtime_pb2.Update.INSERT) == exists:
                    context.abort(grpc.StatusCode.ALREADY_EXISTS if exists else grpc.StatusCode.NOT_FOUND,
                                  "entry exists" if exists else "no such entry")
                if update.type == p4runtime_pb2.Update.DELETE:
                    del self.entries[match]
                else:
                    self.entries[match] = copy.deepcopy(entry)
        return p4runtime_pb2.WriteResponse()

    def Read(self, request, context):
        wanted = {entity.table_entry.table_id for entity in request.entities if entity.HasField("table_entry")}
        groups = any(entity.HasField("packet_replication_engine_entry") for entity in request.entities)
        reply = p4runtime_pb2.ReadResponse()
        with self.lock:
            for entry in self.entries.values():
                if isinstance(entry, p4runtime_pb2.TableEntry) and entry.table_id in wanted:
                    reply.entities.add().table_entry.CopyFrom(entry)
                elif isinstance(entry, p4runtime_pb2.PacketReplicationEngineEntry) and groups:
                    reply.entities.add().packet_replication_engine_entry.CopyFrom(entry)
        yield reply

    def held(self) -> list:
        return [decode_table_entry(entry, NAMES) if isinstance(entry, p4runtime_pb2.TableEntry)
                else decode_multicast_group(entry.multicast_group_entry) for entry in self.entries.values()]


@pytest.fixture
def switch():
    servicer = RecordingP4Runtime()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


def all_zero(values: dict) -> bool:
    return not any(value if isinstance(value, int) else any(value) for value in values.values())


def held_of(entries: list) -> list:
    """What a switch holds of planned entries: a P4 table has no entry where a BPF array holds zeros (no fleet)."""
    return [entry for entry in entries if entry.value]


def test_push_over_grpc_installs_the_planned_entries(switch):
    servicer, address = switch
    tables = Tables.from_toml(EXAMPLE_TABLES)
    with P4RuntimeClient(address, device_id=3, election_id=5) as client:
        client.set_pipeline(NAMES.info, b"compiled program")
        P4Translator(client, egress=egress).apply(tables)
    assert servicer.pipelines[0].config.p4info == NAMES.info
    assert servicer.pipelines[0].config.p4_device_config == b"compiled program"
    assert all(w.device_id == 3 and w.election_id.low == 5 for w in servicer.writes)
    expected = held_of(plan(tables, Slots(), flush_idle_ns=1_000_000, egress=egress).entries)
    assert sorted((e.table, e.key_tuple(), sorted(e.value.items())) for e in servicer.held()) == \
        sorted((e.table, e.key_tuple(), sorted(e.value.items())) for e in expected)


def test_tna_push_writes_the_xdp_plans_entries_for_every_primitive(switch):
    """The TNA program takes all five primitives: a push to it writes exactly the updates of the shared plan,
    whose configuration entries are the XDP map entries."""
    servicer, address = switch
    tables = Tables.from_toml(EXAMPLE_TABLES)
    assert {s.primitive for s in tables.structures} | {DtaOpcode.APPEND} == set(DtaOpcode)
    with P4RuntimeClient(address) as client:
        P4Translator(client, architecture="tna", egress=egress).apply(tables)
    assert [u for w in servicer.writes for u in w.updates] == planned_updates(tables, egress=egress)
    expected = held_of(plan(tables, Slots(), flush_idle_ns=1_000_000, egress=egress).entries)
    for entry in servicer.held():
        if entry.table in CONFIG_TABLES:
            assert (dict(entry.key), dict(entry.value)) == as_map_reads_it(entry), entry.table
    assert sorted((e.table, e.key_tuple(), sorted(e.value.items())) for e in servicer.held()) == \
        sorted((e.table, e.key_tuple(), sorted(e.value.items())) for e in expected)


def test_tna_refuses_a_two_pass_sketch_on_a_shared_qp():
    """A Sketch-Merge write longer than one TNA egress pass chains takes its PSN before a second pass; only a
    QP of its own keeps its frames in PSN order."""
    from softdta.targets.p4runtime import unsupported
    from softdta.wire.icrc_split import tna_needs_two_passes

    tables = Tables.from_toml(EXAMPLE_TABLES)
    sketch = next(s for s in tables.structures if s.primitive is DtaOpcode.SKETCH_MERGE)
    key_write = next(s for s in tables.structures if s.primitive is DtaOpcode.KEY_WRITE)
    planned = plan(tables, Slots(), flush_idle_ns=1_000_000, egress=egress)
    assert not tna_needs_two_passes(sketch.batch * sketch.slot_size)
    assert not tna_needs_two_passes(39 * 4) and tna_needs_two_passes(40 * 4)  # 4 chunks and a lead of 7 words
    sketch.batch = 1 << (MAX_WRITE_PAYLOAD // sketch.slot_size).bit_length() - 1
    assert tna_needs_two_passes(sketch.batch * sketch.slot_size)
    assert unsupported(tables, planned, "tna") == []  # on its own QP
    key_write.qp = sketch.qp
    problems = unsupported(tables, planned, "tna")
    assert len(problems) == 1 and f"qp {sketch.qp.name!r} must carry nothing else ({key_write.name})" in problems[0]
    assert unsupported(tables, planned, "v1model") == []


def test_the_tna_build_refuses_tables_beyond_its_limits_naming_each():
    """The default TNA build is sized for one Tofino-1 pipe (spec TNA_*): more batch words, sketch rows, lists,
    cache entries or sketches than it holds are refused, each problem naming its limit; v1model takes them."""
    import tomllib

    from softdta.spec import (
        TNA_APPEND_STATE_ENTRIES,
        TNA_MAX_APPEND_BATCH,
        TNA_MAX_SKETCH_ROWS,
        TNA_POSTCARD_CACHE_ENTRIES,
    )
    from softdta.targets.p4runtime import unsupported

    tables = Tables.from_toml(EXAMPLE_TABLES)
    assert unsupported(tables, plan(tables, Slots(), flush_idle_ns=0, egress=egress), "tna") == []
    document = tomllib.loads(EXAMPLE_TABLES.read_text())
    document["append"][0].update(batch=2 * TNA_MAX_APPEND_BATCH, lists=TNA_APPEND_STATE_ENTRIES + 1,
                                 entries=4 * TNA_MAX_APPEND_BATCH)
    document["append"][0]["qp"]["length"] = (TNA_APPEND_STATE_ENTRIES + 1) * 4 * TNA_MAX_APPEND_BATCH * 4
    sketch = next(s for s in document["structures"] if s["primitive"] == "sketch-merge")
    sketch.update(rows=TNA_MAX_SKETCH_ROWS + 1, batch=4)  # 4 columns of 9 rows: one write of 144 B
    sketch["qp"]["length"] = sketch["columns"] * sketch["rows"] * 4
    postcarding = next(s for s in document["structures"] if s["primitive"] == "postcarding")
    postcarding["cache_entries"] = 2 * TNA_POSTCARD_CACHE_ENTRIES
    tables = Tables.from_dict(document)
    problems = unsupported(tables, plan(tables, Slots(), flush_idle_ns=0, egress=egress), "tna")
    for limit in ("TNA_MAX_APPEND_BATCH", "TNA_MAX_SKETCH_ROWS", "TNA_APPEND_STATE_ENTRIES",
                  "TNA_POSTCARD_CACHE_ENTRIES"):
        assert sum(limit in problem for problem in problems) == 1, (limit, problems)
    assert len(problems) == 4
    assert unsupported(tables, plan(tables, Slots(), flush_idle_ns=0, egress=egress), "v1model") == []


def test_live_reapply_keeps_slots_and_deletes_last(switch):
    servicer, address = switch
    tables = Tables.from_toml(EXAMPLE_TABLES)
    with P4RuntimeClient(address) as client:
        P4Translator(client).apply(tables)
        before = {(e.table, e.key_tuple()): e for e in servicer.held()}
        servicer.writes.clear()
        smaller = Tables.from_toml(EXAMPLE_TABLES)
        smaller.structures = [s for s in smaller.structures if s.primitive.name != "POSTCARDING"]
        smaller.qps = [qp for qp in smaller.qps if qp.name != "postcarding@c1"]
        smaller.validate()
        restarted = P4Translator(client)  # a new control plane finds its slots on the switch
        restarted.apply(smaller)
    after = {(e.table, e.key_tuple()): e for e in servicer.held()}
    removed = set(before) - set(after)
    assert {name for name, _ in removed} == {"qp", "qp_by_local_qpn", "structure", "icrc_constant"}
    for key, entry in after.items():
        assert before[key].value == entry.value, key  # every remaining entry kept its slot and value
    updates = [u for w in servicer.writes for u in w.updates]
    deletes = [i for i, u in enumerate(updates) if u.type == p4runtime_pb2.Update.DELETE]
    assert deletes == list(range(len(updates) - len(removed), len(updates)))  # after every write
    assert updates[-1].entity.table_entry.table_id == NAMES.tables["qp"].preamble.id  # once unreferenced
    assert not any(u.entity.WhichOneof("entity") == "register_entry" for u in updates)  # no state reset


def test_losing_arbitration_is_an_error(switch):
    servicer, address = switch
    servicer.primary = 10
    with pytest.raises(P4RuntimeError, match="not primary"):
        P4RuntimeClient(address, election_id=2)


def test_unreachable_switch_is_an_error():
    with pytest.raises(P4RuntimeError, match="UNAVAILABLE"):
        P4RuntimeClient("127.0.0.1:1", timeout=1)


@pytest.mark.privileged
def test_p4_switch_holds_what_the_xdp_maps_hold(switch):
    """The same tables file through both back ends: the maps of a loaded XDP translator and the entries a
    P4Runtime switch holds are the same entries."""
    from softdta.engines.xdp import XdpTranslator, route_egress
    servicer, address = switch
    tables = Tables.from_toml(EXAMPLE_TABLES)
    with XdpTranslator(tables) as xdp:
        in_maps = []
        for name in (name for name in CONFIG_TABLES if name not in P4_WITHOUT):
            layout = map_layout(name)
            for raw, value in xdp.maps[name].items():
                entry = without_padding(map_logical(name, layout.value.unpack(value)))
                if name == "qp" and not entry["remote_qpn"] or name.startswith("fleet_") and all_zero(entry):
                    continue  # an unused slot of the qp array; no fleet
                in_maps.append((name, map_logical(name, layout.key.unpack(raw)), entry))
        with P4RuntimeClient(address) as client:
            P4Translator(client, egress=route_egress, flush_idle_ns=xdp.flush_idle_ns).apply(tables)
        qp_state = {index: xdp.read("qp_state", qp_index=index) for index in xdp.slots.qp.values()}
    held = [(e.table, dict(e.key), dict(e.value)) for e in servicer.held() if e.table not in P4_ONLY_TABLES]
    assert sorted(map(repr, held)) == sorted(map(repr, in_maps))
    # The initial QP state the switch got in registers is the state the kernel holds.
    registers = {r.preamble.id: r.preamble.name for r in NAMES.info.registers}
    written = {}
    for update in (u for w in servicer.writes for u in w.updates if u.entity.HasField("register_entry")):
        entry = update.entity.register_entry
        written[(registers[entry.register_id], entry.index.index)] = int.from_bytes(entry.data.bitstring, "big")
    for index, state in qp_state.items():
        assert state["state"] == QpState.ACTIVE
        for field in ("next_psn", "state", "grace_until_ns", "frames_sent"):
            assert written[(f"qp_state_{field}", index)] == state[field], (index, field)


def test_icrc_constants_complete_every_frame_the_reference_translator_sends(reporter):
    """Each RoCE frame the oracle emits, for every primitive and with immediates, finds its per-QP constant,
    and the constant XOR the tail CRC is the frame's real iCRC."""
    from softdta.core import workload
    from softdta.core.translator import Translator
    from softdta.wire.icrc_split import combine
    from softdta.wire.roce import parse_roce

    tables = Tables.from_toml(EXAMPLE_TABLES)
    planned = plan(tables, Slots(), flush_idle_ns=1_000_000, egress=egress)
    constants = {entry.key_tuple(): entry.value["constant"] for entry in planned.entries
                 if entry.table == "icrc_constant"}
    qp_index = {qp.remote_qpn: planned.slots.qp[qp.local_qpn] for qp in tables.qps}
    reports = (workload.key_write(50, redundancy=3) + workload.key_increment(50) + workload.append(61)
               + workload.postcards(20) + workload.sketch_epoch(2, 64, 4))
    reports = [dataclasses.replace(report, immediate=number % 3 == 0) for number, report in enumerate(reports)]
    translator = Translator(tables)
    frames = [f for r in reports for f in translator.process(reporter.frame(r), now_ns=0).frames]
    frames += translator.flush_idle(now_ns=10**9)
    shapes = set()
    for frame in frames:
        roce = parse_roce(frame)
        packet = frame[14:-4]
        key = (qp_index[roce.bth["dest_qp"]], roce.opcode, len(packet) + 4)
        shapes.add(key)
        assert combine(constants[key], packet) == roce.icrc, key
    assert {index for index, _, _ in shapes} == set(qp_index.values())  # every primitive
    assert {RoceOpcode.UC_WRITE_ONLY, RoceOpcode.UC_WRITE_ONLY_IMM} <= {opcode for _, opcode, _ in shapes}
    assert len({length for index, _, length in shapes if index == qp_index[0x105]}) > 1  # partial Append batches


def test_entries_command_prints_the_first_push(capsys):
    from google.protobuf import text_format

    from softdta.cli.app import main

    assert main(["p4", "entries", "--tables", str(EXAMPLE_TABLES), "--port", "key-write@c1=4"]) == 0
    printed = [text_format.Parse(line, p4runtime_pb2.Update()) for line in capsys.readouterr().out.splitlines()]
    assert printed == planned_updates(Tables.from_toml(EXAMPLE_TABLES),
                                      egress=lambda qp: 4 if qp.name == "key-write@c1" else 0)
    groups = {u.entity.packet_replication_engine_entry.multicast_group_entry.multicast_group_id for u in printed
              if u.entity.HasField("packet_replication_engine_entry")}
    assert groups == {4 * 4 + copies for copies in range(1, 5)} | {copies for copies in range(1, 5)}


def test_push_command_reports_an_unreachable_switch(capsys):
    from softdta.cli.app import main

    assert main(["p4", "push", "--tables", str(EXAMPLE_TABLES), "--p4runtime", "127.0.0.1:1", "--timeout", "1"]) == 2
    assert capsys.readouterr().err.startswith("softdta: error: P4Runtime at 127.0.0.1:1: UNAVAILABLE")
    assert main(["p4", "entries", "--tables", str(EXAMPLE_TABLES), "--port", "kw"]) == 2
    assert "--port 'kw': give QP_OR_INTERFACE=PORT" in capsys.readouterr().err


def test_tables_a_p4_program_cannot_take_are_refused(switch):
    from softdta.core.tables import TableError
    from softdta.targets.p4runtime import unsupported

    tables = Tables.from_toml(EXAMPLE_TABLES)
    planned = plan(tables, Slots(), flush_idle_ns=1_000_000, egress=egress)
    assert unsupported(tables, planned, "v1model") == []
    assert unsupported(tables, planned, "tna") == []
    sketch = next(s for s in tables.structures if s.primitive.name == "SKETCH_MERGE")
    sketch.columns, sketch.batch, sketch.reporters = 48, 6, 33
    assert unsupported(tables, planned, "v1model") == [f"structure {sketch.name}: batch 6 must be a power of two",
                                                       f"structure {sketch.name}: at most 32 reporters"]
    servicer, address = switch
    with P4RuntimeClient(address) as client, pytest.raises(TableError, match="at most 32 reporters"):
        P4Translator(client).apply(tables)
    assert not servicer.writes  # nothing half-written
