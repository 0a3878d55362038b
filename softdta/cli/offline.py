"""Commands that work on pcaps, with no network: `translate`, `decode` and `report`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from softdta.cli.common import CliError, Commands, add_command, print_summary
from softdta.core import registry, workload
from softdta.core.fleet import SlotMap
from softdta.core.fleet_reporter import address as fleet_address
from softdta.core.tables import Tables
from softdta.core.translator import Translator
from softdta.engines.engine import Engine
from softdta.spec import DTA_NACK_PORT, DTA_PORT, ROCE_PORT, RoceOpcode
from softdta.wire.codec import WireError
from softdta.wire.dta import Profile, Report, decode, decode_nack
from softdta.wire.frames import ip_bytes, ip_str, mac_bytes, mac_str, parse_udp_frame
from softdta.wire.pcap import Packet, read_pcap, write_pcap
from softdta.wire.roce import describe_aeth, parse_roce

if TYPE_CHECKING:
    from softdta.core.offline import OfflineCollector
    from softdta.kernel.tx_ring import SendResult


def register(commands: Commands) -> None:
    """Add the offline command(s) to the `softdta` parser."""
    translate = add_command(commands, "translate", "translate a pcap of DTA reports into the RoCEv2 frames a "
                            "translator sends for them, with no network",
                            "Shows the counters of what was translated or dropped, and why.")
    translate.add_argument("--tables", required=True, help="translator tables (TOML, see docs/tables.md)")
    translate.add_argument("--in", dest="input", required=True, help="pcap of Ethernet frames carrying DTA reports")
    translate.add_argument("--out", required=True, help="pcap to write the RoCEv2 frames and NACKs to")
    translate.add_argument("--flush", action="store_true", help="at the end, also write out partial Append batches "
                                                                "and incomplete Postcarding paths")
    translate.add_argument("--with-collector", action="store_true",
                           help="also deliver the frames to a collector model (the reference responder), write its "
                                "ACKs to the pcap, and show what it holds")
    translate.add_argument("--json", action="store_true", help="print the summary as JSON")
    translate.add_argument("--engine", choices=["reference", "xdp"], default="reference",
                           help="reference (default): the Python model; xdp: the kernel fast path, run on each frame "
                                "with BPF_PROG_TEST_RUN (root)")
    translate.set_defaults(run=_translate)

    dissect = add_command(commands, "decode", "show what each frame of a pcap is (DTA report, NACK, RoCEv2 request "
                          "or reply) and flag bad iCRCs and lengths",
                          "Exits 1 if any frame has a problem.")
    dissect.add_argument("pcap", help="the pcap to read")
    dissect.add_argument("--profile", choices=[p.value for p in Profile], default=Profile.DTA_V1.value,
                         help="the DTA header layout the reports use (default %(default)s)")
    dissect.add_argument("--json", action="store_true", help="print one JSON object per frame")
    dissect.set_defaults(run=_decode)

    report = add_command(commands, "report", "make DTA reports of one primitive: write them to a pcap, or send "
                         "them out of an interface to a translator (root), or from a UDP socket",
                         "Give --out, --interface or --udp.")
    report.add_argument("primitive", choices=[primitive.name for primitive in registry.registered()],
                        help="which primitive's reports to make")
    report.add_argument("--out", help="write the reports to this pcap")
    report.add_argument("--interface", "-i", help="send the reports out of this interface instead (root)")
    report.add_argument("--udp", action="store_true",
                        help="send each report in a UDP datagram from an ordinary socket to port 40040 of its "
                             "collector instead (no root: the kernel routes it, through the translator)")
    report.add_argument("--netns", help="with --interface: the interface's network namespace")
    report.add_argument("--engine", choices=("kernel", "python"), default="kernel",
                        help="with --interface: kernel (default) sends at kernel speed (BPF_PROG_TEST_RUN live "
                             "frames: the first report as a template, its key, data and seqnum varied per report); "
                             "python sends the workload's reports from an AF_PACKET TX ring")
    report.add_argument("--rate", type=float, default=0, help="with --interface: reports/s at most (0, the default: "
                                                              "as fast as the engine goes)")
    report.add_argument("--duration", type=float, help="with --interface: send for this many seconds instead of "
                                                       "--count reports")
    report.add_argument("--keys", type=int, default=1024,
                        help="with --engine kernel: distinct keys to cycle over (default %(default)s)")
    report.add_argument("--count", type=int, default=100,
                        help="how many reports (flows for postcarding; default %(default)s)")
    report.add_argument("--seed", type=int, default=0, help="seed of the random keys, data and paths: the same "
                                                            "seed makes the same reports (default %(default)s)")
    report.add_argument("--profile", choices=[p.value for p in Profile], default=Profile.DTA_V1.value,
                        help="the DTA header layout to write (default %(default)s)")
    report.add_argument("--collector", default="10.77.1.1",
                        help="the reports' destination IP: the collector's (default %(default)s)")
    report.add_argument("--fleet-map", metavar="FILE",
                        help="a fleet's slot map (JSON, as the fleet controller writes it): each report goes to its "
                             "slot's collector instead of --collector (docs/fleet.md)")
    report.add_argument("--across", action="store_true",
                        help="with --fleet-map: key-write and key-increment reports go to every replica of their "
                             "slot that holds one of their copies, not all copies to the first")
    report.add_argument("--reporter", default="10.77.9.1", help="the reports' source IP (default %(default)s)")
    report.add_argument("--reporter-mac", default="02:5d:7a:00:09:01",
                        help="the reports' source MAC (default %(default)s)")
    report.add_argument("--translator-mac", default="02:5d:7a:00:00:01",
                        help="the reports' destination MAC: the next hop, the translator (default %(default)s)")
    report.add_argument("--redundancy", "-n", type=int, default=2,
                        help="key-write, key-increment: how many copies of each key the collector keeps "
                             "(default %(default)s)")
    report.add_argument("--key-len", type=int, default=4,
                        help="key-write: key bytes (not 4: the extended header; default %(default)s)")
    report.add_argument("--data-len", type=int, default=4,
                        help="key-write: data bytes (not 4: the extended header; default %(default)s)")
    report.add_argument("--lists", type=int, default=4,
                        help="append: how many lists the reports spread over (default %(default)s)")
    report.add_argument("--hops", type=int, default=5,
                        help="postcarding: switches on each flow's path, one postcard each (default %(default)s)")
    report.add_argument("--columns", type=int, default=64,
                        help="sketch-merge: columns of each reporter's sketch (default %(default)s)")
    report.add_argument("--rows", type=int, default=4,
                        help="sketch-merge: rows of each reporter's sketch (default %(default)s)")
    report.add_argument("--reporters", type=int, default=2,
                        help="sketch-merge: how many reporters send their sketch (default %(default)s)")
    report.add_argument("--interval-us", type=float, default=1.0,
                        help="with --out: microseconds between the reports' timestamps (default %(default)s)")
    report.set_defaults(run=_report)


def _offline_engine(args: argparse.Namespace, tables: Tables) -> Engine:
    if args.engine == "reference":
        return Translator(tables)
    from softdta.engines.xdp import XdpTranslator
    from softdta.kernel.programs import EngineError
    try:
        return XdpTranslator(tables, flush_idle_ns=0)
    except EngineError as error:
        raise CliError(f"{error}; --engine xdp needs root and clang (run `make setup`)") from None


def _translate(args: argparse.Namespace) -> int:
    tables = Tables.from_toml(args.tables)
    translator = _offline_engine(args, tables)
    collector = _offline_collector(tables) if args.with_collector else None
    written: list[Packet] = []
    deferred = 0
    now_ns = 0
    for packet in read_pcap(args.input):
        now_ns = packet.timestamp_ns
        out = translator.process(packet.frame, now_ns)
        deferred += out.deferred
        emitted = out.frames + out.to_reporter
        written += [Packet(now_ns, frame) for frame in emitted]
        if collector:
            for frame in out.frames:
                for reply in collector.deliver(frame):
                    written.append(Packet(now_ns, reply))
                    translator.process(reply, now_ns)
    if args.flush:
        for frame in translator.flush_idle(now_ns):
            written.append(Packet(now_ns, frame))
            if collector:
                collector.deliver(frame)
    write_pcap(args.out, written)
    summary = {"engine": args.engine,
               "counters": {c.name.lower(): n for c, n in sorted(translator.counts().items()) if n},
               "frames_written": len(written), "deferred_to_userspace": deferred}
    if collector:
        summary["collector"] = collector.counters()
    print_summary(summary, args.json)
    return 0


def _offline_collector(tables: Tables) -> OfflineCollector:
    from softdta.core.offline import OfflineCollector
    return OfflineCollector(tables)


def dissect_frame(frame: bytes, profile: Profile) -> dict[str, Any]:
    """One frame as a dict; `problems` lists what is wrong with it (empty when it is well formed)."""
    try:
        udp = parse_udp_frame(frame)
    except WireError as error:
        return {"kind": "other", "problems": [] if error.reason == "NOT_UDP" else [str(error)]}
    info: dict[str, Any] = {"src": ip_str(udp.src_ip), "dst": ip_str(udp.dst_ip), "eth_src": mac_str(udp.eth["src"]),
                  "eth_dst": mac_str(udp.eth["dst"]), "problems": []}
    dport = udp.udp["dport"]
    try:
        if dport == DTA_PORT:
            report = decode(udp.payload, profile)
            info["kind"] = "dta"
            info["report"] = {k: (v.hex() if isinstance(v, bytes) else v.name if hasattr(v, "name") else v)
                              for k, v in report.__dict__.items()}
        elif dport == DTA_NACK_PORT:
            nack = decode_nack(udp.payload)
            info.update(kind="dta-nack", nack={"kind": nack.kind.name, "value": nack.value, "reporter": nack.reporter})
        elif dport == ROCE_PORT:
            roce = parse_roce(frame, udp)
            info.update(kind="roce", opcode=RoceOpcode(roce.opcode).name, dest_qp=roce.bth["dest_qp"],
                        psn=roce.bth["psn"], ack_req=roce.bth["ack_req"], payload_len=len(roce.payload),
                        icrc=roce.icrc.hex(), headers=roce.headers)
            if "aeth" in roce.headers:
                info["aeth"] = describe_aeth(roce.headers["aeth"]["syndrome"])
            if not roce.icrc_ok:
                info["problems"].append("bad iCRC")
            reth = roce.headers.get("reth")
            if reth and reth["dma_length"] != len(roce.payload):
                info["problems"].append(f"RETH DMA length {reth['dma_length']} != payload {len(roce.payload)}")
        else:
            info["kind"] = "udp"
    except WireError as error:
        info.setdefault("kind", {DTA_PORT: "dta", DTA_NACK_PORT: "dta-nack", ROCE_PORT: "roce"}[dport])
        info["problems"].append(f"{error.reason.lower()}: {error}")
    return info


def _decode(args: argparse.Namespace) -> int:
    profile = Profile(args.profile)
    flagged = 0
    for number, packet in enumerate(read_pcap(args.pcap), 1):
        info = dissect_frame(packet.frame, profile)
        flagged += bool(info["problems"])
        if args.json:
            print(json.dumps({"frame": number, "time_ns": packet.timestamp_ns, **info}))
            continue
        print(f"{number:6} {_one_line(info)}")
    if not args.json:
        print(f"{flagged} frame(s) with problems", file=sys.stderr)
    return 1 if flagged else 0


def _one_line(info: dict[str, Any]) -> str:
    problems = f"  !! {'; '.join(info['problems'])}" if info["problems"] else ""
    route = f"{info.get('src', '?')} -> {info.get('dst', '?')}"
    if info["kind"] == "dta" and "report" in info:
        report = info["report"]
        fields = {k: v for k, v in report.items() if v not in (0, "", (), False) and k != "opcode"}
        return f"DTA  {route} {report['opcode']} {fields}{problems}"
    if info["kind"] == "roce" and "opcode" in info:
        detail = info.get("aeth") or " ".join(
            f"{k}=0x{v:x}" if k in ("va", "rkey") else f"{k}={v}" for h in info["headers"].values()
            for k, v in h.items() if k in ("va", "rkey", "dma_length", "swap_add", "immediate"))
        return (f"RoCE {route} {info['opcode']} qp=0x{info['dest_qp']:x} psn={info['psn']} {detail} "
                f"payload={info['payload_len']}B{problems}")
    if info["kind"] == "dta-nack" and "nack" in info:
        return f"NACK {route} {info['nack']}{problems}"
    return f"{info['kind']:4} {route}{problems}"


def _report(args: argparse.Namespace) -> int:
    profile = Profile(args.profile)
    address = workload.ReporterAddress(mac=mac_bytes(args.reporter_mac), ip=ip_bytes(args.reporter),
                                       translator_mac=mac_bytes(args.translator_mac),
                                       collector_ip=ip_bytes(args.collector))
    if args.count < 1:
        raise CliError(f"--count {args.count}: give at least 1 report")
    count = 1 if args.interface and args.engine == "kernel" else args.count  # the kernel engine needs a template
    params = workload.WorkloadParams(count, args.seed, args.redundancy, args.key_len, args.data_len,
                                     lists=args.lists, hops=args.hops, reporters=args.reporters,
                                     columns=args.columns, rows=args.rows)
    try:
        reports = registry.by_name(args.primitive).workload(params)
        frames = [address.frame(report, profile) for report in reports]
    except ValueError as error:
        raise CliError(str(error)) from None
    if [bool(args.out), bool(args.interface), args.udp].count(True) != 1:
        raise CliError("give one of --out FILE (write a pcap), --interface IF (send on the wire) or --udp (send "
                       "from a socket)")
    slot_map = _slot_map(args)
    if args.udp:
        return _send_udp(reports, slot_map, args)
    if slot_map is not None and not (args.interface and args.engine == "kernel"):
        frames = [replace(address, collector_ip=each.collector).frame(each.report, profile) for report in reports
                  for each in fleet_address(slot_map, report, copies_across=args.across)]
    if args.interface:
        return _send_reports(reports, frames, slot_map, args)
    step = int(args.interval_us * 1000)
    written = write_pcap(args.out, (Packet(i * step, frame) for i, frame in enumerate(frames)))
    print(f"wrote {written} {args.primitive} reports to {args.out}")
    return 0


def _slot_map(args: argparse.Namespace) -> SlotMap | None:
    if args.fleet_map is None:
        if args.across:
            raise CliError("--across applies to a fleet: give its slot map with --fleet-map FILE")
        return None
    try:
        with open(args.fleet_map, "rb") as file:
            return SlotMap.from_json(file.read())
    except OSError as error:
        raise CliError(f"cannot read the slot map {args.fleet_map}: {error.strerror}; give the file the fleet "
                       "controller wrote") from None


def _send_udp(reports: list[Report], slot_map: SlotMap | None, args: argparse.Namespace) -> int:
    import itertools
    import time

    from softdta.kernel.udp_reporter import UdpReporter
    if args.rate < 0:
        raise CliError(f"--rate {args.rate} must be 0 (as fast as possible) or more reports/s")
    if args.duration is not None and args.duration <= 0:
        raise CliError(f"--duration {args.duration} must be positive; give the seconds to send for")
    with UdpReporter(slot_map=slot_map, collector=None if slot_map else args.collector,
                     profile=Profile(args.profile), copies_across=args.across) as reporter:
        started, sent = time.perf_counter(), 0
        for report in itertools.cycle(reports) if args.duration else reports:
            if args.duration and time.perf_counter() - started >= args.duration:
                break
            reporter.send(report)
            sent += 1
            ahead = sent / args.rate - (time.perf_counter() - started) if args.rate else 0
            if ahead > 0:
                time.sleep(ahead)
        seconds = time.perf_counter() - started
    spread = ", ".join(f"{count} to {collector}" for collector, count in sorted(reporter.sent.items()))
    print(f"sent {sent} {args.primitive} reports in {sum(reporter.sent.values())} datagrams in {seconds:.3f} s "
          f"({spread})")
    return 0


def _send_reports(reports: list[Report], frames: list[bytes], slot_map: SlotMap | None,
                  args: argparse.Namespace) -> int:
    if args.duration is not None and args.duration <= 0:
        raise CliError(f"--duration {args.duration} must be positive; give the seconds to send for")
    if args.rate < 0:
        raise CliError(f"--rate {args.rate} must be 0 (as fast as possible) or more reports/s")
    try:
        if args.engine == "kernel":
            result = _send_kernel(reports[0], frames[0], slot_map, args)
        else:
            result = _send_ring(frames, args)
    except PermissionError as error:
        raise CliError(f"{error}; sending needs root (CAP_NET_RAW, CAP_SYS_ADMIN)") from None
    print(f"sent {result.frames} {args.primitive} reports out of {args.interface} in {result.seconds:.3f} s "
          f"({result.rate:,.0f} reports/s, {args.engine} engine)")
    return 0


def _send_kernel(template: Report, frame: bytes, slot_map: SlotMap | None, args: argparse.Namespace) -> SendResult:
    from softdta.core.generator import plan
    from softdta.kernel.generator import KernelReporter
    if args.across:
        raise CliError("the kernel generator sends each report to its slot's first replica only; for --across "
                       "use --engine python or --udp")
    generator = plan(template, frame, Profile(args.profile), key_span=args.keys, slot_map=slot_map)
    with KernelReporter(generator, args.interface, args.netns) as reporter:
        if not reporter.linked:
            print("softdta: note: the generator could not link to lo (another XDP program there?), so each of its "
                  "calls waits for two RCU grace periods (docs/lab.md); sending goes on, slower", file=sys.stderr)
        return reporter.run(rate=args.rate, count=None if args.duration else args.count, seconds=args.duration)


def _send_ring(frames: list[bytes], args: argparse.Namespace) -> SendResult:
    import itertools
    import time

    from softdta.kernel.tx_ring import RingReporter
    batch, sent = 256, 0
    with RingReporter(args.interface, args.netns, batch) as ring:
        started = time.perf_counter()
        # with --duration, the workload's frames over and over
        chunks = itertools.cycle(range(0, len(frames), batch)) if args.duration else range(0, len(frames), batch)
        for first in chunks:
            if args.duration and time.perf_counter() - started >= args.duration:
                break
            sent += ring.send(frames[first:first + batch]).frames
            ahead = sent / args.rate - (time.perf_counter() - started) if args.rate else 0
            if ahead > 0:
                time.sleep(ahead)
        return SendResult(sent, time.perf_counter() - started)
