"""Query-success analysis of the Key-Write and Postcarding primitives.

Bounds follow the DTA paper (section 4, appendices A.5 and A.6) and DART (section 4):
M slots, alpha*M distinct keys written after the queried key, N copies per key, b-bit checksums.
All bounds use the Poisson approximation 1 - e^(-alpha*N) for "a given copy was overwritten".

The Monte-Carlo simulation checks the Key-Write bounds against an explicit store.
"""

from collections.abc import Iterable, Sequence
from math import comb, exp, expm1, log1p

import numpy as np

# Marks a slot that still holds the queried key's own copy (later keys use values 0, 1, 2, ...).
_OWN_VALUE = -1


def _validate(alpha: float, n: int, b: int) -> None:
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 1 <= b <= 64:
        raise ValueError(f"b must be in 1..64, got {b}")


def _at_least_one(q: float, trials: int) -> float:
    """1 - (1 - q)^trials, without cancellation for tiny q."""
    return -expm1(trials * log1p(-q))


def _at_least_two(q: float, trials: int) -> float:
    """P(Binomial(trials, q) >= 2), summed directly: 1 - P(0) - P(1) cancels for tiny q."""
    return sum(comb(trials, k) * q**k * (1 - q) ** (trials - k) for k in range(2, trials + 1))


def _empty_return_bound(alpha: float, n: int, q: float) -> float:
    """Three-term empty-return bound, q = chance that an overwritten slot looks valid for the key."""
    overwritten = -expm1(-alpha * n)
    intact = exp(-alpha * n)
    all_overwritten = overwritten**n
    none_valid = all_overwritten * (1 - q) ** n
    two_valid_disagree = all_overwritten * _at_least_two(q, n)
    partial_with_valid_intruder = sum(
        comb(n, j) * overwritten**j * intact ** (n - j) * _at_least_one(q, j) for j in range(1, n)
    )
    return none_valid + two_valid_disagree + partial_with_valid_intruder


def _wrong_output_bound(alpha: float, n: int, q: float) -> float:
    return (-expm1(-alpha * n)) ** n * n * q


def key_write_empty_return_bound(alpha: float, n: int, b: int = 32) -> float:
    """Upper bound on P(query returns nothing), paper terms (1)+(2)+(3):

    (1-e^(-aN))^N (1-2^-b)^N                                   all copies gone, no checksum match
    + (1-e^(-aN))^N (1-(1-2^-b)^N - N 2^-b (1-2^-b)^(N-1))     all gone, >= 2 intruders match
    + sum_{j=1}^{N-1} C(N,j) (1-e^(-aN))^j e^(-aN(N-j)) (1-(1-2^-b)^j)   some gone, an intruder matches
    """
    _validate(alpha, n, b)
    return _empty_return_bound(alpha, n, 2.0**-b)


def key_write_wrong_output_bound(alpha: float, n: int, b: int = 32) -> float:
    """Upper bound on P(query returns a wrong value): (1-e^(-aN))^N * N * 2^-b (paper term (4))."""
    _validate(alpha, n, b)
    return _wrong_output_bound(alpha, n, 2.0**-b)


def _postcard_chunk_collision(hops: int, value_set_size: int, b: int) -> float:
    """Chance that a foreign chunk decodes as valid for the queried flow: ((|V|+1) 2^-b)^B.

    The +1 is the "blank" value for hops that did not report.
    """
    per_slot = (value_set_size + 1) * 2.0**-b
    if hops < 1:
        raise ValueError(f"hops must be >= 1, got {hops}")
    if per_slot >= 1:
        raise ValueError(f"need |V|+1 < 2^b for a meaningful slot, got |V|={value_set_size}, b={b}")
    return per_slot**hops


def postcarding_empty_return_bound(
    alpha: float, n: int, hops: int, value_set_size: int, b: int = 32
) -> float:
    """Upper bound on P(no report for a flow), paper terms (9)+(10)+(11).

    Same three terms as Key-Write with 2^-b replaced by p = ((|V|+1) 2^-b)^B, the chance that
    a chunk of B slots written by another flow decodes as valid for the queried flow.
    Here alpha*C reports (C = M/B chunks) were written after the queried one.
    """
    _validate(alpha, n, b)
    return _empty_return_bound(alpha, n, _postcard_chunk_collision(hops, value_set_size, b))


def postcarding_wrong_output_bound(
    alpha: float, n: int, hops: int, value_set_size: int, b: int = 32
) -> float:
    """Upper bound on P(wrong report): (1-e^(-aN))^N * N * ((|V|+1) 2^-b)^B (paper term (12))."""
    _validate(alpha, n, b)
    return _wrong_output_bound(alpha, n, _postcard_chunk_collision(hops, value_set_size, b))


def expected_success(chances: Sequence[float]) -> tuple[float, float]:
    """The expected fraction of queries answered right, and its standard deviation, when query i is right with
    chance chances[i]. Taking queries as independent, the count right is Poisson-binomial: mean sum(p), variance
    sum(p (1 - p)). This is the spread a measured fraction has around its expectation; it is not a bound."""
    p = np.asarray(chances, dtype=np.float64)
    if p.size == 0 or ((p < 0) | (p > 1)).any():
        raise ValueError("need at least one chance, each in [0, 1]")
    return float(p.mean()), float(np.sqrt(np.sum(p * (1 - p))) / p.size)


def key_write_success_chances(later_loads: Sequence[float], n: int, b: int = 32) -> list[float]:
    """Each Key-Write query's chance of the right answer, alpha being the load written after its key:
    1 - the empty-return and wrong-output terms. Those over-count only by terms of order 2^-b, so this is the chance
    itself under the Poisson model, to within 2^-b."""
    return [1.0 - key_write_empty_return_bound(alpha, n, b) - key_write_wrong_output_bound(alpha, n, b)
            for alpha in later_loads]


def postcarding_success_chances(later_loads: Sequence[float], n: int, hops: int, value_set_size: int,
                                b: int = 32) -> list[float]:
    """Each Postcarding query's chance of decoding its path, as key_write_success_chances."""
    return [1.0 - postcarding_empty_return_bound(alpha, n, hops, value_set_size, b)
            - postcarding_wrong_output_bound(alpha, n, hops, value_set_size, b) for alpha in later_loads]


def simulate_key_write(
    slots: int,
    alpha: float,
    n: int,
    b: int = 32,
    queries: int = 20000,
    consensus: int = 1,
    seed: int = 0,
) -> dict[str, float]:
    """Monte-Carlo estimate of Key-Write query outcomes.

    Model (one run simulates `queries` independent queried keys at once):
      1. Each queried key writes (its b-bit checksum, its value) to N independent uniform slots.
         Queried keys do not overwrite one another: each sees the store as if it were the only
         key written at that moment, so every queried key has exactly K later keys.
      2. K = round(alpha * slots) distinct later keys are written in order into one shared
         store, each to N independent uniform slots with a random b-bit checksum and a value
         of its own (values never coincide, as in the paper's pessimistic assumption);
         the last writer of a slot wins.
      3. Query: read the key's N slots, keep values whose checksum equals the key's, and return
         the plurality value if it is unique and appears at least `consensus` times; otherwise
         the return is empty.
    Queried keys share the later-key stream, so outcomes of keys whose slots overlap are
    correlated; each one still has the single-key distribution, but the fractions are only as
    precise as independent samples when queries * N is well below slots.
    """
    _validate(alpha, n, b)
    if slots < 1 or queries < 1 or consensus < 1:
        raise ValueError("slots, queries and consensus must be >= 1")
    rng = np.random.default_rng(seed)
    later_keys = round(alpha * slots)
    checksum_limit = 1 << b

    later_slots = rng.integers(0, slots, size=later_keys * n)
    later_checksums = rng.integers(0, checksum_limit, size=later_keys, dtype=np.uint64)
    # Writes happen in key order, so a slot's last writer is the highest key index that hit it.
    last_writer = np.full(slots, -1, dtype=np.int64)
    np.maximum.at(last_writer, later_slots, np.arange(later_keys * n, dtype=np.int64) // n)

    queried_slots = rng.integers(0, slots, size=(queries, n))
    queried_checksums = rng.integers(0, checksum_limit, size=(queries, 1), dtype=np.uint64)
    writer = last_writer[queried_slots]
    overwritten = writer >= 0
    values = np.where(overwritten, writer, _OWN_VALUE)
    checksums = np.repeat(queried_checksums, n, axis=1)
    checksums[overwritten] = later_checksums[writer[overwritten]]
    valid = checksums == queried_checksums

    # votes[q, j]: how many valid copies agree with copy j (0 if copy j itself is invalid).
    agree = valid[:, None, :] & (values[:, None, :] == values[:, :, None])
    votes = np.where(valid, agree.sum(axis=2), 0)
    top_votes = votes.max(axis=1)
    winner = values[np.arange(queries), votes.argmax(axis=1)]
    tied = ((votes == top_votes[:, None]) & (values != winner[:, None])).any(axis=1)
    answered = (top_votes >= consensus) & ~tied

    success = int(np.count_nonzero(answered & (winner == _OWN_VALUE)))
    wrong = int(np.count_nonzero(answered & (winner != _OWN_VALUE)))
    return {
        "success": success / queries,
        "empty": (queries - success - wrong) / queries,
        "wrong": wrong / queries,
        "slots": slots,
        "alpha": alpha,
        "n": n,
        "b": b,
        "queries": queries,
        "consensus": consensus,
        "later_keys": later_keys,
        "seed": seed,
    }


def simulate_query_success_curve(
    slots: int,
    alphas: Sequence[float],
    ns: Iterable[int],
    b: int = 32,
    queries: int = 20000,
    seed: int = 0,
) -> list[dict[str, float]]:
    """Rows for a Figure-12 style plot: query success against load for each redundancy N.

    The x axis is alpha, the number of keys written after the queried one per slot: the
    quantity the bounds are stated in (the paper's figure averages over key ages instead).
    Queries use the default plurality vote (consensus 1), the rule the bounds cover.
    Each row holds the simulated fractions and
    success_lower_bound = 1 - empty-return bound - wrong-output bound.
    """
    rows = []
    for n in ns:
        for alpha in alphas:
            simulated = simulate_key_write(slots, alpha, n, b, queries, seed=seed)
            bound = key_write_empty_return_bound(alpha, n, b) + key_write_wrong_output_bound(alpha, n, b)
            rows.append(
                {
                    "n": n,
                    "alpha": alpha,
                    "success": simulated["success"],
                    "empty": simulated["empty"],
                    "wrong": simulated["wrong"],
                    "success_lower_bound": 1.0 - bound,
                }
            )
    return rows
