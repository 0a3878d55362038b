"""What every command module shares: the repository root, the one CLI error, the summary printer."""

from __future__ import annotations

import json
from pathlib import Path

from softdta.errors import SoftdtaError

REPO_ROOT = Path(__file__).resolve().parents[2]


class CliError(SoftdtaError):
    """A user-facing error: the message names the problem and the fix."""


def print_summary(summary: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    for section, values in summary.items():
        if isinstance(values, dict):
            print(f"{section}:")
            for name, value in values.items():
                print(f"  {name:28} {value}")
        else:
            print(f"{section:30} {values}")
