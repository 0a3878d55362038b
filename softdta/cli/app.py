"""The `softdta` command line: one module per command group (offline, translator, collector, query, fleet,
lab, compose, p4, codegen); this one parses and dispatches, and turns every SoftdtaError into one line and exit
status 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from softdta.cli import codegen, collector, compose, fleet, lab, offline, p4, query, translator
from softdta.errors import SoftdtaError

DESCRIPTION = """\
softdta turns the telemetry reports switches send (DTA, UDP port 40040) into
RDMA writes (RoCEv2) that land in a collector's memory, where queries read
them without the collector's CPU handling any report.

  try it:     softdta demo             the whole path live, in namespaces (root)
              softdta demo --offline   the same kind of workload in this process
  deploy it:  softdta collector up     where the data is kept
              softdta translator up    where the reports arrive
              softdta query            read what a collector holds"""

EPILOG = """\
`softdta COMMAND --help` tells what a command does and what each of its options
means; the guides are in docs/."""


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.run
    try:
        return command(args)
    except SoftdtaError as error:
        print(f"softdta: error: {error.line()}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"softdta: error: {error.filename}: no such file; check the path", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="softdta", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, title="commands")
    for group in (offline, translator, collector, query, fleet, lab, compose, p4, codegen):
        group.register(commands)
    return parser
