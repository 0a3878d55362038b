"""The offline demo: a mixed workload through the reference translator into the reference collector, queried.

It prints what a user wants to know first: what was sent, what the translator emitted and dropped, how full the
collector is, and whether the queries give back what was reported, beside the success the analysis expects.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TypeVar

import numpy as np

from softdta.core import registry, workload
from softdta.core.analysis import expected_success, key_write_success_chances
from softdta.core.offline import OfflineCollector
from softdta.core.primitives.key_increment.queries import keyincrement_query
from softdta.core.primitives.key_increment.region import KeyIncrementRegion
from softdta.core.primitives.key_write.queries import key_write_query
from softdta.core.primitives.key_write.region import KeyWriteRegion
from softdta.core.primitives.postcarding.queries import postcard_query
from softdta.core.primitives.postcarding.region import PostcardRegion
from softdta.core.primitives.sketch_merge.region import SketchRegion
from softdta.core.settings import TableError
from softdta.core.tables import Structure, Tables
from softdta.core.translator import Translator
from softdta.spec import DtaOpcode
from softdta.wire.dta import Report
from softdta.wire.frames import ip_bytes, ip_str, mac_bytes
from softdta.wire.pcap import Packet, write_pcap

SWITCH_IDS = list(range(1, 4097))

_Region = TypeVar("_Region", KeyWriteRegion, KeyIncrementRegion, PostcardRegion, SketchRegion)


def _structure(tables: Tables, collector_ip: bytes, primitive: DtaOpcode) -> Structure:
    structure = tables.structure(collector_ip, primitive)
    if structure is None:
        raise TableError(f"the tables have no {registry.by_opcode(primitive).name} structure on collector "
                         f"{ip_str(collector_ip)}; "
                         "the offline demo needs one of each primitive there (as in examples/tables.toml)")
    return structure


def _region(collector: OfflineCollector, primitive: DtaOpcode, collector_ip: bytes, kind: type[_Region]) -> _Region:
    region = collector.structure_region(primitive, collector_ip)
    assert isinstance(region, kind)  # each primitive has its own kind of region
    return region


def _workloads(tables: Tables, collector_ip: bytes, seed: int) -> dict[DtaOpcode, list[Report]]:
    kw = _structure(tables, collector_ip, DtaOpcode.KEY_WRITE)
    sketch = _structure(tables, collector_ip, DtaOpcode.SKETCH_MERGE)
    lists = tables.append_lists[0]
    return {
        DtaOpcode.KEY_WRITE: workload.key_write(kw.slot_count // 10, seed, 2, kw.key_len, kw.data_len),
        DtaOpcode.KEY_INCREMENT: workload.key_increment(4000, seed, 2, flows=200),
        DtaOpcode.APPEND: workload.append(lists.lists * lists.entries // 2, seed, lists.lists, lists.first_list),
        DtaOpcode.POSTCARDING: workload.postcards(2000, seed, 5, SWITCH_IDS),
        DtaOpcode.SKETCH_MERGE: workload.sketch_epoch(sketch.reporters, sketch.columns, sketch.rows, seed),
    }


def run_offline_demo(tables: Tables, seed: int = 0, pcap_dir: str | None = None) -> str:
    collector_ip = tables.structures[0].qp.collector_ip
    reporter = workload.ReporterAddress(mac=mac_bytes("02:5d:7a:00:09:01"), ip=ip_bytes("10.77.9.1"),
                                        translator_mac=tables.mac, collector_ip=collector_ip)
    per_primitive = _workloads(tables, collector_ip, seed)
    ordered = workload.interleave(list(per_primitive.values()), seed)

    translator = Translator(tables)
    collector = OfflineCollector(tables, collector_ip)
    report_frames, roce_frames = [], []
    started = time.perf_counter()
    for number, report in enumerate(ordered):
        now_ns = number * 1000
        frame = reporter.frame(report, tables.profile)
        report_frames.append(Packet(now_ns, frame))
        out = translator.process(frame, now_ns)
        for emitted in out.frames:
            roce_frames.append(Packet(now_ns, emitted))
            for reply in collector.deliver(emitted):
                translator.process(reply, now_ns)
    for emitted in translator.flush_idle(len(ordered) * 1000):
        roce_frames.append(Packet(len(ordered) * 1000, emitted))
        collector.deliver(emitted)
    elapsed = time.perf_counter() - started
    if pcap_dir:
        Path(pcap_dir).mkdir(parents=True, exist_ok=True)
        write_pcap(Path(pcap_dir) / "reports.pcap", report_frames)
        write_pcap(Path(pcap_dir) / "roce.pcap", roce_frames)

    lines = ["softdta offline demo: reference translator -> reference RoCEv2 responder -> queries", ""]
    lines.append("reports sent per primitive:")
    for opcode, reports in per_primitive.items():
        lines.append(f"  {opcode.name.lower():16} {len(reports):8}")
    lines.append(f"translated {len(ordered)} reports into {len(roce_frames)} RoCEv2 frames in {elapsed:.2f} s "
                 f"({len(ordered) / elapsed:,.0f} reports/s, pure Python)")
    drops = {c.name.lower(): n for c, n in translator.counters.items() if c.name.startswith("DROP_") and n}
    lines.append(f"drops by reason: {drops or 'none'}")
    responder = collector.counters()
    lines.append(f"collector executed {responder.get('executed', 0)} requests; "
                 f"rejected {sum(n for k, n in responder.items() if k != 'executed')}")
    lines.append("")
    lines += _collector_fill(tables, collector, collector_ip)
    lines.append("")
    lines += _query_results(tables, collector, collector_ip, per_primitive)
    return "\n".join(lines)


def _collector_fill(tables: Tables, collector: OfflineCollector, collector_ip: bytes) -> list[str]:
    lines = ["collector fill (non-empty slots):"]
    for structure in tables.structures:
        if structure.qp.collector_ip != collector_ip or structure.slot_size == 0:
            continue
        memory = np.frombuffer(collector.region_of(structure.qp), dtype=np.uint8)
        used = memory[:structure.slot_count * structure.slot_size].reshape(-1, structure.slot_size).any(axis=1)
        lines.append(f"  {registry.by_opcode(structure.primitive).name:16} {used.sum():8} / {used.size} "
                     f"({100 * used.mean():.2f} %)")
    return lines


def _query_results(tables: Tables, collector: OfflineCollector, collector_ip: bytes,
                   per_primitive: dict[DtaOpcode, list[Report]]) -> list[str]:
    lines = ["queries against the truth:"]
    kw = _structure(tables, collector_ip, DtaOpcode.KEY_WRITE)
    reports = per_primitive[DtaOpcode.KEY_WRITE]
    answer = key_write_query(_region(collector, DtaOpcode.KEY_WRITE, collector_ip, KeyWriteRegion),
                            [r.key for r in reports], redundancy=2, key_hash=kw.key_hash)
    correct = np.array([found and bytes(value) == r.data if kw.data_len not in (4, 8) else
                        found and int(value) == int.from_bytes(r.data, "big")
                        for found, value, r in zip(answer.found, answer.values, reports)])
    later = np.arange(len(reports) - 1, -1, -1) / kw.slot_count
    rate, spread = expected_success(key_write_success_chances(later.tolist(), 2))
    lines.append(f"  key-write        {correct.mean() * 100:6.2f} % of keys answered correctly "
                 f"(N=2, load {len(reports) / kw.slot_count:.2f}, hash {kw.key_hash.name.lower()}); "
                 f"expected {100 * rate:.2f} % ± {100 * spread:.2f} % (one standard deviation)")
    lines.append(f"                   wrong answers: {int((answer.found & ~correct).sum())}")

    ki = _structure(tables, collector_ip, DtaOpcode.KEY_INCREMENT)
    truth: dict[bytes, int] = {}
    for report in per_primitive[DtaOpcode.KEY_INCREMENT]:
        truth[report.key] = truth.get(report.key, 0) + report.counter
    estimate = keyincrement_query(_region(collector, DtaOpcode.KEY_INCREMENT, collector_ip, KeyIncrementRegion),
                                  list(truth), 2, ki.key_hash)
    exact = sum(int(e) == t for e, t in zip(estimate, truth.values()))
    lines.append(f"  key-increment    {exact} / {len(truth)} flow counters exact (Count-Min, N=2)")

    sent_per_list: dict[int, list[int]] = {}
    for report in per_primitive[DtaOpcode.APPEND]:
        sent_per_list.setdefault(report.list_id, []).append(int.from_bytes(report.data, "big"))
    received = collector.append_pollers[0].poll()
    recovered = sum(list(received.get(list_id, [])) == values for list_id, values in sent_per_list.items())
    entries = sum(len(v) for v in received.values())
    sent = sum(len(v) for v in sent_per_list.values())
    lines.append(f"  append           {entries} / {sent} entries recovered "
                 f"({100 * entries / sent:.1f} %), {recovered} / {len(sent_per_list)} lists in exact order")

    paths: dict[bytes, list[int]] = {}
    for report in per_primitive[DtaOpcode.POSTCARDING]:
        paths.setdefault(report.key, [0] * 5)[report.hop - 1] = int.from_bytes(report.data, "big")
    decoded = postcard_query(_region(collector, DtaOpcode.POSTCARDING, collector_ip, PostcardRegion), list(paths),
                             SWITCH_IDS)
    right = (decoded.values == np.array(list(paths.values()))).all(axis=1) & decoded.complete
    lines.append(f"  postcarding      {int(right.sum())} / {len(paths)} paths decoded exactly")

    sketch = _structure(tables, collector_ip, DtaOpcode.SKETCH_MERGE)
    expected = np.zeros((sketch.rows, sketch.columns), dtype=np.uint64)
    for report in per_primitive[DtaOpcode.SKETCH_MERGE]:
        expected[:, report.column] += np.array(report.counters, dtype=np.uint64)
    merged = _region(collector, DtaOpcode.SKETCH_MERGE, collector_ip, SketchRegion).matrix()
    lines.append(f"  sketch-merge     merged sketch {'matches' if (merged == expected).all() else 'DIFFERS from'} "
                 f"the sum of {sketch.reporters} reporters' sketches ({sketch.rows}x{sketch.columns})")
    return lines
