"""Typed, checked access to one table of a TOML configuration (translator tables, collector configuration).

Every setting is read through an accessor that checks its type and range, so a bad value is refused with its
name and the fix; a key no accessor knows is a misspelling, and the error suggests the closest known name.
"""

from __future__ import annotations

import difflib
from typing import Any

from softdta.errors import SoftdtaError

_REQUIRED = object()


class TableError(SoftdtaError, ValueError):
    """A configuration (translator tables, collector configuration) that cannot work; the message names the
    entry, the problem and the fix."""


class Settings:
    """The settings of one table; `where` names it in errors (`[collector]`, `structure key-write`, ...)."""

    def __init__(self, where: str, value: Any, known: tuple[str, ...]):
        if not isinstance(value, dict):
            raise TableError(f"{where} must be a table (key = value settings), not {value!r}")
        for key in sorted(set(value) - set(known)):
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"the settings here are {', '.join(known)}"
            raise TableError(f"{where}: unknown setting {key!r}; {hint}")
        self.where, self.value = where, value

    def __contains__(self, key: str) -> bool:
        return key in self.value

    def _get(self, key: str, default: Any) -> Any:
        if key in self.value:
            return self.value[key]
        if default is _REQUIRED:
            raise TableError(f"{self.where}: missing required setting {key!r}")
        return default

    def integer(self, key: str, default: Any = _REQUIRED, minimum: int | None = None,
                maximum: int | None = None) -> int:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise TableError(f"{self.where}: {key} = {value!r} must be a whole number")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            span = f"from {minimum} to {maximum}" if maximum is not None else f"at least {minimum}"
            raise TableError(f"{self.where}: {key} = {value} is out of range; give a whole number {span}")
        return value

    def number(self, key: str, default: Any = _REQUIRED, minimum: float = 0.0) -> float:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= minimum \
                or value == float("inf"):
            raise TableError(f"{self.where}: {key} = {value!r} must be a finite number of at least {minimum}")
        return float(value)

    def text(self, key: str, default: Any = _REQUIRED, choices: tuple[str, ...] | None = None,
             empty: bool = True) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise TableError(f"{self.where}: {key} = {value!r} must be a string (in quotes)")
        if choices is not None and value not in choices:
            raise TableError(f"{self.where}: {key} = {value!r} must be one of {', '.join(map(repr, choices))}")
        if not empty and not value:
            raise TableError(f"{self.where}: {key} must not be empty")
        return value

    def boolean(self, key: str, default: Any = _REQUIRED) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise TableError(f"{self.where}: {key} = {value!r} must be true or false")
        return value

    def table(self, key: str, known: tuple[str, ...], where: str | None = None) -> Settings:
        return Settings(where or f"{self.where} {key}", self._get(key, _REQUIRED), known)


def tables_of(document: dict[str, Any], key: str, known: tuple[str, ...], what: str) -> list[Settings]:
    """An array of tables (`[[key]]`), each checked against `known`."""
    entries = document.get(key, [])
    if not isinstance(entries, list):
        raise TableError(f"{key} must be an array of tables ([[{key}]] sections), not {entries!r}")
    return [Settings(f"{what} {index + 1}", entry, known) for index, entry in enumerate(entries)]
