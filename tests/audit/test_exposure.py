"""Exposure, rank and the ε lower bound against hand-computed cases and scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from synthq.audit.exposure import (
    clopper_pearson,
    epsilon_lower_bound,
    exposure_extrapolated,
    exposure_from_rank,
    rank_of,
)


def test_rank_counts_strictly_likelier_references():
    assert rank_of(1.0, [2.0, 3.0, 4.0]) == 1
    assert rank_of(3.5, [2.0, 3.0, 4.0]) == 3
    assert rank_of(5.0, [2.0, 3.0, 4.0]) == 4
    assert rank_of(3.0, [2.0, 3.0, 4.0]) == 2  # a tie does not push the canary down


def test_exposure_from_rank_by_hand():
    # rank 1 of 100 candidates: log2(100) bits observed, whatever the space
    assert exposure_from_rank(1, 100) == pytest.approx(math.log2(100))
    assert exposure_from_rank(100, 100) == pytest.approx(0.0)
    assert exposure_from_rank(25, 100) == pytest.approx(2.0)
    assert exposure_from_rank(1, 8, space=8) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        exposure_from_rank(0, 100)


def test_extrapolation_matches_scipy_and_exceeds_interpolation_for_outliers():
    rng = np.random.default_rng(0)
    references = rng.normal(50.0, 5.0, size=2000)
    # a canary 5 standard deviations likelier than the references: far beyond rank 1 of 2001
    exposure = exposure_extrapolated(25.0, references)
    params = stats.skewnorm.fit(references)
    assert exposure == pytest.approx(-stats.skewnorm.logcdf(25.0, *params) / math.log(2))
    assert exposure > math.log2(2001)
    # a typical canary has low exposure under both methods
    typical = exposure_extrapolated(50.0, references)
    assert 0.5 < typical < 2.0
    rank = rank_of(50.0, references)
    assert abs(typical - exposure_from_rank(rank, 2001)) < 0.5
    assert exposure_extrapolated(-1e9, references) == pytest.approx(math.log2(10**10))


def test_clopper_pearson_known_values():
    low, high = clopper_pearson(0, 10)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 10))
    low, high = clopper_pearson(10, 10)
    assert high == 1.0 and low == pytest.approx(0.025 ** (1 / 10))
    low, high = clopper_pearson(5, 10)
    assert low == pytest.approx(0.187086, abs=1e-5) and high == pytest.approx(0.812914, abs=1e-5)


def test_epsilon_lower_bound():
    # perfectly separated members: a clearly positive bound, limited by the sample size
    separated = epsilon_lower_bound([10.0] * 50, [0.0] * 50)
    tpr_low, _ = clopper_pearson(50, 50)
    _, fpr_high = clopper_pearson(0, 50)
    assert separated["epsilon_lower_bound"] == pytest.approx(math.log(tpr_low / fpr_high))
    assert separated["tpr"] == 1.0 and separated["fpr"] == 0.0
    # indistinguishable members: no evidence of leakage
    rng = np.random.default_rng(1)
    same = epsilon_lower_bound(rng.normal(size=50), rng.normal(size=50))
    assert same["epsilon_lower_bound"] < 0.5
    with pytest.raises(ValueError):
        epsilon_lower_bound([], [1.0])


def test_held_out_threshold_is_chosen_on_the_other_half():
    from synthq.audit.exposure import held_out_epsilon_lower_bound, threshold_bound

    members = np.array([10.0, 9.0, 8.0, 7.0, 6.0, 5.0] * 10)
    nonmembers = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.5] * 10)
    bound_at = held_out_epsilon_lower_bound(members, nonmembers)
    # the threshold comes from the even positions; the bound is that test on the odd positions
    threshold = epsilon_lower_bound(members[0::2], nonmembers[0::2])["threshold"]
    expected = threshold_bound(members[1::2], nonmembers[1::2], threshold, 0.0)
    assert bound_at(0.0) == pytest.approx(expected) and expected > 0
    assert bound_at(0.1) < bound_at(0.0)  # δ only lowers the bound
    assert held_out_epsilon_lower_bound([1.0], [0.0]) is None


def test_per_pair_bound_from_a_group_bound():
    from synthq.audit.exposure import per_pair_from_group

    # a group bound of 6 that does not depend on δ: per pair exactly 6 / r
    assert per_pair_from_group(lambda delta: 6.0, 3, 1e-5) == pytest.approx(2.0, abs=1e-9)
    # a bound that vanishes once the group δ reaches 1e-3: with r = 10 and δ = 1e-5 the per-pair
    # bound must keep 10 e^{9ε} 1e-5 < 1e-3, i.e. ε < ln(10) / 9, below the naive 5 / 10
    bound = per_pair_from_group(lambda delta: 5.0 if delta < 1e-3 else 0.0, 10, 1e-5)
    assert bound == pytest.approx(math.log(10) / 9, abs=1e-6)
    assert per_pair_from_group(lambda delta: 0.0, 10, 1e-5) == 0.0
