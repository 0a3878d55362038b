"""The XDP translator at a fleet address against the reference translator, frame for frame (BPF_PROG_TEST_RUN):
the program's partition hash, slot lookup and replica choice agree with softdta.core.translator on random keys,
and a live re-apply of a new epoch moves exactly the keys whose slot changed owner."""

import random
import threading
import time

import pytest

from softdta.core.fleet import Member, SlotMap, assign
from softdta.core.settings import TableError
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.core.workload import ReporterAddress
from softdta.engines.xdp import XdpTranslator
from softdta.spec import DtaOpcode, TranslatorCounter
from softdta.wire import dta
from softdta.wire.frames import ip_bytes, mac_bytes, parse_udp_frame
from softdta.wire.hashing import partition_slot
from tests.kernel.test_xdp_translator import assert_same, assert_same_state

pytestmark = pytest.mark.privileged

COLLECTORS = {f"c{n}": (f"10.78.{n}.1", f"02:5d:7b:00:0{n}:01") for n in range(1, 5)}
FLEET_ADDRESS = "10.78.0.100"
SLOT_BITS = 12
FIRST_LIST, LISTS = 100, 40
GRACE_MS = 60_000.0


def members(names: list[str]) -> dict[str, Member]:
    return {name: Member(name, COLLECTORS[name][0], COLLECTORS[name][1], f"{COLLECTORS[name][0]}:7000",
                         f"http://{COLLECTORS[name][0]}:8080") for name in names}


def fleet_document(rng: random.Random, slot_map: SlotMap, *, across: bool = False, key_len: int = 4,
                   data_len: int = 4, without_postcarding: str = "") -> dict:
    """Every collector of the slot map with the same structures (Postcarding but at `without_postcarding`) and
    the same Append lists, and the fleet section for `slot_map`."""
    qpn = iter(range(0x100, 0x800))

    def qp(transport: str, length: int) -> dict:
        number = next(qpn)
        return {"remote_qpn": number, "local_qpn": number + 0x1000, "rkey": rng.getrandbits(32),
                "base": rng.getrandbits(40) << 8, "length": length, "transport": transport,
                "start_psn": rng.randrange(1 << 24)}

    names = sorted(slot_map.members)
    structures, appends = [], []
    for name in names:
        structures += [
            {"primitive": "key-write", "collector": name, "key_len": key_len, "data_len": data_len,
             "hash": "independent", "redundancy": 4, "qp": qp("rc", 4096)},
            {"primitive": "key-increment", "collector": name, "key_len": key_len, "hash": "dta-v1", "redundancy": 4,
             "qp": qp("rc", 512)},
            {"primitive": "sketch-merge", "collector": name, "columns": 8, "rows": 2, "reporters": 2, "batch": 2,
             "merge": "sum", "qp": qp("uc", 8 * 2 * 4)}]
        if name != without_postcarding:
            structures.append({"primitive": "postcarding", "collector": name, "key_len": key_len, "hops": 5,
                               "cache_entries": 16, "qp": qp("uc", 2048)})
        appends.append({"collector": name, "first_list": FIRST_LIST, "lists": LISTS, "entries": 8, "batch": 2,
                        "data_len": 4, "qp": qp("uc", LISTS * 8 * 4)})
    return {
        "translator": {"profile": "dta-v1", "mac": "02:5d:7b:00:00:01", "ip": "10.78.0.1", "udp_sport": 50000,
                       "grace_ms": GRACE_MS, "ack_request_interval": 3},
        "collectors": [{"name": name, "ip": COLLECTORS[name][0], "mac": COLLECTORS[name][1]} for name in names],
        "structures": structures, "append": appends,
        "fleet": {"address": FLEET_ADDRESS, "epoch": slot_map.epoch, "slot_bits": slot_map.slot_bits,
                  "across": across, "slots": [list(owners) for owners in slot_map.slots]},
    }


class FleetReporter:
    """Reports with fresh random keys, nine in ten to the fleet address, the rest to a collector's own IP."""

    def __init__(self, rng: random.Random, tables: Tables, key_len: int, data_len: int):
        self.rng, self.tables, self.key_len, self.data_len = rng, tables, key_len, data_len
        self.sketch_column = [0, 0]
        self.targets = [ip_bytes(FLEET_ADDRESS)] * 9 + sorted(tables.collector_ips)

    def frame(self, kind: DtaOpcode | None = None, to: bytes | None = None) -> bytes:
        rng = self.rng
        to = to or rng.choice(self.targets)
        address = ReporterAddress(mac_bytes("02:5d:7b:00:09:01"), ip_bytes("10.78.9.1"), self.tables.mac, to)
        return address.frame(self.report(kind or rng.choice(list(DtaOpcode))))

    def report(self, kind: DtaOpcode) -> dta.Report:
        rng = self.rng
        extended = self.key_len != 4 or self.data_len != 4 or rng.random() < 0.3
        key = rng.randbytes(self.key_len)
        if kind is DtaOpcode.KEY_WRITE:
            return dta.key_write(key, rng.randbytes(self.data_len), rng.randint(1, 4),
                                 immediate=rng.random() < 0.3, extended=extended)
        if kind is DtaOpcode.KEY_INCREMENT:
            return dta.key_increment(key, rng.getrandbits(32), rng.randint(1, 4), extended=extended)
        if kind is DtaOpcode.POSTCARDING:
            return dta.postcard(key, rng.randint(1, 5), rng.randbytes(4), extended=extended)
        if kind is DtaOpcode.APPEND:
            return dta.append(FIRST_LIST + rng.randrange(LISTS + 2), rng.randbytes(4))
        reporter = rng.randrange(2)
        column = self.sketch_column[reporter]
        self.sketch_column[reporter] = (column + 1) % 8
        return dta.sketch_column(reporter, column, [rng.getrandbits(32), rng.getrandbits(32)])


def run_fleet(seed: int, reports: int, *, across: bool = False, without_postcarding: str = "",
              unmapped_slots: int = 0, grace: str = "") -> tuple[Translator, XdpTranslator]:
    """Both translators over the same random reports to a three-collector fleet of 4096 slots (core.fleet.assign,
    two replicas). `unmapped_slots` slots are left to `without_postcarding` alone; `grace` puts that collector's
    Key-Write QP into its grace period, so copies across replicas skip it."""
    rng = random.Random(seed)
    key_len, data_len = rng.choice([(4, 4), (rng.randint(1, 32), rng.randint(1, 32))])
    slot_map = assign(members(["c1", "c2", "c3"]), replicas=2, slot_bits=SLOT_BITS)
    document = fleet_document(rng, slot_map, across=across, key_len=key_len, data_len=data_len,
                              without_postcarding=without_postcarding)
    for slot in rng.sample(range(1 << SLOT_BITS), unmapped_slots):
        document["fleet"]["slots"][slot] = [without_postcarding]
    reference = Translator(Tables.from_dict(document))
    kernel = XdpTranslator(Tables.from_dict(document), flush_idle_ns=0)
    if grace:
        qp = reference.tables.structure(ip_bytes(COLLECTORS[grace][0]), DtaOpcode.KEY_WRITE).qp
        now = time.monotonic_ns()
        reference.resync(qp, 77, now)
        kernel.resync(qp, 77, now)
    reporter = FleetReporter(rng, reference.tables, key_len, data_len)
    for index in range(reports):
        frame = reporter.frame()
        assert_same(reference.process(frame, time.monotonic_ns()), kernel.process(frame),
                    f"seed {seed} report {index}: {parse_udp_frame(frame).payload.hex()}")
    return reference, kernel


@pytest.mark.parametrize("seed", range(6))
def test_reports_to_the_fleet_address_match_the_reference_frame_for_frame(seed):
    reference, kernel = run_fleet(seed, 1500)
    with kernel:
        assert_same_state(reference, kernel)
        assert kernel.flush() == reference.flush_idle(time.monotonic_ns(), 0)
        assert_same_state(reference, kernel)
    assert reference.counters[TranslatorCounter.FLEET_RESOLVED] > 700
    sent = {qp.collector_ip for qp in reference.tables.qps if reference.qp_state[qp.index].frames_sent}
    assert sent == reference.tables.collector_ips


def test_a_slot_without_the_structure_drops_as_unmapped():
    """Slots left to c3, which has no Postcarding structure: their Postcarding reports are unmapped, their
    other reports still go to c3."""
    reference, kernel = run_fleet(21, 1500, without_postcarding="c3", unmapped_slots=1024)
    with kernel:
        assert_same_state(reference, kernel)
    assert reference.counters[TranslatorCounter.DROP_FLEET_UNMAPPED] > 10


@pytest.mark.parametrize("seed", range(3))
def test_copies_across_replicas_match_the_reference(seed):
    """Copy n of a Key-Write or Key-Increment to replica n mod 2 through that replica's QP, parked for the tc
    stage with its own PSN and collector address; copies to a QP in its grace period are skipped and counted."""
    reference, kernel = run_fleet(100 + seed, 1500, across=True, grace="c2")
    with kernel:
        assert_same_state(reference, kernel)
    assert reference.counters[TranslatorCounter.DROP_GRACE] > 10


def test_copies_across_replicas_need_structures_that_send_alike():
    """A Key-Write structure of redundancy 1 at one replica would send its QP's frames both through XDP and
    through the tc stage (copies of the others' reports), out of PSN order: refused."""
    rng = random.Random(5)
    document = fleet_document(rng, assign(members(["c1", "c2", "c3"]), replicas=2, slot_bits=SLOT_BITS),
                              across=True)
    document["structures"][0]["redundancy"] = 1
    with pytest.raises(TableError, match="redundancy"):
        XdpTranslator(Tables.from_dict(document))


def destination(out) -> bytes | None:
    return parse_udp_frame(out.frames[0]).dst_ip if out.frames else None


def test_a_live_epoch_change_moves_exactly_the_remapped_keys():
    """c4 joins: the new epoch, applied live, sends the keys of the slots it took to c4 and every other key where
    it went before; reports to unchanged slots keep going through while the new map is written."""
    rng = random.Random(31)
    old_map = assign(members(["c1", "c2", "c3"]), replicas=2, slot_bits=SLOT_BITS)
    new_map = assign(members(["c1", "c2", "c3", "c4"]), replicas=2, slot_bits=SLOT_BITS, previous=old_map)
    old_tables = Tables.from_dict(fleet_document(random.Random(1), old_map))
    new_document = fleet_document(random.Random(1), new_map)
    keys = [rng.randbytes(4) for _ in range(3000)]
    fleet = ip_bytes(FLEET_ADDRESS)
    reporter = ReporterAddress(mac_bytes("02:5d:7b:00:09:01"), ip_bytes("10.78.9.1"), old_tables.mac, fleet)

    def frame(key: bytes) -> bytes:
        return reporter.frame(dta.key_write(key, b"\1\2\3\4", 1))

    def owner(slot_map: SlotMap, key: bytes) -> bytes:
        return ip_bytes(slot_map.members[slot_map.owners(key)[0]])

    with XdpTranslator(old_tables, flush_idle_ns=0) as kernel:
        before = {key: destination(kernel.process(frame(key))) for key in keys}
        assert before == {key: owner(old_map, key) for key in keys}
        unchanged = [key for key in keys if old_map.owners(key)[0] == new_map.owners(key)[0]]
        during, done = [], threading.Event()

        def keep_sending() -> None:
            while not done.is_set():
                for key in unchanged[:64]:
                    during.append((key, destination(kernel.process(frame(key)))))

        sender = threading.Thread(target=keep_sending)
        sender.start()
        try:
            kernel.apply(Tables.from_dict(new_document))
        finally:
            done.set()
            sender.join()
        after = {key: destination(kernel.process(frame(key))) for key in keys}
        assert kernel.read("fleet_config", index=0)["epoch"] == new_map.epoch == old_map.epoch + 1
    assert during and all(got == before[key] for key, got in during)
    assert after == {key: owner(new_map, key) for key in keys}
    moved = {key for key in keys if after[key] != before[key]}
    assert moved == {key for key in keys if old_map.owners(key)[0] != new_map.owners(key)[0]}
    assert {after[key] for key in moved} == {ip_bytes(COLLECTORS["c4"][0])}
    assert 0.15 < len(moved) / len(keys) < 0.35
    slots_moved = {partition_slot(key, SLOT_BITS) for key in moved}
    assert all(new_map.slots[slot][0] == "c4" for slot in slots_moved)
