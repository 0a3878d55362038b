"""The batch translator at a fleet address against the oracle: reports of every primitive to the fleet address
and to the collectors' own addresses, mixed, with copies across replicas or not, give the same frames in the same
order (and so PSN order per QP), NACKs, deferrals, counters and state; and the fleet's reports are vectorized."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softdta.core.batch import BatchTranslator
from softdta.core.tables import Tables, with_queue_qps
from softdta.core.translator import Translator
from softdta.spec import ACK_SYNDROME, AethKind, DtaOpcode, NakCode, RoceOpcode, TranslatorCounter
from softdta.wire import dta
from softdta.wire.frames import ip_bytes
from softdta.wire.roce import aeth_syndrome
from tests.common import FLEET_ADDRESS, fleet_document
from tests.unit.test_batch import SketchReporters, assert_same, cuts_from, reply, reporter, run_batches, run_oracle

FLEET = ip_bytes(FLEET_ADDRESS)
UNMAPPED_SLOTS = range(0, 1 << 12, 7)  # left to c3 alone, which has no Postcarding structure


def fleet_batch_tables(across: bool) -> Tables:
    """Three collectors (tests.common.fleet_document: the slot map of core.fleet.assign, two replicas), RC with
    ACK requests and PSNs about to wrap. c2's Key-Write and Key-Increment hash as dta-v1 (the others as
    independent), so that a key's copies across replicas land in slots of another scheme; c3 has no Postcarding,
    and some slots are c3's alone; Postcarding caches and sketches are small, Append batches short."""
    document, _ = fleet_document(across=across)
    document["translator"].update(ack_request_interval=3)
    for number, entry in enumerate([*document["structures"], *document["append"]]):
        entry["qp"].update(transport="rc", start_psn=(0xFFFFF0 + 3 * number) & 0xFFFFFF)
        if entry.get("primitive") in ("key-write", "key-increment") and entry["collector"] == "c2":
            entry["hash"] = "dta-v1"
        if entry.get("primitive") == "postcarding":
            entry["cache_entries"] = 16
        if entry.get("primitive") == "sketch-merge":
            entry.update(columns=16, batch=4, reporters=2)
        if "first_list" in entry:
            entry.update(lists=8, entries=9, batch=3, first_list=0 if entry["collector"] != "c3" else 4)
    document["structures"] = [entry for entry in document["structures"]
                              if not (entry["primitive"] == "postcarding" and entry["collector"] == "c3")]
    for slot in UNMAPPED_SLOTS:
        document["fleet"]["slots"][slot] = ["c3"]
    return Tables.from_dict(document)


def collector_ips(tables: Tables) -> list[bytes]:
    return sorted(tables.collector_ips)


def fleet_workload(seed: int, tables: Tables, size: int, fleet_share: float = 0.6) -> list[bytes]:
    """Reports of every primitive, `fleet_share` of them to the fleet address and the rest to a collector, with
    replies (ACKs, NAKs that put QPs into grace) and reports the oracle drops mixed in."""
    rng = random.Random(seed)
    collectors = collector_ips(tables)
    ends = {address: reporter(address, tables) for address in [FLEET, *collectors]}
    flows = [rng.randbytes(4) for _ in range(rng.choice([3, 30]))]
    sketch_owner = next(ip for ip in tables.fleet.replicas(b"")
                        if tables.structure(ip, DtaOpcode.SKETCH_MERGE) is not None)
    sketches = {ip: SketchReporters(tables.structure(ip, DtaOpcode.SKETCH_MERGE), rng) for ip in collectors}
    sketches[FLEET] = sketches[sketch_owner]  # the fleet's sketch is its owner's: one stream of columns
    qps = tables.qps
    frames = []
    for _ in range(size):
        destination = FLEET if rng.random() < fleet_share else rng.choice(collectors)
        flags = {"immediate": rng.random() < 0.3}
        roll = rng.random()
        if roll < 0.30:
            extended = rng.random() < 0.3
            report = dta.key_write(rng.randbytes(4), rng.randbytes(4), rng.randint(1, 4), **flags,
                                   essential=extended and rng.random() < 0.3, extended=extended)
        elif roll < 0.45:
            report = dta.key_increment(rng.choice(flows), rng.randint(0, 1 << 40), rng.randint(1, 4), **flags,
                                       extended=rng.random() < 0.3)
        elif roll < 0.58:
            report = dta.append(rng.randrange(14), rng.randbytes(4), **flags, extended=rng.random() < 0.3)
        elif roll < 0.70:
            hop = rng.randint(1, 5)
            report = dta.postcard(rng.choice(flows), hop, rng.randbytes(4), **flags)
        elif roll < 0.80:
            report = sketches[destination].report()
        elif roll < 0.92:  # a reply: mostly ACKs, now and then a NAK that puts its QP into grace
            qp = rng.choice(qps)
            psn = (qp.start_psn + rng.randint(-2, 40)) & 0xFFFFFF
            syndrome = rng.choice([ACK_SYNDROME] * 8 + [aeth_syndrome(AethKind.NAK, NakCode.PSN_SEQUENCE_ERROR)])
            opcode = RoceOpcode.RC_ATOMIC_ACK if rng.random() < 0.2 else RoceOpcode.RC_ACK
            frames.append(reply(tables, qp.collector_ip, qp.local_qpn, psn, syndrome, opcode))
            continue
        else:  # what the oracle drops: a key of the wrong length, too many copies, a retransmission
            report = rng.choice([dta.key_write(rng.randbytes(5), rng.randbytes(4), 1, extended=True),
                                 dta.key_increment(rng.randbytes(4), 1, 9, extended=True),
                                 dta.postcard(rng.choice(flows), 2, 1, retransmit=True, seqnum=rng.randrange(256),
                                              extended=True)])
        frames.append(ends[destination].frame(report, tables.profile))
    return frames


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), size=st.integers(1, 600), sizes=st.lists(st.integers(1, 400), min_size=1,
                                                                            max_size=8),
       across=st.booleans(), as_rows=st.booleans())
def test_batches_at_a_fleet_address_equal_the_oracle_frame_for_frame(seed, size, sizes, across, as_rows):
    tables = fleet_batch_tables(across)
    frames = fleet_workload(seed, tables, size)
    cuts = cuts_from(sizes, len(frames))

    def now_of(position):  # grace periods end within a workload
        return position * 20_000

    expected = run_oracle(tables, frames, cuts, now_of)
    assert_same(expected, run_batches(tables, frames, cuts, now_of, as_rows=as_rows))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), sizes=st.lists(st.integers(1, 300), min_size=1, max_size=8),
       queues=st.lists(st.integers(0, 2), min_size=8, max_size=8), across=st.booleans())
def test_fleet_batches_from_several_rx_queues_equal_the_oracle_frame_for_frame(seed, sizes, queues, across):
    """Each batch from one RX queue (2 has no QPs): a report's copies go through its queue's QPs of each replica."""
    tables = with_queue_qps(fleet_batch_tables(across), 2)
    frames = fleet_workload(seed, tables, 400)
    cuts = cuts_from(sizes, len(frames))
    starts = [0, *cuts]

    def queue_of(start):
        return queues[starts.index(start) % len(queues)]

    def now_of(position):
        return position * 20_000

    assert_same(run_oracle(tables, frames, cuts, now_of, queue_of=queue_of),
                run_batches(tables, frames, cuts, now_of, queue_of=queue_of))


@pytest.mark.parametrize("across", [False, True], ids=["first-replica", "across"])
def test_copies_to_a_replica_in_grace_are_dropped_copy_by_copy_like_the_oracle_drops_them(monkeypatch, across):
    """c2's Key-Write QP in its grace period: copies of the fleet's reports bound for it are counted drops, the
    copies to the other replica still go, in the oracle's order."""
    tables = fleet_batch_tables(across)
    frames = [reporter(FLEET, tables).frame(dta.key_write(key.to_bytes(4, "big"), key, 4)) for key in range(300)]
    in_grace = ip_bytes("10.77.1.2")
    oracle, batch = Translator(tables), BatchTranslator(Translator(tables))
    for translator in (oracle, batch.oracle):
        translator.resync(tables.structure(in_grace, DtaOpcode.KEY_WRITE).qp, 5, 0)
    wanted = [frame for position in frames for frame in oracle.process(position, 10).frames]
    calls = []
    process = Translator.process
    monkeypatch.setattr(Translator, "process", lambda self, *args: calls.append(args[0]) or process(self, *args))
    assert batch.process_batch(frames, 10).frames == wanted
    assert batch.oracle.counts() == oracle.counts()
    assert oracle.counts()[TranslatorCounter.DROP_GRACE] > (100 if across else 10)
    # the oracle takes only the reports whose own target is in grace, to drop them
    assert calls == [frame for key, frame in enumerate(frames)
                     if tables.fleet.replicas(key.to_bytes(4, "big"))[0] == in_grace]


@pytest.mark.parametrize("across", [False, True], ids=["first-replica", "across"])
def test_reports_to_the_fleet_address_are_vectorized_not_sent_through_the_oracle(monkeypatch, across):
    """Key-Writes, Key-Increments, Appends, postcards and sketch columns to the fleet address, each kind in its
    own batch: none goes through the oracle, and the frames are the oracle's, in its order."""
    tables = fleet_batch_tables(across)
    sketch_owner = next(ip for ip in tables.fleet.replicas(b"")
                        if tables.structure(ip, DtaOpcode.SKETCH_MERGE) is not None)
    sketch = tables.structure(sketch_owner, DtaOpcode.SKETCH_MERGE)
    rng = random.Random(5)
    held = [list_id for list_id in range(12) if tables.append_range(list_id) is not None]
    mapped = [key for key in (rng.randbytes(4) for _ in range(400)) if tables.fleet.slot(key) not in UNMAPPED_SLOTS]
    kinds = {
        "key-write": [dta.key_write(key, rng.randbytes(4), rng.randint(1, 4)) for key in mapped[:200]],
        "key-increment": [dta.key_increment(key, 3, rng.randint(1, 4), extended=True) for key in mapped[:200]],
        "append": [dta.append(rng.choice(held), rng.randbytes(4)) for _ in range(200)],
        "postcarding": [dta.postcard(key, hop, hop) for key in mapped[:40] for hop in range(1, 6)],
        "sketch-merge": [dta.sketch_column(reporter_, column, [column] * sketch.rows)
                         for column in range(sketch.columns) for reporter_ in range(sketch.reporters)],
    }
    to_fleet = reporter(FLEET, tables)
    for name, reports in kinds.items():
        frames = [to_fleet.frame(report) for report in reports]
        expected = run_oracle(tables, frames, [len(frames)], lambda _: 0)
        batch = BatchTranslator(Translator(tables))
        calls = []
        process = batch.oracle.process
        monkeypatch.setattr(batch.oracle, "process", lambda *args: calls.append(args) or process(*args))
        out = batch.process_batch(frames, 0)
        assert calls == [], name
        assert out.frames == expected[1]["frames"] and len(out.frames) >= 4, name
        assert batch.oracle.counts() == expected[0].counts(), name
