"""The demo's verdict (live_demo.verdict) over made-up summaries: exact per hop and frame kind, with no drop
excusing a shortfall elsewhere."""

import copy

import pytest

from softdta.lab.live_demo import burst_problems, verdict

CLEAN = {
    "reports_sent": {"key-write": 100, "key-increment": 50},
    "translator": {"received": {"key-write": 100, "key-increment": 50}, "frames_emitted": 300, "drops": {},
                   "replies": {"rx_acks": 60, "rx_nak_sequence": 0}},
    "collector": {"executed": 300, "drops": {}, "replies_sent": 60},
    "link_drops": {},
    "complete": True,
    "queries": {"key_write": {"success": 0.99, "bound": 0.985, "differ_from_prediction": 0},
                "key_increment": {"under_counted": 0, "differ_from_prediction": 0},
                "append": {"entries_sent": 40, "entries_recovered": 40, "lists": 4, "lists_in_exact_order": 4,
                           "lists_differ_from_prediction": 0},
                "postcarding": {"paths": 100, "decoded_exactly": 99, "bound": 0.99, "differ_from_prediction": 0},
                "sketch_merge": {"matches_sum_of_reporters": True, "matches_prediction": True}},
}


def changed(**paths) -> dict:
    summary = copy.deepcopy(CLEAN)
    for path, value in paths.items():
        *parents, leaf = path.split("__")
        node = summary
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return summary


def test_a_clean_run_has_no_problem():
    assert verdict(copy.deepcopy(CLEAN)) == []


@pytest.mark.parametrize("shortfall, words", [
    ({"queries__key_increment__under_counted": 298}, "Key-Increment"),
    ({"queries__key_write__success": 0.9707, "queries__key_write__bound": 0.9902}, "Key-Write"),
    ({"queries__append__lists_in_exact_order": 3}, "Append"),
    ({"queries__append__entries_recovered": 39}, "Append"),
    ({"queries__append__entries_recovered": 36, "queries__append__entries_overwritten": 4}, "laps overwrote 4"),
    ({"queries__sketch_merge__matches_sum_of_reporters": False}, "Sketch-Merge"),
    ({"queries__postcarding__decoded_exactly": 90}, "Postcarding"),
    ({"collector__replies_sent": 61}, "RC replies"),
    ({"translator__received__key-write": 99}, "reports"),
    # within the bound or the truth, but not what the reports sent must have left in memory
    ({"queries__key_write__differ_from_prediction": 1}, "key-write: 1 answers differ"),
    ({"queries__key_increment__differ_from_prediction": 2}, "key-increment: 2 answers differ"),
    ({"queries__postcarding__differ_from_prediction": 1}, "postcarding: 1 answers differ"),
    ({"queries__append__lists_differ_from_prediction": 1}, "append: 1 lists differ"),
    ({"queries__sketch_merge__matches_prediction": False}, "sketch-merge: the merged sketch differs from the memory"),
])
def test_a_shortfall_is_a_problem_even_beside_unrelated_counted_drops(shortfall, words):
    """The first `make demo` on a fresh machine passed with all of these at once, because link drops had been
    counted somewhere."""
    summary = changed(link_drops={"sdta-lab-t/t0": 2165}, **shortfall)
    summary["translator"]["drops"] = {"drop_grace": 3}
    problems = verdict(summary)
    assert any(words in problem for problem in problems), problems


@pytest.mark.parametrize("where", [{"translator__drops": {"drop_no_room": 1}},
                                   {"collector__drops": {"out_of_seq_request": 1}},
                                   {"link_drops": {"sdta-lab-c/c0": 1}, "translator__received__key-write": 99}])
def test_any_loss_is_a_problem_even_when_the_queries_come_out_right(where):
    assert verdict(changed(**where))


BURST = {"sent": 3_000_000, "executed": 3_000_000, "lost": {},
         "keys": {"keys": 8192, "correct": 8192, "success": 1.0, "bound": 0.94}}


def test_a_clean_burst_has_no_problem():
    assert burst_problems(copy.deepcopy(BURST)) == []


@pytest.mark.parametrize("change, words", [
    ({"executed": 2_999_999, "lost": {"before_collector": 1}}, "3,000,000 reports sent, 2,999,999 executed"),
    ({"lost": {"link sdta-direct1-t/t1": 1}}, "link sdta-direct1-t/t1"),
    ({"keys": {"keys": 8192, "correct": 7000, "success": 0.8545, "bound": 0.94}}, "85.45% of 8,192 keys"),
])
def test_any_loss_or_wrong_key_in_the_burst_is_a_problem(change, words):
    problems = burst_problems({**copy.deepcopy(BURST), **change})
    assert len(problems) == 1 and words in problems[0]
