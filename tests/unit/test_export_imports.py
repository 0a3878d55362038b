"""The collector loads nats-py, pyarrow and DuckDB only where it exports, snapshots or runs SQL: the soft-RoCE
guest (softdta.lab.rxe) runs `softdta collector up` from Debian's packages, which have none of them."""

import subprocess
import sys

from tests.common import ROOT

EXPORT_ONLY = ("nats", "pyarrow", "duckdb")


def test_a_collector_that_does_not_export_loads_none_of_the_export_packages():
    program = ("import sys; import softdta.cli.app, softdta.collector.daemon, softdta.collector.verbs, "
               "softdta.collector.service, softdta.collector.config; "
               f"print(sorted(set({EXPORT_ONLY!r}) & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
