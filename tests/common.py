"""Shared test constants and helpers (imported by tests; fixtures live in conftest.py)."""

from pathlib import Path

from softdta.dta import Profile, Report
from softdta.frames import ip_bytes
from softdta.workload import ReporterAddress

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_TABLES = ROOT / "examples" / "tables.toml"
COLLECTOR_IP = ip_bytes("10.77.1.1")


def frames_of(reporter: ReporterAddress, reports: list[Report], profile: Profile = Profile.DTA_V1) -> list[bytes]:
    return [reporter.frame(report, profile) for report in reports]
