"""A release's accounting event, typed: every recorded guarantee (old manifests' ``details`` included)
reads into one event, and the ε recomputed from it is the accountant's own."""

from __future__ import annotations

import math

import pytest
from opacus.accountants import RDPAccountant

from synthq.privacy.accounting import recomputed_epsilon
from synthq.privacy.events import (
    Composed,
    NoisyMaxSelections,
    NotPrivate,
    Public,
    SampledGaussian,
    Unaccounted,
    gaussian,
    release_event,
)
from synthq.privacy.guarantee import Guarantee

GAUSSIAN_DETAILS = {"noise_multiplier": 0.8, "sample_rate": 0.05, "steps": 40, "max_batch_size": 12}


def _dp(details: dict, **fields) -> Guarantee:
    return Guarantee(epsilon=5.0, delta=1e-5, unit="query", mechanism="dp-adam", accountant="rdp",
                     details=details, **fields)  # fmt: skip


def test_each_kind_of_record_reads_into_its_event():
    assert release_event(Guarantee.non_private("read without DP")) == NotPrivate()
    assert release_event(Guarantee(epsilon=0.0, mechanism="public")) == Public()
    event = release_event(_dp(GAUSSIAN_DETAILS))
    assert event == SampledGaussian(0.8, 0.05, 40, 1e-5, "rdp", None, 12) and event.subsampled
    selections = Guarantee(epsilon=2.0, mechanism="report-noisy-max",
                           details={"epsilon_per_selection": 0.5, "selections": 4})  # fmt: skip
    assert release_event(selections) == NoisyMaxSelections(0.5, 4)
    parts = [_dp(GAUSSIAN_DETAILS).model_dump(mode="json")] * 2
    composed = release_event(_dp({"components": parts}))
    assert isinstance(composed, Composed) and len(composed.parts) == 2
    assert release_event(_dp({"clip_norm": 1.0})) == Unaccounted()  # private, nothing to recompute from
    assert gaussian(selections) is None and gaussian(_dp(GAUSSIAN_DETAILS)).steps == 40


def test_the_accountant_delta_wins_over_the_headline_delta_as_in_every_manifest():
    """A release re-accounted at another δ records ``accountant_delta``; older records have none
    and were accounted at the headline δ."""
    assert release_event(_dp({**GAUSSIAN_DETAILS, "accountant_delta": 1e-7})).delta == 1e-7
    assert release_event(_dp(GAUSSIAN_DETAILS)).delta == 1e-5


def test_the_epsilon_recomputed_by_type_is_opacus_own():
    accountant = RDPAccountant()
    accountant.history = [(0.8, 0.05, 40)]
    assert recomputed_epsilon(_dp(GAUSSIAN_DETAILS)) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    selections = Guarantee(epsilon=2.0, mechanism="report-noisy-max",
                           details={"epsilon_per_selection": 0.5, "selections": 4})  # fmt: skip
    assert recomputed_epsilon(selections) == 2.0
    assert recomputed_epsilon(Guarantee.non_private("x")) == math.inf
    assert recomputed_epsilon(Guarantee(epsilon=0.0, mechanism="public")) == 0.0
    assert recomputed_epsilon(_dp({"clip_norm": 1.0})) is None
    unknown = _dp(GAUSSIAN_DETAILS).model_copy(update={"accountant": "gdp"})
    assert recomputed_epsilon(unknown) is None  # an accountant synthq does not run: not recomputed


def test_a_selection_record_without_its_numbers_is_malformed_not_unaccounted():
    """An edited report-noisy-max record that drops its ε per selection must not open at any ε: the
    reader raises (open_artifact refuses a malformed privacy record) rather than reading it as a
    release with nothing to recompute."""
    edited = Guarantee(epsilon=0.01, mechanism="report-noisy-max", details={"selections": 4})
    with pytest.raises(KeyError):
        release_event(edited)
    with pytest.raises(KeyError):
        recomputed_epsilon(edited)
