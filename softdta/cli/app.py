"""The `softdta` command line: offline translation, dissection, report generation, code generation, demo."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from softdta.core import workload
from softdta.core.control_plane import DEFAULT_FLUSH_IDLE_NS
from softdta.core.tables import TableError, Tables
from softdta.core.translator import Translator
from softdta.engines.engine import Engine
from softdta.engines.xdp import DEFAULT_PIN_DIR
from softdta.errors import SoftdtaError
from softdta.links.source import TablesFile, TableSource
from softdta.spec import DTA_NACK_PORT, DTA_PORT, ROCE_PORT, QpState, RoceOpcode
from softdta.wire.codec import WireError
from softdta.wire.dta import Profile, decode, decode_nack
from softdta.wire.frames import ip_bytes, ip_str, mac_bytes, mac_str, parse_udp_frame
from softdta.wire.pcap import Packet, read_pcap, write_pcap
from softdta.wire.roce import describe_aeth, parse_roce

REPO_ROOT = Path(__file__).resolve().parents[2]


class CliError(SoftdtaError):
    """A user-facing error: the message names the problem and the fix."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except SoftdtaError as error:
        print(f"softdta: error: {error.line()}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"softdta: error: {error.filename}: no such file; check the path", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="softdta", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    translate = commands.add_parser("translate", help="run the reference translator over a pcap of DTA reports")
    translate.add_argument("--tables", required=True, help="translator tables (TOML, see docs/tables.md)")
    translate.add_argument("--in", dest="input", required=True, help="pcap of Ethernet frames carrying DTA reports")
    translate.add_argument("--out", required=True, help="pcap to write RoCEv2 frames and NACKs to")
    translate.add_argument("--flush", action="store_true", help="write out partial Append batches and "
                                                                "incomplete Postcarding paths at the end")
    translate.add_argument("--with-collector", action="store_true",
                           help="also feed the frames to the reference responder and show what it holds")
    translate.add_argument("--json", action="store_true", help="print the summary as JSON")
    translate.add_argument("--engine", choices=["reference", "xdp"], default="reference",
                           help="reference: the Python model; xdp: the kernel fast path via BPF_PROG_TEST_RUN (root)")
    translate.set_defaults(run=_translate)

    translator = commands.add_parser("translator", help="run the XDP translator on interfaces and inspect it")
    actions = translator.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="attach the fast path and run its control loop until interrupted "
                                       "(SIGHUP reloads the tables live)")
    up.add_argument("--tables", required=True, help="translator tables (TOML, see docs/tables.md)")
    up.add_argument("--interface", "-i", action="append", required=True,
                    help="interface to translate on (repeat for several: reports in, collectors out)")
    up.add_argument("--mode", choices=["native", "generic"], default="native", help="XDP attach mode")
    up.add_argument("--allow-multiqueue", action="store_true",
                    help="attach to multi-queue interfaces whose DTA traffic is steered to one RX queue")
    up.add_argument("--pin", default=str(DEFAULT_PIN_DIR),
                    help="bpffs directory for the maps, so a restart keeps PSNs, heads and caches")
    up.add_argument("--flush-idle-ms", type=float, default=DEFAULT_FLUSH_IDLE_NS / 1e6,
                    help="write out partial Append batches and Postcarding paths idle this long")
    up.add_argument("--netns", help="run in this network namespace (unlike `ip netns exec`, keeps the host's bpffs)")
    up.add_argument("--engine", choices=["xdp", "python"], default="xdp",
                    help="xdp: the kernel fast path; python: the reference translator (and plug-in primitives) "
                         "on AF_XDP, one interface (docs/primitives.md)")
    up.add_argument("--primitive", action="append", default=[], metavar="MODULE:CLASS",
                    help="--engine python: add this plug-in primitive (repeat for several), e.g. "
                         "softdta.plugins.latency_sum:LatencySum")
    up.add_argument("--io", choices=["auto", "af_xdp", "af_packet"], default="auto",
                    help="--engine python: packet I/O (auto: AF_XDP, else an AF_PACKET TPACKET_V3 ring)")
    up.set_defaults(run=_translator_up)
    stats = actions.add_parser("stats", help="counters and QP state of a running (or stopped) translator")
    stats.add_argument("--pin", default=str(DEFAULT_PIN_DIR))
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(run=_translator_stats)
    up.add_argument("--collector", action="append", default=[], metavar="HOST:PORT",
                    help="take the structures from this collector's control service (repeat for several); "
                         "--tables then needs only its [translator] section")
    up.add_argument("--token", default="", help="the collectors' control token")
    up.add_argument("--collector-ca", metavar="PEM",
                    help="speak TLS to the collectors, whose certificates this CA signed (docs/control.md)")
    up.add_argument("--collector-cert", metavar="PEM", help="with --collector-ca: this translator's certificate, for "
                                                           "collectors that require one")
    up.add_argument("--collector-key", metavar="PEM", help="with --collector-cert: its private key")
    up.add_argument("--collector-cm", action="append", default=[], metavar="IP:PORT,kind=K[,list=N][,batch=B]",
                    help="connect over rdma_cm to a collector written for the original DTA, one listening port per "
                         "structure (kind: key-write, key-increment, postcarding, append); repeat for each port. "
                         "--tables then needs only its [translator] section (docs/drop-in.md)")
    down = actions.add_parser("down", help="detach the fast path from interfaces; --forget drops its state")
    down.add_argument("--interface", "-i", action="append", default=[])
    down.add_argument("--pin", default=str(DEFAULT_PIN_DIR))
    down.add_argument("--forget", action="store_true", help="also remove the pinned maps (PSNs restart)")
    down.set_defaults(run=_translator_down)

    dissect = commands.add_parser("decode", help="dissect DTA and RoCEv2 frames; flag bad iCRCs and lengths")
    dissect.add_argument("pcap")
    dissect.add_argument("--profile", choices=[p.value for p in Profile], default=Profile.DTA_V1.value)
    dissect.add_argument("--json", action="store_true", help="one JSON object per frame")
    dissect.set_defaults(run=_decode)

    report = commands.add_parser("report", help="write DTA reports to a pcap")
    report.add_argument("primitive", choices=["key-write", "key-increment", "append", "postcarding", "sketch-merge"])
    report.add_argument("--out", help="write the reports to this pcap")
    report.add_argument("--interface", help="send the reports out of this interface instead (AF_PACKET TX ring)")
    report.add_argument("--netns", help="with --interface: the interface's network namespace")
    report.add_argument("--rate", type=float, default=0, help="with --interface: reports/s at most (0: as fast "
                                                              "as the ring goes)")
    report.add_argument("--count", type=int, default=100, help="reports (flows for postcarding)")
    report.add_argument("--seed", type=int, default=0)
    report.add_argument("--profile", choices=[p.value for p in Profile], default=Profile.DTA_V1.value)
    report.add_argument("--collector", default="10.77.1.1", help="collector IP (the reports' destination)")
    report.add_argument("--reporter", default="10.77.9.1", help="reporter IP")
    report.add_argument("--reporter-mac", default="02:5d:7a:00:09:01")
    report.add_argument("--translator-mac", default="02:5d:7a:00:00:01", help="next hop: the translator")
    report.add_argument("--redundancy", "-n", type=int, default=2)
    report.add_argument("--key-len", type=int, default=4)
    report.add_argument("--data-len", type=int, default=4)
    report.add_argument("--lists", type=int, default=4)
    report.add_argument("--hops", type=int, default=5)
    report.add_argument("--columns", type=int, default=64)
    report.add_argument("--rows", type=int, default=4)
    report.add_argument("--reporters", type=int, default=2)
    report.add_argument("--interval-us", type=float, default=1.0, help="timestamp spacing in the pcap")
    report.set_defaults(run=_report)

    collector = commands.add_parser("collector", help="host DTA structures and serve queries")
    collector_actions = collector.add_subparsers(dest="action", required=True)
    collector_up = collector_actions.add_parser("up", help="run a collector until interrupted")
    collector_up.add_argument("--config", required=True, help="collector configuration (TOML, docs/collector.md)")
    collector_up.add_argument("--netns", help="run in this network namespace")
    collector_up.add_argument("--control-host", default="0.0.0.0", help="address of the control service")
    collector_up.add_argument("--query-host", default="127.0.0.1", help="address of the query service")
    collector_up.set_defaults(run=_collector_up)

    query = commands.add_parser("query", help="ask a collector's query service (docs/query.md)")
    query.add_argument("--url", default="http://127.0.0.1:8040", help="the query service")
    query.add_argument("what", choices=["structures", "stats", "health", "metrics", "key-write", "key-increment",
                                        "postcarding", "append", "sketch-merge"])
    query.add_argument("name", nargs="?", help="structure name, as `softdta query structures` lists them")
    query.add_argument("keys", nargs="*", help="keys: hex in wire order (0a000001) or integers")
    query.add_argument("--redundancy", "-n", type=int, default=2)
    query.add_argument("--consensus", type=int, help="Key-Write: votes needed (consensus mode)")
    query.add_argument("--values", type=int, nargs="*", default=[], help="Postcarding: the value set")
    query.add_argument("--list", type=int, help="Append: one list")
    query.add_argument("--take", action="store_true",
                       help="Append: take the entries (each is taken once) instead of reading them; needs --token")
    query.add_argument("--follow", action="store_true",
                       help="Append: take new entries as they come, until interrupted; needs --token")
    query.add_argument("--token", default=os.environ.get("SOFTDTA_TOKEN"),
                       help="the collector's token, for --take and --follow (default: $SOFTDTA_TOKEN)")
    query.set_defaults(run=_query)

    bench = commands.add_parser("bench", help="the comparison benchmarks: softdta against the alternatives, side by "
                                              "side in one run (root); writes bench/results/ (docs/benchmarks.md)")
    bench.add_argument("--quick", action="store_true", help="small sizes: a smoke run of every comparison")
    bench.add_argument("--out", default=str(REPO_ROOT / "bench" / "results"), help="where to write JSON and plots")
    bench.set_defaults(run=_bench)

    p4 = commands.add_parser("p4", help="the P4 translator: its P4Runtime entries, a push to a switch, the v1model "
                                        "program built and run in bmv2 (docs/p4.md)")
    p4_actions = p4.add_subparsers(dest="action", required=True)
    entries = p4_actions.add_parser("entries", help="print the updates a first push sends (protobuf text format)")
    push = p4_actions.add_parser("push", help="write the tables to a switch over P4Runtime, live")
    run_p4 = p4_actions.add_parser("run", help="build the v1model program, run it in bmv2 on interfaces, and push "
                                               "the tables; until interrupted (root)")
    for command in (entries, push, run_p4):
        command.add_argument("--tables", required=True, help="translator tables (TOML, docs/tables.md)")
        command.add_argument("--port", action="append", default=[], metavar="QP_OR_INTERFACE=PORT",
                             help="device port towards a QP's collector (default: the port reports came in on)")
    for command in (entries, push):
        command.add_argument("--architecture", choices=["v1model", "tna"], default="v1model")
    push.add_argument("--p4runtime", required=True, metavar="HOST:PORT")
    push.add_argument("--device-id", type=int, default=1)
    push.add_argument("--election-id", type=int, default=1)
    push.add_argument("--pipeline", help="device config (compiler output) to install first")
    push.add_argument("--bmv2-thrift", type=int, metavar="PORT",
                      help="bmv2: its Thrift port, for the register writes its P4Runtime server refuses")
    push.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the switch")
    build = p4_actions.add_parser("build", help="compile the v1model program with p4c-bm2-ss ($P4C or PATH)")
    build.add_argument("--out", default="build/p4", help="where the bmv2 JSON and the P4Info go")
    run_p4.add_argument("--interface", "-i", action="append", required=True, metavar="[PORT@]INTERFACE",
                        help="a switch port (repeat; numbered from 0 in order unless PORT@ says)")
    run_p4.add_argument("--grpc-port", type=int, default=9559)
    run_p4.add_argument("--thrift-port", type=int, default=9090)
    run_p4.add_argument("--log", help="bmv2's log file")
    p4.set_defaults(run=_p4)

    from softdta.codegen.generate import GENERATED
    generate = commands.add_parser("codegen", help="regenerate the files the spec generates: "
                                   + ", ".join(str(path) for path in GENERATED))
    generate.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    generate.set_defaults(run=_codegen)

    demo = commands.add_parser("demo", help="the live lab end to end: reporters -> XDP translator -> collector -> "
                                            "queries, with a summary (root); --offline runs the Python models")
    demo.add_argument("--reporters", type=int, default=2, help="reporter namespaces")
    demo.add_argument("--collector", choices=["xdp", "rxe"], default="xdp",
                      help="the XDP responder, or the kernel's soft-RoCE in a QEMU guest (slower: see --rate)")
    demo.add_argument("--engine", choices=["xdp", "python"], default="xdp",
                      help="the translator: the XDP fast path, or the reference translator on AF_XDP "
                           "(slower: see --rate)")
    demo.add_argument("--scale", type=float, help="workload size (1.0: about 100 k reports; default 1.0, rxe 0.2)")
    demo.add_argument("--rate", type=float, help="reports/s over all reporters (default 100000, rxe 2000, "
                                                 "--engine python 3000)")
    demo.add_argument("--seconds", type=float, default=60.0, help="stop streaming after this long")
    demo.add_argument("--keep", action="store_true", help="leave the lab up afterwards (`softdta lab down`)")
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--offline", action="store_true",
                      help="no lab: the reference translator into the reference responder, in this process")
    demo.add_argument("--tables", default=str(REPO_ROOT / "examples" / "tables.toml"), help="--offline: tables")
    demo.add_argument("--pcap-dir", help="--offline: also write the reports and RoCEv2 frames as pcaps here")
    demo.set_defaults(run=_demo)

    lab = commands.add_parser("lab", help="the live lab: reporter, translator and collector namespaces (root)")
    lab_actions = lab.add_subparsers(dest="action", required=True)
    lab_up = lab_actions.add_parser("up", help="build the topology and start the translator and the collector")
    lab_up.add_argument("--reporters", type=int, default=2)
    lab_up.add_argument("--collector", choices=["xdp", "rxe"], default="xdp")
    lab_up.add_argument("--engine", choices=["xdp", "python"], default="xdp", help="the translator's engine")
    lab_up.set_defaults(run=_lab)
    lab_actions.add_parser("down", help="stop everything and remove it (safe to repeat)").set_defaults(run=_lab)
    lab_status = lab_actions.add_parser("status", help="what is up, with the translator's counters")
    lab_status.add_argument("--json", action="store_true")
    lab_status.set_defaults(run=_lab)
    return parser


# ------------------------------------------------------------------------------------------------------------

def _offline_engine(args, tables: Tables) -> Engine:
    if args.engine == "reference":
        return Translator(tables)
    from softdta.engines.xdp import EngineError, XdpTranslator
    try:
        return XdpTranslator(tables, flush_idle_ns=0)
    except EngineError as error:
        raise CliError(f"{error}; --engine xdp needs root and clang (run `make setup`)") from None


def _translate(args) -> int:
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
    _print_summary(summary, args.json)
    return 0


def _offline_collector(tables: Tables):
    from softdta.core.offline import OfflineCollector
    return OfflineCollector(tables)


def _print_summary(summary: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    for section, values in summary.items():
        if isinstance(values, dict):
            print(f"{section}:")
            for name, value in values.items():
                print(f"  {name:28} {value}")
        else:
            print(f"{section:30} {values}")


def dissect_frame(frame: bytes, profile: Profile) -> dict:
    """One frame as a dict; `problems` lists what is wrong with it (empty when it is well formed)."""
    try:
        udp = parse_udp_frame(frame)
    except WireError as error:
        return {"kind": "other", "problems": [] if error.reason == "NOT_UDP" else [str(error)]}
    info: dict = {"src": ip_str(udp.src_ip), "dst": ip_str(udp.dst_ip), "eth_src": mac_str(udp.eth["src"]),
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


def _decode(args) -> int:
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


def _one_line(info: dict) -> str:
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


def _report(args) -> int:
    profile = Profile(args.profile)
    address = workload.ReporterAddress(mac=mac_bytes(args.reporter_mac), ip=ip_bytes(args.reporter),
                                       translator_mac=mac_bytes(args.translator_mac),
                                       collector_ip=ip_bytes(args.collector))
    generators = {
        "key-write": lambda: workload.key_write(args.count, args.seed, args.redundancy, args.key_len, args.data_len),
        "key-increment": lambda: workload.key_increment(args.count, args.seed, args.redundancy),
        "append": lambda: workload.append(args.count, args.seed, args.lists),
        "postcarding": lambda: workload.postcards(args.count, args.seed, args.hops),
        "sketch-merge": lambda: workload.sketch_epoch(args.reporters, args.columns, args.rows, args.seed),
    }
    try:
        reports = generators[args.primitive]()
        frames = [address.frame(report, profile) for report in reports]
    except ValueError as error:
        raise CliError(str(error)) from None
    if bool(args.out) == bool(args.interface):
        raise CliError("give --out FILE (write a pcap) or --interface IF (send on the wire), not both or neither")
    if args.interface:
        return _send_reports(frames, args)
    step = int(args.interval_us * 1000)
    count = write_pcap(args.out, (Packet(i * step, frame) for i, frame in enumerate(frames)))
    print(f"wrote {count} {args.primitive} reports to {args.out}")
    return 0


def _send_reports(frames: list[bytes], args) -> int:
    import time

    from softdta.engines.xdp import EngineError
    from softdta.kernel.tx_ring import RingReporter
    batch = 256
    try:
        with RingReporter(args.interface, args.netns, batch) as ring:
            started = time.perf_counter()
            for first in range(0, len(frames), batch):
                ring.send(frames[first:first + batch])
                ahead = (first + batch) / args.rate - (time.perf_counter() - started) if args.rate else 0
                if ahead > 0:
                    time.sleep(ahead)
            elapsed = time.perf_counter() - started
    except (EngineError, PermissionError) as error:
        raise CliError(f"{error}; sending needs root (CAP_NET_RAW)") from None
    print(f"sent {len(frames)} {args.primitive} reports out of {args.interface} in {elapsed:.3f} s "
          f"({len(frames) / elapsed:,.0f} reports/s)")
    return 0


def _bench(args) -> int:
    from softdta.engines.xdp import EngineError
    from softdta.lab.benchmarks import run
    try:
        results = run(quick=args.quick, out=Path(args.out))
    except EngineError as error:
        raise CliError(f"{error}; `softdta bench` loads BPF programs, which needs root") from None
    translator, collector = results["translator_ns_per_report"], results["collector_cpu_ns_per_report"]
    print(f"wrote {args.out}/comparison.json and plots in {results['seconds']} s")
    for name, kernel in translator["xdp"].items():
        reference = translator["reference_python"][name]["median"]
        print(f"  translator {name:14} XDP {kernel['median']:8.0f} ns   Python reference {reference:9.0f} ns   "
              f"{reference / max(kernel['median'], 1):6.0f}x")
    udp = translator["userspace_udp_python"]["key-write"]["median"]
    print(f"  userspace UDP translator (Python, uvloop), key-write: {udp:.0f} ns per report "
          f"({udp / max(translator['xdp']['key-write']['median'], 1):.0f}x the XDP path)")
    engines = results["translator_python_engine"]
    print("  Key-Write N=1, reports/s per core: " + ", ".join(
        f"{name} {engines[key]['reports_per_s_per_core']:,}" for name, key in (
            ("python engine on AF_XDP", "af_xdp"), ("on AF_PACKET", "af_packet"),
            ("reference translator alone", "reference_translator_alone"), ("XDP engine", "xdp"))))
    print(f"  live lab (reporter -> bridge -> XDP translator -> XDP collector): "
          f"{results['translator_live_lab']['max_lossless_reports_per_s']:,} reports/s without loss")
    c = collector["c_epoll"]
    print(f"  collector CPU per report: xdp responder (kernel, UC 8 B) "
          f"{collector['xdp_responder_kernel']['uc-write-8']['median']:.0f} ns, userspace 0; "
          f"Python asyncio {collector['python_asyncio']['median']:.0f} ns"
          + (f"; C epoll {c['median']:.0f} ns" if c else ""))
    return 0


def _codegen(args) -> int:
    from softdta.codegen.generate import stale, write_all
    if args.check:
        outdated = stale(REPO_ROOT)
        for path in outdated:
            print(f"stale: {path} (run `softdta codegen`)")
        return 1 if outdated else 0
    for path in write_all(REPO_ROOT):
        print(f"generated {path}")
    return 0


def _translator_up(args) -> int:
    if args.netns:
        from softdta.kernel.netns import NetnsError, in_netns
        try:
            with in_netns(args.netns):
                return _run_translator(args)
        except NetnsError as error:
            raise CliError(f"{error}; list namespaces with `ip netns list`") from None
    return _run_translator(args)


def _run_translator(args) -> int:
    import signal
    import threading

    from softdta.engines.xdp import EngineError
    from softdta.kernel.bpf import BpfError, ensure_bpffs
    if args.collector and args.collector_cm:
        raise CliError("give either --collector (softdta collectors) or --collector-cm (rdma_cm collectors)")
    source, tables = _table_source(args)
    try:
        ensure_bpffs()
        pin = Path(args.pin)
        pin.mkdir(parents=True, exist_ok=True)
        engine = _translator_engine(args, tables, pin)
    except (EngineError, BpfError, PermissionError) as error:
        source.close()
        raise CliError(f"{error}; `softdta translator up` needs root") from None
    # failed QPs go back to the collectors, which re-create their ends
    source.report_failures(lambda: {qp.local_qpn for qp in engine.tables.qps
                                    if engine.qp_state(qp)["state"] == QpState.FAILED})
    stop = threading.Event()

    def reload(*_) -> None:
        try:
            new_tables = source.tables()
            if args.engine == "python":  # it takes new tables between batches, never in the middle of one
                source.updates.put(new_tables)
            else:
                engine.apply(new_tables)
            origin = args.tables if isinstance(source, TablesFile) else "the collectors"
            print(f"softdta: tables reloaded from {origin}", flush=True)
        except TableError as error:
            print(f"softdta: error: reload refused, the running tables stay: {error}", file=sys.stderr, flush=True)

    signal.signal(signal.SIGHUP, reload)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        engine.attach(args.interface, mode=args.mode, allow_multiqueue=args.allow_multiqueue)
        mode = f"{args.mode} XDP" if args.engine == "xdp" else f"python engine, {engine.io_name}" + \
            (f" because AF_XDP failed: {engine.fallback_reason}" if engine.fallback_reason else "")
        print(f"softdta translator up on {', '.join(args.interface)} ({mode}), maps pinned in {pin}; "
              f"{len(tables.qps)} QPs, {len(tables.structures)} structures, "
              f"{sum(a.lists for a in tables.append_lists)} Append lists", flush=True)
        engine.serve(stop, source.updates)
    except (EngineError, BpfError) as error:
        raise CliError(str(error)) from None
    finally:
        engine.close()
        source.close()
    print(f"softdta translator down; state kept in {pin} (`softdta translator stats --pin {pin}`)")
    return 0


def _translator_engine(args, tables: Tables, pin: Path):
    """The engine `--engine` names, loaded with its tables and pinned in `pin`."""
    flush_idle_ns = int(args.flush_idle_ms * 1e6)
    if args.engine == "xdp":
        if args.primitive or args.io != "auto":
            raise CliError("--primitive and --io apply to --engine python only")
        from softdta.engines.xdp import XdpTranslator
        return XdpTranslator(tables, pin_dir=pin, flush_idle_ns=flush_idle_ns)
    from softdta.core.primitives import load
    from softdta.engines.python import PythonEngine
    try:
        plugins = [load(spec) for spec in args.primitive]
    except ValueError as error:
        raise CliError(str(error)) from None
    return PythonEngine(tables, pin_dir=pin, flush_idle_ns=flush_idle_ns, plugins=plugins, io=args.io)


def _translator_section(path: str) -> dict:
    import tomllib
    try:
        return tomllib.loads(Path(path).read_text())["translator"]
    except (KeyError, tomllib.TOMLDecodeError) as error:
        raise CliError(f"{path}: needs a valid [translator] section ({error})") from None


def _table_source(args) -> tuple[TableSource, Tables]:
    """Where the translator's tables come from (--tables, --collector or --collector-cm), and the first tables."""
    if args.collector:
        return _collector_links(args)
    if args.collector_cm:
        return _cm_links(args)
    source = TablesFile(args.tables)
    return source, source.start()


def _cm_links(args) -> tuple[TableSource, Tables]:
    """rdma_cm connections to original-DTA collectors, and the first tables their regions make."""
    from softdta.links.cm import CmError, CmLinks, CmTarget
    if len(args.interface) != 1:
        raise CliError("--collector-cm: give one --interface, the one the collectors are reached on")
    try:
        links = CmLinks(_translator_section(args.tables), [CmTarget.parse(text) for text in args.collector_cm],
                        args.interface[0], log=lambda line: print(line, flush=True))
        return links, links.start()
    except CmError as error:
        raise CliError(str(error)) from None


def _collector_links(args) -> tuple[TableSource, Tables]:
    """Control links to the collectors and the first tables they advertise."""
    from softdta.collector.control import ControlError, client_tls
    from softdta.links.control import CollectorLinks
    translator = _translator_section(args.tables)
    addresses = []
    for address in args.collector:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise CliError(f"--collector {address!r}: give HOST:PORT, for example 10.77.1.1:40050")
        addresses.append((host, int(port)))
    if (args.collector_cert or args.collector_key) and not args.collector_ca:
        raise CliError("--collector-cert and --collector-key need --collector-ca, "
                       "the CA of the collectors' certificates")
    try:
        tls = client_tls(args.collector_ca, args.collector_cert, args.collector_key) if args.collector_ca else None
    except ControlError as error:
        raise CliError(f"--collector-ca/--collector-cert/--collector-key: {error}") from None
    links = CollectorLinks(translator, addresses, args.token, tls=tls)
    try:
        return links, links.start()
    except ControlError as error:
        links.close()
        raise CliError(str(error)) from None


def _collector_up(args) -> int:
    from softdta.collector.backend import BackendError
    from softdta.collector.config import CollectorConfig
    from softdta.collector.control import ControlError
    from softdta.collector.daemon import StartError, run
    config = CollectorConfig.from_toml(args.config)
    if not config.token:
        raise CliError(f"{args.config}: [collector] token is missing or empty; set one, translators must "
                       "authenticate with it")
    try:
        if args.netns:
            from softdta.kernel.netns import in_netns
            with in_netns(args.netns):
                run(config, control_host=args.control_host, query_host=args.query_host)
        else:
            run(config, control_host=args.control_host, query_host=args.query_host)
    except (BackendError, StartError, ControlError) as error:
        raise CliError(str(error)) from None
    return 0


def _query(args) -> int:
    import urllib.error
    import urllib.request

    def keys():
        return [int(k) if k.isdigit() else k for k in args.keys]

    if args.what in ("key-write", "key-increment", "postcarding", "append", "sketch-merge") and not args.name:
        raise CliError(f"query {args.what} needs a structure name; list them with `softdta query structures`")
    body = None
    path = f"/{args.what}" + (f"/{args.name}" if args.name else "")
    if args.what == "key-write":
        body = {"keys": keys(), "redundancy": args.redundancy}
        if args.consensus:
            body.update(mode="consensus", consensus=args.consensus)
    elif args.what == "key-increment":
        body = {"keys": keys(), "redundancy": args.redundancy}
    elif args.what == "postcarding":
        body = {"keys": keys(), "value_set": args.values}
    headers = {"Content-Type": "application/json"}
    taking = args.what == "append" and (args.take or args.follow)
    if taking and not args.token:
        raise CliError("taking Append entries needs the collector's token: give --token or set SOFTDTA_TOKEN")
    if taking:
        headers["Authorization"] = f"Bearer {args.token}"
    if args.what == "append":
        query_string = [f"list={args.list}"] if args.list is not None else []
        query_string += ["follow=1"] if args.follow else []
        path += "?" + "&".join(query_string) if query_string else ""
    request = urllib.request.Request(args.url + path, data=json.dumps(body).encode() if body else None,
                                     headers=headers, method="POST" if body or taking else "GET")
    try:
        with urllib.request.urlopen(request) as response:
            for line in response:
                sys.stdout.write(line.decode())
                sys.stdout.flush()
    except urllib.error.HTTPError as error:
        reason = json.loads(error.read() or b"{}").get("error", error.reason)
        raise CliError(f"{args.url}{path}: {error.code} {reason}") from None
    except urllib.error.URLError as error:
        raise CliError(f"{args.url}: {error.reason}; is `softdta collector up` running, and is --url right?") from None
    except KeyboardInterrupt:
        pass
    return 0


def _p4(args) -> int:
    import signal
    import tempfile
    import threading

    from google.protobuf import text_format  # after .p4runtime, which picks protobuf's runtime

    from softdta.core.control_plane import Slots, plan
    from softdta.targets.bmv2 import Bmv2, ThriftRegisters, compile_v1model, tool
    from softdta.targets.p4runtime import (
        P4Names,
        P4RuntimeClient,
        P4RuntimeError,
        P4Translator,
        egress_ports,
        load_p4info,
        planned_updates,
        require_supported,
    )

    try:
        if args.action == "build":
            program, p4info = compile_v1model(Path(args.out))
            print(f"built {program} and {p4info}")
            return 0
        tables = Tables.from_toml(args.tables)
        egress = egress_ports(args.port)
        require_supported(tables, plan(tables, Slots(), flush_idle_ns=DEFAULT_FLUSH_IDLE_NS, egress=egress),
                          getattr(args, "architecture", "v1model"))
        if args.action == "entries":
            for update in planned_updates(tables, egress=egress):
                print(text_format.MessageToString(update, as_one_line=True))
            return 0
        if args.action == "push":
            with P4RuntimeClient(args.p4runtime, device_id=args.device_id, election_id=args.election_id,
                                 timeout=args.timeout) as client:
                if args.pipeline:
                    client.set_pipeline(load_p4info(), Path(args.pipeline).read_bytes())
                registers = ThriftRegisters(tool("simple_switch_CLI", "BMV2", "bmv2"), args.bmv2_thrift,
                                            P4Names(load_p4info())).write if args.bmv2_thrift else None
                P4Translator(client, architecture=args.architecture, egress=egress,
                             write_registers=registers).apply(tables)
            print(f"pushed {len(tables.qps)} queue pairs to {args.p4runtime}")
            return 0
        ports = {}
        for position, given in enumerate(args.interface):
            number, _, name = given.rpartition("@")
            if number and not number.isdigit():
                raise CliError(f"--interface {given!r}: give INTERFACE or PORT@INTERFACE, for example 1@veth1")
            ports[int(number) if number else position] = name
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        with tempfile.TemporaryDirectory(prefix="softdta-p4-") as out:
            program, _ = compile_v1model(Path(out))
            with Bmv2(program, ports, grpc_port=args.grpc_port, thrift_port=args.thrift_port,
                      log=Path(args.log) if args.log else None) as switch:
                switch.translator(egress=egress).apply(tables)
                print(f"bmv2 translator up on {', '.join(f'{p}@{n}' for p, n in sorted(ports.items()))}: "
                      f"{len(tables.qps)} queue pairs; P4Runtime 127.0.0.1:{args.grpc_port}, Thrift "
                      f"{args.thrift_port}", flush=True)
                while not stop.wait(0.5):
                    if switch.process.poll() is not None:
                        raise CliError(f"simple_switch_grpc exited with {switch.process.returncode}"
                                       f"{'; see ' + args.log if args.log else '; --log FILE keeps its log'}")
        return 0
    except P4RuntimeError as error:
        raise CliError(str(error)) from None


def _translator_stats(args) -> int:
    from softdta.engines.python import engine_stats
    from softdta.engines.xdp import EngineError
    try:
        stats = engine_stats(Path(args.pin))
    except EngineError as error:
        raise CliError(str(error)) from None
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"engine: {stats['engine']['name']}" + (f" ({stats['engine']['io']})" if "io" in stats["engine"] else ""))
    print("counters:")
    for name, value in stats["counters"].items():
        print(f"  {name:28} {value}")
    print("queue pairs:")
    for qp in stats["qps"]:
        print(f"  local 0x{qp['local_qpn']:06x} -> remote 0x{qp['remote_qpn']:06x} at {qp['collector']:15} "
              f"{qp['transport']}  next PSN {qp['next_psn']:8}  {qp['state']}")
    return 0


def _translator_down(args) -> int:
    import shutil
    import socket

    from softdta.kernel.bpf import BpfError, detach_tc, detach_xdp
    for name in args.interface:
        try:
            index = socket.if_nametoindex(name)
            detach_tc(index)
            detach_xdp(index)
        except OSError:
            raise CliError(f"interface {name!r} does not exist; check `ip link`") from None
        except BpfError as error:
            raise CliError(str(error)) from None
    if args.forget:
        shutil.rmtree(args.pin, ignore_errors=True)
    print(f"detached from {', '.join(args.interface) or 'no interface'}"
          + (f"; removed {args.pin}" if args.forget else ""))
    return 0


def _demo(args) -> int:
    if args.offline:
        from softdta.lab.demo import run_offline_demo
        print(run_offline_demo(Tables.from_toml(args.tables), args.seed, args.pcap_dir))
        return 0
    from softdta.lab import live_demo
    from softdta.lab import topology as lab
    try:
        defaults = live_demo.DEFAULTS[args.collector]
        rate = min(defaults["rate"], live_demo.PYTHON_ENGINE_RATE) if args.engine == "python" else defaults["rate"]
        return live_demo.run(args.reporters, args.seed, args.scale or defaults["scale"], args.seconds, args.keep,
                             args.json, args.rate or rate, args.collector, args.engine)
    except lab.LabError as error:
        raise CliError(str(error)) from None


def _lab(args) -> int:
    from softdta.lab import topology as lab
    try:
        if args.action == "up":
            state = lab.up(args.reporters, args.collector, args.engine)
            namespaces = ", ".join(state.reporter(i)["netns"] for i in range(1, state.reporters + 1))
            collector = "soft-RoCE guest" if state.collector == "rxe" else "XDP responder"
            print(f"lab up: {state.reporters} reporters ({namespaces}) -> {lab.PREFIX}t -> {lab.PREFIX}c "
                  f"({collector}); "
                  f"queries at {state.query_url} (inside the lab namespaces); "
                  f"logs in {lab.STATE_DIR}")
        elif args.action == "down":
            removed = lab.down()
            print(f"lab down; removed {', '.join(removed) or 'nothing'}")
        else:
            report = lab.status()
            if args.json:
                print(json.dumps(report, indent=2))
            elif not report["up"]:
                stray = ", ".join(report["namespaces"])
                print("no lab is up" + (f" (stray namespaces: {stray}; `softdta lab down` removes them)"
                                        if report["namespaces"] else ""))
            else:
                engine = report["translator"]["engine"]
                print(f"lab up: {', '.join(report['namespaces'])}; translator ({engine['name']}"
                      f"{', ' + engine['io'] if 'io' in engine else ''}) "
                      f"{'running' if report['translator']['running'] else 'NOT running'}, collector "
                      f"({report['collector']['kind']}) "
                      f"{'running' if report['collector']['running'] else 'NOT running'}")
                for name, value in report["translator"].get("counters", {}).items():
                    print(f"  {name:28} {value}")
    except lab.LabError as error:
        raise CliError(str(error)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
