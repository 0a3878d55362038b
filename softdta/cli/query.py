"""`softdta query`: ask a collector's query service."""

from __future__ import annotations

import argparse
import json
import os
import sys

from softdta.cli.common import CliError, Commands, add_command, add_lookup_arguments
from softdta.core import registry


def register(commands: Commands) -> None:
    """Add the query command(s) to the `softdta` parser."""
    query = add_command(commands, "query", "read what a collector holds: look keys up, take Append entries, see "
                        "its structures, counters and health; or run SQL over snapshots",
                        "See docs/query.md; `softdta query sql \"SELECT ...\" --dir DIR` runs DuckDB over the Parquet "
                        "snapshots of any number of collectors under DIR (docs/export.md).")
    query.add_argument("--url", default="http://127.0.0.1:8040",
                       help="the collector's query service (default %(default)s)")
    query.add_argument("what", choices=["structures", "stats", "health", "metrics",
                                        *(p.name for p in registry.registered()), "sql"],
                       help="what to ask: the structures, the collector's counters, its health, its Prometheus "
                            "metrics, one structure (by its primitive), or snapshots (sql)")
    query.add_argument("name", nargs="?", help="structure name, as `softdta query structures` lists them; for sql, "
                                               "the SQL statement")
    add_lookup_arguments(query)
    query.add_argument("--follow", action="store_true",
                       help="Append: take new entries as they come, until interrupted; needs --token")
    query.add_argument("--token", default=os.environ.get("SOFTDTA_TOKEN"),
                       help="the collector's token, for --take and --follow (default: $SOFTDTA_TOKEN)")
    query.add_argument("--dir", help="sql: the directory of the snapshots (searched to any depth)")
    query.add_argument("--json", action="store_true", help="sql: the rows as JSON objects, one per line")
    query.set_defaults(run=_query)


def _query(args: argparse.Namespace) -> int:
    if args.what == "sql":
        return _sql(args)
    import urllib.error
    import urllib.request

    def keys() -> list[int | str]:
        return [int(k) if k.isdigit() else k for k in args.keys]

    primitive = next((p for p in registry.registered() if p.name == args.what), None)
    if primitive is not None and not args.name:
        raise CliError(f"query {args.what} needs a structure name; list them with `softdta query structures`")
    body = None
    path = f"/{args.what}" + (f"/{args.name}" if args.name else "")
    if primitive is not None and primitive.query is not None and primitive.query.takes_body():
        # the fields its query takes, from the options that give them
        options: dict[str, object] = {"keys": keys(), "redundancy": args.redundancy, "value_set": args.values}
        if args.consensus:
            options.update(mode="consensus", consensus=args.consensus)
        query = primitive.query
        body = {field: options[field] for field in query.required_fields + query.optional_fields if field in options}
    headers = {"Content-Type": "application/json"}
    ranges = primitive is not None and not primitive.has_structure  # lists (Append's), read or taken
    taking = ranges and (args.take or args.follow)
    if taking and not args.token:
        raise CliError("taking Append entries needs the collector's token: give --token or set SOFTDTA_TOKEN")
    if taking:
        headers["Authorization"] = f"Bearer {args.token}"
    if ranges:
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


def _sql(args: argparse.Namespace) -> int:
    from pathlib import Path

    from softdta.collector.warehouse import query
    if not args.name or args.keys:
        raise CliError('query sql takes one statement, quoted: softdta query sql "SELECT ..." --dir DIR')
    if not args.dir:
        raise CliError("query sql needs --dir: the directory the snapshots are in ([snapshot] dir, by default "
                       "<data_dir>/snapshots)")
    answer = query(Path(args.dir), args.name)
    if args.json:
        for row in answer.rows:
            print(json.dumps(dict(zip(answer.columns, row)), default=str))
        return 0
    shown = [answer.columns] + [["NULL" if value is None else str(value) for value in row] for row in answer.rows]
    widths = [max(len(line[column]) for line in shown) for column in range(len(answer.columns))]
    for line in shown:
        print("  ".join(value.ljust(width) for value, width in zip(line, widths)).rstrip())
    return 0
