"""Privacy auditing in one training run, and the usual membership-inference summaries.

**The game** (Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run",
NeurIPS 2023): ``m`` canaries are each included in the training set independently with
probability ½ (a secret coin per canary). After training, every canary gets a membership score;
the auditor guesses "included" for the ``k₊`` highest scores, "excluded" for the ``k₋`` lowest and
abstains on the rest, so ``r = k₊ + k₋`` guesses are made and ``v`` of them are correct.

**The bound** (their Theorem 5.2, computed as in their Appendix D): if training is (ε, δ)-DP
with respect to adding or removing one canary, then for every v::

    P[W ≥ v] ≤ β + 2 m δ · α,   β = P[Bin(r, q) ≥ v],
    α = max_{1 ≤ i ≤ v} P[v − i ≤ Bin(r, q) < v] / i,   q = e^ε / (1 + e^ε)

(each guess is at most as accurate as ε-DP randomized response, plus the δ term). The audit
rejects "(ε, δ)-DP" when this is ≤ 1 − confidence at the observed v; the reported ε lower bound
is the largest rejected ε, found by bisection (the right-hand side increases with ε). A bound is
per canary — one (query, document) pair included once — so it is directly comparable with the
proven per-pair ε.

**Choosing k₊, k₋** after seeing the scores would void the confidence, so
:func:`one_run_audit` tries a fixed grid of guess counts and splits the failure probability
over it (Bonferroni): every reported bound holds with the stated confidence.

**Gaussian-DP version** (:func:`gaussian_epsilon_lower_bound`). Mahloujifar, Melis & Chaudhuri,
"Auditing f-Differential Privacy in One Run" (2024), audit a whole trade-off curve with a
sharper recursive analysis; that analysis is *not* implemented here. What is implemented is a
simpler bound that is valid and labelled as such: a μ-GDP mechanism is (ε, δ_μ(ε))-DP for every
ε at once (Dong, Roth & Su 2019, Corollary 2.13:
``δ_μ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)``), so P[W ≥ v] ≤ min_ε of the bound above at
(ε, δ_μ(ε)). The largest μ rejected this way is a lower bound on μ, reported with the ε it
implies at the audited δ ("if the mechanism's privacy profile is Gaussian, its ε is at least
this"). It uses the whole privacy profile instead of one δ, so it is usually larger than the
(ε, δ) bound, and never larger than what the same test can support.

**Summaries**: TPR at fixed FPR (thresholds on the scores, no interpolation) and AUROC (the
Mann–Whitney statistic, ties counted ½) with a percentile bootstrap interval (members and
non-members resampled separately). These describe the scores; unlike the one-run bound they are
not privacy guarantees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
EPSILON_SEARCH_MAX = 60.0
GUESS_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5)


def _accuracy(epsilon: float) -> float:
    """q = e^ε / (1 + e^ε): the accuracy of ε-DP randomized response."""
    return float(stats.logistic.cdf(epsilon))


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Upper bound on P[≥ v of r guesses correct] for an (ε, δ)-DP run with m canaries.

    Theorem 5.2 of Steinke et al. (2023); see the module docstring. ``m`` enters only through
    the δ term (each of the m canaries may spend δ)."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 ≤ v ≤ r ≤ m, got v={v}, r={r}, m={m}")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need ε ≥ 0 and 0 ≤ δ ≤ 1, got ε={epsilon}, δ={delta}")
    q = _accuracy(epsilon)
    beta = float(stats.binom.sf(v - 1, r, q))
    if delta == 0 or v == 0:
        return min(beta, 1.0)
    # P[v − i ≤ Bin(r, q) < v] for i = 1..v is the running sum of pmf(v−1), pmf(v−2), ...
    below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)
    alpha = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
    return min(beta + 2 * m * delta * alpha, 1.0)


def epsilon_lower_bound(
    m: int, r: int, v: int, delta: float = 0.0, confidence: float = CONFIDENCE, tolerance: float = 1e-4
) -> float:
    """The largest ε (to ``tolerance``, rounded down) with ``p_value(m, r, v, ε, δ) ≤ 1 − confidence``.

    0 when even ε = 0 cannot be rejected: the guesses are no better than coin flips."""
    level = 1 - confidence
    if r == 0 or p_value(m, r, v, 0.0, delta) > level:
        return 0.0
    return _largest_rejected(lambda e: p_value(m, r, v, e, delta) <= level, EPSILON_SEARCH_MAX, tolerance)


def _largest_rejected(rejected, high: float, tolerance: float) -> float:
    """The largest x in [0, high] with ``rejected(x)``, for a predicate true at 0 that stays
    false once false (bisection, rounded down)."""
    if rejected(high):
        return high
    low = 0.0
    while high - low > tolerance:
        middle = (low + high) / 2
        if rejected(middle):
            low = middle
        else:
            high = middle
    return low


def gaussian_delta(mu: float, epsilon: float) -> float:
    """δ of μ-GDP at ε: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), computed in log space."""
    if mu <= 0:
        return 0.0
    log_a = stats.norm.logcdf(-epsilon / mu + mu / 2)
    log_b = epsilon + stats.norm.logcdf(-epsilon / mu - mu / 2)
    if log_b >= log_a:
        return 0.0
    return float(math.exp(log_a) * -math.expm1(log_b - log_a))


def gaussian_epsilon(mu: float, delta: float) -> float:
    """ε of μ-GDP at δ (the inverse of :func:`gaussian_delta` in ε); 0 when δ_μ(0) ≤ δ."""
    if mu <= 0 or gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    high = 1.0
    while gaussian_delta(mu, high) > delta:
        high *= 2
    low = 0.0
    for _ in range(80):
        middle = (low + high) / 2
        if gaussian_delta(mu, middle) > delta:
            low = middle
        else:
            high = middle
    return high


def _gaussian_p_value(m: int, r: int, v: int, mu: float, grid: np.ndarray) -> float:
    return min(p_value(m, r, v, float(e), min(gaussian_delta(mu, float(e)), 1.0)) for e in grid)


def gaussian_mu_lower_bound(
    m: int, r: int, v: int, confidence: float = CONFIDENCE, tolerance: float = 1e-3
) -> float:
    """The largest μ such that "μ-GDP" is rejected by the one-run test at the given confidence.

    The p-value under μ-GDP is the minimum of the (ε, δ_μ(ε)) bound over a grid of ε (each grid
    point is a valid bound on its own); it increases with μ, so μ is found by bisection."""
    level = 1 - confidence
    if r == 0 or p_value(m, r, v, 0.0, 0.0) > level:
        return 0.0
    grid = np.linspace(0.0, 12.0, 97)
    return _largest_rejected(lambda mu: _gaussian_p_value(m, r, v, mu, grid) <= level, 64.0, tolerance)


@dataclass
class Guesses:
    """The outcome of one guessing rule: k₊ "included" and k₋ "excluded" guesses, v correct."""

    k_plus: int
    k_minus: int
    correct: int

    @property
    def guesses(self) -> int:
        return self.k_plus + self.k_minus


def count_correct(scores: Sequence[float], included: Sequence[bool], k_plus: int, k_minus: int) -> Guesses:
    """Guess "included" on the ``k_plus`` highest scores and "excluded" on the ``k_minus`` lowest.

    Ties are broken by position (a stable sort), which does not depend on the coins."""
    scores = np.asarray(scores, dtype=float)
    included = np.asarray(included, dtype=bool)
    if k_plus + k_minus > scores.size:
        raise ValueError(f"{k_plus} + {k_minus} guesses for {scores.size} canaries")
    order = np.argsort(-scores, kind="stable")
    top = order[:k_plus]
    bottom = order[scores.size - k_minus :] if k_minus else order[:0]
    return Guesses(k_plus, k_minus, int(included[top].sum() + (~included[bottom]).sum()))


def guess_grid(m: int, fractions: Sequence[float] = GUESS_FRACTIONS) -> list[tuple[int, int]]:
    """Fixed (k₊, k₋) pairs to try: k₊ = k₋ = ⌈f·m/2⌉ for each fraction f of the canaries guessed."""
    pairs = sorted({(max(1, math.ceil(f * m / 2)),) * 2 for f in fractions})
    return [(k_plus, k_minus) for k_plus, k_minus in pairs if k_plus + k_minus <= m]


@dataclass
class OneRunResult:
    """The one-run audit of one set of scores; every bound holds with ``confidence``."""

    canaries: int
    included: int
    k_plus: int
    k_minus: int
    guesses: int
    correct: int
    delta: float
    confidence: float
    rules_tried: int
    epsilon_lower_bound: float
    gdp_mu_lower_bound: float
    gdp_epsilon_lower_bound: float

    def to_dict(self) -> dict:
        return asdict(self)


def one_run_audit(
    scores: Sequence[float],
    included: Sequence[bool],
    delta: float,
    confidence: float = CONFIDENCE,
    rules: Sequence[tuple[int, int]] | None = None,
    gaussian: bool = True,
) -> OneRunResult:
    """The one-run ε lower bound (and its Gaussian-DP version) for membership scores.

    Args:
        scores: one score per canary, higher = more likely included.
        included: the secret coins (True = the canary was in the training set).
        delta: δ of the (ε, δ) hypothesis being tested (the audited run's δ).
        confidence: the bounds hold with this probability over the coins and the training run.
        rules: the (k₊, k₋) guessing rules to try; default :func:`guess_grid`. The failure
            probability is split evenly over them (Bonferroni), so picking the best is allowed.
        gaussian: also compute the Gaussian-DP bound (slower: a search over μ and ε).
    """
    scores = np.asarray(scores, dtype=float)
    included = np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.size == 0:
        raise ValueError("need one coin per score and at least one canary")
    m = int(scores.size)
    rules = list(rules) if rules is not None else guess_grid(m)
    per_rule = 1 - (1 - confidence) / len(rules)
    best: tuple[float, Guesses] | None = None
    for k_plus, k_minus in rules:
        outcome = count_correct(scores, included, k_plus, k_minus)
        bound = epsilon_lower_bound(m, outcome.guesses, outcome.correct, delta, per_rule)
        if best is None or bound > best[0] or (bound == best[0] and outcome.correct > best[1].correct):
            best = (bound, outcome)
    assert best is not None
    bound, outcome = best
    mu = (
        max(
            gaussian_mu_lower_bound(m, g.guesses, g.correct, per_rule)
            for g in (count_correct(scores, included, kp, km) for kp, km in rules)
        )
        if gaussian
        else math.nan
    )
    return OneRunResult(
        canaries=m,
        included=int(included.sum()),
        k_plus=outcome.k_plus,
        k_minus=outcome.k_minus,
        guesses=outcome.guesses,
        correct=outcome.correct,
        delta=delta,
        confidence=confidence,
        rules_tried=len(rules),
        epsilon_lower_bound=bound,
        gdp_mu_lower_bound=mu,
        gdp_epsilon_lower_bound=_gaussian_epsilon_bound(mu, delta),
    )


def _gaussian_epsilon_bound(mu: float, delta: float) -> float:
    if math.isnan(mu):
        return math.nan
    if delta == 0:
        return math.inf if mu > 0 else 0.0
    return gaussian_epsilon(mu, delta)


def tpr_at_fpr(member_scores: Sequence[float], nonmember_scores: Sequence[float], fpr: float) -> float:
    """The highest TPR of a threshold rule "member if score > t" whose FPR is at most ``fpr``."""
    members = np.asarray(member_scores, dtype=float)
    nonmembers = np.sort(np.asarray(nonmember_scores, dtype=float))
    if members.size == 0 or nonmembers.size == 0:
        raise ValueError("need both member and non-member scores")
    allowed = math.floor(fpr * nonmembers.size + 1e-9)  # false positives allowed
    threshold = nonmembers[nonmembers.size - allowed - 1] if allowed < nonmembers.size else -math.inf
    return float(np.mean(members > threshold))


def auroc(member_scores: Sequence[float], nonmember_scores: Sequence[float]) -> float:
    """P[member score > non-member score] + ½ P[tie] (the Mann–Whitney U statistic / (n₊ n₋))."""
    members = np.asarray(member_scores, dtype=float)
    nonmembers = np.asarray(nonmember_scores, dtype=float)
    if members.size == 0 or nonmembers.size == 0:
        raise ValueError("need both member and non-member scores")
    ranks = stats.rankdata(np.concatenate([members, nonmembers]))
    u = ranks[: members.size].sum() - members.size * (members.size + 1) / 2
    return float(u / (members.size * nonmembers.size))


def auroc_interval(
    member_scores: Sequence[float],
    nonmember_scores: Sequence[float],
    samples: int = 1000,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the AUROC (members and non-members resampled separately).

    The seed only drives the resampling of released scores; it protects nothing."""
    members = np.asarray(member_scores, dtype=float)
    nonmembers = np.asarray(nonmember_scores, dtype=float)
    rng = np.random.default_rng(seed)
    values = [
        auroc(rng.choice(members, members.size), rng.choice(nonmembers, nonmembers.size))
        for _ in range(samples)
    ]
    tail = (1 - confidence) / 2
    low, high = np.quantile(values, [tail, 1 - tail])
    return float(low), float(high)


def score_summary(member_scores: Sequence[float], nonmember_scores: Sequence[float], seed: int = 0) -> dict:
    """TPR at FPR 1 % and 10 %, AUROC and its 95 % bootstrap interval; ``None`` each when the coins
    left one side empty (every canary included, or none: likely with few canaries), where they
    are undefined — the one-run bound itself still holds."""
    if len(member_scores) == 0 or len(nonmember_scores) == 0:
        return dict.fromkeys(("tpr_at_fpr_1", "tpr_at_fpr_10", "auroc", "auroc_low", "auroc_high"))
    low, high = auroc_interval(member_scores, nonmember_scores, seed=seed)
    return {
        "tpr_at_fpr_1": tpr_at_fpr(member_scores, nonmember_scores, 0.01),
        "tpr_at_fpr_10": tpr_at_fpr(member_scores, nonmember_scores, 0.10),
        "auroc": auroc(member_scores, nonmember_scores),
        "auroc_low": low,
        "auroc_high": high,
    }
