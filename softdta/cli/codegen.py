"""`softdta codegen`: regenerate what the spec generates."""

from __future__ import annotations

import argparse

from softdta.cli.common import REPO_ROOT, Commands, add_command


def register(commands: Commands) -> None:
    """Add the codegen command(s) to the `softdta` parser."""
    from softdta.codegen.generate import GENERATED
    generate = add_command(commands, "codegen", "regenerate the C and P4 files made from softdta's spec (after "
                           "changing softdta/spec)", "They are: " + ", ".join(str(path) for path in GENERATED) + ".")
    generate.add_argument("--check", action="store_true",
                          help="change nothing; list the files that are out of date and exit 1 if any")
    generate.set_defaults(run=_codegen)


def _codegen(args: argparse.Namespace) -> int:
    from softdta.codegen.generate import stale, write_all
    if args.check:
        outdated = stale(REPO_ROOT)
        for path in outdated:
            print(f"stale: {path} (run `softdta codegen`)")
        return 1 if outdated else 0
    for path in write_all(REPO_ROOT):
        print(f"generated {path}")
    return 0
