"""`softdta fleet`: many collectors partitioned by key (docs/fleet.md). One function registers each action, one
runs it."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn, cast

from softdta.cli.common import Commands, add_command, print_summary
from softdta.spec import DEFAULT_SLOT_BITS, MAX_REPLICAS, MAX_SLOT_BITS


class OneLineErrors(argparse.ArgumentParser):
    """A parser whose bad arguments end it with one line and status 2, as every other error of the CLI does."""

    def error(self, message: str) -> NoReturn:
        print(f"softdta: error: {self.prog}: {message}; see `{self.prog} --help`", file=sys.stderr)
        sys.exit(2)


def register(commands: Commands) -> None:
    """Add the fleet command(s) to the `softdta` parser."""
    fleet = add_command(commands, "fleet", "spread keys over many collectors: plan a fleet",
                        "See docs/fleet.md.")
    actions = cast(Commands, fleet.add_subparsers(dest="action", required=True, title="actions",
                                                  parser_class=OneLineErrors))
    _register_plan(actions)
    _register_controller(actions)
    _register_status(actions)


def _register_plan(actions: Commands) -> None:
    plan = add_command(actions, "plan", "simulate a fleet: its slot balance, what a join or a leave moves, and "
                       "what churn writes to etcd", "A pure computation with the controller's assignment; no "
                       "fleet runs (docs/fleet.md).")
    plan.add_argument("--collectors", type=int, required=True, help="collectors in the fleet")
    plan.add_argument("--reporters", type=int,
                      help="reporters and translators watching the slot map (default: 10 per collector)")
    plan.add_argument("--replicas", type=int, default=1,
                      help=f"collectors per slot, 1..{MAX_REPLICAS} (default %(default)s)")
    plan.add_argument("--slot-bits", type=int, default=DEFAULT_SLOT_BITS,
                      help=f"the slot map has 2^bits slots, 1..{MAX_SLOT_BITS} (default %(default)s)")
    plan.add_argument("--churn", type=float, default=1.0, metavar="JOINS_PER_HOUR",
                      help="collector joins per hour, each matched by a leave (default %(default)s)")
    plan.add_argument("--json", action="store_true", help="print JSON")
    plan.set_defaults(run=_plan)


def _plan(args: argparse.Namespace) -> int:
    from softdta.core.fleet_plan import PlanInput, plan
    reporters = 10 * args.collectors if args.reporters is None else args.reporters
    result = plan(PlanInput(args.collectors, reporters, replicas=args.replicas, slot_bits=args.slot_bits,
                            churn_per_hour=args.churn))
    if args.json:
        print(result.to_json())
        return 0
    n = result.collectors
    print_summary({
        "fleet": {"collectors": n, "reporters and translators": result.reporters, "replicas": result.replicas,
                  "slots": result.slots},
        "balance (slots led, max/mean)": {
            "simulated": result.max_over_mean,
            "best these slots allow": result.best_max_over_mean,
            "goal": f"<= {result.balance_goal}"},
        "moved on one join": {
            "simulated": _fraction(result.moved_on_join),
            "ideal 1/(N+1)": _fraction(result.ideal_on_join),
            "goal 1.2/N": _fraction(result.join_goal)},
        "moved on one leave": {
            "simulated": _fraction(result.moved_on_leave),
            "ideal (the leaver's share)": _fraction(result.ideal_on_leave)},
        "etcd per membership change": {
            "writes": f"{result.writes_per_change} (member, slot map, {result.reporters} applied)",
            "bytes written": result.bytes_per_change,
            "slot map bytes": f"{result.slot_map_bytes}" + ("" if result.slot_map_fits_etcd else
                                                            " (over etcd's default 1.5 MiB request limit)"),
            "bytes sent to watchers": result.watch_bytes_per_change},
        f"etcd under {result.churn_per_hour:g} joins/hour": {
            "writes/s": result.writes_per_second,
            "bytes/s": result.bytes_per_second},
    }, as_json=False)
    return 0


def _fraction(value: float) -> str:
    return f"{value:.6f} ({value * 100:.3f} %)"


def _register_controller(actions: Commands) -> None:
    controller = add_command(actions, "controller", "run a fleet controller: commit a slot map epoch whenever the "
                             "collectors change", "Several may run: one leads by election in etcd, the others "
                             "take over within the lease TTL when it goes (docs/fleet.md, \"Control plane on "
                             "etcd\"). Runs until SIGINT or SIGTERM; etcd unreachable is logged and retried.")
    controller.add_argument("--etcd", required=True, metavar="URL", help="etcd's client URL, http://HOST:PORT")
    controller.add_argument("--fleet", required=True, metavar="NAME", help="the fleet (its keys are under "
                            "/softdta/NAME/)")
    controller.add_argument("--replicas", type=int, default=1,
                            help=f"collectors per slot, 1..{MAX_REPLICAS} (default %(default)s)")
    controller.add_argument("--slot-bits", type=int, default=DEFAULT_SLOT_BITS,
                            help=f"the slot map has 2^bits slots, 1..{MAX_SLOT_BITS} (default %(default)s)")
    controller.add_argument("--id", help="this controller's name in the leader key (default HOST-PID)")
    controller.add_argument("--lease-ttl", type=int, metavar="S",
                            help="seconds a dead leader keeps the lead (default 5, at least 2)")
    controller.add_argument("--metrics", metavar="HOST:PORT",
                            help="serve the controller's counters for Prometheus at http://HOST:PORT/metrics")
    controller.set_defaults(run=_controller)


def _controller(args: argparse.Namespace) -> int:
    from softdta.cli.common import Signals
    from softdta.etcd.client import Etcd
    from softdta.fleet.controller import LEASE_TTL_S, Controller, serve_metrics
    ttl = LEASE_TTL_S if args.lease_ttl is None else args.lease_ttl
    controller = Controller(Etcd(args.etcd), args.fleet, ident=args.id, replicas=args.replicas,
                            slot_bits=args.slot_bits, lease_ttl=ttl)
    if args.metrics:
        serve_metrics(controller, args.metrics)
    print(f"softdta fleet controller {controller.ident} up: fleet {args.fleet}, etcd {controller.etcd.endpoint}",
          flush=True)
    controller.run(Signals())
    return 0


def _register_status(actions: Commands) -> None:
    status = add_command(actions, "status", "show a fleet: its collectors, leader, epoch, slots per collector and "
                         "the epoch each translator and reporter applies", "Reads etcd once; exits 2 when etcd "
                         "does not answer.")
    status.add_argument("--etcd", required=True, metavar="URL", help="etcd's client URL, http://HOST:PORT")
    status.add_argument("--fleet", required=True, metavar="NAME", help="the fleet")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(run=_status)


def _status(args: argparse.Namespace) -> int:
    import json

    from softdta.etcd.client import Etcd
    from softdta.fleet.controller import fleet_status
    status = fleet_status(Etcd(args.etcd), args.fleet)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    epoch = status["epoch"]
    print_summary({
        "fleet": args.fleet,
        "leader": status["leader"] or "none (no controller runs)",
        "epoch": epoch if epoch is not None else f"none ({status['slot_map_problem'] or 'no slot map yet'})",
        "collectors (weight, slots led/held)": {
            name: f"{member['ip']}  weight {member['weight']:g}  slots {member['slots_led']}/{member['slots_held']}"
            for name, member in status["members"].items()} or "none registered",
        "in the map, not registered": ", ".join(status["unregistered_in_map"]) or "none",
        "applied (translators, reporters)": {
            name: f"epoch {applied.get('epoch')}" + ("" if applied["current"] else f" (behind {epoch})")
            for name, applied in status["applied"].items()} or "none",
    }, as_json=False)
    return 0
