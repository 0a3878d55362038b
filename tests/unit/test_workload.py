"""Workloads are reproducible: the same seed gives the same reports in any process (the rxe guest generates
reports with the same code and must agree with the host)."""

import subprocess
import sys

PRINT_WORKLOAD = ("from softdta.core import workload; print([r.key.hex() + r.data.hex() for r in "
                  "workload.key_write(50, 3, 1) + workload.key_increment(20, 4, 1) + workload.postcards(5, 5, 5)])")


def test_a_seed_gives_the_same_workload_whatever_the_hash_seed():
    outputs = {subprocess.run([sys.executable, "-c", PRINT_WORKLOAD], capture_output=True, text=True, check=True,
                              env={"PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2, 3)}
    assert len(outputs) == 1
