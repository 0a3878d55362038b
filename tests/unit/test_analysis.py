import math

import numpy as np
import pytest

from softdta.core.analysis import (
    key_write_empty_return_bound,
    key_write_wrong_output_bound,
    postcarding_empty_return_bound,
    postcarding_wrong_output_bound,
    simulate_key_write,
    simulate_query_success_curve,
)

# Simulated fractions must lie within this many standard errors of the expected value.
SIGMAS = 4


def standard_error(p: float, samples: int) -> float:
    return math.sqrt(p * (1 - p) / samples)


@pytest.mark.parametrize("n, expected", [(1, 0.095), (4, 0.012)])
def test_key_write_empty_return_worked_values(n, expected):
    assert key_write_empty_return_bound(0.1, n) == pytest.approx(expected, abs=0.001)


def test_key_write_empty_return_n2_under_3_3_percent():
    assert 0.032 < key_write_empty_return_bound(0.1, 2) < 0.033


def test_key_write_wrong_output_n2_at_most_1_6e_11():
    assert 1.5e-11 < key_write_wrong_output_bound(0.1, 2) <= 1.6e-11


def test_postcarding_worked_example():
    params = dict(alpha=0.1, n=2, hops=5, value_set_size=2**18, b=32)
    assert 0.032 < postcarding_empty_return_bound(**params) <= 0.033
    assert 1e-23 < postcarding_wrong_output_bound(**params) < 1e-22


def test_postcarding_wrong_output_far_below_key_write_per_hop():
    # The paper's comparison: Key-Write per hop errs in at least one of 5 hops with about 8e-11.
    key_write_any_hop = 1 - (1 - key_write_wrong_output_bound(0.1, 2)) ** 5
    assert key_write_any_hop == pytest.approx(8e-11, rel=0.1)
    postcarding = postcarding_wrong_output_bound(0.1, 2, hops=5, value_set_size=2**18)
    assert postcarding < key_write_any_hop * 1e-11


@pytest.mark.parametrize("hops, key_write_bits", [(1, 8), (5, 40)])
def test_postcarding_equals_key_write_with_equivalent_checksum(hops, key_write_bits):
    # |V| values plus "blank" fill 2^4 codes of a 12-bit slot: each hop leaves 8 checksum bits.
    params = dict(alpha=0.3, n=3, hops=hops, value_set_size=2**4 - 1, b=12)
    assert postcarding_empty_return_bound(**params) == pytest.approx(
        key_write_empty_return_bound(0.3, 3, b=key_write_bits), rel=1e-12
    )
    assert postcarding_wrong_output_bound(**params) == pytest.approx(
        key_write_wrong_output_bound(0.3, 3, b=key_write_bits), rel=1e-12
    )


def test_postcarding_rejects_slots_narrower_than_value_set():
    with pytest.raises(ValueError):
        postcarding_empty_return_bound(0.1, 2, hops=5, value_set_size=2**18, b=16)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_bounds_grow_with_alpha(n):
    alphas = np.linspace(0.01, 3.0, 60)
    empty = [key_write_empty_return_bound(a, n) for a in alphas]
    wrong = [key_write_wrong_output_bound(a, n, b=8) for a in alphas]
    assert np.all(np.diff(empty) > 0)
    assert np.all(np.diff(wrong) > 0)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_simulated_empty_returns_match_bound(n):
    queries = 200_000
    result = simulate_key_write(2**20, 0.1, n, b=32, queries=queries)
    bound = key_write_empty_return_bound(0.1, n)
    assert abs(result["empty"] - bound) <= SIGMAS * standard_error(bound, queries)
    assert result["wrong"] == 0
    assert result["success"] + result["empty"] + result["wrong"] == pytest.approx(1.0)


@pytest.mark.parametrize("alpha, b", [(0.1, 4), (1.0, 2)])
def test_simulated_empty_returns_with_small_checksum_match_bound(alpha, b):
    # With tiny b checksum collisions matter: for N=2 under a plurality vote every term of the
    # bound is an exact case (a surviving copy tied with a matching intruder is empty).
    queries = 200_000
    result = simulate_key_write(2**20, alpha, 2, b=b, queries=queries)
    bound = key_write_empty_return_bound(alpha, 2, b=b)
    assert abs(result["empty"] - bound) <= SIGMAS * standard_error(bound, queries)


def test_simulated_wrong_output_with_small_checksum_is_of_bound_order():
    queries = 200_000
    result = simulate_key_write(2**20, 0.5, 2, b=8, queries=queries)
    bound = key_write_wrong_output_bound(0.5, 2, b=8)
    # With N=2 and a plurality vote the bound is nearly exact, so the estimate must not fall far short.
    assert 0.8 * bound <= result["wrong"] <= bound + SIGMAS * standard_error(bound, queries)


def test_consensus_two_gives_more_empty_returns():
    queries = 100_000
    plurality = simulate_key_write(2**20, 0.1, 2, queries=queries, consensus=1)
    consensus = simulate_key_write(2**20, 0.1, 2, queries=queries, consensus=2)
    assert consensus["empty"] > plurality["empty"]
    # T=2 answers only when both copies survive: probability e^(-alpha*N*N).
    expected_empty = 1 - math.exp(-0.1 * 2 * 2)
    assert abs(consensus["empty"] - expected_empty) <= SIGMAS * standard_error(expected_empty, queries)


def test_consensus_two_suppresses_wrong_outputs():
    plurality = simulate_key_write(2**20, 0.5, 2, b=4, queries=100_000, consensus=1)
    consensus = simulate_key_write(2**20, 0.5, 2, b=4, queries=100_000, consensus=2)
    assert plurality["wrong"] > 0.01
    assert consensus["wrong"] < 1e-4


@pytest.mark.parametrize("n, consensus", [(1, 1), (2, 2), (4, 1), (4, 4)])
def test_nothing_written_later_means_every_query_succeeds(n, consensus):
    result = simulate_key_write(2**16, 0.0, n, b=4, queries=5_000, consensus=consensus)
    assert result["success"] == 1.0
    assert result["later_keys"] == 0


def test_simulation_counts_later_keys_per_slot():
    assert simulate_key_write(2**16, 0.25, 2, queries=10)["later_keys"] == 2**14


def test_simulation_is_reproducible_per_seed():
    first = simulate_key_write(2**16, 1.0, 2, b=8, queries=20_000, seed=7)
    again = simulate_key_write(2**16, 1.0, 2, b=8, queries=20_000, seed=7)
    other = simulate_key_write(2**16, 1.0, 2, b=8, queries=20_000, seed=8)
    assert first == again
    assert first["empty"] != other["empty"]


def test_success_curve_tracks_bound_and_crosses_over():
    queries = 50_000
    rows = simulate_query_success_curve(2**20, [0.1, 1.0], [1, 4], queries=queries)
    assert [(row["n"], row["alpha"]) for row in rows] == [(1, 0.1), (1, 1.0), (4, 0.1), (4, 1.0)]
    for row in rows:
        p = row["success_lower_bound"]
        assert abs(row["success"] - p) <= SIGMAS * standard_error(p, queries)
    success = {(row["n"], row["alpha"]): row["success"] for row in rows}
    # Figure 12: redundancy helps at light load and hurts at heavy load.
    assert success[(4, 0.1)] > success[(1, 0.1)]
    assert success[(1, 1.0)] > success[(4, 1.0)]
