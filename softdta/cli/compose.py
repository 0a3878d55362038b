"""`softdta compose`: the reporter and check roles of docker-compose.yml's lab (docs/lab.md)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from softdta.cli.common import CliError, Commands, add_command

if TYPE_CHECKING:
    from softdta.lab.compose import Run


def register(commands: Commands) -> None:
    """Add the compose command(s) to the `softdta` parser."""
    compose = add_command(commands, "compose", "the roles docker-compose.yml runs besides collectors and translators: "
                          "reporters and the verdict (root for report)",
                          "A fleet's reporters send a workload made from --seed once the fleet is ready; the check "
                          "reads every key and list back through the query router and exits 1 on any shortfall "
                          "(docs/lab.md, \"The lab in containers\").")
    actions = compose.add_subparsers(dest="action", required=True, title="actions")
    report = add_command(actions, "report", "send this reporter's share of the workload, then stay up until stopped")
    check = add_command(actions, "check", "wait for every reporter, then hold the fleet's answers to the prediction")
    for parser in (report, check):
        parser.add_argument("--etcd", required=True, metavar="URL", help="the fleet's etcd, http://HOST:PORT")
        parser.add_argument("--fleet", required=True, metavar="NAME", help="the fleet")
        parser.add_argument("--reporters", type=int, required=True, help="how many reporters share the workload")
        parser.add_argument("--keys", type=int, default=1000, help="Key-Write keys per reporter (default %(default)s)")
        parser.add_argument("--entries", type=int, default=16, help="Append entries per list (default %(default)s)")
        parser.add_argument("--seed", type=int, default=0, help="the workload's seed (default %(default)s)")
        parser.add_argument("--timeout", type=float, default=120.0, metavar="S",
                            help="how long to wait for the fleet, and for the answers (default %(default)s)")
    report.add_argument("--index", type=int, required=True, help="this reporter's number, 1 to --reporters")
    report.add_argument("--interface", "-i", required=True, help="the interface to send from")
    report.add_argument("--reporter", required=True, metavar="IP", help="the reports' source IP")
    report.add_argument("--reporter-mac", required=True, metavar="MAC", help="the reports' source MAC")
    report.add_argument("--translator-mac", required=True, metavar="MAC", help="the next hop: this reporter's "
                                                                              "translator")
    report.add_argument("--fleet-address", required=True, metavar="IP", help="the address the fleet's translators "
                                                                            "answer")
    report.add_argument("--collectors", type=int, required=True,
                        help="send once the slot map spans this many collectors")
    report.add_argument("--translator", action="append", required=True, metavar="NAME",
                        help="and this translator applied it in full, connected to every replica (repeat for "
                             "each)")
    report.add_argument("--rate", type=float, default=5000.0, help="reports/s (default %(default)s)")
    report.set_defaults(run=_report)
    check.add_argument("--router", required=True, metavar="URL", help="the fleet's query router, http://HOST:PORT")
    check.add_argument("--nats", metavar="URL", help="read the Append lists from this NATS server, where the "
                                                     "collectors export them (taking them from their rings)")
    check.add_argument("--json", action="store_true", help="print the summary as JSON")
    check.set_defaults(run=_check)


def _run(args: argparse.Namespace) -> Run:
    from softdta.lab.compose import Run
    if args.reporters < 1 or args.keys < 1 or args.entries < 1:
        raise CliError("--reporters, --keys and --entries must be 1 or more")
    return Run(args.etcd, args.fleet, args.reporters, args.keys, args.entries, args.seed)


def _report(args: argparse.Namespace) -> int:
    from softdta.lab import compose
    if not 1 <= args.index <= args.reporters:
        raise CliError(f"--index {args.index} must be 1 to --reporters {args.reporters}")
    if args.rate <= 0:
        raise CliError(f"--rate {args.rate:g} must be more than 0 reports/s")
    address = compose.reporter_address(args.reporter, args.reporter_mac, args.translator_mac, args.fleet_address)
    return compose.report(_run(args), args.index, address, args.interface, args.rate,
                          args.collectors, args.translator, args.timeout)


def _check(args: argparse.Namespace) -> int:
    from softdta.lab import compose
    summary, problems = compose.check(_run(args), args.router.rstrip("/"), args.nats,
                                      args.timeout)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"reports sent: {summary['reports_sent']:,} by {len(summary['reporters'])} reporters; Key-Write: "
              f"{summary['key_write']['keys']:,} keys with {summary['key_write']['copies']} copies across "
              f"collectors; Append: {summary['append']['lists']} lists, {summary['append']['entries']:,} entries"
              + (f"; exported lists read from NATS: {summary['exported_lists']}" if args.nats else ""))
        print("problems: " + "; ".join(problems) if problems else
              "every key read back as predicted through the router, and every list "
              + ("from NATS JetStream" if args.nats else "through the router"))
    return 1 if problems else 0
