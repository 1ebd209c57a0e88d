"""The Rényi DP of the Poisson-subsampled Gaussian mechanism at every order Opacus' RDP accountant
uses, computed at once (numpy over orders and terms) for the σ search of
:func:`synthq.privacy.accounting.noise_multiplier_for`; and Opacus' own analysis for the exact check.

Opacus' ``RDPAccountant`` computes ε from ``opacus/accountants/analysis/rdp.py`` (Mironov, Talwar and
Zhang 2019): for each of its 151 orders α, log A_α as a sum of binomial terms, one Python float at a
time (0.1–0.3 s for one σ at the σ a DP run ends with; the σ search needs about thirty of them).
:func:`rdp_per_step` is the same sums, term for term and with the same stopping rule, as numpy
arrays (a few milliseconds); it agrees with Opacus to about 1e-12 (``tests/privacy/
test_sampled_gaussian.py`` checks a grid). It only steers the search: the σ the search returns is
checked by Opacus' own functions (:func:`exact_epsilon`), and every released ε is Opacus'
accountant's (:func:`synthq.privacy.accounting.epsilon_for`).

:func:`opacus_rdp_analysis` loads that Opacus module as the file it is (it imports math, numpy
and scipy only), so the check costs no torch import (the ``opacus`` package imports torch: 3 s).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
import warnings
from pathlib import Path

import numpy as np
from scipy import special

# RDPAccountant.DEFAULT_ALPHAS (tests check they are still Opacus' orders)
ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
_ORDERS = np.array(ORDERS, dtype=float)
_INTEGER = np.array([float(order).is_integer() for order in ORDERS])
_INTEGER_ORDERS = _ORDERS[_INTEGER].astype(int)
_FRACTIONAL_ORDERS = _ORDERS[~_INTEGER]
# Opacus' fractional-order loop stops after the first term below e^-30; past this many terms the
# order is left to Opacus itself (only q near 1/2 with σ in the thousands goes that far).
MAX_TERMS = 1 << 18
_FIRST_CHUNK = 128


def opacus_rdp_analysis():
    """``opacus.accountants.analysis.rdp``: the imported module when Opacus is loaded, else the
    same file loaded on its own (without the ``opacus`` package, which imports torch)."""
    return _analysis()


@functools.cache
def _analysis():
    name = "opacus.accountants.analysis.rdp"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec("opacus")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("opacus is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "accountants" / "analysis" / "rdp.py"
    file_spec = importlib.util.spec_from_file_location("synthq._opacus_rdp_analysis", path)
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return module


@functools.cache
def _integer_log_binomials() -> np.ndarray:
    """log C(α, i) for every integer order α (rows) and i ≤ α; -inf beyond."""
    width = int(_INTEGER_ORDERS.max()) + 1
    table = np.full((len(_INTEGER_ORDERS), width), -np.inf)
    for row, alpha in enumerate(_INTEGER_ORDERS):
        terms = np.arange(alpha + 1)
        table[row, : alpha + 1] = np.log(special.binom(alpha, terms))
    return table


# C(α, i) of the fractional orders by chunk, kept for the first terms (about 12 MB at most; the
# terms beyond are needed only near q = 1/2 with σ in the hundreds, and computed each time)
_fractional_coefficients: dict[int, np.ndarray] = {}
KEPT_TERMS = 1 << 14


def _coefficients(chunk: int, start: int, size: int) -> np.ndarray:
    if chunk in _fractional_coefficients:
        return _fractional_coefficients[chunk]
    terms = np.arange(start, start + size, dtype=float)
    values = special.binom(_FRACTIONAL_ORDERS[:, None], terms[None, :])
    if start + size <= KEPT_TERMS:
        _fractional_coefficients[chunk] = values
    return values


def _chunks():
    """(chunk number, first term, terms): 128, 256, 512, ... terms, at most 32,768 a chunk."""
    start, size, number = 0, _FIRST_CHUNK, 0
    while start < MAX_TERMS:
        yield number, start, size
        start, number, size = start + size, number + 1, min(2 * size, 1 << 15)


def _log_erfc(x: np.ndarray) -> np.ndarray:
    return math.log(2) + special.log_ndtr(-x * 2**0.5)


def _logsumexp(values: np.ndarray) -> np.ndarray:
    """log Σ e^x along the last axis (-inf for a row of -inf); scipy's costs more in checks than
    in arithmetic at these sizes."""
    top = values.max(axis=-1)
    shift = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.exp(values - shift[..., None]).sum(axis=-1)) + shift


def _log_sub(positive: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """log(e^p − e^n) elementwise (NaN where n > p: Opacus refuses such a sum)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        difference = positive - negative
        out = np.log(np.expm1(difference)) + negative
        out = np.where(np.isneginf(negative), positive, out)
        out = np.where(difference == 0, -np.inf, out)
        out = np.where(np.isinf(np.expm1(difference)) & (difference > 0), positive, out)
    return np.where(difference < 0, np.nan, out)


def _log_a_integer(q: float, sigma: float) -> np.ndarray:
    terms = np.arange(_integer_log_binomials().shape[1], dtype=float)
    alphas = _INTEGER_ORDERS[:, None].astype(float)
    with np.errstate(invalid="ignore"):
        log_terms = (_integer_log_binomials() + terms * math.log(q) + (alphas - terms) * math.log(1 - q)) + (
            terms * terms - terms
        ) / (2 * (sigma**2))
    log_terms = np.where(terms[None, :] <= alphas, log_terms, -np.inf)
    return _logsumexp(log_terms)


def _log_a_fractional(q: float, sigma: float) -> np.ndarray:
    """Opacus' ``_compute_log_a_for_frac_alpha`` for every fractional order: the same terms, the
    same stop (after the first term whose two parts are both below e^-30), positive and negative
    terms summed apart. NaN for an order that needs more than :data:`MAX_TERMS` terms."""
    count = len(_FRACTIONAL_ORDERS)
    sums = {key: np.full(count, -np.inf) for key in ("p0", "n0", "p1", "n1")}
    running = np.ones(count, dtype=bool)
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    alphas = _FRACTIONAL_ORDERS[:, None]
    for number, start, size in _chunks():
        coefficients = _coefficients(number, start, size)
        rows = np.flatnonzero(running)
        coef, alpha = coefficients[rows], alphas[rows]
        i = np.arange(start, start + size, dtype=float)[None, :]
        j = alpha - i
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log_coef = np.log(np.abs(coef))
            log_t0 = log_coef + i * math.log(q) + j * math.log(1 - q)
            log_t1 = log_coef + j * math.log(q) + i * math.log(1 - q)
            log_e0 = math.log(0.5) + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
            log_e1 = math.log(0.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
            log_s0 = log_t0 + (i * i - i) / (2 * (sigma**2)) + log_e0
            log_s1 = log_t1 + (j * j - j) / (2 * (sigma**2)) + log_e1
        small = np.maximum(log_s0, log_s1) < -30
        stops = small.any(axis=1)
        last = np.where(stops, small.argmax(axis=1), size - 1)
        kept = np.arange(size)[None, :] <= last[:, None]
        positive = coef > 0
        for key, values, sign in (
            ("p0", log_s0, positive), ("n0", log_s0, ~positive),
            ("p1", log_s1, positive), ("n1", log_s1, ~positive),
        ):  # fmt: skip
            chosen = np.where(kept & sign, values, -np.inf)
            with np.errstate(divide="ignore"):
                sums[key][rows] = np.logaddexp(sums[key][rows], _logsumexp(chosen))
        running[rows[stops]] = False
        if not running.any():
            break
    log_a = np.logaddexp(_log_sub(sums["p0"], sums["n0"]), _log_sub(sums["p1"], sums["n1"]))
    return np.where(running, np.nan, log_a)


def rdp_per_step(q: float, sigma: float) -> np.ndarray:
    """RDP of one step at every order of :data:`ORDERS` (Opacus' ``_compute_rdp``; ``steps`` steps
    are ``steps`` × this). An order the vectorised sums cannot settle is Opacus' own value."""
    if q == 0:
        return np.zeros(len(ORDERS))
    if sigma == 0:
        return np.full(len(ORDERS), np.inf)
    if q == 1.0:
        return np.array([alpha / (2 * sigma**2) for alpha in ORDERS])
    log_a = np.empty(len(ORDERS))
    log_a[_INTEGER] = _log_a_integer(q, sigma)
    log_a[~_INTEGER] = _log_a_fractional(q, sigma)
    rdp = log_a / (_ORDERS - 1)
    for index in np.flatnonzero(~np.isfinite(rdp)):  # Opacus' own loop (or its error)
        rdp[index] = _analysis()._compute_rdp(q, sigma, ORDERS[index])
    return rdp


def _conversion(rdp: np.ndarray, orders: np.ndarray, delta: float) -> np.ndarray:
    """ε at each order (Opacus' ``get_privacy_spent``, Balle et al. 2020, Theorem 21)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return rdp - (np.log(delta) + np.log(orders)) / (orders - 1) + np.log((orders - 1) / orders)


def epsilons(sigma: float, delta: float, q: float, steps: int) -> np.ndarray:
    """ε at each order for ``steps`` steps (vectorised sums); the accountant's ε is the least."""
    return _conversion(rdp_per_step(q, sigma) * steps, _ORDERS, delta)


def fast_epsilon(sigma: float, delta: float, q: float, steps: int) -> float:
    """The RDP accountant's ε (≥ 0) from the vectorised sums: a guide for the σ search, within
    about 1e-12 of Opacus'."""
    values = epsilons(sigma, delta, q, steps)
    if np.isnan(values).all():
        return math.inf
    return max(0.0, float(np.nanmin(values)))


def exact_epsilon(sigma: float, delta: float, q: float, steps: int, orders: int = 3) -> float:
    """Opacus' RDP ε at ``sigma`` from its own functions, at the ``orders`` orders where the
    vectorised sums put the least ε. The accountant takes the least over all orders, so this is
    never below its ε (a sound upper bound) and equals it whenever the least is among them (the
    sums agree with Opacus to about 1e-12, so it is)."""
    values = epsilons(sigma, delta, q, steps)
    if np.isnan(values).all():
        return math.inf
    best = np.argsort(np.where(np.isnan(values), np.inf, values))[:orders]
    analysis = _analysis()
    chosen = [ORDERS[index] for index in sorted(best)]
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")  # "optimal order is the smallest alpha" of this subset
        rdp = analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=chosen)
        epsilon, _ = analysis.get_privacy_spent(orders=chosen, rdp=rdp, delta=delta)
    return max(0.0, float(epsilon))
