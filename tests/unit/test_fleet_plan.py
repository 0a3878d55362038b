"""`softdta fleet plan`: a fleet simulated with the controller's assignment, run as a user types it (a clean
environment), and its refusal of arguments it cannot plan with."""

import json
import subprocess

import pytest

from softdta.core.fleet import assign
from softdta.core.fleet_plan import PlanInput, applied_record, collector, plan
from tests.common import ROOT, SOFTDTA, one_line_error

PLAIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def softdta(*args: str, home) -> subprocess.CompletedProcess:
    return subprocess.run(SOFTDTA + list(args), cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": PLAIN_PATH, "HOME": str(home)})


def test_plan_json_gives_the_balance_the_moves_and_the_etcd_load(tmp_path):
    result = softdta("fleet", "plan", "--collectors", "16", "--reporters", "500", "--replicas", "2", "--churn", "3",
                     "--json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    numbers = json.loads(result.stdout)
    assert numbers["max_over_mean"] <= 1.10
    assert numbers["moved_on_join"] <= 1.2 / 16
    assert numbers["ideal_on_join"] == pytest.approx(1 / 17, abs=1e-6)
    assert numbers["moved_on_leave"] == pytest.approx(numbers["ideal_on_leave"], abs=1e-6)
    assert numbers["replicas"] == 2 and numbers["slots"] == 4096
    assert numbers["writes_per_change"] == 2 + 500  # member, slot map, one applied put per reporter
    assert numbers["changes_per_hour"] == 6  # 3 joins and 3 leaves
    assert numbers["writes_per_second"] == pytest.approx(6 * 502 / 3600, abs=1e-4)
    assert numbers["bytes_per_change"] == numbers["member_bytes"] + numbers["slot_map_bytes"] + \
        500 * numbers["applied_bytes"]
    assert numbers["watch_bytes_per_change"] == 500 * numbers["slot_map_bytes"]


def test_plan_prints_a_table_by_default(tmp_path):
    result = softdta("fleet", "plan", "--collectors", "3", home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "moved on one join" in result.stdout and "writes/s" in result.stdout


@pytest.mark.parametrize("args, names", [
    (["--collectors", "1"], "--collectors 1"),
    (["--collectors", "three"], "--collectors"),
    ([], "--collectors"),
    (["--collectors", "4", "--replicas", "5"], "--replicas 5"),
    (["--collectors", "4", "--slot-bits", "17"], "--slot-bits 17"),
    (["--collectors", "4", "--reporters", "-1"], "--reporters -1"),
    (["--collectors", "4", "--churn", "-2"], "--churn -2"),
    (["--collectors", "4", "--churn", "nan"], "--churn nan"),
    (["--collectors", "5000", "--slot-bits", "16"], "too large"),
    (["--collectors", "4", "--bogus"], "--bogus"),
])
def test_bad_arguments_end_with_one_line(tmp_path, args, names):
    assert names in one_line_error(softdta("fleet", "plan", *args, home=tmp_path))


def test_the_bytes_counted_are_those_written():
    result = plan(PlanInput(5, 7, replicas=2, slot_bits=8))
    fleet = {member.name: member for member in map(collector, range(6))}
    before = assign({name: fleet[name] for name in sorted(fleet)[:5]}, replicas=2, slot_bits=8)
    joined = assign(fleet, replicas=2, slot_bits=8, previous=before)
    assert result.slot_map_bytes == len("/softdta/fleet/slotmap") + len(joined.to_json())
    joiner = fleet[sorted(fleet)[5]]
    assert result.member_bytes == len(f"/softdta/fleet/members/{joiner.name}") + len(joiner.to_json())
    assert result.applied_bytes == len("/softdta/fleet/applied/reporter-00006") + len(applied_record(2))
    assert result.writes_per_change == 9
