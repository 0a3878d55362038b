"""Postcarding's state: the path of a flow being gathered in a cache entry."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PostcardEntry:
    key: bytes
    path_length: int
    values: list[int]
    hop_mask: int = 0
    first_ns: int = 0
    token: int = 0
