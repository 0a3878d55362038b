"""`softdta collector up`: a collector with its control and query services."""

from __future__ import annotations

from softdta.cli.common import CliError


def register(commands) -> None:
    """Add the collector command(s) to the `softdta` parser."""
    collector = commands.add_parser("collector", help="host DTA structures and serve queries")
    collector_actions = collector.add_subparsers(dest="action", required=True)
    collector_up = collector_actions.add_parser("up", help="run a collector until interrupted")
    collector_up.add_argument("--config", required=True, help="collector configuration (TOML, docs/collector.md)")
    collector_up.add_argument("--netns", help="run in this network namespace")
    collector_up.add_argument("--control-host", default="0.0.0.0", help="address of the control service")
    collector_up.add_argument("--query-host", default="127.0.0.1", help="address of the query service")
    collector_up.set_defaults(run=_collector_up)


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
