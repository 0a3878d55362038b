"""Shared test constants and helpers (imported by tests; fixtures live in conftest.py)."""

import os
import shutil
from pathlib import Path

import pytest

from softdta.core.workload import ReporterAddress
from softdta.wire.dta import Profile, Report
from softdta.wire.frames import ip_bytes

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_TABLES = ROOT / "examples" / "tables.toml"
COLLECTOR_IP = ip_bytes("10.77.1.1")


def frames_of(reporter: ReporterAddress, reports: list[Report], profile: Profile = Profile.DTA_V1) -> list[bytes]:
    return [reporter.frame(report, profile) for report in reports]


def shared_tool(name: str, variable: str, folder: str, how_to_get: str) -> str:
    """A tool not packaged for Debian or PyPI: from $`variable` (its bin directory), then PATH, then
    ../shared/tools/`folder`/bin. Missing, it fails the test in CI (CI=true) and skips it elsewhere."""
    given = Path(os.environ.get(variable, "")) / name if os.environ.get(variable) else None
    shared = ROOT.parent / "shared" / "tools" / folder / "bin" / name
    found = (str(given) if given and given.is_file() else None) or shutil.which(name) \
        or (str(shared) if shared.is_file() else None)
    if found:
        return found
    message = f"{name} not found: {how_to_get}, then set {variable} to its bin directory or put it on PATH (docs/p4.md)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def p4_tool(name: str) -> str:
    """p4c's `name` (p4test, p4c-bm2-ss)."""
    return shared_tool(name, "P4C", "p4c", "build p4c (https://github.com/p4lang/p4c)")


def bmv2_tool(name: str) -> str:
    """bmv2's `name` (simple_switch_grpc, simple_switch_CLI)."""
    return shared_tool(name, "BMV2", "bmv2", "build p4lang/behavioral-model with its P4Runtime server")
