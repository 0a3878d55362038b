from pathlib import Path

import pytest

from softdta.dta import Profile, Report
from softdta.frames import ip_bytes, mac_bytes
from softdta.tables import Tables
from softdta.workload import ReporterAddress

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_TABLES = ROOT / "examples" / "tables.toml"
COLLECTOR_IP = ip_bytes("10.77.1.1")


@pytest.fixture
def tables() -> Tables:
    return Tables.from_toml(EXAMPLE_TABLES)


@pytest.fixture
def reporter(tables) -> ReporterAddress:
    return ReporterAddress(mac=mac_bytes("02:5d:7a:00:09:01"), ip=ip_bytes("10.77.9.1"), translator_mac=tables.mac,
                           collector_ip=COLLECTOR_IP)


def frames_of(reporter: ReporterAddress, reports: list[Report], profile: Profile = Profile.DTA_V1) -> list[bytes]:
    return [reporter.frame(report, profile) for report in reports]
