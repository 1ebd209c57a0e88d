"""Paired significance over queries: sign-flip randomization test, paired bootstrap, Holm.

Two retrievers evaluated on the same queries give paired per-query scores ``a_i`` and ``b_i``.
The unit of resampling is the query (the test set is a sample of queries), so every test here
works on the per-query differences ``d_i = a_i - b_i``:

* :func:`permutation_test` - the paired randomization test (Fisher; Smucker et al., CIKM 2007):
  under H0 "the two systems are exchangeable on every query" each ``d_i`` is as likely to be
  ``-d_i``, so the two-sided p-value is the share of sign assignments whose ``|mean|`` is at
  least the observed one. Exact (all ``2^n`` assignments) for small ``n``, Monte Carlo with the
  ``(1 + hits) / (1 + resamples)`` estimator otherwise (never 0, valid at any resample count).
* :func:`bootstrap_ci` - the percentile bootstrap interval of ``mean(d)``, resampling queries
  with replacement. With several training seeds per system (``[seeds, queries]`` arrays) each
  bootstrap replicate also resamples each system's seeds, so the interval covers both the
  query sampling and the training-seed variance (a two-level bootstrap).
* :func:`holm` - Holm-Bonferroni step-down adjustment: family-wise error ≤ α over all pairs.

With seeds, the p-value is computed on the per-query scores averaged over each system's seeds:
it asks whether the seed-averaged systems differ on this query sample; the interval and the
seed standard deviation (shown in the tables) carry the training noise.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

# 2^n ≤ this: enumerate every sign assignment (the exact p-value); else Monte Carlo.
EXACT_LIMIT = 2**16


def _as_runs(scores) -> np.ndarray:
    """``[queries]`` or ``[seeds, queries]`` -> a float64 ``[seeds, queries]`` array."""
    array = np.asarray(scores, dtype=np.float64)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] == 0:
        raise ValueError(f"per-query scores must be [queries] or [seeds, queries], got shape {array.shape}")
    return array


def _differences(a, b) -> np.ndarray:
    a, b = _as_runs(a).mean(0), _as_runs(b).mean(0)
    if a.shape != b.shape:
        raise ValueError(f"paired scores differ in length: {a.shape[0]} vs {b.shape[0]} queries")
    return a - b


def permutation_test(a, b, resamples: int = 10_000, seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip randomization test of ``mean(a) = mean(b)``.

    Args:
        a, b: per-query scores of two systems on the same queries in the same order
            (``[queries]``, or ``[seeds, queries]``, averaged over seeds first).
        resamples: random sign assignments when ``2^n`` exceeds :data:`EXACT_LIMIT`.
        seed: of the random sign assignments.
    """
    d = _differences(a, b)
    n = d.shape[0]
    observed = abs(d.mean())
    tolerance = 1e-12 * max(1.0, observed)  # float sums of equal sets may differ in the last bit
    if 2**n <= EXACT_LIMIT:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=n)))
        return float(np.mean(np.abs(signs @ d) / n >= observed - tolerance))
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, resamples, 1000):
        signs = rng.choice((-1.0, 1.0), size=(min(1000, resamples - start), n))
        hits += int(np.sum(np.abs(signs @ d) / n >= observed - tolerance))
    return (1 + hits) / (1 + resamples)


def bootstrap_ci(
    a, b=None, resamples: int = 10_000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``mean(a - b)`` over queries (of ``mean(a)`` without ``b``).

    ``a`` and ``b`` are ``[queries]`` or ``[seeds, queries]``; with several seeds each replicate
    first draws each system's seeds with replacement, then the queries (shared by both systems,
    so the pairing is kept), and averages.
    """
    runs_a = _as_runs(a)
    runs_b = _as_runs(b) if b is not None else np.zeros((1, runs_a.shape[1]))
    if runs_a.shape[1] != runs_b.shape[1]:
        raise ValueError(f"paired scores differ in length: {runs_a.shape[1]} vs {runs_b.shape[1]} queries")
    rng = np.random.default_rng(seed)
    n = runs_a.shape[1]
    estimates = np.empty(resamples)
    for start in range(0, resamples, 500):
        size = min(500, resamples - start)
        queries = rng.integers(0, n, size=(size, n))
        per_a = _resample_seeds(runs_a, size, rng)  # [size, n]: seed-averaged scores per replicate
        per_b = _resample_seeds(runs_b, size, rng)
        d = per_a - per_b
        estimates[start : start + size] = np.take_along_axis(d, queries, axis=1).mean(1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(estimates, [tail, 1 - tail])
    return float(low), float(high)


def _resample_seeds(runs: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    if runs.shape[0] == 1:
        return np.broadcast_to(runs[0], (size, runs.shape[1]))
    picks = rng.integers(0, runs.shape[0], size=(size, runs.shape[0]))
    return runs[picks].mean(1)


def holm(pvalues: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as given): reject where adjusted ≤ α."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted = [0.0] * len(pvalues)
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class Comparison:
    """One pair of systems on one dataset: ``a - b`` on a metric."""

    a: str
    b: str
    difference: float
    ci_low: float
    ci_high: float
    p_value: float
    p_holm: float = math.nan
    alpha: float = 0.05

    @property
    def significant(self) -> bool:
        return self.p_holm <= self.alpha


def compare_all(
    systems: dict[str, np.ndarray],
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[Comparison]:
    """Every pair of ``systems`` (name -> ``[queries]`` or ``[seeds, queries]`` scores on the
    same queries), higher-mean system first, with Holm's adjustment over all the pairs."""
    means = {name: float(_as_runs(s).mean()) for name, s in systems.items()}
    raw = []
    for x, y in itertools.combinations(systems, 2):
        a, b = (x, y) if means[x] >= means[y] else (y, x)
        low, high = bootstrap_ci(systems[a], systems[b], resamples, confidence, seed)
        p = permutation_test(systems[a], systems[b], resamples, seed)
        raw.append(Comparison(a, b, means[a] - means[b], low, high, p, alpha=1 - confidence))
    adjusted = holm([c.p_value for c in raw])
    return [
        Comparison(c.a, c.b, c.difference, c.ci_low, c.ci_high, c.p_value, p, c.alpha)
        for c, p in zip(raw, adjusted, strict=True)
    ]
