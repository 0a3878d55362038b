"""`softdta codegen`: regenerate what the spec generates."""

from __future__ import annotations

from softdta.cli.common import REPO_ROOT


def register(commands) -> None:
    """Add the codegen command(s) to the `softdta` parser."""
    from softdta.codegen.generate import GENERATED
    generate = commands.add_parser("codegen", help="regenerate the files the spec generates: "
                                   + ", ".join(str(path) for path in GENERATED))
    generate.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    generate.set_defaults(run=_codegen)


def _codegen(args) -> int:
    from softdta.codegen.generate import stale, write_all
    if args.check:
        outdated = stale(REPO_ROOT)
        for path in outdated:
            print(f"stale: {path} (run `softdta codegen`)")
        return 1 if outdated else 0
    for path in write_all(REPO_ROOT):
        print(f"generated {path}")
    return 0
