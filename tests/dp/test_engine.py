"""The DP engine, tested once: sampling, the batch cap, noise, calibration, units, secrets."""

from __future__ import annotations

import math

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant
from scipy import stats

from synthq.dp.clipping import clip_and_sum
from synthq.dp.engine import Mechanism, PrivacyPlan
from synthq.dp.noise import SecretRandomness
from synthq.dp.privacy_units import PrivacyUnits, batch_cap, poisson_units
from synthq.runtime.errors import PrivacyError


class _Fixed(Mechanism):
    name = "fixed"

    def __init__(self, sensitivity: float, needs_cap: bool = False):
        self._sensitivity = sensitivity
        self.needs_batch_cap = needs_cap

    def sensitivity(self, batch_cap: int | None) -> float:
        return self._sensitivity * (batch_cap or 1)


def test_poisson_sampling_rate_and_variable_batches():
    generator = torch.Generator().manual_seed(0)
    sizes = [len(poisson_units(1000, 0.05, generator)) for _ in range(300)]
    assert sum(sizes) / len(sizes) == pytest.approx(50, rel=0.05)
    assert len(set(sizes)) > 5  # the batch size varies, as Poisson sampling must


def test_an_over_full_batch_is_emptied_not_cut():
    generator = torch.Generator().manual_seed(1)
    batches = [poisson_units(100, 0.5, generator, cap=50) for _ in range(400)]
    assert all(len(b) <= 50 for b in batches)
    assert any(len(b) == 0 for b in batches)  # about half the draws exceed 50: emptied
    assert not any(0 < len(b) < 30 for b in batches)  # nothing is cut down to a smaller batch


def test_batch_cap_is_the_smallest_with_few_wasted_steps():
    cap = batch_cap(1000, 0.032, 100, expected_lost_steps=1e-3)
    distribution = stats.binom(1001, 0.032)
    assert 100 * distribution.sf(cap) <= 1e-3 < 100 * distribution.sf(cap - 1)


def test_noise_is_sigma_times_sensitivity_over_the_expected_batch():
    plan = PrivacyPlan.with_noise(1.5, sensitivity=0.2, expected_batch_size=4)
    noisy = plan.privatize([torch.zeros(200, 100)], SecretRandomness(seed=0))
    assert noisy[0].std().item() == pytest.approx(1.5 * 0.2 / 4, rel=0.02)
    assert abs(noisy[0].mean().item()) < 0.01


def test_noise_is_added_in_place_and_repeats_with_the_generator():
    from synthq.dp.noise import add_noise

    tensors = [torch.ones(15_000), torch.zeros(50, 100)]
    noisy = add_noise(tensors, 0.5, torch.Generator().manual_seed(7))
    assert all(n is t for n, t in zip(noisy, tensors, strict=True))  # no second copy
    again = add_noise([torch.ones(15_000), torch.zeros(50, 100)], 0.5, torch.Generator().manual_seed(7))
    assert all(torch.equal(a, b) for a, b in zip(noisy, again, strict=True))
    values = torch.cat([noisy[0] - 1, noisy[1].flatten()])
    assert values.std().item() == pytest.approx(0.5, rel=0.02)
    assert stats.kstest(values.numpy() / 0.5, "norm").pvalue > 1e-3


def test_noise_streams_cover_every_coordinate_once():
    from synthq.dp.noise import _noise_spans

    sizes = [5, 0, 17, 1, 40]
    for streams in (1, 3, 8):
        seen = [[0] * size for size in sizes]
        for pieces in _noise_spans(sizes, streams):
            for index, start, stop in pieces:
                for i in range(start, stop):
                    seen[index][i] += 1
        assert all(count == 1 for row in seen for count in row)


def test_noise_does_not_depend_on_the_thread_count_and_reaches_strided_tensors(monkeypatch):
    from synthq.dp import noise

    monkeypatch.setattr(noise, "NOISE_CHUNK", 1000)  # several chunks per stream and per tensor
    threads = torch.get_num_threads()

    def noisy(num_threads):
        torch.set_num_threads(num_threads)
        try:
            strided = torch.zeros(300, 40).T  # not contiguous: its noise must still land in place
            tensors = noise.add_noise([torch.zeros(7_001), strided], 1.0, torch.Generator().manual_seed(3))
        finally:
            torch.set_num_threads(threads)
        assert tensors[1] is strided and not strided.is_contiguous()
        return torch.cat([t.flatten() for t in tensors])

    one, two = noisy(1), noisy(2)
    assert torch.equal(one, two)
    assert (one != 0).all()
    assert stats.kstest(one.numpy(), "norm").pvalue > 1e-3
    streams = noise.NOISE_STREAMS  # each stream its own seed: no span starts as another does
    starts = {tuple(one[one.numel() * s // streams :][:8].tolist()) for s in range(streams)}
    assert len(starts) == noise.NOISE_STREAMS


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_plan_calibrates_sigma_and_the_guarantee_is_what_opacus_computes(accountant):
    plan = PrivacyPlan.create(
        num_units=2000, expected_batch_size=64, steps=300, epsilon=4.0, delta=None,
        accountant=accountant, mechanism=_Fixed(0.5),
    )  # fmt: skip
    assert plan.sample_rate == 64 / 2000 and plan.delta == 1 / 4000
    assert plan.sensitivity == 0.5 and plan.noise_std == pytest.approx(plan.noise_multiplier * 0.5)
    guarantee = plan.guarantee(mechanism="dp-test", assumptions=["x", None, "x"])
    independent = RDPAccountant() if accountant == "rdp" else PRVAccountant()
    independent.history = [(plan.noise_multiplier, plan.sample_rate, 300)]
    assert guarantee.epsilon == pytest.approx(independent.get_epsilon(delta=plan.delta), rel=1e-6)
    assert 3.9 < guarantee.epsilon <= 4.0 and guarantee.unit == "query" and guarantee.assumptions == ["x"]
    # the progress bar's ε comes from the same accountant
    assert plan.epsilon_after(300) == pytest.approx(guarantee.epsilon)
    assert plan.epsilon_after(100) < guarantee.epsilon and plan.epsilon_after(0) == 0.0


def test_plan_caps_only_mechanisms_that_need_it_and_refuses_impossible_budgets():
    uncapped = PrivacyPlan.create(
        num_units=500, expected_batch_size=16, steps=50, epsilon=8, delta=None, accountant="rdp",
        mechanism=_Fixed(1.0),
    )  # fmt: skip
    capped = PrivacyPlan.create(
        num_units=500, expected_batch_size=16, steps=50, epsilon=8, delta=None, accountant="rdp",
        mechanism=_Fixed(1.0, needs_cap=True),
    )  # fmt: skip
    assert uncapped.batch_cap is None and capped.batch_cap > 16 and capped.sensitivity == capped.batch_cap
    assert capped.guarantee(mechanism="m").delta == capped.delta  # no tail term in δ
    with pytest.raises(PrivacyError, match="ε must be > 0"):
        PrivacyPlan.create(
            num_units=500, expected_batch_size=16, steps=50, epsilon=-1, delta=None, accountant="rdp",
            mechanism=_Fixed(1.0),
        )  # fmt: skip
    with pytest.raises(
        PrivacyError, match=r"larger than the 10 privacy units \(queries\): pass --batch-size 10 or less"
    ):
        PrivacyPlan.create(
            num_units=10, expected_batch_size=16, steps=5, epsilon=8, delta=None, accountant="rdp",
            mechanism=_Fixed(1.0),
        )  # fmt: skip


def test_units_group_rows_by_query_and_weights_bound_a_whole_query():
    units = PrivacyUnits.from_keys(["a", "b", "a", "c", "a"])
    assert len(units) == 3 and units.max_rows == 3
    rows, weights = units.expand([0, 2])
    assert rows == [0, 2, 4, 3] and weights == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])
    # a query's k rows, each clipped to C and weighted 1/k, move the sum by at most C together
    torch.manual_seed(0)
    same = torch.randn(1, 10) * 5  # the query's three rows point the same way: the bound is tight
    gradients = {"w": torch.cat([same, same * 2, same * 3, torch.randn(1, 10) * 5])}
    clip_norm = 0.1
    with_query, _ = clip_and_sum(gradients, clip_norm, torch.tensor(weights))
    without, _ = clip_and_sum({"w": gradients["w"][3:]}, clip_norm, torch.tensor(weights[3:]))
    difference = (with_query["w"] - without["w"]).norm()
    assert clip_norm * 0.99 < difference <= clip_norm * (1 + 1e-5)


def test_secret_randomness_is_fresh_unless_seeded_and_restores_from_its_state():
    first, second = SecretRandomness(), SecretRandomness()
    assert torch.rand(5, generator=first.noise).tolist() != torch.rand(5, generator=second.noise).tolist()
    assert first.assumption() is None and "reproducible seed 7" in SecretRandomness(7).assumption()
    seeded = [SecretRandomness(7), SecretRandomness(7)]
    assert torch.equal(torch.rand(5, generator=seeded[0].noise), torch.rand(5, generator=seeded[1].noise))
    assert seeded[0].keyed_choice(1000, "group", 3, "q1") == seeded[1].keyed_choice(1000, "group", 3, "q1")
    state = first.state_dict()
    expected = torch.rand(3, generator=first.sampling)
    restored = SecretRandomness()
    restored.load_state_dict(state)
    assert torch.equal(torch.rand(3, generator=restored.sampling), expected)
    assert restored.keyed_choice(10**6, "x") == first.keyed_choice(10**6, "x")
    choices = [first.keyed_choice(4, "group", 0, f"q{i}") for i in range(400)]
    assert all(abs(choices.count(k) - 100) < 40 for k in range(4))  # roughly uniform
    assert not math.isnan(sum(choices))
