"""The offline demo (`softdta lab demo --offline`) on tables that lack a primitive it runs."""

import tomllib

import pytest

from softdta.core.settings import TableError
from softdta.core.tables import Tables
from softdta.lab.offline_demo import run_offline_demo
from tests.common import EXAMPLE_TABLES


def test_tables_without_a_primitive_are_refused_in_one_line():
    document = tomllib.loads(EXAMPLE_TABLES.read_text())
    document["structures"] = [entry for entry in document["structures"] if entry["primitive"] != "sketch-merge"]
    with pytest.raises(TableError, match="no sketch-merge structure on collector .*one of each primitive"):
        run_offline_demo(Tables.from_dict(document))
