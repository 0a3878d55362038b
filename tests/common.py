"""Shared test constants and helpers (imported by tests; fixtures live in conftest.py)."""

import os
import shutil
from pathlib import Path

import pytest

from softdta.dta import Profile, Report
from softdta.frames import ip_bytes
from softdta.workload import ReporterAddress

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_TABLES = ROOT / "examples" / "tables.toml"
COLLECTOR_IP = ip_bytes("10.77.1.1")


def frames_of(reporter: ReporterAddress, reports: list[Report], profile: Profile = Profile.DTA_V1) -> list[bytes]:
    return [reporter.frame(report, profile) for report in reports]


def p4_tool(name: str) -> str:
    """p4c's `name` (p4test, p4c-bm2-ss): from $P4C (p4c's bin directory), then PATH, then ../shared/tools.
    Missing, it fails the test in CI (CI=true) and skips it elsewhere, saying how to get it."""
    directories = [os.environ.get("P4C", ""), str(ROOT.parent / "shared" / "tools" / "p4c" / "bin")]
    found = next((str(Path(d) / name) for d in directories[:1] if d and (Path(d) / name).is_file()), None) \
        or shutil.which(name) \
        or next((str(Path(d) / name) for d in directories[1:] if (Path(d) / name).is_file()), None)
    if found:
        return found
    message = (f"{name} (p4c) not found: build p4c (https://github.com/p4lang/p4c) and set P4C to its bin directory "
               "or put it on PATH; Debian bookworm and PyPI have no package (docs/p4.md)")
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def bmv2_tool(name: str) -> str:
    """bmv2's `name` (simple_switch_grpc, simple_switch_CLI): from $BMV2 (its bin directory), then PATH, then
    ../shared/tools. Missing, it fails the test in CI (CI=true) and skips it elsewhere, saying how to get it."""
    directories = [os.environ.get("BMV2", ""), str(ROOT.parent / "shared" / "tools" / "bmv2" / "bin")]
    found = next((str(Path(d) / name) for d in directories[:1] if d and (Path(d) / name).is_file()), None) \
        or shutil.which(name) \
        or next((str(Path(d) / name) for d in directories[1:] if (Path(d) / name).is_file()), None)
    if found:
        return found
    message = (f"{name} (bmv2) not found: build p4lang/behavioral-model with its P4Runtime server and set BMV2 to "
               "its bin directory or put it on PATH (docs/p4.md)")
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)
