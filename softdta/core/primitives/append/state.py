"""Append's state: each list's batch being gathered and its ring head."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AppendRuntime:
    head: int = 0
    pending: list[bytes] = field(default_factory=list)
    first_pending_ns: int = 0
    token: int = 0  # names this batch in the flush queue
    # the heads of rings on other collectors the list wrote before a fleet moved it, by (collector IP, R_Key)
    parked: dict[tuple[bytes, int], int] = field(default_factory=dict)
