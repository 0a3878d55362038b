"""The XDP translator live: the highest rate it translates without loss, in the lab (reporter -> bridge ->
translator -> collector) from a TX ring or from the kernel report generator, and on the direct path
(softdta.lab.direct: generators -> veth -> XDP translator -> veth -> XDP responder), each direct figure beside the
floor: the same path with a bare forwarder and sink."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NotRequired, TypedDict

from softdta.core import workload
from softdta.wire import dta
from softdta.wire.frames import ip_bytes, mac_bytes

if TYPE_CHECKING:
    from softdta.lab.direct import HopCounts, StepResult
    from softdta.lab.topology import LabState


class LabStep(TypedDict):
    """One offered rate in the lab, from a TX ring."""

    offered: float
    achieved: int
    sent: int
    translated: int
    link_drops: int
    lossless: bool


class LiveLab(TypedDict):
    steps: list[LabStep]
    max_lossless_reports_per_s: int


class LiveKernelGenerator(TypedDict):
    primitive: str
    generator: str
    seconds_per_step: float
    steps: list[StepResult]
    max_lossless_reports_per_s: int


class LiveDirect(TypedDict):
    primitive: str
    structure_redundancy: int
    path: str
    rx_queues: int
    seconds_per_step: float
    steps: list[StepResult]
    max_lossless_reports_per_s: int
    frames_per_report: int
    profiled_step: StepResult | None
    fraction_of_floor: NotRequired[float]  # frames/s, of the floor's on as many RX queues


def _lab_sender(state: LabState) -> workload.ReporterAddress:
    """The addresses the reports of the lab's first reporter carry."""
    from softdta.lab import topology as lab
    address = state.reporter(1)
    return workload.ReporterAddress(mac_bytes(address["mac"]), ip_bytes(address["ip"]),
                                    mac_bytes(lab.TRANSLATOR_MAC), ip_bytes(lab.COLLECTOR_IP))


def translator_live(reports_per_step: int, rates: list[float]) -> LiveLab:
    """The XDP translator live in the lab (reporter -> bridge -> translator -> collector): at each offered rate,
    Key-Write N=2 reports from one TX-ring reporter, and whether all of them were translated without loss."""
    from softdta.engines.xdp import pinned_stats
    from softdta.kernel.tx_ring import RingReporter
    from softdta.lab import topology as lab
    from softdta.lab.demo import link_drops
    steps: list[LabStep] = []
    state = lab.up(1)
    try:
        address, sender = state.reporter(1), _lab_sender(state)
        frames = [sender.frame(report) for report in workload.key_write(reports_per_step, 9, 2, 13, 20)]
        with RingReporter(address["interface"], address["netns"], 256) as ring:
            for rate in rates:
                before = pinned_stats(lab.PIN_DIR)["counters"].get("rx_reports", 0)
                drops_before = sum(link_drops().values())
                started = time.perf_counter()
                for first in range(0, len(frames), 64):
                    ring.send(frames[first:first + 64])
                    ahead = (first + 64) / rate - (time.perf_counter() - started)
                    if ahead > 0:
                        time.sleep(ahead)
                elapsed = time.perf_counter() - started
                deadline = time.monotonic() + 3.0  # the last reports may still be on their way
                while True:
                    received = pinned_stats(lab.PIN_DIR)["counters"].get("rx_reports", 0) - before
                    if received >= len(frames) or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
                lost = sum(link_drops().values()) - drops_before
                # lossless: every report translated, and no link (reporter, translator or collector side) dropped
                # anything: a dropped RoCEv2 write or ACK is a loss too
                steps.append({"offered": rate, "achieved": round(len(frames) / elapsed), "sent": len(frames),
                              "translated": received, "link_drops": lost,
                              "lossless": received == len(frames) and lost == 0})
    finally:
        lab.down()
    lossless = [step["achieved"] for step in steps if step["lossless"]]
    return {"steps": steps, "max_lossless_reports_per_s": max(lossless) if lossless else 0}


def translator_live_kernel(rates: list[float], seconds: float = 1.0, keys: int = 4096) -> LiveKernelGenerator:
    """The lab at kernel speed: Key-Write N=1 from the kernel report generator (reporter -> bridge -> XDP
    translator -> XDP responder). Each step offers `seconds` of reports at a rate, and is lossless when every report
    was translated and executed at the collector, and no link dropped a frame. The rate rises until the first
    lossy step, which says where the loss began."""
    from softdta.core.generator import plan
    from softdta.engines.xdp import pinned_stats
    from softdta.kernel.generator import KernelReporter
    from softdta.lab import topology as lab
    from softdta.lab.demo import collector_http, link_drops
    from softdta.lab.direct import losses

    def counts() -> HopCounts:
        translator = pinned_stats(lab.PIN_DIR)["counters"]
        responder = collector_http("/stats").get("responder", {})
        return {"translated": translator.get("rx_reports", 0), "emitted": translator.get("tx_frames", 0),
                "translator_drops": sum(n for name, n in translator.items() if name.startswith("drop_")),
                "executed": responder.get("executed", 0), "links": link_drops()}

    steps: list[StepResult] = []
    state = lab.up(1)
    try:
        address, sender = state.reporter(1), _lab_sender(state)
        # the lab's Key-Write structure holds 13-byte keys and 20-byte data (the demo's INT path tracing)
        template = dta.key_write(bytes(range(13)), bytes(20), 1, extended=True)
        with KernelReporter(plan(template, sender.frame(template), key_span=keys), address["interface"],
                            address["netns"]) as reporter:
            for rate in rates:
                before = counts()
                sent = reporter.run(rate=rate, seconds=seconds)
                deadline = time.monotonic() + 3.0  # the last reports may still be on their way
                while True:
                    after = counts()
                    done = after["executed"] - before["executed"] >= sent.frames
                    if done or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
                lost = losses(before, after, sent.frames)
                steps.append({"offered": rate, "achieved": round(sent.rate), "sent": sent.frames,
                              "executed": after["executed"] - before["executed"], "lost": lost,
                              "lossless": not lost})
                if lost:
                    break
    finally:
        lab.down()
    lossless = [step["achieved"] for step in steps if step["lossless"]]
    return {"primitive": "key-write N=1", "generator": "kernel", "seconds_per_step": seconds, "steps": steps,
            "max_lossless_reports_per_s": max(lossless) if lossless else 0}


def translator_live_direct(rates: list[float], seconds: float = 1.0, queues: int = 2, keys: int = 4096,
                           redundancy: int = 1, bare: bool = False, copies: int = 1,
                           via_tc: bool = False) -> LiveDirect:
    """Key-Write N=`copies` at kernel speed on the direct path (softdta.lab.direct: generators -> veth -> XDP translator
    -> veth -> XDP responder, no bridge). Each step offers `seconds` of reports at a rate (0: as fast as the
    generators go), and is lossless when every report was translated and executed and no link dropped a frame.
    The rate rises until the first lossy step, which says where the loss began; one more step at the highest
    lossless rate says where the CPU goes.

    The Key-Write structure takes `redundancy` copies at most: at 1 its frames leave with a redirect, above that
    as one broadcast to a devmap, or with `via_tc` through the tc stage (docs/translator.md). `bare`: the floor
    (softdta.lab.direct). Rates count reports; each makes `copies` frames and WRITEs."""
    from softdta.lab.direct import DirectPath

    steps: list[StepResult] = []
    profile = None
    with DirectPath(queues, keys, redundancy, bare=bare, copies=copies, via_tc=via_tc) as direct:
        for rate in rates:
            steps.append(direct.step(rate, seconds))
            if not steps[-1]["lossless"]:
                break
        lossless = [each["achieved"] for each in steps if each["lossless"]]
        if lossless:
            profile = direct.step(max(lossless), seconds, profiled=True)
    lossless = [each["achieved"] for each in steps if each["lossless"]]
    path = ("bare forwarder (MACs, WRITE length, redirect) -> veth -> sink (count, drop)" if bare else
            "XDP translator" + (" -> tc stage" if via_tc and redundancy > 1 else " -> devmap broadcast"
                                if redundancy > 1 else "") + " -> veth -> XDP responder")
    return {"primitive": f"key-write N={copies}", "structure_redundancy": redundancy,
            "path": f"generator -> veth -> {path}",
            "rx_queues": queues, "seconds_per_step": seconds, "steps": steps,
            "max_lossless_reports_per_s": max(lossless) if lossless else 0, "frames_per_report": copies,
            "profiled_step": profile}


def with_floor_fractions(direct: dict[str, LiveDirect]) -> dict[str, LiveDirect]:
    """Each figure of the direct path in frames/s as a fraction of the floor's on as many RX queues (entries named
    `_floor`, a frame per report)."""
    floors = {entry["rx_queues"]: entry["max_lossless_reports_per_s"] for name, entry in direct.items()
              if name.endswith("_floor")}
    for name, entry in direct.items():
        floor = floors.get(entry["rx_queues"])
        if not name.endswith("_floor") and floor:
            entry["fraction_of_floor"] = round(entry["max_lossless_reports_per_s"] * entry["frames_per_report"] / floor,
                                               3)
    return direct
