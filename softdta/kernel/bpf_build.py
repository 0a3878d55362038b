"""Compiling softdta's BPF programs: clang against the UAPI headers (linux-libc-dev, libbpf-dev), no kernel
headers needed. Standard library only, because setup.py loads this file by path to build the objects a wheel
ships (softdta/kernel/resources.py), before softdta or its dependencies are installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

# The programs the product loads; a wheel ships them built.
SHIPPED = ("translator.bpf.c", "responder.bpf.c", "xsk_steer.bpf.c", "veth_peer.bpf.c", "reporter.bpf.c",
           "floor.bpf.c", "frame_sender.bpf.c", "local.bpf.c", "lab_switch.bpf.c")


class BuildError(Exception):
    """clang is missing or refused a program; the message says which and why."""


def object_name(source: Path) -> str:
    return source.name.replace(".c", ".o")


def compile_bpf(source: Path, target: Path, include_dir: Path) -> None:
    """Build `source` into `target`, atomically (a concurrent build never sees half an object)."""
    clang = shutil.which("clang")
    if clang is None:
        raise BuildError(f"clang is not installed, and {source.name} must be built; run `make setup` (it installs "
                         "clang and libbpf-dev), or install softdta from a wheel, which ships its BPF objects")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    multiarch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    command = [clang, "-O2", "-g", "-Wall", "-Werror", "-target", "bpf", "-I", str(include_dir),
               "-I", str(include_dir / "include"),
               "-I", f"/usr/include/{multiarch}", "-c", str(source), "-o", str(partial)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        partial.unlink(missing_ok=True)
        raise BuildError(f"clang failed to build {source.name}:\n{result.stderr.strip()}")
    os.replace(partial, target)
