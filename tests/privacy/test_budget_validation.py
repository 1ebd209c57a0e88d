"""The privacy budget a user asks for: unreachable or tiny ε, δ not below 1/n and --epsilon without
--dp are refused before any work; the calibration prints no accountant advice."""

from __future__ import annotations

import time
import warnings

import pytest
from opacus.accountants import RDPAccountant
from pydantic import ValidationError

from synthq.data.beir_io import load_beir_dir
from synthq.privacy.accounting import epsilon_for, noise_multiplier_for
from synthq.runtime.errors import PrivacyError
from synthq.stages import train_retriever
from tests.helpers import finetune, retriever_config


def test_an_unreachably_large_epsilon_is_refused_quickly():
    started = time.perf_counter()
    with pytest.raises(PrivacyError, match="beyond any meaningful guarantee.*--epsilon inf"):
        noise_multiplier_for(1e17, 1e-5, 0.05, 100)
    assert time.perf_counter() - started < 30  # Opacus' own search never returns here


def test_a_small_epsilon_is_met_from_below_and_a_tiny_one_refused():
    calibration = noise_multiplier_for(0.5, 1e-5, 0.01, 1)
    assert 0.495 <= calibration.epsilon <= 0.5  # relative tolerance, not Opacus' absolute 0.01
    independent = RDPAccountant()
    independent.history = [(calibration.noise_multiplier, 0.01, 1)]
    assert independent.get_epsilon(delta=1e-5) == pytest.approx(calibration.epsilon)
    # RDP cannot certify ε = 1e-6 at δ = 1e-5 with any noise: refused, never a negative ε written
    with pytest.raises(PrivacyError, match="cannot be reached"):
        noise_multiplier_for(1e-6, 1e-5, 0.05, 100)
    assert epsilon_for(1e5, 0.5, 1.0, 1).epsilon >= 0  # a conversion below 0 still proves (0, δ)


def test_finetune_with_an_extreme_epsilon_fails_before_training(tmp_path, tiny_beir, tiny_causal_dir):
    with pytest.raises(PrivacyError, match="beyond any meaningful guarantee"):
        finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon=1e17, max_steps=2)
    assert not (tmp_path / "gen").exists()


def test_epsilon_without_dp_is_refused(tmp_path, tiny_beir, tiny_encoder_dir):
    with pytest.raises(ValidationError, match="--epsilon needs --dp"):
        retriever_config(tmp_path / "r", tiny_beir, tiny_encoder_dir, epsilon=8)
    retriever_config(tmp_path / "r", tiny_beir, tiny_encoder_dir, epsilon="inf")  # says what it does


def test_delta_not_below_one_over_n_is_refused(tmp_path, tiny_beir, tiny_encoder_dir):
    units = len(load_beir_dir(tiny_beir).split_queries("train"))
    with pytest.raises(PrivacyError, match="not below 1/n"):
        train_retriever.run(
            retriever_config(
                tmp_path / "r", tiny_beir, tiny_encoder_dir, dp="group", epsilon=8, delta=1 / units
            )
        )
    assert not (tmp_path / "r").exists()


def test_the_calibration_prints_no_accountant_advice():
    """Opacus' "optimal order is the largest alpha" comes from the σ the search probes, not from
    the answer: it must not reach every DP run's log."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        noise_multiplier_for(8.0, 1e-5, 0.05, 8)
        noise_multiplier_for(0.5, 1e-5, 0.01, 1000, "prv")
    assert not [w for w in caught if "Optimal order" in str(w.message)]
