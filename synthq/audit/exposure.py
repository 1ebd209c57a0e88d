"""Canary exposure (Carlini et al., 2019, "The Secret Sharer") and an empirical ε lower bound.

A canary is a secret drawn from a space ``R`` (here all 10-digit strings, ``|R| = 10**10``).
The model scores the inserted canary and ``k`` reference candidates that differ only in the
secret; lower log-perplexity = more likely.

* **rank**: 1 + the number of references the model finds strictly more likely.
* **exposure by rank interpolation**: ``log2(|R|) - log2(rank * |R| / (k + 1))``, i.e. the
  rank among ``k + 1`` candidates scaled up to the whole space. Capped at ``log2(k + 1)``: with
  99 references no more than ~6.6 bits can be *observed*.
* **exposure by extrapolation**: fit a skew-normal to the references' log-perplexities and
  take ``-log2 P(X <= x_canary)`` (as TensorFlow Privacy's secret-sharer tools do), which is
  meaningful beyond ``k + 1`` candidates, up to ``log2(|R|)``.
* **ε lower bound**: treat "was this canary inserted?" as a membership test on inserted vs
  held-out canaries. Any test with true-positive rate TPR and false-positive rate FPR against an
  (ε, δ)-DP mechanism satisfies ``TPR <= e^ε FPR + δ`` (and the same for the complements), so
  ``ε >= log((TPR - δ) / FPR)``. Clopper–Pearson intervals make this a bound that holds with
  the stated confidence (Jagielski et al., 2020; Stock et al., 2022).
* **held-out thresholds** (:func:`held_out_epsilon_lower_bound`): the threshold is chosen on
  one half of the canaries (alternate members and controls) and the bound is computed on the
  other half, so the choice does not flatter the bound.
* **groups** (:func:`per_pair_from_group`): a canary inserted r times is a group of r pairs; its
  bound is about the r-fold group, whose guarantee under per-pair (ε, δ)-DP is
  (rε, r e^{(r−1)ε} δ) (group privacy). The per-pair lower bound is the largest ε with
  "group bound at δ_group(ε) ≥ rε" — about bound / r, smaller when δ_group grows.

Canaries pooled from one training run are not independent trials of one neighbouring pair, so
read these bounds as indicative; :mod:`synthq.audit.one_run` gives bounds that are proved for
pooled canaries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

SECRET_SPACE = 10**10


def rank_of(canary_score: float, reference_scores: Sequence[float]) -> int:
    """1-based rank of the canary among the candidates by log-perplexity (lower = likelier).

    Ties count in the canary's favour (a tie does not push it down), matching the
    interpolation below."""
    references = np.asarray(reference_scores, dtype=float)
    return int(np.sum(references < canary_score)) + 1


def exposure_from_rank(rank: int, num_candidates: int, space: int = SECRET_SPACE) -> float:
    """Exposure by rank interpolation: ``log2(space) - log2(rank * space / num_candidates)``.

    ``num_candidates`` counts the canary plus its references."""
    if not 1 <= rank <= num_candidates:
        raise ValueError(f"rank {rank} outside 1..{num_candidates}")
    return math.log2(space) - math.log2(rank * space / num_candidates)


def exposure_extrapolated(
    canary_score: float, reference_scores: Sequence[float], space: int = SECRET_SPACE
) -> float:
    """Exposure from a skew-normal fitted to the reference log-perplexities.

    ``-log2 CDF(canary)``, clipped to ``[0, log2(space)]``: the fraction of the whole secret
    space the model would rank above the canary if the references are representative."""
    references = np.asarray(reference_scores, dtype=float)
    if references.size < 10:
        raise ValueError("extrapolation needs at least 10 reference scores")
    shape, loc, scale = stats.skewnorm.fit(references)
    log_cdf = stats.skewnorm.logcdf(canary_score, shape, loc, scale)
    exposure = -log_cdf / math.log(2)
    return float(min(max(exposure, 0.0), math.log2(space)))


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper–Pearson interval for a binomial proportion."""
    if trials <= 0:
        return 0.0, 1.0
    alpha = 1 - confidence
    low = 0.0 if successes == 0 else float(stats.beta.ppf(alpha / 2, successes, trials - successes + 1))
    high = (
        1.0
        if successes == trials
        else float(stats.beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
    )
    return low, high


def epsilon_lower_bound(
    member_scores: Sequence[float],
    nonmember_scores: Sequence[float],
    delta: float = 0.0,
    confidence: float = 0.95,
) -> dict:
    """Best ε lower bound over threshold tests "member if score >= t".

    Scores are higher-is-more-member (e.g. exposure). For each threshold the bound uses the
    Clopper–Pearson lower end of TPR and upper end of FPR (and the complementary test with
    FNR/TNR). The threshold is chosen on the same canaries, so with few canaries read the result
    as indicative; it is ~0 whenever members and non-members are indistinguishable.
    """
    members = np.asarray(member_scores, dtype=float)
    nonmembers = np.asarray(nonmember_scores, dtype=float)
    if members.size == 0 or nonmembers.size == 0:
        raise ValueError("need both inserted and held-out canaries")
    best = {"epsilon_lower_bound": 0.0, "threshold": None, "tpr": None, "fpr": None}
    for threshold in np.unique(np.concatenate([members, nonmembers])):
        bound = threshold_bound(members, nonmembers, threshold, delta, confidence)
        if bound > best["epsilon_lower_bound"]:
            best = {
                "epsilon_lower_bound": bound,
                "threshold": float(threshold),
                "tpr": float(np.mean(members >= threshold)),
                "fpr": float(np.mean(nonmembers >= threshold)),
            }
    return best


def threshold_bound(
    members: np.ndarray, nonmembers: np.ndarray, threshold: float, delta: float, confidence: float = 0.95
) -> float:
    """The Clopper–Pearson ε lower bound of the one test "member if score ≥ threshold" (and its
    complement) at δ; 0 when the test shows nothing."""
    true_positives = int(np.sum(members >= threshold))
    false_positives = int(np.sum(nonmembers >= threshold))
    tpr_low, _ = clopper_pearson(true_positives, members.size, confidence)
    _, fpr_high = clopper_pearson(false_positives, nonmembers.size, confidence)
    tnr_low, _ = clopper_pearson(nonmembers.size - false_positives, nonmembers.size, confidence)
    _, fnr_high = clopper_pearson(members.size - true_positives, members.size, confidence)
    # (ε, δ)-DP implies TPR <= e^ε FPR + δ and TNR <= e^ε FNR + δ (Kairouz et al., 2015).
    candidates = [0.0]
    if tpr_low > delta:
        candidates.append(math.log((tpr_low - delta) / fpr_high))
    if tnr_low > delta:
        candidates.append(math.log((tnr_low - delta) / fnr_high))
    return max(candidates)


def held_out_epsilon_lower_bound(
    member_scores: Sequence[float], nonmember_scores: Sequence[float], confidence: float = 0.95
) -> Callable[[float], float] | None:
    """The bound as a function of δ, for the threshold chosen on the *other* half of the canaries.

    Even positions of each list choose the threshold (:func:`epsilon_lower_bound` at δ = 0);
    odd positions are scored. ``None`` when a half is empty or no threshold separates anything."""
    members = np.asarray(member_scores, dtype=float)
    nonmembers = np.asarray(nonmember_scores, dtype=float)
    if min(members.size, nonmembers.size) < 2:
        return None
    threshold = epsilon_lower_bound(members[0::2], nonmembers[0::2], confidence=confidence)["threshold"]
    if threshold is None:
        return None
    scored_members, scored_nonmembers = members[1::2], nonmembers[1::2]
    return lambda delta: threshold_bound(scored_members, scored_nonmembers, threshold, delta, confidence)


def per_pair_from_group(group_bound_at: Callable[[float], float], repetitions: int, delta: float) -> float:
    """Per-pair ε lower bound from a bound on an r-fold group (see the module docstring).

    If the per-pair mechanism were (ε, δ)-DP, the group would be (rε, r e^{(r−1)ε} δ)-DP; so
    every ε with ``group_bound_at(r e^{(r−1)ε} δ) ≥ rε`` is refuted. The largest such ε is found
    by bisection (the left side falls and the right side grows with ε)."""
    r = repetitions

    def group_delta(epsilon: float) -> float:
        return min(1.0, r * math.exp(min((r - 1) * epsilon, 700.0)) * delta)

    high = group_bound_at(group_delta(0.0)) / r
    if high <= 0:
        return 0.0
    low = 0.0
    for _ in range(60):
        middle = (low + high) / 2
        if group_bound_at(group_delta(middle)) >= r * middle:
            low = middle
        else:
            high = middle
    return low
