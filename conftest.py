"""Shared by tests/ and bench/: the example tables and a reporter for them; privileged tests (BPF programs,
network namespaces) need root and say so."""

import os
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="privileged: loads BPF programs and creates network namespaces, which needs root "
                                   "(CI runs as root; run `sudo make test`)")
    for item in items:
        if "privileged" in item.keywords:
            item.add_marker(skip)


# softdta (and numpy) are imported inside the fixtures: bench/conftest.py pins numpy's thread pools first


@pytest.fixture
def tables():
    from softdta.core.tables import Tables
    return Tables.from_toml(Path(__file__).parent / "examples" / "tables.toml")


@pytest.fixture
def reporter(tables):
    from softdta.core.workload import ReporterAddress
    from softdta.lab.benchmarks.workloads import COLLECTOR_IP
    from softdta.wire.frames import ip_bytes, mac_bytes
    return ReporterAddress(mac=mac_bytes("02:5d:7a:00:09:01"), ip=ip_bytes("10.77.9.1"), translator_mac=tables.mac,
                           collector_ip=COLLECTOR_IP)
