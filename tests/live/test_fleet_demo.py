"""`softdta demo --fleet`, run as a user runs it from a plain shell (root: namespaces, XDP, etcd)."""

import json
import os
import subprocess

import pytest

from softdta.lab import fleet_demo
from tests.common import SOFTDTA

pytestmark = pytest.mark.privileged


def test_the_fleet_demo_survives_a_join_and_a_kill_with_every_answer_predicted():
    environment = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    result = subprocess.run(SOFTDTA + ["demo", "--fleet", "--json"], capture_output=True, text=True, timeout=600,
                            env=environment, cwd="/")
    assert result.stdout, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert result.returncode == 0 and summary["problems"] == [], summary["problems"]
    keys, lists = summary["key_write"], summary["append"]
    assert keys["read_back"] == keys["keys"] > 0 and keys["lost_to_the_killed_collector"] == 0
    assert lists["as_predicted"] == lists["lists"] and lists["partial_lists"], \
        "the killed collector held some lists: their answers are partial, and say so"
    assert summary["translators"]["received"] == summary["reports_sent"] and not summary["translators"]["drops"]
    *_, joined, left = summary["epochs"]
    assert joined["collectors"] == ["c1", "c2", "c3", "c4"] and left["collectors"] == ["c1", "c3", "c4"]
    assert joined["moved"] <= 1.2 / 4 and left["moved"] <= 1.2 / 4  # the bound on one join, 1.2/N
    assert all(epoch["max_over_mean"] <= 1.10 for epoch in summary["epochs"])
    for phase in summary["frames_by_phase"]:
        assert phase["sent"] == phase["executed"]
    assert not [name for name in os.listdir("/run/netns") if name.startswith(fleet_demo.PREFIX)]
    assert not fleet_demo.demo_lab("").pin_root.exists()
