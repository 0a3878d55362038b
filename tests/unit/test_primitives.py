"""The primitive plug-in API: built-ins dispatch through it, and the Latency-Sum example works end to end
(reporter frames -> reference translator with the plug-in -> reference responder -> the collector's memory)."""

import numpy as np
import pytest

from softdta.core import primitives
from softdta.core.offline import OfflineCollector
from softdta.core.primitives.key_write.queries import key_write_query
from softdta.core.translator import Translator
from softdta.plugins.latency_sum import LatencySum
from softdta.spec import DtaOpcode, RoceOpcode, TranslatorCounter
from softdta.wire.frames import build_udp_frame, parse_udp_frame
from softdta.wire.hashing import key_checksum, key_slot
from softdta.wire.roce import parse_roce
from tests.common import COLLECTOR_IP, ENDS, hop_frames


def test_built_in_primitives_are_dispatched_through_the_plug_in_api(tables):
    translator = Translator(tables)
    assert set(translator.primitives) == set(DtaOpcode)
    assert all(isinstance(p, primitives.Primitive) for p in translator.primitives.values())


def test_a_plug_in_cannot_take_an_opcode_already_in_use(tables):
    class Clash(LatencySum):
        opcode = DtaOpcode.APPEND

    with pytest.raises(ValueError, match="already has"):
        Translator(tables, plugins=[Clash])


def test_latency_sum_writes_only_slow_flows_into_the_key_write_store(tables):
    translator = Translator(tables, plugins=[LatencySum])
    collector = OfflineCollector(tables)
    slow = {(1000 + i).to_bytes(4, "big"): [400_000, 350_000, 300_000 + i] for i in range(50)}  # > 1 ms in total
    fast = {(5000 + i).to_bytes(4, "big"): [200_000, 300_000, 100_000 + i] for i in range(50)}
    emitted = []
    for key, latencies in {**slow, **fast}.items():
        frames = hop_frames(key, latencies)
        for frame in frames[:-1]:
            assert translator.process(frame).frames == []  # nothing until the path is complete
        out = translator.process(frames[-1])
        assert len(out.frames) == (key in slow)
        emitted += out.frames
        for frame in out.frames:
            assert collector.deliver(frame) == []  # UC: no replies
    structure = tables.structure(COLLECTOR_IP, DtaOpcode.KEY_WRITE)
    first_key, first = next(iter(slow.items()))
    roce = parse_roce(emitted[0], parse_udp_frame(emitted[0]))
    assert roce.icrc_ok and roce.opcode == RoceOpcode.UC_WRITE_ONLY
    slot = key_slot(first_key, 0, structure.slot_count, structure.key_hash)
    assert roce.headers["reth"]["va"] == structure.qp.base_va + slot * structure.slot_size
    assert roce.payload == key_checksum(first_key).to_bytes(4, "little") + sum(first).to_bytes(4, "big")

    region = collector.structure_region(DtaOpcode.KEY_WRITE, COLLECTOR_IP)
    keys = lambda flows: np.array([int.from_bytes(k, "big") for k in flows], dtype=np.uint64)  # noqa: E731
    answer = key_write_query(region, keys(slow), redundancy=1, key_hash=structure.key_hash)
    assert answer.found.all() and list(answer.values) == [sum(v) for v in slow.values()]
    assert not key_write_query(region, keys(fast), redundancy=1, key_hash=structure.key_hash).found.any()
    plugin = translator.primitives[LatencySum.opcode]
    assert (plugin.reported, plugin.below_threshold, plugin.state) == (50, 50, {})
    assert translator.counters[TranslatorCounter.TX_FRAMES] == 50
    assert translator.counters[TranslatorCounter.RX_REPORTS] == 300


def test_latency_sum_counts_a_repeated_hop_once(tables):
    translator = Translator(tables, plugins=[LatencySum])
    key = b"\x00\x00\x00\x07"
    first, second = hop_frames(key, [900_000, 200_000])
    assert translator.process(first).frames == [] and translator.process(first).frames == []
    assert len(translator.process(second).frames) == 1  # 1.1 ms, not 2 ms and not early


@pytest.mark.parametrize("payload,reason", [
    (LatencySum.report(b"\x01\x02\x03\x04", 3, 2, 10), TranslatorCounter.DROP_BAD_HOP),
    (LatencySum.report(b"\x01\x02\x03\x04", 1, 1, 10)[:-1], TranslatorCounter.DROP_TRUNCATED),
    (LatencySum.report(b"\x01\x02\x03\x04", 1, 1, 10) + b"\0", TranslatorCounter.DROP_BAD_LENGTH),
    (LatencySum.report(b"\x01\x02\x03", 1, 1, 10), TranslatorCounter.DROP_BAD_LENGTH),  # the store keeps 4-byte keys
])
def test_latency_sum_drops_malformed_reports_with_a_reason(tables, payload, reason):
    translator = Translator(tables, plugins=[LatencySum])
    assert translator.process(build_udp_frame(ENDS, payload)).drop is reason


def test_without_the_plug_in_its_opcode_is_unknown(tables):
    out = Translator(tables).process(hop_frames(b"\x00\x00\x00\x01", [5])[0])
    assert out.drop is TranslatorCounter.DROP_UNKNOWN_OPCODE


def test_plug_ins_load_by_module_and_class_name():
    assert primitives.load("softdta.plugins.latency_sum:LatencySum") is LatencySum
    for spec, message in [("softdta.plugins.latency_sum", "MODULE:CLASS"), ("softdta.nothing:X", "cannot be loaded"),
                          ("softdta.spec:Header", "not a subclass")]:
        with pytest.raises(ValueError, match=message):
            primitives.load(spec)
