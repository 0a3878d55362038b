"""The offline demo: a mixed workload through the reference translator into the reference collector, queried.

It prints what a user wants to know first: what was sent, what the translator emitted and dropped, how full the
collector is, and whether the queries give back what was reported, beside the success the analysis expects.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from softdta.core import registry, workload
from softdta.core.offline import OfflineCollector
from softdta.core.settings import TableError
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.core.workload import DemoSetting, PrimitiveDemo
from softdta.wire.frames import ip_bytes, ip_str, mac_bytes
from softdta.wire.pcap import Packet, write_pcap

# Half the live demo's workload: pure Python translates about a thousand reports/s
SCALE = 0.5


def _parts(tables: Tables, collector_ip: bytes, seed: int) -> list[PrimitiveDemo]:
    """Every primitive's part in the demo, on its structure (or Append lists) at `collector_ip`."""
    setting, parts = DemoSetting(seed, SCALE), []
    for primitive in registry.registered():
        if primitive.demo is None:
            continue
        target = primitive.demo.target_in(primitive, tables, collector_ip)
        if target is None:
            raise TableError(f"the tables have no {primitive.name} structure on collector {ip_str(collector_ip)}; "
                             "the offline demo needs one of each primitive there (as in examples/tables.toml)")
        parts.append(primitive.demo(primitive, target, setting))
    return parts


def run_offline_demo(tables: Tables, seed: int = 0, pcap_dir: str | None = None) -> str:
    collector_ip = tables.structures[0].qp.collector_ip
    reporter = workload.ReporterAddress(mac=mac_bytes("02:5d:7a:00:09:01"), ip=ip_bytes("10.77.9.1"),
                                        translator_mac=tables.mac, collector_ip=collector_ip)
    parts = _parts(tables, collector_ip, seed)
    ordered = workload.interleave([part.reports for part in parts], seed)

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
    for part in parts:
        lines.append(f"  {part.primitive.name.replace('-', '_'):16} {len(part.reports):8}")
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
    lines += _query_results(collector, parts)
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


def _query_results(collector: OfflineCollector, parts: list[PrimitiveDemo]) -> list[str]:
    lines = ["queries against the truth:"]
    for part in parts:
        fields = part.request(len(part.reports))
        if fields is None:
            continue
        answer = part.answer_from(collector, fields)
        entry = part.check(answer, answer, len(part.reports))
        first, *more = part.offline_lines(entry, answer)
        lines.append(f"  {part.primitive.name:16} {first}")
        lines += [f"{'':19}{line}" for line in more]
    return lines
