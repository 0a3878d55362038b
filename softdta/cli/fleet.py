"""`softdta fleet`: many collectors partitioned by key (docs/fleet.md). One function registers each action, one
runs it."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn, cast

from softdta.cli.common import Commands, add_command, add_lookup_arguments, print_summary
from softdta.spec import DEFAULT_SLOT_BITS, MAX_REPLICAS, MAX_SLOT_BITS


class OneLineErrors(argparse.ArgumentParser):
    """A parser whose bad arguments end it with one line and status 2, as every other error of the CLI does."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:  # else the top parser would report them, with its usage
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        print(f"softdta: error: {self.prog}: {message}; see `{self.prog} --help`", file=sys.stderr)
        sys.exit(2)


def register(commands: Commands) -> None:
    """Add the fleet command(s) to the `softdta` parser."""
    fleet = add_command(commands, "fleet", "spread keys over many collectors: plan, control and query a fleet",
                        "See docs/fleet.md.")
    actions = cast(Commands, fleet.add_subparsers(dest="action", required=True, title="actions",
                                                  parser_class=OneLineErrors))
    _register_plan(actions)
    _register_controller(actions)
    _register_status(actions)
    _register_router(actions)
    _register_query(actions)


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


def _register_router(actions: Commands) -> None:
    router = add_command(actions, "router", "serve queries over the whole fleet with a collector's query API",
                         "Follows the slot map and the collectors in etcd; each query goes to the collectors that "
                         "own its keys, in the current epoch and the ones before it, and their answers are merged. "
                         "A collector that does not answer makes the answer partial (\"partial\": true, "
                         "\"missing_slots\"). Runs until SIGINT or SIGTERM (docs/fleet.md, \"Federated queries\").")
    router.add_argument("--etcd", required=True, metavar="URL", help="etcd's client URL, http://HOST:PORT")
    router.add_argument("--fleet", required=True, metavar="NAME", help="the fleet")
    router.add_argument("--listen", default="127.0.0.1:8050", metavar="HOST:PORT",
                        help="where to serve (default %(default)s)")
    router.set_defaults(run=_router)


def _router(args: argparse.Namespace) -> int:
    from softdta.cli.common import CliError
    from softdta.etcd.client import Etcd
    from softdta.fleet.router import run
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise CliError(f"--listen {args.listen!r} is not HOST:PORT")

    def ready(bound: int) -> None:
        print(f"softdta fleet router up on http://{host}:{bound}: fleet {args.fleet}, etcd {args.etcd}", flush=True)
    run(Etcd(args.etcd), args.fleet, host, int(port), ready)
    return 0


def _register_query(actions: Commands) -> None:
    from softdta.core import registry
    query = add_command(actions, "query", "ask the whole fleet once: look keys up, read a sketch or an Append list",
                        "Reads the slot map and the collectors from etcd, asks the collectors that own the keys and "
                        "prints the merged answer as JSON, as `softdta query` prints a collector's. Exits 3 when "
                        "the answer is partial (a collector did not answer; \"missing_slots\" names its slots).")
    query.add_argument("--etcd", required=True, metavar="URL", help="etcd's client URL, http://HOST:PORT")
    query.add_argument("--fleet", required=True, metavar="NAME", help="the fleet")
    query.add_argument("what", choices=[p.name for p in registry.registered()
                                        if p.query is not None or not p.has_structure],
                       help="the primitive whose structures to ask (Append: its lists)")
    add_lookup_arguments(query)
    query.add_argument("--token", default=os.environ.get("SOFTDTA_TOKEN"),
                       help="the collectors' token, for --take (default: $SOFTDTA_TOKEN)")
    query.add_argument("--timeout", type=float, default=5.0, metavar="S",
                       help="seconds a collector has to answer before it counts as down (default %(default)s)")
    query.set_defaults(run=_query)


def _query(args: argparse.Namespace) -> int:
    import json
    from typing import Any

    from softdta.cli.common import CliError
    from softdta.core import registry
    from softdta.etcd.client import Etcd
    from softdta.fleet.router import Router, query_once
    primitive = registry.by_name(args.what)
    if not primitive.has_structure:  # lists (Append's)
        if args.list is None:
            raise CliError("fleet query append needs --list: the router reads one list at a time")
        if args.take and not args.token:
            raise CliError("taking Append entries needs the collectors' token: give --token or set SOFTDTA_TOKEN")

        async def ask(router: Router) -> dict[str, Any]:
            return await router.append(args.list, args.take, f"Bearer {args.token}" if args.take else None)
    else:
        options: dict[str, object] = {"keys": [int(k) if k.isdigit() else k for k in args.keys],
                                      "redundancy": args.redundancy, "value_set": args.values}
        if args.consensus:
            options.update(mode="consensus", consensus=args.consensus)
        fields = {name: options[name] for name in primitive.query.required_fields + primitive.query.optional_fields
                  if name in options} if primitive.query is not None else {}

        async def ask(router: Router) -> dict[str, Any]:
            return await router.query(primitive, fields)
    answer = query_once(Etcd(args.etcd), args.fleet, ask, timeout=args.timeout)
    print(json.dumps(answer))
    if answer.get("partial"):
        print(f"softdta: partial answer: {', '.join(answer['down']) or 'some collectors'} did not answer; "
              f"{len(answer['missing_slots'])} slot(s) missing", file=sys.stderr)
        return 3
    return 0
