"""ε of a Poisson-subsampled Gaussian release when one unit's data is *replaced*, not removed.

A user-level DP-SGD release protects each user against being added or removed. Seen per query,
removing one of a user's queries keeps the user but changes what the user contributes: the
clipped sum moves from ``f(D∖u) + a`` to ``f(D∖u) + b`` when the user is sampled, with
``‖a‖, ‖b‖ ≤ s`` (s, the add/remove sensitivity the noise was calibrated to), and not at all when
the user is not. Per step, with noise multiplier σ (noise std / s) and sampling rate q, that pair
of output distributions is dominated by the one-dimensional pair (dp_accounting's ``REPLACE``
adjacency for a subsampled Gaussian; Zhu, Dong & Wang, *Optimal Accounting of Differential Privacy
via Characteristic Function*, AISTATS 2022)::

    P = (1 − q)·N(0, σ²) + q·N(−1, σ²)        Q = (1 − q)·N(0, σ²) + q·N(+1, σ²)

(in units of s), and T adaptive steps by its T-fold composition. Unlike two add/remove steps
glued by group privacy, this keeps subsampling's amplification for the replaced user.

:func:`substitution_epsilon` computes the ε of that composition at δ with a *pessimistic* privacy
loss distribution ("privacy buckets": Meiser & Mohammadi, CCS 2018; Koskela, Jälkö & Honkela, 2020):

1. The privacy loss ``L(x) = ln P(x)/Q(x)`` is decreasing in x and has a closed-form inverse, so
   the mass P gives to ``L ∈ (l − h, l]`` is exact (two CDF values) and is put at ``l``: every loss
   is rounded *up* to a grid of step ``h``. Mass below ``x_lo`` (losses above the grid) goes to
   +∞ and is paid in δ outright.
2. The T-fold composition is the T-fold convolution of that grid distribution (FFT, by squaring).
   After each product, mass in the far right tail goes to +∞ and mass in the far left tail is
   raised to the lowest loss kept: both only enlarge δ(ε).
3. ``δ(ε) = P(L = ∞) + Σ_{l > ε} p_l (1 − e^{ε − l})`` is solved for ε exactly on the grid.

Every step only raises δ(ε), so the ε returned is an upper bound of the true one; rounding up by
at most h per step makes it at most ``T·h`` above it (h ≤ 0.02 / T, so ≤ 0.02, unless the grid
would pass :data:`MAX_BUCKETS`). Without subsampling (q = 1) the pair is two Gaussians 2/σ apart
and ε is the analytic Gaussian mechanism's (Balle & Wang, ICML 2018), exact.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.signal import fftconvolve
from scipy.special import ndtr, ndtri

# Share of δ spent on the mass cut to +∞ (per-step tails and composition tails together).
TRUNCATION_SHARE = 1e-4
# The most loss buckets one step's distribution may hold (memory: a few arrays of this length).
MAX_BUCKETS = 1 << 21
# The most buckets a composed distribution may hold; beyond, both factors' grids are coarsened.
MAX_COMPOSED = 1 << 22
# Beyond this ε a bound says nothing; the computation stops there (e^ε must stay finite).
EPSILON_CEILING = 500.0


def _log_p_over_q(x: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """L(x) = ln P(x)/Q(x) for the pair above, computed in logs (no overflow for small σ)."""
    s2 = sigma * sigma
    keep, moved = math.log1p(-q), math.log(q)
    upper = np.logaddexp(keep, moved - (2 * x + 1) / (2 * s2))
    lower = np.logaddexp(keep, moved + (2 * x - 1) / (2 * s2))
    return upper - lower


def _x_of_loss(losses: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """The inverse of L: the x with ``L(x) = l``. With ``a = e^{−x/σ²}`` and ``c = e^{−1/(2σ²)}``,
    ``P/Q = r`` is ``q c a² + (1 − q)(1 − r) a − r q c = 0``; its positive root, taken in the form
    without cancellation on each side of r = 1, and x = −σ² ln a."""
    s2 = sigma * sigma
    r = np.exp(losses)
    log_c = -1.0 / (2 * s2)
    b = (1 - q) * (1 - r)
    disc = np.sqrt(b * b + 4 * q * q * math.exp(2 * log_c) * r)
    with np.errstate(divide="ignore", invalid="ignore"):
        small_r = 2 * r * q * math.exp(log_c) / (b + disc)  # r ≤ 1: b ≥ 0
        large_r = (disc - b) / (2 * q * math.exp(log_c))  # r > 1: −b > 0
    a = np.where(r <= 1, small_r, large_r)
    return -s2 * np.log(a)


def _p_cdf(x: np.ndarray, sigma: float, q: float) -> np.ndarray:
    return (1 - q) * ndtr(x / sigma) + q * ndtr((x + 1) / sigma)


def _p_sf(x: np.ndarray, sigma: float, q: float) -> np.ndarray:
    return (1 - q) * ndtr(-x / sigma) + q * ndtr(-(x + 1) / sigma)


def _step_distribution(sigma: float, q: float, h: float, tail: float) -> tuple[int, np.ndarray, float]:
    """One step's pessimistic loss distribution: (index of its first grid bucket, the masses on the
    grid ``k·h`` from there, the mass at +∞)."""
    x_lo = sigma * float(ndtri(tail)) - 1.0  # P(X < x_lo) ≤ Φ((x_lo + 1)/σ) = tail
    x_hi = -sigma * float(ndtri(tail))
    loss_top = float(_log_p_over_q(np.array([x_lo]), sigma, q)[0])
    loss_bottom = float(_log_p_over_q(np.array([x_hi]), sigma, q)[0])
    if loss_top > 300:  # the root's b² ~ e^{2L} overflows near L = 354: no bound (the caller's holds)
        raise OverflowError("the privacy loss is beyond float range")
    k_first, k_last = math.floor(loss_bottom / h), math.ceil(loss_top / h)
    if k_last - k_first + 1 > MAX_BUCKETS:
        raise MemoryError("the loss grid would exceed MAX_BUCKETS")
    grid = np.arange(k_first, k_last + 1) * h
    x = _x_of_loss(grid, sigma, q)  # decreasing: X ≥ x[k] exactly when L(X) ≤ grid[k]
    x[0] = math.inf  # bucket 1 takes every X ≥ x[1], the far right tail included (loss ≤ grid[1])
    # P(x[k] ≤ X < x[k−1]) is the mass of L ∈ (grid[k−1], grid[k]], put at grid[k] (rounded up)
    upper_x, lower_x = x[:-1], x[1:]
    use_sf = lower_x > 0  # right half: survival functions keep the precision of small masses
    mass = np.where(
        use_sf,
        _p_sf(lower_x, sigma, q) - _p_sf(upper_x, sigma, q),
        _p_cdf(upper_x, sigma, q) - _p_cdf(lower_x, sigma, q),
    )
    pmf = np.concatenate([[0.0], np.maximum(mass, 0.0)])
    infinite = float(_p_cdf(np.array([x[-1]]), sigma, q)[0])  # X < x[-1] ≤ x_lo: loss above the grid
    return k_first, pmf, infinite


class _Losses:
    """A loss distribution on the grid ``(first + i)·h`` with ``mass[i]``, plus mass at +∞."""

    def __init__(self, first: int, mass: np.ndarray, infinite: float, h: float):
        self.first, self.mass, self.infinite, self.h = first, mass, infinite, h

    def coarsened(self) -> _Losses:
        """The same losses on a grid twice as coarse, each rounded *up* to it."""
        start = self.first % 2  # an odd first index moves up to the next even one
        mass = np.concatenate([[0.0] * (1 - start), self.mass, [0.0] * ((len(self.mass) + 1 - start) % 2)])
        # buckets 2k − 1 and 2k go to k (loss 2k·h): an even start gets an empty bucket in front
        first = (self.first + 1) // 2 if start else self.first // 2
        paired = mass.reshape(-1, 2).sum(axis=1)
        return _Losses(first, paired, self.infinite, 2 * self.h)

    def compose(self, other: _Losses, tail: float) -> _Losses:
        """The distribution of the sum of independent losses, its far tails cut: right-tail mass up
        to ``tail`` goes to +∞ and left-tail mass up to ``tail`` is raised onto the lowest bucket
        kept. Raising a loss only enlarges δ(ε), so the result still bounds the true one. Grids
        are coarsened (rounding up) while the product would pass :data:`MAX_COMPOSED`."""
        a, b = self, other
        while a.h < b.h:
            a = a.coarsened()
        while b.h < a.h:
            b = b.coarsened()
        while len(a.mass) + len(b.mass) - 1 > MAX_COMPOSED:
            a, b = a.coarsened(), b.coarsened()
        mass = np.maximum(fftconvolve(a.mass, b.mass), 0.0)
        infinite = 1.0 - (1.0 - a.infinite) * (1.0 - b.infinite)  # ∞ + anything = ∞
        first = a.first + b.first
        right = np.cumsum(mass[::-1])
        cut = int(np.searchsorted(right, tail, side="right"))
        if cut:
            infinite += float(right[cut - 1])
            mass = mass[: len(mass) - cut]
        left = np.cumsum(mass)
        raise_up = int(np.searchsorted(left, tail, side="right"))
        if 0 < raise_up < len(mass):
            mass = mass[raise_up:].copy()
            mass[0] += float(left[raise_up - 1])
            first += raise_up
        return _Losses(first, mass, min(infinite, 1.0), a.h)


def _epsilon_at(grid: np.ndarray, mass: np.ndarray, delta: float) -> float:
    """The least ε ≥ 0 with ``Σ_{l > ε} p_l (1 − e^{ε − l}) ≤ delta`` (the mass at +∞ already taken
    out of ``delta``), exact for the grid distribution. Losses ≤ 0 never count for ε ≥ 0."""
    if delta <= 0:
        return math.inf
    beyond = grid > EPSILON_CEILING
    delta -= float(mass[beyond].sum())  # losses beyond the ceiling are paid in δ, never dropped
    if delta <= 0:
        return math.inf
    keep = (grid > 0) & ~beyond
    grid, mass = grid[keep], mass[keep]
    above = np.concatenate([np.cumsum(mass[::-1])[::-1], [0.0]])  # Σ_{j ≥ i} p_j
    weighted = np.concatenate([np.cumsum((mass * np.exp(-grid))[::-1])[::-1], [0.0]])
    if above[0] - weighted[0] <= delta:  # δ(0) is within the budget
        return 0.0
    # δ at ε = grid[i] counts the buckets j > i; it decreases with i
    at_grid = above[1:] - np.exp(grid) * weighted[1:]
    within = at_grid <= delta
    if not within.any():
        return math.inf
    index = int(np.argmax(within))
    # on (grid[index − 1], grid[index]] the buckets j ≥ index count: solve above − e^ε·weighted = δ
    lowest = float(grid[index - 1]) if index else 0.0
    return max(lowest, math.log((above[index] - delta) / weighted[index]))


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε at δ of a Gaussian pair μ noise deviations apart (Balle & Wang, ICML 2018)."""

    def delta_of(eps: float) -> float:
        return float(ndtr(-eps / mu + mu / 2) - math.exp(eps) * ndtr(-eps / mu - mu / 2))

    if delta_of(0.0) <= delta:
        return 0.0
    low, high = 0.0, 1.0
    while delta_of(high) > delta:
        low, high = high, high * 2
        if high > EPSILON_CEILING:
            return math.inf
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if delta_of(middle) > delta else (low, middle)
    return high


def substitution_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> float:
    """ε at ``delta`` of ``steps`` Poisson-sampled Gaussian steps (noise multiplier σ, rate q) when
    one unit's contribution is replaced by another within the same norm bound. An upper bound, at
    most ``T·h`` above the exact value (module docstring); ∞ where σ is too small to compute it."""
    sigma, q, steps = float(noise_multiplier), float(sample_rate), int(steps)
    if sigma <= 0 or steps < 1 or not 0 < q <= 1 or not 0 < delta < 1:
        raise ValueError(f"no substitution ε for σ={sigma}, q={q}, T={steps}, δ={delta}")
    if q == 1.0:  # no subsampling: two Gaussians 2/σ apart per step, 2√T/σ after T steps
        return _gaussian_epsilon(2.0 * math.sqrt(steps) / sigma, delta)
    budget = delta * TRUNCATION_SHARE
    rounds = 2 * steps.bit_length()
    h = max(min(1e-3, 0.02 / steps), 1e-7)
    while True:
        try:
            first, mass, infinite = _step_distribution(sigma, q, h, budget / (2 * steps))
            break
        except OverflowError:
            return math.inf
        except MemoryError:
            h *= 2
    tail = budget / (2 * steps * rounds)
    power, result, remaining = _Losses(first, mass, infinite, h), None, steps
    while remaining:  # T-fold composition by squaring
        if remaining & 1:
            result = power if result is None else result.compose(power, tail)
        remaining >>= 1
        if remaining:
            power = power.compose(power, tail)
    grid = (result.first + np.arange(len(result.mass))) * result.h
    return _epsilon_at(grid, result.mass, delta - result.infinite)
