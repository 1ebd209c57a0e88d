"""--batch-size auto: the expected batch with the least σ/B at the target ε among those that leave
enough steps, every σ from Opacus' RDP accountant itself (not synthq's calibration)."""

from __future__ import annotations

import math

import pytest
from opacus.accountants.utils import get_noise_multiplier

from synthq.dp.batch_choice import MIN_AUTO_STEPS, candidate_batches, choose_batch_size
from synthq.dp.engine import planned_steps
from synthq.runtime.errors import PrivacyError


def test_the_batches_weighed_leave_the_steps_asked_and_the_largest_is_the_last_that_does():
    sizes = candidate_batches(300, 1.0, None, MIN_AUTO_STEPS)
    assert sizes == [8, 16, 19]  # ⌈300/19⌉ = 16 steps; ⌈300/20⌉ = 15
    assert planned_steps(300, 20, 1.0, None) == 15
    assert all(planned_steps(300, b, 1.0, None) >= MIN_AUTO_STEPS for b in sizes)
    largest = max(candidate_batches(300, 1.0, None, MIN_AUTO_STEPS))
    assert planned_steps(300, largest + 1, 1.0, None) < MIN_AUTO_STEPS or largest == 300
    # --max-steps below the floor: the floor is the cap, so larger batches become possible
    assert max(candidate_batches(300, 1.0, 4, MIN_AUTO_STEPS)) == 99  # ⌈300/99⌉ = 4, ⌈300/100⌉ = 3
    # no batch of 8 leaves 16 steps: the smallest alone
    assert candidate_batches(44, 1.0, None, MIN_AUTO_STEPS) == [8]
    assert candidate_batches(5, 1.0, None, MIN_AUTO_STEPS) == [5]


def test_the_choice_has_the_least_noise_to_signal_by_opacus_accountant():
    n, epsilon, delta = 300, 8.0, 1 / 600
    choice = choose_batch_size(n, 3.0, None, epsilon, delta)
    for candidate in choice.candidates:
        steps = planned_steps(n, candidate.batch_size, 3.0, None)
        sigma = get_noise_multiplier(
            target_epsilon=epsilon, target_delta=delta, sample_rate=candidate.batch_size / n,
            steps=steps, accountant="rdp", epsilon_tolerance=0.01,
        )  # fmt: skip
        assert candidate.steps == steps
        assert candidate.noise_multiplier == pytest.approx(sigma, rel=0.03)
        assert candidate.noise_to_signal == pytest.approx(candidate.noise_multiplier / candidate.batch_size)
    assert choice.chosen.noise_to_signal == min(c.noise_to_signal for c in choice.candidates)
    assert choice.chosen.steps >= MIN_AUTO_STEPS
    assert "a larger batch would leave fewer than 16 steps" in choice.line("user")


def test_direct_dp_groups_count_one_clipped_term_per_group():
    choice = choose_batch_size(300, 3.0, None, 8.0, 1 / 600, sensitivity_factor=2.0, group_size=8)
    for candidate in choice.candidates:
        assert candidate.noise_to_signal == pytest.approx(
            2 * candidate.noise_multiplier / math.ceil(candidate.batch_size / 8)
        )


def test_a_small_log_says_no_batch_leaves_enough_steps_and_no_budget_is_refused():
    small = choose_batch_size(44, 1.0, None, 8.0, 1 / 88)
    assert small.batch_size == 8 and small.chosen.steps == 6
    assert "no batch of ≥ 8 leaves 16 steps" in small.line("user")
    with pytest.raises(PrivacyError, match="finite --epsilon"):
        choose_batch_size(300, 1.0, None, math.inf, 1e-3)
