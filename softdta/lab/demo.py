"""`softdta demo`: the lab up, a mixed telemetry workload through the XDP translator into the collector, the
collector queried against the truth, and an honest summary. Exit status 1 if anything was lost anywhere
(`verdict`: per hop and frame kind, counted or not), an answer differs from the one the reference translator
predicts from the reports sent, or a query's success rate fell well below what the analysis expects.
"""

from __future__ import annotations

import json
import os
import random
import time
import tomllib
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from softdta.collector.collector import tables_document
from softdta.collector.config import CollectorConfig
from softdta.collector.xdp_backend import pin_dir_for
from softdta.core import registry, workload
from softdta.core.offline import OfflineCollector
from softdta.core.primitives import Primitive
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.core.workload import (
    BELOW_EXPECTED,
    BELOW_EXPECTED_WORDS,
    DemoSetting,
    PrimitiveDemo,
    expected_words,
    summary_key,
)
from softdta.engines.python import IO_DROPS, engine_stats
from softdta.kernel import netns
from softdta.kernel.bpf import Map, enable_run_stats
from softdta.kernel.frame_sender import FrameSender, as_rows
from softdta.kernel.netns import in_netns
from softdta.kernel.tx_ring import RingReporter
from softdta.lab import topology as lab
from softdta.lab.export_consumer import ExportConsumer
from softdta.spec import ResponderCounter, TranslatorCounter
from softdta.wire.dta import Report
from softdta.wire.frames import ip_bytes, mac_bytes

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

VETH_RING = 256  # a veth's receive ring while it runs XDP: what the translator's link holds at once
# Reports all reporters send per round: half the translator's ring, so that the collector's ACKs and what the
# ring still holds fit beside it (a full ring's worth per round overflowed now and then under a CPU hog)
ROUND = VETH_RING // 2
# The python engine's steps grow with what waits for it, past their fixed cost. Its frames leave through its
# socket, which a queueing discipline on t0 makes wait for room on the link (softdta.lab.topology), so a step's
# burst is not dropped there; its receive ring holds 16384. With 1024 waiting, the replies to a step's frames
# overflowed the ring of sw-c, which the responder's XDP_TX fills, in 1 run of 4 (docs/lab.md).
PYTHON_WINDOW = 512
# A sender waits while more than ROUND of the reports sent are still in the links to the translator, so that a
# stall of the translator's core (a CPU hog, the host) is never answered with a burst its ring cannot hold; if
# nothing moves for this long, the reports are lost or the translator is stuck, and the sender goes on.
STALL_S = 0.2
DEFAULT_RATE = 100_000.0  # reports/s over all reporters
# rxe runs in an emulated guest: a few thousand frames/s before its queues overflow
DEFAULTS = {"xdp": {"rate": DEFAULT_RATE, "scale": 1.0}, "rxe": {"rate": 2000.0, "scale": 0.2}}
# about half what the demo sustains with the python engine on 2 cores (docs/lab.md)
PYTHON_ENGINE_RATE = 20000.0
# responder counters of frames not executed: the XDP responder's reasons, and rxe's RNR NAKs (its other
# counters, rcvd_pkts and such, count traffic)
RESPONDER_DROPS = {counter.name.lower() for counter in ResponderCounter} - {"executed", "replies_sent", "completions"} \
    | {"send_rnr_err"}
# translator counters of the RC replies it consumed, by what it made of them
REPLY_COUNTERS = ("rx_acks", "rx_nak_sequence", "rx_nak_fatal", "rx_rnr_naks", "drop_reply_psn_outside_window",
                  "drop_reply_on_uc")
DRAIN_POLL_S = 0.2  # how often the demo takes what primitives it drains hold (Append's entries)
# The burst after the mixed workload: Key-Write N=2 from kernel generators over the direct path (softdta.lab.direct)
BURST_COPIES = 2
BURST_RATE = 1_000_000.0  # reports/s over all generators
BURST_SECONDS = 3.0
EXPORTED_WITHIN_S = 30.0  # for the collector to take and publish the last Append entries, and the consumer to read them


@dataclass
class Workload:
    tables: Tables  # the lab's, as the translator gets them from the collector (addresses and QPs aside)
    parts: list[PrimitiveDemo]  # every primitive's part, with its reports
    per_reporter: list[list[Report]]  # what each reporter sends, in order
    unit_ends: list[list[int]]  # per reporter and report: where the unit it travels with ends


def build_workload(tables: Tables, reporters: int, seed: int, scale: float = 1.0) -> Workload:
    """Every primitive's demo workload on the lab's `tables` (INT path tracing, postcards, congestion events,
    per-flow counters, sketches), split over reporters.

    Each primitive says which reporter sends each of its units (`PrimitiveDemo.owner`): Append lists and sketch
    columns keep their order, and reports whose order in one slot matters come from one reporter, so that the
    collector's memory is predictable exactly (`predicted_collector`). Units travel whole, each reporter's
    primitives interleaved, each keeping its order."""
    setting, collector_ip = DemoSetting(seed, scale, reporters), ip_bytes(lab.COLLECTOR_IP)
    parts = []
    for primitive in registry.registered():
        target = primitive.demo.target_in(primitive, tables, collector_ip) if primitive.demo else None
        if primitive.demo and target is not None:
            parts.append(primitive.demo(primitive, target, setting))
    streams: list[list[list[list[Report]]]] = [[] for _ in range(reporters)]
    for part in parts:
        split: list[list[list[Report]]] = [[] for _ in range(reporters)]
        for index, unit in enumerate(part.units()):
            split[part.owner(index, unit) % reporters].append(unit)
        for reporter, units in enumerate(split):
            streams[reporter].append(list(reversed(units)))
    rng = random.Random(seed)
    per_reporter, unit_ends = [], []
    for own in streams:  # interleave the primitives, each keeping its order
        order = [i for i, stream in enumerate(own) for _ in stream]
        rng.shuffle(order)
        reports: list[Report] = []
        ends: list[int] = []
        for i in order:
            unit = own[i].pop()
            reports += unit
            ends += [len(reports)] * len(unit)
        per_reporter.append(reports)
        unit_ends.append(ends)
    return Workload(tables, parts, per_reporter, unit_ends)


def collector_http(path: str, body: dict[str, Any] | None = None, token: str | None = None) -> dict[str, Any]:
    """A query; with the collector's token, a POST that takes (Append entries)."""
    with in_netns(lab.PREFIX + "c"):
        request = urllib.request.Request(f"http://{lab.COLLECTOR_IP}:{lab.QUERY_PORT}{path}",
                                         data=json.dumps(body).encode() if body else None,
                                         headers={"Content-Type": "application/json",
                                                  **({"Authorization": f"Bearer {token}"} if token else {})},
                                         method="POST" if body or token else "GET")
        with urllib.request.urlopen(request, timeout=30) as response:
            return cast(dict[str, Any], json.loads(response.read()))


def link_drops() -> dict[str, int]:
    """Packets the lab's veth links dropped (full rings), which no BPF counter sees."""
    return netns.link_drops(lab.status()["namespaces"])


def _chunk_end(unit_ends: list[int], start: int, chunk: int) -> int:
    """`chunk` reports on, or a few more so that no unit straddles two chunks (a flow's postcards: a path's hops
    leave their switches microseconds apart, while the paced sender's chunks are milliseconds apart, more than
    the translator's idle flush waits for the rest of a path)."""
    end = min(start + chunk, len(unit_ends))
    return unit_ends[end - 1] if end > start else end


def in_flight(sent: int, counts: tuple[int, int, int, int], before: tuple[int, int, int, int],
              written_off: Sequence[int]) -> tuple[int, int, int]:
    """Of `sent` reports, those still in the links and those waiting in the translator, and the frames on their way
    to the collector; from the counters (reports off the link, reports taken off the socket into a step, reports
    translated, frames not yet executed) now and `before` the reports were sent, less what was `written_off` (lost
    in the links, given up in the translator, frames lost)."""
    (off_link, stepped, translated, unexecuted), (off_link_0, stepped_0, translated_0, unexecuted_0) = counts, before
    # a report in a step no longer waits; without a socket (the XDP translator, packet I/O) nothing counts reports
    # off the link or into a step, and a report is off the link once translated
    taken = max(stepped - stepped_0, translated - translated_0)
    off_link = max(off_link - off_link_0, taken)
    lost, given_up, frames_lost = written_off
    return sent - off_link - lost, off_link - taken - given_up, unexecuted - unexecuted_0 - frames_lost


class _Backlog:
    """What is on its way, from live counters: reports still in the links to the translator (sent, not yet off the
    link: the python engine's XDP program counts those it passes to its socket, the XDP translator translates
    them where they arrive), reports waiting in the translator's socket (the python engine publishes those it
    takes off it before each step, so that the next step gathers while one is translated), and, with the XDP
    collector, frames the translator emitted that the collector has not yet executed."""

    def __init__(self, pin_dir: Path, collector_pin_dir: Path | None, window: int):
        self.limits = (ROUND, window, window)
        self.counters = Map.from_pinned(pin_dir / "counters")
        self.responder = Map.from_pinned(collector_pin_dir / "responder_counters") if collector_pin_dir else None
        self.before = self._counts()  # counted before this demo
        # given up after a stall: reports lost in the links, reports the translator will not take, frames lost
        self.written_off = [0, 0, 0]

    def _counts(self) -> tuple[int, int, int, int]:
        """Reports off the link, taken into a step and translated, and frames not yet executed, as the counters
        stand."""
        off_link, stepped, translated = (self.counters.counter_total(counter) for counter in (
            TranslatorCounter.RX_TO_SOCKET, TranslatorCounter.RX_FROM_SOCKET, TranslatorCounter.RX_REPORTS))
        unexecuted = 0 if self.responder is None else self.counters.counter_total(TranslatorCounter.TX_FRAMES) - \
            self.responder.counter_total(ResponderCounter.EXECUTED)
        return off_link, stepped, translated, unexecuted

    def _behind(self, sent: int) -> tuple[int, int, int]:
        return in_flight(sent, self._counts(), self.before, self.written_off)

    def wait_for_room(self, sent: int) -> None:
        """Until at most ROUND of `sent` reports are still in the links to the translator, at most a window of them
        wait in the translator, and at most a window of its frames are on their way to the collector; after
        STALL_S without progress, what is on its way is given up for lost (the verdict counts it) and the sender
        goes on."""
        behind = self._behind(sent)
        since = time.perf_counter()
        while any(count > limit for count, limit in zip(behind, self.limits)):
            time.sleep(0.0001)
            now = self._behind(sent)
            if now != behind:
                behind, since = now, time.perf_counter()
            elif time.perf_counter() - since > STALL_S:
                # what the links held beyond their share is lost there, and never waits in the translator
                for index, (count, limit) in enumerate(zip(behind, self.limits)):
                    self.written_off[index] += max(0, count - limit)
                return

    def close(self) -> None:
        self.counters.close()
        if self.responder is not None:
            self.responder.close()


def stream(state: lab.LabState, load: Workload, progress: Callable[[int], Any] | None = None,
           seconds: float = 60.0, rate: float = DEFAULT_RATE, exported: ExportConsumer | None = None
           ) -> dict[str, Any]:
    """Send every reporter's reports in chunks, round-robin between reporters, at most `rate` reports/s in total
    and `ROUND` reports a round (bursts beyond what the translator's veth ring holds are dropped by the link),
    within `seconds`. No more than ROUND reports are ever in the links to the translator, no more than a window
    wait in it, and with the XDP collector, no more than a window of its frames are on their way to the
    collector: ROUND, or PYTHON_WINDOW for the python engine."""
    frames_by_reporter = []
    for index, reports in enumerate(load.per_reporter, 1):
        address = state.reporter(index)
        sender = workload.ReporterAddress(mac_bytes(address["mac"]), ip_bytes(address["ip"]),
                                          mac_bytes(lab.TRANSLATOR_MAC), ip_bytes(lab.COLLECTOR_IP))
        frames_by_reporter.append([(report, sender.frame(report)) for report in reports])
    offsets = [0] * len(frames_by_reporter)
    chunk = max(1, ROUND // len(frames_by_reporter))
    senders: list[RingReporter | FrameSender] = []
    rows = [as_rows([frame for _, frame in frames]) for frames in frames_by_reporter] \
        if state.engine == "python" else []
    try:
        for i in range(1, len(frames_by_reporter) + 1):
            port = state.reporter(i)
            # The python engine takes the demo's mix faster than an AF_PACKET TX ring sends it from Python (about
            # 5 us of the sender's CPU a report, on the same two cores): its reporters send from XDP.
            senders.append(FrameSender(port["interface"], port["netns"]) if rows else
                           RingReporter(port["interface"], port["netns"], VETH_RING))
    except BaseException:
        for each in senders:
            each.close()
        raise
    collector_pins = pin_dir_for(lab.COLLECTOR_NAME, ip_bytes(lab.COLLECTOR_IP)) if state.collector == "xdp" else None
    backlog = _Backlog(lab.PIN_DIR, collector_pins, PYTHON_WINDOW if state.engine == "python" else ROUND)
    # The pace starts with the first report: counted from before the frames were built, the time spent building
    # them would leave the sender that far behind, and it would catch up in one burst the translator's ring
    # cannot hold.
    sent = 0
    started = last_poll = paced_from = time.perf_counter()
    try:
        # XDP senders all send from one CPU: the stream stays there, sparing two migrations per call
        with senders[0].pinned() if isinstance(senders[0], FrameSender) else nullcontext():
            while any(offset < len(frames) for offset, frames in zip(offsets, frames_by_reporter)):
                if time.perf_counter() - started > seconds:
                    break
                for index, frames in enumerate(frames_by_reporter):
                    part = frames[offsets[index]:_chunk_end(load.unit_ends[index], offsets[index], chunk)]
                    if not part:
                        continue
                    backlog.wait_for_room(sent + len(part))
                    each = senders[index]
                    if isinstance(each, FrameSender):
                        each.send(rows[index][offsets[index]:offsets[index] + len(part)])
                    else:
                        each.send([frame for _, frame in part])
                    offsets[index] += len(part)
                    sent += len(part)
                    if progress:
                        progress(len(part))
                    if time.perf_counter() - last_poll > DRAIN_POLL_S:
                        _drain(load.parts, state.token, exported)
                        last_poll = time.perf_counter()
                    ahead = sent / rate - (time.perf_counter() - paced_from)
                    if ahead > 0:
                        time.sleep(ahead)
                    elif ahead < -chunk / rate:  # behind (a stall): at most one chunk back to back, then the rate
                        paced_from -= ahead + chunk / rate
    finally:
        for each in senders:
            each.close()
        backlog.close()
    elapsed = time.perf_counter() - started
    # each reporter sent the first of its reports: tallied once here, not per report while sending
    by_opcode = Counter(report.opcode for reports, offset in zip(load.per_reporter, offsets)
                        for report in reports[:offset])
    return {"sent": by_opcode, "sent_per_reporter": offsets, "seconds": elapsed,
            "rate": sent / elapsed if elapsed else 0,
            "senders": "XDP" if rows else "AF_PACKET TX rings",
            "complete": all(offset == len(frames) for offset, frames in zip(offsets, frames_by_reporter))}


def _drain(parts: list[PrimitiveDemo], token: str, exported: ExportConsumer | None = None) -> None:
    """Take what the drained primitives hold, as a consumer does while reports keep coming: an Append ring that is
    not drained wraps and overwrites (DTA's Append has no backpressure). With `exported`, the collector drains
    its rings into JetStream and the demo takes what the stream brought; else through the query service."""
    for part in parts:
        if part.drained:
            part.take(exported.answer() if exported else collector_http(part.path(), token=token))


def _exported_rest(exported: ExportConsumer, entries_sent: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Once the collector has taken as many entries as were sent (or EXPORTED_WITHIN_S passed) and JetStream has
    acknowledged them all: the rest of the stream as the query service's answer, and the export's figures."""
    deadline = time.monotonic() + EXPORTED_WITHIN_S
    while True:
        status = collector_http("/stats")["export"]
        taken = status["taken"] + status["lost_to_overflow"]
        if (taken >= entries_sent and not status["backlog_messages"]) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    answer = exported.finish(EXPORTED_WITHIN_S)
    figures = {**exported.figures(), "collector_taken": status["taken"], "acknowledged": status["acknowledged"],
               "lost_to_overflow": status["lost_to_overflow"], "dropped_from_backlog": status["dropped_from_backlog"],
               "backlog_entries": status["backlog_entries"], "url": status["url"], "stream": status["stream"]}
    return answer, figures


def lab_tables(state: lab.LabState) -> Tables:
    """The tables the lab's translator gets from its collector: the same [translator] settings and structures
    (addresses and QP numbers made up: they do not reach memory)."""
    config_path = lab.STATE_DIR / "prediction-collector.toml"
    config_path.write_text(lab.collector_config(state))
    config = CollectorConfig.from_toml(config_path)
    adverts = [{"structure": region.name, **region.advertised(),
                "qp": {"remote_qpn": 0x10 + index, "local_qpn": 0x10 + index, "rkey": 1 + index,
                       "base": (1 + index) << 40, "length": region.length,
                       "transport": region.transport.name.lower()}}
               for index, region in enumerate(config.regions())]
    translator = tomllib.loads(lab.translator_settings(state.collector))["translator"]
    return Tables.from_dict(tables_document(translator, {"name": config.name, "ip": lab.COLLECTOR_IP,
                                                         "mac": lab.COLLECTOR_MAC}, adverts))


def predicted_collector(state: lab.LabState, load: Workload, sent_per_reporter: list[int]) -> OfflineCollector:
    """What the collector must hold: the reports each reporter sent, replayed in its order through the reference
    translator into an offline collector laid out as the lab's. The idle flush runs once at the end: Append's
    answers do not depend on when a partial batch left, and a Postcarding path flushed before its last hop is a
    shortfall the comparison must show."""
    reference, offline = Translator(load.tables), OfflineCollector(load.tables)
    for index, (reports, count) in enumerate(zip(load.per_reporter, sent_per_reporter), 1):
        address = state.reporter(index)
        sender = workload.ReporterAddress(mac_bytes(address["mac"]), ip_bytes(address["ip"]),
                                          mac_bytes(lab.TRANSLATOR_MAC), ip_bytes(lab.COLLECTOR_IP))
        for report in reports[:count]:
            for frame in reference.process(sender.frame(report), 0).frames:
                offline.deliver(frame)
    for frame in reference.flush_idle(now_ns=1 << 62, idle_ns=0):
        offline.deliver(frame)
    return offline


def summarize(state: lab.LabState, load: Workload, sent: Counter[int], streamed: dict[str, Any],
              exported: ExportConsumer | None = None) -> tuple[dict[str, Any], list[str]]:
    """Query the collector and compare with the truth; returns the summary and the problems found."""
    stats = engine_stats(lab.PIN_DIR)
    counters = stats["counters"]
    drops = {name: value for name, value in counters.items() if name.startswith("drop_")}
    collector_stats = collector_http("/stats")
    responder = collector_stats.get("responder", {})
    responder_drops = {name: value for name, value in responder.items() if name in RESPONDER_DROPS and value}
    links = link_drops()
    sent_by = [registry.by_opcode(opcode) for opcode in sent]
    summary: dict[str, Any] = {
        "reports_sent": {primitive.name: sent[primitive.opcode] for primitive in sent_by},
        "reports_per_second": round(streamed["rate"]),
        "senders": streamed["senders"],
        "translator": {"received": {primitive.name: counters.get(primitive.rx_counter.name.lower(), 0)
                                    if primitive.rx_counter else 0 for primitive in sent_by},
                       "frames_emitted": counters.get("tx_frames", 0), "nacks": counters.get("tx_nacks", 0),
                       "acks_from_collector": counters.get("rx_acks", 0), "drops": drops,
                       "engine": stats["engine"]},
        "collector": {"executed" if "executed" in responder else "rxe_rcvd_pkts":
                      responder.get("executed", responder.get("rcvd_pkts", 0)), "drops": responder_drops,
                      "fill": {s["name"].split("@")[0]: round(s["fill"], 4) for s in collector_stats["structures"]}},
        "link_drops": links,
    }
    cpu = stats.get("cpu", {})
    run_time = sum(program["run_time_ns"] for program in cpu.values())
    received = counters.get("rx_reports", 0)
    summary["translator"]["cpu_ns_per_report"] = round(run_time / received, 1) if received and run_time else None
    summary["collector"]["replies_sent"] = responder.get("replies_sent", responder.get("sent_pkts", 0))
    summary["translator"]["replies"] = {name: counters.get(name, 0) for name in REPLY_COUNTERS}
    queries = summary["queries"] = {}
    prediction = predicted_collector(state, load, streamed["sent_per_reporter"])
    for part in load.parts:
        count = sent[part.primitive.opcode]
        fields = part.request(count)
        if fields is None:
            continue
        if part.drained and exported is not None:
            answer, summary["export"] = _exported_rest(exported, count)
        else:
            answer = collector_http(part.path(), fields or None, state.token if part.drained else None)
        queries[summary_key(part.primitive)] = part.check(answer, part.answer_from(prediction, fields), count)
    summary["complete"] = streamed["complete"]
    problems = summary["problems"] = verdict(summary)
    return summary, problems


def verdict(summary: dict[str, Any]) -> list[str]:
    """Every shortfall, hop by hop and frame kind by frame kind; every answer that differs from the reference
    translator's prediction; every query below its truth, or more than BELOW_EXPECTED below its expected success.

    Strict: a drop anywhere never excuses a shortfall somewhere else, and any loss at all is a problem (the lab
    runs below the rate where anything should be lost)."""
    problems: list[str] = []
    translator, collector = summary["translator"], summary["collector"]
    export = summary.get("export")
    if export and (export["duplicates_stored"] or export["gaps"] or export["backlog_entries"]
                   or export["entries"] != export["acknowledged"]):
        problems.append(f"export: the collector took {export['collector_taken']:,} Append entries, JetStream "
                        f"acknowledged {export['acknowledged']:,} ({export['backlog_entries']:,} still waiting), the "
                        f"stream brought {export['entries']:,}, with {export['gaps']:,} in gaps and "
                        f"{export['duplicates_stored']:,} messages stored twice")
    sent, received = sum(summary["reports_sent"].values()), sum(translator["received"].values())
    # the python engine's socket drops by reason what its link counts as rx_dropped (full rings)
    socket_drops = {name: count for name, count in translator["engine"].get("io_stats", {}).items()
                    if name in IO_DROPS and count}
    if sent != received:
        problems.append(f"reports: {sent:,} sent, {received:,} reached the translator"
                        f"{'; link drops ' + str(summary['link_drops']) if summary['link_drops'] else ''}"
                        f"{'; of those, the AF_XDP socket ' + str(socket_drops) if socket_drops else ''}")
    if translator["drops"]:
        problems.append(f"the translator dropped reports or replies: {translator['drops']}")
    if collector["drops"]:
        problems.append(f"the collector refused requests: {collector['drops']}")
    replies_taken = sum(translator["replies"].values())
    if collector["replies_sent"] != replies_taken:
        problems.append(f"RC replies: the collector sent {collector['replies_sent']:,}, the translator took "
                        f"{replies_taken:,}")
    queries = summary["queries"]
    for primitive, demo, entry in _entries(queries):
        problems += demo.problems(entry, summary["complete"])
    # Exact: the collector's answers against those from the memory the reference predicts for what was sent.
    for primitive, demo, entry in _entries(queries):
        count = demo.prediction_count(entry)
        if count:
            problems.append(f"{primitive.name}: {count:,} {demo.prediction_unit} differ from the memory the "
                            f"reference translator predicts from the reports sent")
    return problems


def _entries(queries: dict[str, Any]) -> list[tuple[type[Primitive], type[PrimitiveDemo], dict[str, Any]]]:
    """Every primitive with an entry in the summary's queries, its part in the demo and its entry."""
    return [(primitive, primitive.demo, queries[summary_key(primitive)]) for primitive in registry.registered()
            if primitive.demo and summary_key(primitive) in queries]


def _prediction_words(queries: dict[str, Any]) -> str:
    """How the answers compare with the reference translator's prediction: counts that differ, and the rest."""
    counts = [f"{primitive.name} {count:,}" for primitive, demo, entry in _entries(queries)
              if (count := demo.prediction_count(entry)) is not None]
    notes = [note for _, demo, entry in _entries(queries) if (note := demo.prediction_note(entry)) is not None]
    return "; ".join([", ".join(counts), *notes])


def burst(rate: float, seconds: float) -> dict[str, Any]:
    """`seconds` of Key-Write N=2 at `rate` reports/s (0: as fast as the generators go) on the direct path: a
    kernel generator per CPU into the XDP translator, a QP per RX queue, both copies of a report broadcast from
    XDP (no skb) into the XDP responder. Then every key is read back from the collector's memory."""
    from softdta.lab.direct import DirectPath

    with DirectPath(queues=min(2, len(os.sched_getaffinity(0))), redundancy=BURST_COPIES,
                    copies=BURST_COPIES) as direct:
        step = direct.step(rate, seconds)
        return {**step, "seconds": seconds, "rx_queues": direct.queues, "keys": direct.key_write_check()}


def burst_problems(result: dict[str, Any]) -> list[str]:
    """Strict, as the mixed workload's verdict: any loss at all, or keys read back right more than BELOW_EXPECTED
    below the expected rate."""
    problems = []
    if result["lost"]:
        problems.append(f"burst: {result['sent']:,} reports sent, {result['executed']:,} executed; lost "
                        f"{result['lost']}")
    keys = result["keys"]
    if keys["success"] < keys["expected"] - BELOW_EXPECTED:
        problems.append(f"burst: {keys['success']:.2%} of {keys['keys']:,} keys read back right, more than "
                        f"{BELOW_EXPECTED_WORDS} below the expected {expected_words(keys)}")
    return problems


def run(reporters: int = 2, seed: int = 0, scale: float = 1.0, seconds: float = 60.0, keep: bool = False,
        as_json: bool = False, rate: float = DEFAULT_RATE, collector: str = "xdp", engine: str = "xdp",
        burst_rate: float = BURST_RATE, burst_seconds: float = BURST_SECONDS) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console(stderr=as_json)
    kind = "XDP responder" if collector == "xdp" else "soft-RoCE in a QEMU guest"
    translator = "XDP translator" if engine == "xdp" else "python translator on AF_XDP"
    with console.status(f"bringing the lab up (namespaces, {translator}, {kind} collector)"):
        state = lab.up(reporters, collector, engine, export=collector == "xdp")
    exported = ExportConsumer(state.export_url, lab.COLLECTOR_NAME, lab.PREFIX + "c").start() \
        if state.export_url else None
    try:
        load = build_workload(lab_tables(state), reporters, seed, scale)
        total = sum(len(r) for r in load.per_reporter)
        stats_fd = enable_run_stats()
        try:
            with Progress(console=console, transient=as_json) as progress:
                task = progress.add_task(f"streaming {total:,} reports from {reporters} reporters", total=total)
                streamed = stream(state, load, lambda n: progress.advance(task, n), seconds, rate, exported)
            # the idle flush writes out partial batches and paths
            time.sleep(1.0 + lab.flush_idle_ms(collector, engine) / 1e3)
        finally:
            os.close(stats_fd)
        summary, problems = summarize(state, load, streamed["sent"], streamed, exported)
    finally:
        if not keep:
            lab.down()
    summary["burst"] = None
    if burst_seconds and (collector, engine) == ("xdp", "xdp"):
        with console.status(f"burst: {burst_seconds:g} s of Key-Write at "
                            f"{f'{burst_rate:,.0f} reports/s' if burst_rate else 'full speed'} on the direct path"):
            summary["burst"] = burst(burst_rate, burst_seconds)
        problems += burst_problems(summary["burst"])
        summary["problems"] = problems
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        _print(console, summary, Table)
    return 1 if problems else 0


def _print(console: Console, summary: dict[str, Any], Table: type[Table]) -> None:
    reports = Table(title="reports", show_edge=False)
    for column in ("primitive", "sent", "translated"):
        reports.add_column(column, justify="right" if column != "primitive" else "left")
    for name, sent in summary["reports_sent"].items():
        reports.add_row(name, f"{sent:,}", f"{summary['translator']['received'][name]:,}")
    console.print(reports)
    translator, collector = summary["translator"], summary["collector"]
    console.print(f"sent at {summary['reports_per_second']:,} reports/s ({summary['senders']}, paced); "
                  "translator emitted "
                  f"{translator['frames_emitted']:,} RoCEv2 frames, consumed {translator['acks_from_collector']:,} "
                  f"RC ACKs, {translator['cpu_ns_per_report'] or '?'} ns of "
                  + ("XDP (its devmap and tc stages too)" if translator["engine"]["name"] == "xdp" else "python engine")
                  + " CPU per report")
    console.print(f"drops: translator {translator['drops'] or 'none'}, collector {collector['drops'] or 'none'}, "
                  f"links {summary['link_drops'] or 'none'}")
    received = (f"executed {collector['executed']:,} requests" if "executed" in collector else
                f"(rxe) received {collector['rxe_rcvd_pkts']:,} packets")
    console.print(f"collector {received}; fill {collector['fill']}")
    if summary.get("export"):
        export = summary["export"]
        console.print(f"export: {export['messages']:,} messages with {export['entries']:,} Append entries read back "
                      f"from JetStream stream {export['stream']} ({export['url']}), {export['duplicates_stored']} "
                      f"stored twice, {export['gaps']:,} entries in gaps; the collector took "
                      f"{export['collector_taken']:,}, JetStream acknowledged {export['acknowledged']:,}")
    queries = Table(title="queries against the truth", show_edge=False)
    queries.add_column("structure")
    queries.add_column("result")
    q = summary["queries"]
    for primitive, demo, entry in _entries(q):
        queries.add_row(primitive.name, demo.row(entry))
    console.print(queries)
    console.print(f"answers that differ from the reference translator's prediction: {_prediction_words(q)}")
    if summary["burst"]:
        result, keys = summary["burst"], summary["burst"]["keys"]
        console.print(f"burst: {result['sent']:,} Key-Write N={BURST_COPIES} reports in {result['seconds']:g} s "
                      f"({result['achieved']:,}/s) from {result['rx_queues']} kernel generators through the XDP "
                      f"translator (a QP per RX queue, copies broadcast from XDP) into the XDP responder; WRITEs "
                      f"executed "
                      f"{result['executed']:,}, lost {result['lost'] or 'none'}; {keys['correct']:,} of "
                      f"{keys['keys']:,} keys read back right ({keys['success']:.2%}, expected {expected_words(keys)})")
    if summary["problems"]:
        console.print("[bold red]problems:[/] " + "; ".join(summary["problems"]))
    else:
        console.print("[bold green]everything sent is accounted for; every answer is the one the reference "
                      "translator predicts, and no query is below its truth or more than "
                      f"{BELOW_EXPECTED_WORDS} below its expected success")
