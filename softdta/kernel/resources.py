"""Where softdta's parts that are not Python live: the BPF programs and the P4 sources.

A wheel ships them inside the package, in `softdta/_data/`, with the BPF objects built when the wheel was
(setup.py): an installed softdta loads its programs with no compiler present. A source checkout has them at its
root (`bpf/`, `p4/`), and builds a BPF object on first use and whenever its sources change.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]
_WHEEL_DATA = _PACKAGE / "_data"

INSTALLED = _WHEEL_DATA.is_dir()
BPF_DIR = _WHEEL_DATA / "bpf" if INSTALLED else _PACKAGE.parent / "bpf"
P4_DIR = _WHEEL_DATA / "p4" if INSTALLED else _PACKAGE.parent / "p4"
