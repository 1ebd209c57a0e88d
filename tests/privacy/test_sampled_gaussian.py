"""The vectorised RDP sums that steer the σ search agree with Opacus' own analysis on a grid of
σ and q, at every order its accountant uses; the exact check is Opacus' functions and never below
its accountant's ε; and none of it loads torch."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as opacus_rdp

from synthq.privacy import sampled_gaussian

SIGMAS = (0.01, 0.1, 0.3, 0.52, 1.0, 5.0, 100.0)
RATES = (1e-4, 0.0456, 0.5, 0.9, 1.0)


def test_the_orders_are_opacus_rdp_accountants():
    assert list(sampled_gaussian.ORDERS) == list(RDPAccountant.DEFAULT_ALPHAS)


@pytest.mark.parametrize("q", RATES)
def test_the_vectorised_rdp_is_opacus_at_every_order(q):
    for sigma in SIGMAS:
        fast = sampled_gaussian.rdp_per_step(q, sigma)
        exact = np.array([opacus_rdp._compute_rdp(q, sigma, order) for order in sampled_gaussian.ORDERS])
        # 1.4e-12 at most on this grid: 1e-11 per step is the margin the σ search allows for
        assert np.abs(fast - exact).max() <= 2e-12 * max(1.0, np.abs(exact).max()), (q, sigma)


def opacus_epsilon(sigma, delta, q, steps):
    accountant = RDPAccountant()
    accountant.history = [(sigma, q, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return max(0.0, float(accountant.get_epsilon(delta=delta)))


@pytest.mark.parametrize(
    ("sigma", "delta", "q", "steps"),
    [(0.521, 3.6e-4, 0.0456, 22), (1.0, 1e-5, 0.01, 1000), (0.3, 1e-6, 0.5, 7), (4.0, 1e-3, 1.0, 3)],
)
def test_the_exact_check_is_the_accountants_epsilon(sigma, delta, q, steps):
    expected = opacus_epsilon(sigma, delta, q, steps)
    exact = sampled_gaussian.exact_epsilon(sigma, delta, q, steps)
    assert exact >= expected  # the least over three orders: never below the least over all
    assert exact == pytest.approx(expected, rel=1e-12)
    assert sampled_gaussian.fast_epsilon(sigma, delta, q, steps) == pytest.approx(expected, rel=1e-9)


def test_the_sums_and_opacus_analysis_load_no_torch():
    code = (
        "import sys; from synthq.privacy import sampled_gaussian as s; "
        "e = s.exact_epsilon(0.521, 3.6e-4, 0.0456, 22); "
        "assert 'torch' not in sys.modules and 'opacus' not in sys.modules, sorted(sys.modules); "
        "print(e)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert float(out) == pytest.approx(opacus_epsilon(0.521, 3.6e-4, 0.0456, 22), rel=1e-12)
