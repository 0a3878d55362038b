import pytest

from softdta.frames import ip_bytes, mac_bytes
from softdta.tables import Tables
from softdta.workload import ReporterAddress

from common import COLLECTOR_IP, EXAMPLE_TABLES


@pytest.fixture
def tables() -> Tables:
    return Tables.from_toml(EXAMPLE_TABLES)


@pytest.fixture
def reporter(tables) -> ReporterAddress:
    return ReporterAddress(mac=mac_bytes("02:5d:7a:00:09:01"), ip=ip_bytes("10.77.9.1"), translator_mac=tables.mac,
                           collector_ip=COLLECTOR_IP)


@pytest.fixture(scope="session")
def guest():
    """One QEMU soft-RoCE guest for the whole session (tests marked interop; softdta/rxe_lab.py)."""
    from softdta import rxe_lab
    from softdta.netns import NETNS_DIR
    rxe_lab.cleanup()
    with rxe_lab.Guest().boot() as booted:
        yield booted
    assert not (rxe_lab.RUN_DIR / booted.name).exists() and not (NETNS_DIR / booted.name).exists()
