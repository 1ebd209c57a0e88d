"""The one-run audit bound against hand computations, its confidence under random guessing,
and the score summaries against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from synthq.audit.one_run import (
    auroc,
    auroc_interval,
    count_correct,
    epsilon_lower_bound,
    gaussian_delta,
    gaussian_epsilon,
    guess_grid,
    one_run_audit,
    p_value,
    tpr_at_fpr,
)


def _perfect_bound(r: int, confidence: float = 0.95) -> float:
    """δ = 0, all r guesses right: P = q^r ≤ 1 − c  ⇔  q ≥ (1 − c)^(1/r), ε = logit(q)."""
    q = (1 - confidence) ** (1 / r)
    return math.log(q / (1 - q))


def test_p_value_by_hand():
    # δ = 0: a binomial tail at q = e^ε/(1+e^ε)
    q = math.exp(1) / (1 + math.exp(1))
    assert p_value(100, 10, 9, 1.0, 0.0) == pytest.approx(10 * q**9 * (1 - q) + q**10)
    # δ > 0, r = 2, v = 2: α = max(P[Bin = 1], P[Bin ∈ {0, 1}] / 2)
    q = 0.5
    alpha = max(2 * q * (1 - q), (2 * q * (1 - q) + (1 - q) ** 2) / 2)
    assert p_value(10, 2, 2, 0.0, 1e-3) == pytest.approx(q**2 + 2 * 10 * 1e-3 * alpha)
    with pytest.raises(ValueError):
        p_value(10, 5, 6, 1.0, 0.0)


def test_perfect_guesses_match_the_closed_form_and_grow_with_m():
    bounds = [epsilon_lower_bound(m, m, m, 0.0) for m in (10, 100, 1000)]
    assert bounds == sorted(bounds) and bounds[0] < bounds[-1]
    for m, bound in zip((10, 100, 1000), bounds, strict=True):
        assert bound == pytest.approx(_perfect_bound(m), abs=2e-4)
        assert bound <= _perfect_bound(m)  # never above what the theorem allows
    assert bounds[-1] == pytest.approx(5.809, abs=1e-3)
    # δ only weakens the bound
    with_delta = epsilon_lower_bound(1000, 1000, 1000, 1e-5)
    assert with_delta < bounds[-1]
    assert (
        p_value(1000, 1000, 1000, with_delta, 1e-5)
        <= 0.05
        < p_value(1000, 1000, 1000, with_delta + 1e-3, 1e-5)
    )


def test_no_evidence_gives_zero():
    assert epsilon_lower_bound(1000, 100, 50, 1e-5) == 0.0
    assert epsilon_lower_bound(1000, 0, 0, 1e-5) == 0.0


def test_random_scores_give_zero_in_at_least_95_percent_of_runs():
    rng = np.random.default_rng(0)
    positive = 0
    runs = 200
    for _ in range(runs):
        included = rng.random(200) < 0.5
        result = one_run_audit(rng.normal(size=200), included, delta=1e-5, gaussian=False)
        positive += result.epsilon_lower_bound > 0
    assert positive / runs <= 0.05


def test_guessing_rules():
    scores = [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    included = [True, True, False, True, False, False]
    outcome = count_correct(scores, included, 2, 2)
    assert (outcome.guesses, outcome.correct) == (4, 4)
    outcome = count_correct(scores, included, 3, 1)
    assert outcome.correct == 3
    assert guess_grid(1000)[0] == (10, 10) and all(a + b <= 1000 for a, b in guess_grid(1000))


def test_separated_scores_give_a_positive_bound_below_the_perfect_one():
    rng = np.random.default_rng(1)
    included = rng.random(1000) < 0.5
    scores = included * 10.0 + rng.normal(size=1000)
    result = one_run_audit(scores, included, delta=1e-5)
    assert result.correct == result.guesses == 500
    assert 0 < result.epsilon_lower_bound <= _perfect_bound(500)
    assert result.gdp_mu_lower_bound > 0 and result.gdp_epsilon_lower_bound > 0
    assert result.rules_tried == len(guess_grid(1000))


def test_gaussian_profile():
    # δ_μ(ε) against the formula with scipy directly, and ε as its inverse
    mu, eps = 1.0, 2.0
    expected = stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
    assert gaussian_delta(mu, eps) == pytest.approx(expected)
    assert gaussian_delta(mu, gaussian_epsilon(mu, 1e-5)) == pytest.approx(1e-5, rel=1e-6)
    assert gaussian_epsilon(2.0, 1e-5) > gaussian_epsilon(1.0, 1e-5)


def test_tpr_at_fpr_and_auroc_by_hand():
    members = [0.9, 0.8, 0.7, 0.2]
    nonmembers = [0.6, 0.5, 0.4, 0.3, 0.1, 0.05, 0.04, 0.03, 0.02, 0.01]
    assert tpr_at_fpr(members, nonmembers, 0.0) == 0.75
    assert tpr_at_fpr(members, nonmembers, 0.10) == 0.75
    assert tpr_at_fpr(members, nonmembers, 0.40) == 1.0
    pairs = sum((a > b) + 0.5 * (a == b) for a in members for b in nonmembers)
    assert auroc(members, nonmembers) == pytest.approx(pairs / 40)
    assert auroc([1.0, 1.0], [1.0]) == 0.5


def test_auroc_matches_sklearn_and_the_interval_covers_it():
    rng = np.random.default_rng(2)
    members, nonmembers = rng.normal(0.5, 1, 300), rng.normal(0, 1, 300)
    labels = np.r_[np.ones(300), np.zeros(300)]
    expected = roc_auc_score(labels, np.r_[members, nonmembers])
    assert auroc(members, nonmembers) == pytest.approx(expected)
    low, high = auroc_interval(members, nonmembers, samples=300)
    assert low < expected < high and high - low < 0.15
