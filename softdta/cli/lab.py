"""`softdta lab`, `softdta demo` and `softdta bench`: the live lab, the demos and the comparison benchmarks."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, cast

from softdta.cli.common import REPO_ROOT, CliError, Commands, add_command
from softdta.core.tables import Tables

if TYPE_CHECKING:
    from softdta.lab.benchmarks.python_engine import BatchRate, EngineRate


def register(commands: Commands) -> None:
    """Add the lab command(s) to the `softdta` parser."""
    bench = add_command(commands, "bench", "measure softdta against the alternatives a user would pick, side by "
                        "side in one run (root)", "Writes JSON and plots to --out (docs/benchmarks.md).")
    bench.add_argument("--quick", action="store_true", help="small sizes: a quick run of every comparison")
    bench.add_argument("--out", default=str(REPO_ROOT / "bench" / "results"),
                       help="where to write the JSON and the plots (default %(default)s)")
    bench.set_defaults(run=_bench)

    demo = add_command(commands, "demo", "see softdta work end to end: reports from switches, translated into RDMA "
                       "writes, land in a collector and are queried back (root; --offline needs none)",
                       "It builds a lab of network namespaces, streams about 100 k reports of every primitive, "
                       "checks every answer against the reference translator's prediction and prints a summary; "
                       "then, through the XDP translator and responder, a burst of Key-Write N=2 at 1 M reports/s. It "
                       "exits 1 if anything was lost or an answer is wrong (docs/lab.md).")
    demo.add_argument("--reporters", type=int, default=2, help="how many reporters (switches) send reports "
                                                               "(default %(default)s)")
    demo.add_argument("--collector", choices=["xdp", "rxe"], default="xdp",
                      help="xdp (default): the XDP responder; rxe: the kernel's soft-RoCE in a QEMU guest "
                           "(slower: see --rate)")
    demo.add_argument("--engine", choices=["xdp", "python"], default="xdp",
                      help="the translator: xdp (default), the kernel fast path; python, the batch translator in "
                           "Python on AF_XDP (slower: see --rate)")
    demo.add_argument("--scale", type=float, help="workload size (1.0: about 100 k reports; default 1.0, rxe 0.2)")
    demo.add_argument("--rate", type=float, help="reports/s over all reporters (default 100000, rxe 2000, "
                                                 "--engine python 20000)")
    demo.add_argument("--seconds", type=float, default=60.0,
                      help="stop streaming after this many seconds (default %(default)s)")
    demo.add_argument("--burst-rate", type=float, default=1_000_000.0,
                      help="then a burst of Key-Write N=2 from kernel generators, XDP translator and responder "
                           "only: reports/s (0: as fast as they go; default 1000000)")
    demo.add_argument("--burst-seconds", type=float, default=3.0, help="the burst's length (0: no burst; default 3)")
    demo.add_argument("--keep", action="store_true", help="leave the lab up afterwards (`softdta lab down` "
                                                          "removes it)")
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.add_argument("--seed", type=int, default=0, help="seed of the workload's random keys, data and paths: "
                                                          "the same seed sends the same reports (default "
                                                          "%(default)s)")
    demo.add_argument("--offline", action="store_true",
                      help="no lab and no root: the reference translator into the reference responder, in this "
                           "process")
    demo.add_argument("--tables", default=str(REPO_ROOT / "examples" / "tables.toml"),
                      help="--offline: the translator tables (default %(default)s)")
    demo.add_argument("--pcap-dir", help="--offline: also write the reports and RoCEv2 frames as pcaps here")
    demo.add_argument("--fleet", action="store_true",
                      help="the fleet demo instead: etcd, a controller, three collectors and two translators in "
                           "namespaces; a fourth collector joins and another is killed with SIGKILL mid-run; every "
                           "key and list read back through the federated router (docs/fleet.md)")
    demo.set_defaults(run=_demo)

    lab = add_command(commands, "lab", "bring up the demo's lab and leave it running, to try commands in it "
                      "(root)", "Reporter, translator and collector network namespaces joined by veth pairs "
                      "(docs/lab.md).")
    lab_actions = lab.add_subparsers(dest="action", required=True, title="actions")
    lab_up = add_command(lab_actions, "up", "build the namespaces and start the translator and the collector")
    lab_up.add_argument("--reporters", type=int, default=2,
                        help="how many reporter namespaces (default %(default)s)")
    lab_up.add_argument("--collector", choices=["xdp", "rxe"], default="xdp",
                        help="xdp (default): the XDP responder; rxe: the kernel's soft-RoCE in a QEMU guest")
    lab_up.add_argument("--engine", choices=["xdp", "python"], default="xdp",
                        help="the translator: xdp (default), the kernel fast path; python, the batch translator "
                             "in Python on AF_XDP")
    lab_up.add_argument("--export", action="store_true",
                        help="start nats-server with JetStream in the collector's namespace and have the collector "
                             "export its Append entries to it (xdp collector; docs/export.md)")
    lab_up.set_defaults(run=_lab)
    add_command(lab_actions, "down", "stop everything and remove it (safe to repeat)").set_defaults(run=_lab)
    lab_status = add_command(lab_actions, "status", "show what is up, with the translator's counters")
    lab_status.add_argument("--json", action="store_true", help="print it as JSON")
    lab_status.set_defaults(run=_lab)


def _bench(args: argparse.Namespace) -> int:
    from softdta.kernel.programs import EngineError
    from softdta.lab.benchmarks.comparison import run
    try:
        results = run(quick=args.quick, out=Path(args.out))
    except EngineError as error:
        raise CliError(f"{error}; `softdta bench` loads BPF programs, which needs root") from None
    translator, collector = results["translator_ns_per_report"], results["collector_cpu_ns_per_report"]
    print(f"wrote {args.out}/comparison.json and plots in {results['seconds']} s")
    empty = translator["empty_xdp_program"]["median"]
    for name, kernel in translator["xdp"].items():
        reference = translator["reference_python"][name]["median"]
        print(f"  translator {name:14} XDP {kernel['median']:8.0f} ns (empty program {empty:.0f} ns)   Python "
              f"reference {reference:9.0f} ns   {reference / max(kernel['median'], 1):6.0f}x")
    udp = translator["userspace_udp_python"]["key-write"]["median"]
    print(f"  userspace UDP translator (Python, uvloop), key-write: {udp:.0f} ns per report "
          f"({udp / max(translator['xdp']['key-write']['median'], 1):.0f}x the XDP path)")
    for name, scaling in results["translator_rx_queue_scaling"].items():
        print(f"  XDP translator, {name}: {scaling['one_queue_reports_per_s']:,} reports/s on one RX queue, "
              f"{scaling['two_queues_reports_per_s']:,} on two ({scaling['scaling']}x)")
    engines = results["translator_python_engine"]
    print("  Key-Write N=1, reports/s per core: " + ", ".join(
        f"{name} {engines[key]['reports_per_s_per_core']:,}" for name, key in (
            (f"python engine on AF_XDP (frames out through {cast('EngineRate', engines['af_xdp'])['transmit']})",
             "af_xdp"),
            ("on AF_PACKET", "af_packet"), ("reference translator alone", "reference_translator_alone"),
            ("XDP engine", "xdp"))))
    print(f"  the demo's mix of every primitive, python engine on AF_XDP: "
          f"{engines['af_xdp_mixed']['reports_per_s_per_core']:,} reports/s per core")
    for name, rates in results["translator_batch"].items():
        print(f"  translation alone, {name}, reports/s per core: oracle {rates['oracle']['reports_per_s_per_core']:,}, "
              + ", ".join(f"{key.replace('_', ' of ')} {rate['reports_per_s_per_core']:,} "
                          f"({cast('BatchRate', rate)['times_the_oracle']}x)"
                          for key, rate in rates.items() if key != "oracle"))
    print(f"  live lab (reporter -> bridge -> XDP translator -> XDP collector): "
          f"{results['translator_live_lab']['max_lossless_reports_per_s']:,} reports/s without loss")
    generated = results["translator_live_lab_kernel_generator"]
    first_loss = next((step for step in generated["steps"] if not step["lossless"]), None)
    print(f"  live lab, Key-Write N=1 from the kernel generator: {generated['max_lossless_reports_per_s']:,} reports/s "
          "without loss" + (f"; first loss offered {first_loss['offered'] or 'unthrottled'}, reached "
                            f"{first_loss['achieved']:,}/s, lost {first_loss['lost']}" if first_loss else ""))
    for name, direct in results["translator_live_direct"].items():
        first_loss = next((step for step in direct["steps"] if not step["lossless"]), None)
        print(f"  direct path ({direct['path'].replace('generator', 'generators')}), {direct['rx_queues']} RX "
              "queue(s): "
              f"{direct['max_lossless_reports_per_s']:,} reports/s without loss"
              + (f" ({direct['frames_per_report']} frames each)" if direct["frames_per_report"] > 1 else "")
              + (f" ({direct['fraction_of_floor']:.2f} of the floor)" if "fraction_of_floor" in direct else "")
              + (f"; first loss offered {first_loss['offered'] or 'unthrottled'}, lost {first_loss['lost']}"
                 if first_loss else ""))
    c = collector["c_epoll"]
    print(f"  collector CPU per report: xdp responder (kernel, UC 8 B) "
          f"{collector['xdp_responder_kernel']['uc-write-8']['median']:.0f} ns (empty program {empty:.0f} ns), "
          "userspace 0; "
          f"Python asyncio {collector['python_asyncio']['median']:.0f} ns"
          + (f"; C epoll {c['median']:.0f} ns" if c else ""))
    local = results["local_translation_ns_per_report"]
    for name, case in local["cases"].items():
        print(f"  local translation, {name}: {case['local']['median']:.0f} ns per report at the collector "
              f"({case['local_via_responder']['median']:.0f} ns through the responder's tail call); translator + "
              f"responder {case['translator_plus_responder']:.0f} ns (empty program "
              f"{local['empty_xdp_program']['median']:.0f} ns)")
    for fleet in results["fleet_slot_map"].values():
        print(f"  fleet of {fleet['collectors']}, {fleet['replicas']} replica(s): slots led max/mean "
              f"{fleet['max_over_mean']} (goal <= {fleet['balance_goal']}), moved on a join "
              f"{fleet['moved_on_join']:.4f} "
              f"(ideal {fleet['ideal_on_join']:.4f}, goal <= {fleet['join_goal']:.4f})")
    routed = results["query_router"]
    print(f"  Key-Write lookups, batches of {routed['keys_per_batch']:,}: one collector directly "
          f"{routed['direct_keys_per_s']['median']:,.0f} keys/s, three through the fleet's router "
          f"{routed['router_keys_per_s']['median']:,.0f} keys/s ({routed['router_over_direct']}x; goals >= "
          f"{routed['goal_keys_per_s']:,} keys/s and >= {routed['goal_ratio']}x)")
    for name, cost in results["translator_fleet_slot_lookup"].items():
        print(f"  XDP translator, {name}: {cost['direct_ns_per_report']:.0f} ns per report to a collector, "
              f"{cost['fleet_ns_per_report']:.0f} ns to the fleet address ({cost['ratio']}x; goal <= 1.1x)")
    propagation = results["fleet_propagation"]
    print(f"  a new slot-map epoch, etcd commit to the last of {propagation['translators']} {propagation['engine']} "
          f"translators applying it: median {propagation['median_s']} s, max {propagation['max_s']} s "
          f"(goal <= {propagation['goal_s']} s)")
    for name, exported in results["export_throughput"].items():
        saturated = exported["steps"][-1]
        print(f"  export to a local nats-server, {name.replace('_', ' ')}: {exported['max_lossless_per_s']:,} "
              f"entries/s acknowledged at the highest offered rate kept up with, {saturated['acknowledged_per_s']:,} "
              f"as fast as the exporter takes them (goal >= {exported['goal_per_s']:,})")
    for name, impact in results["export_responder_impact"].items():
        print(f"  XDP responder ({impact['case']}) with an exporter at {impact['export_rate']:,} entries/s beside it "
              f"({name}): {impact['on_ns']['median']:.0f} ns against {impact['off_ns']['median']:.0f} ns without, "
              f"{impact['ratios']['median']:.3f}x ({impact['ratios']['min']:.3f}-{impact['ratios']['max']:.3f}; "
              f"goal <= {impact['goal_ratio']}x)")
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.offline:
        from softdta.lab.offline_demo import run_offline_demo
        print(run_offline_demo(Tables.from_toml(args.tables), args.seed, args.pcap_dir))
        return 0
    if args.fleet:
        from softdta.lab import fleet_demo
        from softdta.lab.fleet_lab import FleetLabError
        try:
            return fleet_demo.run(seed=args.seed, as_json=args.json, **({"rate": args.rate} if args.rate else {}))
        except FleetLabError as error:
            raise CliError(str(error)) from None
    from softdta.lab import demo
    from softdta.lab import topology as lab
    if args.burst_rate < 0:
        raise CliError(f"--burst-rate {args.burst_rate:g} must be 0 (as fast as the generators go) or more reports/s")
    if args.burst_seconds < 0:
        raise CliError(f"--burst-seconds {args.burst_seconds:g} must be 0 (no burst) or more")
    try:
        defaults = demo.DEFAULTS[args.collector]
        rate = min(defaults["rate"], demo.PYTHON_ENGINE_RATE) if args.engine == "python" else defaults["rate"]
        return demo.run(args.reporters, args.seed, args.scale or defaults["scale"], args.seconds, args.keep,
                        args.json, args.rate or rate, args.collector, args.engine, args.burst_rate,
                        args.burst_seconds)
    except lab.LabError as error:
        raise CliError(str(error)) from None


def _lab(args: argparse.Namespace) -> int:
    from softdta.lab import topology as lab
    try:
        if args.action == "up":
            state = lab.up(args.reporters, args.collector, args.engine, args.export)
            namespaces = ", ".join(state.reporter(i)["netns"] for i in range(1, state.reporters + 1))
            collector = "soft-RoCE guest" if state.collector == "rxe" else "XDP responder"
            exported = f"Append entries exported to {state.export_url} (in {lab.PREFIX}c); " if state.export_url \
                else ""
            print(f"lab up: {state.reporters} reporters ({namespaces}) -> {lab.PREFIX}t -> {lab.PREFIX}c "
                  f"({collector}); "
                  f"queries at {state.query_url} (inside the lab namespaces); "
                  f"{exported}"
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
                      f"{', ' + engine['io'] if 'io' in engine else ''}"
                      f"{', frames out through ' + engine['transmit'] if 'transmit' in engine else ''}) "
                      f"{'running' if report['translator']['running'] else 'NOT running'}, collector "
                      f"({report['collector']['kind']}) "
                      f"{'running' if report['collector']['running'] else 'NOT running'}")
                for name, value in report["translator"].get("counters", {}).items():
                    print(f"  {name:28} {value}")
    except lab.LabError as error:
        raise CliError(str(error)) from None
    return 0
