"""What every command module shares: the repository root, the one CLI error, adding a command, the summary
printer, and the signals of long-running commands."""

from __future__ import annotations

import argparse
import json
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import TypeAlias

from softdta.errors import SoftdtaError

REPO_ROOT = Path(__file__).resolve().parents[2]

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # the sub-commands of a parser


class CliError(SoftdtaError):
    """A user-facing error: the message names the problem and the fix."""


def add_command(commands: Commands, name: str, summary: str, details: str = "") -> argparse.ArgumentParser:
    """A sub-command: `summary` is its line in the parent's --help, and opens its own --help, which `details`
    continues."""
    sentence = summary[0].upper() + summary[1:] + "."
    return commands.add_parser(name, help=summary, description=f"{sentence} {details}" if details else sentence)


def add_lookup_arguments(parser: argparse.ArgumentParser) -> None:
    """The keys and lookup options that `softdta query` and `softdta fleet query` share."""
    parser.add_argument("keys", nargs="*", help="keys: hex in wire order (0a000001) or integers")
    parser.add_argument("--redundancy", "-n", type=int, default=2,
                        help="Key-Write and Key-Increment: the copies of each key the reporters asked for "
                             "(default %(default)s)")
    parser.add_argument("--consensus", type=int,
                        help="Key-Write: answer only when this many copies agree (consensus mode)")
    parser.add_argument("--values", type=int, nargs="*", default=[],
                        help="Postcarding: the values hops may report, for example every switch ID (the value set)")
    parser.add_argument("--list", type=int, help="Append: read (or take) this list only")
    parser.add_argument("--take", action="store_true",
                        help="Append: take the entries (each is taken once) instead of reading them; needs --token")


def print_summary(summary: Mapping[str, object], as_json: bool) -> None:
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


class Signals:
    """What a long-running command's main loop runs until: SIGTERM or SIGINT stops it, SIGHUP (with `reload`)
    reloads, and both are acted on in the loop, never inside a signal handler.

    Python runs a handler in the main thread between two bytecodes. One that called `threading.Event.set` while
    the main thread was inside `Event.wait` on that very event, holding its lock, waited for that lock forever:
    a SIGTERM hung `softdta translator up` for good. These handlers only set flags, which takes no lock; `wait`
    polls them, and `is_set` runs a pending reload. The engines' `serve` takes this as its `stop`."""

    def __init__(self, reload: Callable[[], None] | None = None, poll_s: float = 0.05):
        self._stopping = self._reload_asked = False
        self._reload, self._poll_s = reload, poll_s
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        if reload is not None:
            signal.signal(signal.SIGHUP, self._on_reload)

    def _on_stop(self, _signal: int, _frame: FrameType | None) -> None:
        self._stopping = True

    def _on_reload(self, _signal: int, _frame: FrameType | None) -> None:
        self._reload_asked = True

    def set(self) -> None:
        self._stopping = True

    def is_set(self) -> bool:
        if self._reload_asked and self._reload is not None:
            self._reload_asked = False  # signals that come during the reload ask for one more
            self._reload()
        return self._stopping

    def wait(self, timeout: float | None = None) -> bool:
        """Whether a stop came within `timeout` seconds (None: wait for one); sees it within `poll_s`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = self._poll_s if deadline is None else min(self._poll_s, deadline - time.monotonic())
            if left <= 0:
                return False
            time.sleep(left)
        return True
