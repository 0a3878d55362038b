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


def test_every_built_in_primitive_declares_its_workload_and_its_part_in_the_demos():
    """`softdta report` and the demos ask the primitive: its workload is one of the generators, with what it takes
    of one WorkloadParams, and the same for the same params."""
    from softdta.core import primitives, workload

    params = workload.WorkloadParams(count=20, seed=7, key_len=13, data_len=20, lists=3, hops=4, reporters=2,
                                     columns=8, rows=2)
    expected = {"key-write": workload.key_write(20, 7, 2, 13, 20), "key-increment": workload.key_increment(20, 7, 2),
                "append": workload.append(20, 7, 3), "postcarding": workload.postcards(20, 7, 4),
                "sketch-merge": workload.sketch_epoch(2, 8, 2, 7)}
    assert {primitive.name for primitive in primitives.BUILT_IN} == set(expected)
    for primitive in primitives.BUILT_IN:
        assert primitive.workload(params) == expected[primitive.name]
        assert primitive.demo is not None
