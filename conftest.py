"""Shared by tests/ and bench/: privileged tests (BPF programs, network namespaces) need root and say so."""

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="privileged: loads BPF programs and creates network namespaces, which needs root "
                                   "(CI runs as root; run `sudo make test`)")
    for item in items:
        if "privileged" in item.keywords:
            item.add_marker(skip)
