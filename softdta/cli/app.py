"""The `softdta` command line: one module per command group (offline, translator, collector, query, p4, codegen,
lab); this one parses and dispatches, and turns every SoftdtaError into one line and exit status 2."""

from __future__ import annotations

import argparse
import sys

from softdta.cli import codegen, collector, lab, offline, p4, query, translator
from softdta.errors import SoftdtaError


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
    for group in (offline, translator, collector, query, lab, p4, codegen):
        group.register(commands)
    return parser
