"""Postcarding's cache and Sketch-Merge's columns are arrays that the oracle and the batch translator share: workloads
of those primitives alone, dense enough that a batch holds many paths per cache entry and several laps of a sketch's
columns, cut into batches at random and flushed idle between batches, give the oracle's frames, NACKs, counters and
state."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softdta.core.batch import BatchTranslator
from softdta.core.translator import Translator
from softdta.spec import ACK_SYNDROME, DtaOpcode, TranslatorCounter
from softdta.wire import dta
from tests.unit.test_batch import C1, C2, assert_same, batch_tables, cuts_from, reply, reporter

IDLE_NS = 50_000


def postcard_workload(seed: int, tables, size: int) -> list[bytes]:
    """Postcards of a few flows to C1 (5 hops, a cache of 64) and C2 (3 hops, a cache of 2): paths that complete,
    repeat a hop, wait, evict each other, and one-hop paths beside another flow's; ACKs of C1's QP between them."""
    rng = random.Random(seed)
    to_c1, to_c2 = reporter(C1, tables), reporter(C2, tables)
    postcarding = tables.structure(C1, DtaOpcode.POSTCARDING)
    flows = [rng.randbytes(4) for _ in range(rng.choice([2, 8, 90]))]
    long_flows = [rng.randbytes(8) for _ in range(rng.choice([1, 3, 6]))]
    frames = []
    for _ in range(size):
        roll, flags = rng.random(), {"immediate": rng.random() < 0.3}
        if roll < 0.6:
            hop = rng.randint(1, 5)
            if rng.random() < 0.5:
                frames.append(to_c1.frame(dta.postcard(rng.choice(flows), hop, rng.randbytes(4), **flags)))
            else:
                length = rng.choice([1, hop, 5]) if hop == 1 else rng.choice([0, hop, 5])
                frames.append(to_c1.frame(dta.postcard(rng.choice(flows), hop, rng.randbytes(4), length,
                                                       extended=True, **flags)))
        elif roll < 0.95:
            hop = rng.randint(1, 3)
            length = rng.choice([0, hop, 3, 1 if hop == 1 else 0])
            frames.append(to_c2.frame(dta.postcard(rng.choice(long_flows), hop, rng.randbytes(4), length,
                                                   extended=True, **flags)))
        else:
            psn = (postcarding.qp.start_psn + rng.randint(0, 40)) & 0xFFFFFF
            frames.append(reply(tables, C1, postcarding.qp.local_qpn, psn, ACK_SYNDROME))
    return frames


def sketch_workload(seed: int, tables, size: int) -> list[bytes]:
    """Sketch columns to C1 (16 columns in groups of 4, 3 reporters, SUM) and C2 (4 columns in groups of 2, 2
    reporters, MAX), each reporter in its own order of columns and at its own pace: in step, a column or a few
    ahead, or a lap ahead (NACKed); now and then a column out of order or sent again."""
    rng = random.Random(seed)
    senders = {C1: reporter(C1, tables), C2: reporter(C2, tables)}
    structures = {ip: tables.structure(ip, DtaOpcode.SKETCH_MERGE) for ip in senders}
    next_column = {ip: [0] * structure.reporters for ip, structure in structures.items()}
    pace = {ip: [rng.choice([1, 1, 2, 8]) for _ in range(structure.reporters)] for ip, structure in structures.items()}
    frames = []
    while len(frames) < size:
        ip = C1 if rng.random() < 0.7 else C2
        structure = structures[ip]
        who = rng.choices(range(structure.reporters), pace[ip])[0]
        column = next_column[ip][who]
        if rng.random() < 0.97:
            next_column[ip][who] = (column + 1) % structure.columns
        else:
            column = rng.randrange(structure.columns)
        counters = [rng.randrange(1 << 32) for _ in range(structure.rows)]
        frames.append(senders[ip].frame(dta.sketch_column(who, column, counters, immediate=rng.random() < 0.3)))
    return frames


def run(translate, flush_idle, frames, cuts):
    """Batch k at k idle times, then idle flushes half an idle time apart: after every other batch, long enough
    for the QP to be found idle and the paths of the batch before to be written out."""
    out = {"frames": [], "to_reporter": [], "deferred": []}
    start = 0
    for number, cut in enumerate(cuts):
        now = number * IDLE_NS
        made = translate(frames[start:cut], now)
        out["frames"] += made["frames"]
        out["to_reporter"] += made["to_reporter"]
        out["deferred"] += [start + position for position in made["deferred"]]
        for later in range(2 + number % 2):
            out["frames"] += flush_idle(now + later * IDLE_NS // 2, IDLE_NS)
        start = cut
    return out


def both(tables, frames, cuts):
    oracle, batch = Translator(tables), BatchTranslator(Translator(tables))

    def one_by_one(part, now):
        results = [oracle.process(frame, now) for frame in part]
        return {"frames": [frame for result in results for frame in result.frames],
                "to_reporter": [frame for result in results for frame in result.to_reporter],
                "deferred": [position for position, result in enumerate(results) if result.deferred]}

    def batched(part, now):
        made = batch.process_batch(part, now)
        return {"frames": made.frames, "to_reporter": made.to_reporter, "deferred": made.deferred}

    expected = oracle, run(one_by_one, oracle.flush_idle, frames, cuts)
    got = batch.oracle, run(batched, batch.oracle.flush_idle, frames, cuts)
    return expected, got


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), size=st.integers(1, 900),
       sizes=st.lists(st.integers(1, 900), min_size=1, max_size=6))
def test_postcards_crowding_small_caches_equal_the_oracle_with_idle_flushes(seed, size, sizes):
    tables = batch_tables()
    frames = postcard_workload(seed, tables, size)
    assert_same(*both(tables, frames, cuts_from(sizes, len(frames))))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), size=st.integers(1, 900),
       sizes=st.lists(st.integers(1, 900), min_size=1, max_size=6))
def test_sketch_reporters_at_their_own_pace_equal_the_oracle(seed, size, sizes):
    tables = batch_tables()
    frames = sketch_workload(seed, tables, size)
    assert_same(*both(tables, frames, cuts_from(sizes, len(frames))))


def test_a_batch_of_many_paths_per_cache_entry_is_flushed_like_the_oracle():
    """Hundreds of postcards of many flows in C1's 64 entries and a few in C2's 2, in one batch: rounds of
    completions and evictions, and the paths left waiting are named by their flush queue entries."""
    tables = batch_tables()
    frames = postcard_workload(7, tables, 900)
    expected, got = both(tables, frames, [len(frames)] * 3)  # then idle flushes
    assert expected[0].counts()[TranslatorCounter.POSTCARD_EVICTIONS] > 10
    assert expected[0].counts()[TranslatorCounter.POSTCARD_FLUSHES] > 0
    assert_same(expected, got)


def test_laps_of_the_columns_in_one_batch_are_merged_at_once(monkeypatch):
    """Reporters a few columns apart, lap after lap, in one batch: every report is merged without the oracle, and
    each group is written by its last report, in the order the groups completed."""
    tables = batch_tables()
    sketch = tables.structure(C1, DtaOpcode.SKETCH_MERGE)
    to_c1 = reporter(C1, tables)
    rng = random.Random(5)
    given = [0] * sketch.reporters
    frames = []
    while min(given) < 5 * sketch.columns:
        # any reporter but one a group ahead of the slowest, so no report comes before the write it needs
        ready = [who for who in range(sketch.reporters) if given[who] < min(given) + sketch.batch]
        who = rng.choice(ready)
        frames.append(to_c1.frame(dta.sketch_column(who, given[who] % sketch.columns, [given[who], who, 1, 2])))
        given[who] += 1
    oracle = Translator(tables)
    expected = [frame for report in frames for frame in oracle.process(report, 0).frames]
    batch = BatchTranslator(Translator(tables))
    calls = []
    monkeypatch.setattr(batch.oracle, "process", lambda *args: calls.append(args))
    assert batch.process_batch(frames, 0).frames == expected and calls == []
    assert len(expected) == 5 * sketch.columns // sketch.batch
    assert batch.oracle.primitive(DtaOpcode.SKETCH_MERGE).state == oracle.primitive(DtaOpcode.SKETCH_MERGE).state
