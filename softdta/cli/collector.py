"""`softdta collector up`: a collector with its control and query services."""

from __future__ import annotations

import argparse
import dataclasses

from softdta.cli.common import CliError, Commands, add_command


def register(commands: Commands) -> None:
    """Add the collector command(s) to the `softdta` parser."""
    collector = add_command(commands, "collector", "keep the DTA structures that translators write into, and "
                            "serve queries on them")
    collector_actions = collector.add_subparsers(dest="action", required=True, title="actions")
    collector_up = add_command(collector_actions, "up", "run a collector until interrupted",
                               "It advertises its structures to translators on its control service and answers "
                               "queries on its query service (docs/collector.md).")
    collector_up.add_argument("--config", required=True, help="collector configuration (TOML, docs/collector.md)")
    collector_up.add_argument("--netns", help="run in this network namespace")
    collector_up.add_argument("--control-host", default="0.0.0.0",
                              help="address the control service, which translators connect to, listens on "
                                   "(default %(default)s)")
    collector_up.add_argument("--query-host", default="127.0.0.1",
                              help="address the query service (HTTP) listens on (default %(default)s)")
    collector_up.add_argument("--etcd", metavar="URL", help="register in a fleet through etcd at this client URL "
                              "(http://HOST:PORT; docs/fleet.md); needs --fleet")
    collector_up.add_argument("--fleet", metavar="NAME", help="the fleet to join")
    collector_up.add_argument("--weight", type=float, default=1.0,
                              help="its share of the fleet's slots relative to the others' (default %(default)s)")
    collector_up.add_argument("--lease-ttl", type=int, metavar="S",
                              help="seconds until a crashed collector leaves the fleet (default 5, at least 2)")
    collector_up.add_argument("--export", metavar="URL", help="publish every Append entry to NATS JetStream at "
                              "nats://HOST:PORT (the [export] section's url; docs/export.md)")
    collector_up.add_argument("--snapshot-every", type=float, metavar="S",
                              help="write a Parquet snapshot of every structure each S seconds (the [snapshot] "
                                   "section's every; docs/export.md)")
    collector_up.add_argument("--translate-locally", action="store_true",
                              help="translate the DTA reports this collector receives itself, into its own memory: "
                                   "the translator's XDP program on the responder's arena, no RoCE frames "
                                   "([collector] translate_locally; xdp backend only; docs/collector.md)")
    collector_up.set_defaults(run=_collector_up)
    collector_snapshot = add_command(collector_actions, "snapshot", "ask a running collector to write a Parquet "
                                     "snapshot of every structure, and print its files",
                                     "It asks the collector's query service (its query_port, with the token of its "
                                     "configuration); the files go to [snapshot] dir, by default "
                                     "<data_dir>/snapshots (docs/export.md).")
    collector_snapshot.add_argument("--config", required=True, help="the running collector's configuration (TOML)")
    collector_snapshot.add_argument("--url", help="its query service (default http://127.0.0.1:<query_port>)")
    collector_snapshot.add_argument("--netns", help="ask from this network namespace (where the collector runs)")
    collector_snapshot.set_defaults(run=_collector_snapshot)


def _collector_up(args: argparse.Namespace) -> int:
    from softdta.collector.backend import BackendError
    from softdta.collector.config import CollectorConfig
    from softdta.collector.control import ControlError
    from softdta.collector.daemon import StartError, run
    from softdta.collector.registration import DEFAULT_LEASE_TTL_S, FleetSettings
    from softdta.core.export import ExportSettings
    config = CollectorConfig.from_toml(args.config)
    if args.translate_locally:
        config.translate_locally = True
        config.validate()
    if args.export:
        config.export = dataclasses.replace(config.export, url=args.export) if config.export else \
            ExportSettings(args.export)
        config.validate()
    if not config.token:
        raise CliError(f"{args.config}: [collector] token is missing or empty; set one, translators must "
                       "authenticate with it")
    if args.snapshot_every is not None:
        if not args.snapshot_every > 0 or args.snapshot_every == float("inf"):
            raise CliError(f"--snapshot-every {args.snapshot_every} must be a positive number of seconds")
        if config.snapshots_dir() is None:
            raise CliError(f"{args.config}: --snapshot-every needs a directory for the snapshots; set [snapshot] dir "
                           "or [collector] data_dir")
        config.snapshot_every = args.snapshot_every
    if bool(args.etcd) != bool(args.fleet):
        raise CliError("--etcd and --fleet go together: give both to join a fleet, or neither")
    fleet = None
    if args.etcd:
        ttl = DEFAULT_LEASE_TTL_S if args.lease_ttl is None else args.lease_ttl
        fleet = FleetSettings(args.etcd, args.fleet, args.weight, ttl)
        fleet.validate()
    from softdta.links.local import LocalLink
    try:
        if args.netns:
            from softdta.kernel.netns import in_netns
            with in_netns(args.netns):
                run(config, control_host=args.control_host, query_host=args.query_host, fleet=fleet,
                    translate_locally=LocalLink)
        else:
            run(config, control_host=args.control_host, query_host=args.query_host, fleet=fleet,
                translate_locally=LocalLink)
    except (BackendError, StartError, ControlError) as error:
        raise CliError(str(error)) from None
    return 0


def _collector_snapshot(args: argparse.Namespace) -> int:
    import json
    import urllib.error
    import urllib.request

    from softdta.collector.config import CollectorConfig
    config = CollectorConfig.from_toml(args.config)
    url = args.url or f"http://127.0.0.1:{config.query_port}"
    request = urllib.request.Request(f"{url}/snapshot", method="POST",
                                     headers={"Authorization": f"Bearer {config.token}"})

    def ask() -> dict[str, object]:
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                answer: dict[str, object] = json.loads(response.read())
                return answer
        except urllib.error.HTTPError as error:
            reason = json.loads(error.read() or b"{}").get("error", error.reason)
            raise CliError(f"{url}/snapshot: {error.code} {reason}") from None
        except urllib.error.URLError as error:
            raise CliError(f"{url}: {error.reason}; is `softdta collector up --config {args.config}` running (give "
                           "--url or --netns if it listens elsewhere)?") from None

    if args.netns:
        from softdta.kernel.netns import in_netns
        with in_netns(args.netns):
            answer = ask()
    else:
        answer = ask()
    files = answer.get("files")
    for path in files if isinstance(files, list) else []:
        print(path)
    return 0
