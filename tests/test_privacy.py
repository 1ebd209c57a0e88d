"""The ledger rules and the accountant helpers, checked against Opacus directly."""

from __future__ import annotations

import json
import math

import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from synthq.privacy.guarantee import (
    Guarantee,
    default_delta,
    epsilon_for,
    noise_multiplier_for,
    validate_budget,
)
from synthq.runtime.errors import PrivacyError


def test_noise_multiplier_matches_opacus_and_reaches_target():
    calibration = noise_multiplier_for(8.0, 1e-5, sample_rate=0.01, steps=500)
    expected = get_noise_multiplier(
        target_epsilon=8.0,
        target_delta=1e-5,
        sample_rate=0.01,
        steps=500,
        accountant="rdp",
        epsilon_tolerance=0.01,
    )
    # synthq's bounded search (log-σ bisection) and Opacus' land within the same ε tolerance
    assert calibration.noise_multiplier == pytest.approx(expected, rel=1e-3)
    assert calibration.epsilon <= 8.0
    assert calibration.epsilon > 8.0 - 0.05  # not wastefully noisy
    independent = RDPAccountant()
    independent.history = [(calibration.noise_multiplier, 0.01, 500)]
    assert calibration.epsilon == pytest.approx(independent.get_epsilon(delta=1e-5))


def test_epsilon_is_monotone():
    sigmas = [0.6, 0.8, 1.0, 1.5, 3.0]
    epsilons = [epsilon_for(s, 1e-5, 0.02, 300).epsilon for s in sigmas]
    assert epsilons == sorted(epsilons, reverse=True)
    steps = [50, 100, 400]
    by_steps = [epsilon_for(1.0, 1e-5, 0.02, n).epsilon for n in steps]
    assert by_steps == sorted(by_steps)
    targets = [1.0, 3.0, 8.0, 16.0]
    noises = [noise_multiplier_for(t, 1e-5, 0.02, 300).noise_multiplier for t in targets]
    assert noises == sorted(noises, reverse=True)


def test_prv_agrees_roughly_with_rdp_and_falls_back_when_it_fails():
    prv = epsilon_for(1.0, 1e-5, 0.01, 200, accountant="prv")
    rdp = epsilon_for(1.0, 1e-5, 0.01, 200, accountant="rdp")
    assert prv.accountant == "prv"
    assert prv.epsilon <= rdp.epsilon * 1.05  # PRV is tighter than RDP
    # enormous ε: PRV would exhaust memory, so RDP answers and says why
    huge = epsilon_for(0.3, 1e-5, 0.5, 2000, accountant="prv")
    assert huge.accountant == "rdp" and "beyond PRV" in huge.fallback_reason
    assert huge.epsilon == pytest.approx(epsilon_for(0.3, 1e-5, 0.5, 2000).epsilon)


def test_prv_calibration_needs_less_noise_than_rdp():
    prv = noise_multiplier_for(8.0, 1e-5, 0.01, 200, accountant="prv")
    rdp = noise_multiplier_for(8.0, 1e-5, 0.01, 200, accountant="rdp")
    assert prv.accountant == "prv" and prv.epsilon <= 8.0
    assert prv.noise_multiplier < rdp.noise_multiplier
    assert prv.epsilon == pytest.approx(epsilon_for(prv.noise_multiplier, 1e-5, 0.01, 200, "prv").epsilon)


def test_non_private_noise_is_zero():
    calibration = noise_multiplier_for(math.inf, 1e-5, 0.1, 10)
    assert calibration.noise_multiplier == 0 and math.isinf(calibration.epsilon)


@pytest.mark.parametrize(
    ("epsilon", "delta", "message"),
    [
        (0.0, 1e-5, "ε must be > 0"),
        (-1.0, 1e-5, "ε must be > 0"),
        (1.0, 1.0, "δ must be in"),
        (1.0, 0.0, "δ"),
    ],
)
def test_impossible_budgets_are_rejected(epsilon, delta, message):
    with pytest.raises(PrivacyError, match=message):
        validate_budget(epsilon, delta)


def test_bad_sampling_rate_and_steps_and_accountant():
    with pytest.raises(PrivacyError, match="sampling rate"):
        epsilon_for(1.0, 1e-5, 1.5, 10)
    with pytest.raises(PrivacyError, match="sampling rate"):
        noise_multiplier_for(8.0, 1e-5, 0.0, 10)
    with pytest.raises(PrivacyError, match="steps"):
        epsilon_for(1.0, 1e-5, 0.1, 0)
    with pytest.raises(PrivacyError, match="accountant"):
        epsilon_for(1.0, 1e-5, 0.1, 10, accountant="gdp-typo")


def test_unreachable_epsilon_is_a_clear_error():
    with pytest.raises(PrivacyError, match="cannot be reached"):
        noise_multiplier_for(1e-4, 1e-10, 1.0, 100000)


def test_delta_not_below_one_over_n_is_refused():
    with pytest.raises(PrivacyError, match="not below 1/n"):
        validate_budget(8.0, 0.01, num_examples=1000)
    with pytest.raises(PrivacyError, match="not below 1/n"):
        validate_budget(8.0, 1 / 1000, num_examples=1000)
    validate_budget(8.0, 1 / 2000, num_examples=1000)
    assert default_delta(1000) == pytest.approx(1 / 2000)
    with pytest.raises(PrivacyError):
        default_delta(0)


def test_ledger_rules_and_json_round_trip():
    dp = Guarantee(epsilon=8.0, delta=1e-5, unit="example", mechanism="dp-adam", accountant="rdp")
    inherited = dp.inherit("abc123")
    assert inherited.epsilon == 8.0 and inherited.delta == 1e-5
    assert inherited.derived_from == ["abc123"] and "post-processing" in inherited.mechanism
    none = Guarantee.non_private("trained on private pairs without DP")
    assert math.isinf(none.epsilon) and not none.is_private
    assert math.isinf(none.inherit("x").epsilon)  # post-processing cannot create privacy
    dumped = json.loads(json.dumps(none.model_dump(mode="json")))
    assert dumped["epsilon"] == "inf"  # standard JSON, no bare Infinity
    assert math.isinf(Guarantee.from_manifest(dumped).epsilon)
    assert "∞" in none.describe() and "8.00" in dp.describe()
