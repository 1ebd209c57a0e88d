"""``--batch-size auto``: the expected batch whose DP step carries the most signal for the budget.

For a target (ε, δ), ``n`` privacy units and a number of epochs, every expected batch B fixes the
sampling rate q = B/n and the steps T = ⌈epochs · n / B⌉, and the accountant then fixes the noise
multiplier σ. What a DP step delivers to the optimizer is the mean of B clipped unit gradients
(norm ≤ C) plus noise of standard deviation σC/B per coordinate: the noise-to-signal ratio σ/B
(:func:`~synthq.dp.engine.noise_to_signal`; McKenna et al., ICML 2025) decides whether a step
learns. :func:`choose_batch_size` computes σ/B for every candidate batch with the stage's own
accountant and picks the smallest ratio.

At a fixed number of epochs σ/B falls as B grows (amplification by subsampling gives σ ≈ q√T/ε
for small q, so σ/B ∝ 1/√B), all the way to the full batch, which takes one step per epoch. A
model does not move in a handful of steps (the pylibs generator barely moved in 8–11), so the
choice keeps at least :data:`MIN_AUTO_STEPS` steps (or ``--max-steps``, where that is lower):
the batch is the one with the least noise among those that still leave that many updates, and
the line it prints says which bound held it back. The floor matters: on pylibs, one epoch at
B = 128 users (11 steps, σ/B = 0.0044) moved the generator less than B = 64 (22 steps, σ/B =
0.0081) at the same compute and ε (docs/results.md#pylibs-large-batch), so fewer, less noisy
steps are not better below a few tens of steps.

It reads only n (the count every DP stage records and assumes public) and the public settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from synthq.dp.engine import planned_steps
from synthq.privacy.accounting import noise_multiplier_for
from synthq.runtime.errors import PrivacyError

# The fewest optimizer steps an automatic batch may leave (see the module docstring).
MIN_AUTO_STEPS = 16
# The smallest batch considered: below it σ would have to fall where subsampling no longer helps.
MIN_AUTO_BATCH = 8


@dataclass(frozen=True)
class BatchCandidate:
    """One expected batch with what the accountant makes of it."""

    batch_size: int
    steps: int
    noise_multiplier: float
    noise_to_signal: float


@dataclass(frozen=True)
class BatchChoice:
    """The chosen expected batch, every candidate weighed, and what bounded the choice."""

    chosen: BatchCandidate
    candidates: list[BatchCandidate]
    min_steps: int
    num_units: int

    @property
    def batch_size(self) -> int:
        return self.chosen.batch_size

    def line(self, unit: str) -> str:
        """One line for the stage's first output: the batch, its plan and why no larger one."""
        c = self.chosen
        if c.steps < self.min_steps:
            why = (
                f"no batch of ≥ {min(MIN_AUTO_BATCH, self.num_units)} leaves {self.min_steps} steps at "
                "these epochs: the smallest is taken (more --epochs would give more steps)"
            )
        elif c.batch_size < self.num_units and c.batch_size == max(x.batch_size for x in self.candidates):
            why = f"a larger batch would leave fewer than {self.min_steps} steps"
        else:
            why = "the least noise of the batches weighed"
        weighed = ", ".join(f"{x.batch_size}: {x.noise_to_signal:.3g}" for x in self.candidates)
        return (
            f"--batch-size auto: B = {c.batch_size} {unit}s (q = {c.batch_size / self.num_units:.4f}, "
            f"{c.steps} steps, σ = {c.noise_multiplier:.3f}, σ/B = {c.noise_to_signal:.3g}); {why} "
            f"(σ/B by batch: {weighed})"
        )


def candidate_batches(num_units: int, epochs: float, max_steps: int | None, min_steps: int) -> list[int]:
    """The batches weighed: powers of two from :data:`MIN_AUTO_BATCH` and the largest batch, that
    leave ``min_steps`` steps (``max_steps`` where that is lower), never above n; where none of
    them does, the smallest (:data:`MIN_AUTO_BATCH`, or n below it) alone."""
    floor = min(min_steps, max_steps) if max_steps is not None else min_steps
    smallest = min(MIN_AUTO_BATCH, num_units)
    if planned_steps(num_units, smallest, epochs, max_steps) < floor:
        return [smallest]
    largest, low, high = smallest, smallest, num_units  # steps fall as B grows: bisect the last B
    while low <= high:
        middle = (low + high) // 2
        if planned_steps(num_units, middle, epochs, max_steps) >= floor:
            largest, low = middle, middle + 1
        else:
            high = middle - 1
    sizes, size = {largest}, smallest
    while size < largest:
        sizes.add(size)
        size *= 2
    return sorted(sizes)


def choose_batch_size(
    num_units: int,
    epochs: float,
    max_steps: int | None,
    epsilon: float,
    delta: float,
    accountant: str = "rdp",
    *,
    sensitivity_factor: float = 1.0,
    group_size: int = 1,
    min_steps: int = MIN_AUTO_STEPS,
) -> BatchChoice:
    """The expected batch with the least noise-to-signal σΔ/(⌈B/S⌉C) at (ε, δ) among
    :func:`candidate_batches` (Δ = ``sensitivity_factor`` · C; S = ``group_size`` units per
    clipped term, 1 for finetune-lm). Raises when the budget is impossible for every batch."""
    if not math.isfinite(epsilon):
        raise PrivacyError("--batch-size auto chooses the batch for a DP budget: give a finite --epsilon")
    weighed = []
    for size in candidate_batches(num_units, epochs, max_steps, min_steps):
        steps = planned_steps(num_units, size, epochs, max_steps)
        try:
            sigma = noise_multiplier_for(epsilon, delta, size / num_units, steps, accountant).noise_multiplier
        except PrivacyError:
            continue
        ratio = sigma * sensitivity_factor / math.ceil(size / group_size)
        weighed.append(BatchCandidate(size, steps, sigma, ratio))
    if not weighed:
        raise PrivacyError(
            f"no expected batch reaches ε = {epsilon:g} at δ = {delta:.2g} over {num_units} units"
        )
    best = min(weighed, key=lambda candidate: (candidate.noise_to_signal, -candidate.batch_size))
    return BatchChoice(best, weighed, min_steps, num_units)
