"""The paired randomization test, the paired bootstrap interval and Holm's correction on
constructed per-query scores with known answers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from synthq.retrieval.significance import bootstrap_ci, compare_all, holm, permutation_test


def test_identical_systems_are_not_significant():
    scores = np.random.default_rng(0).uniform(size=279)
    assert permutation_test(scores, scores) == 1.0
    assert bootstrap_ci(scores, scores) == (0.0, 0.0)
    (comparison,) = compare_all({"a": scores, "b": scores.copy()})
    assert not comparison.significant and comparison.difference == 0.0


def test_constant_shift_is_significant():
    base = np.random.default_rng(1).uniform(size=200)
    p = permutation_test(base + 0.05, base, resamples=2000)
    assert p == pytest.approx(1 / 2001)  # no sign flip reaches the observed mean: the estimator's floor
    low, high = bootstrap_ci(base + 0.05, base)
    assert low == pytest.approx(0.05) and high == pytest.approx(0.05)
    (comparison,) = compare_all({"worse": base, "better": base + 0.05}, resamples=2000)
    assert comparison.a == "better" and comparison.significant


def test_exact_p_value_by_hand():
    # d = (1, 2, 3): of the 8 sign assignments, sums are 6, 0, 2, -4, 4, -2, 0, -6; |sum| >= 6
    # for 2 of them, so p = 2/8.
    assert permutation_test([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]) == 0.25
    # d = (1, 1, 1, 1): only all-plus and all-minus reach |mean| = 1: p = 2/16.
    assert permutation_test(np.ones(4), np.zeros(4)) == 0.125
    # Against a brute-force enumeration on random data (exact regime, n = 10).
    rng = np.random.default_rng(2)
    a, b = rng.uniform(size=10), rng.uniform(size=10)
    d = a - b
    flips = [abs(np.dot(s, d)) >= abs(d.sum()) - 1e-12 for s in itertools.product((1, -1), repeat=10)]
    assert permutation_test(a, b) == pytest.approx(sum(flips) / 1024)


def test_monte_carlo_p_value_approximates_the_exact_one():
    rng = np.random.default_rng(3)
    a = rng.uniform(size=17)  # 2^17 > EXACT_LIMIT: the function samples
    b = a + rng.normal(0.02, 0.1, size=17)
    d = a - b
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=17)))
    exact = np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-12)
    assert 0.005 < exact < 0.9
    assert permutation_test(a, b, resamples=40_000, seed=7) == pytest.approx(exact, abs=0.01)


def test_bootstrap_interval_contains_the_true_shift():
    rng = np.random.default_rng(4)
    base = rng.uniform(size=300)
    shifted = base + 0.1 + rng.normal(0, 0.05, size=300)
    low, high = bootstrap_ci(shifted, base)
    assert low < 0.1 < high and high - low < 0.03
    # Coverage: over 200 constructed data sets the 95 % interval holds the true shift ~95 % of the time.
    hits = 0
    for trial in range(200):
        noise = np.random.default_rng(100 + trial).normal(0.1, 0.2, size=80)
        low, high = bootstrap_ci(base[:80] + noise, base[:80], resamples=1000, seed=trial)
        hits += low < 0.1 < high
    assert 0.88 <= hits / 200 <= 0.99


def test_seed_variance_widens_the_interval():
    rng = np.random.default_rng(5)
    base = rng.uniform(size=200)
    # Three seeds of one system: each seed shifts every query by its own offset.
    seeds = np.stack([base + offset for offset in (0.0, 0.06, 0.12)])
    one_seed = bootstrap_ci(seeds.mean(0), base)
    both = bootstrap_ci(seeds, base)
    assert one_seed == pytest.approx((0.06, 0.06))  # queries alone: no variance at all
    assert both[0] < 0.05 and both[1] > 0.07  # the seed spread shows
    assert permutation_test(seeds, base, resamples=500) < 0.01  # tested on the seed average


def test_holm():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5] and holm([0.9, 0.9]) == [1.0, 1.0]
    assert holm([]) == []


def test_bad_shapes():
    with pytest.raises(ValueError, match="differ in length"):
        permutation_test([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="per-query scores"):
        bootstrap_ci(np.zeros((2, 2, 2)))
