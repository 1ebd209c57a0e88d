"""Private Evolution's vote: the one place where the private pairs touch ``synthq evolve``.

Private Evolution (Lin et al., ICLR 2024; Aug-PE, Xie et al., ICML 2024) keeps a population of
synthetic samples written by a *public* model and lets the private data vote, through a noisy
histogram, for which samples survive and are varied in the next round. Only the vote reads
private data; every other step (writing, varying, embedding public text, choosing by the noisy
counts) is post-processing.

The vote (:func:`vote_histogram`), document-conditioned for retrieval: a (document, query) pair
is embedded jointly as ``[e(d); e(q)] / √2`` (``e`` an L2-normalised public sentence encoder, so
the joint vector has norm 1 and its cosine is the mean of the document and query cosines). Each
private pair finds its nearest synthetic pair by that cosine. Because a synthetic pair of the
private pair's own document shares ``e(d)`` exactly, the vote lands among the candidates of that
document (or of the most similar public document when the private document is not public) and
among those on the query most like the private one: the histogram says, per public document,
which way of asking for it real users resemble.

The mechanism, per round: ``H + N(0, σ² I)`` with ``H = Σ_u v_u``, where ``v_u`` is unit ``u``'s
vote vector: its rows' nearest-neighbour counts ``c_u`` (one count per row), scaled to
``v_u = c_u / ‖c_u‖₂``. Rounds compose as ``T`` Gaussian mechanisms with sampling rate 1, which
the engine's accountants (:class:`synthq.dp.engine.PrivacyPlan`, ``q = 1``, ``steps = T``)
turn into ε; equivalently μ-GDP with ``μ = √T / σ``.
"""

from __future__ import annotations

import numpy as np
import torch

from synthq.dp.engine import Mechanism, register_mechanism
from synthq.dp.privacy_units import PrivacyUnits

NEAREST_CHUNK = 4096  # private rows scored per matrix product


@register_mechanism("private-evolution")
class NearestNeighbourVotes(Mechanism):
    """The noisy nearest-neighbour histogram of Private Evolution, one privacy unit one vote.

    **Privacy unit**: a query with all of its (query, document) pairs, or with
    ``--privacy-unit user`` a user with all of their kept queries' pairs (the engine's
    :class:`~synthq.dp.privacy_units.PrivacyUnits`).

    **Sensitivity 1 (L2, add/remove one unit).** The histogram is ``H(D) = Σ_{u ∈ D} v_u`` and
    each ``v_u`` depends on unit ``u``'s own rows and on the synthetic population alone (which
    the previous rounds' noisy outputs and public computation determine). Its entries are
    ``c_u[s] / ‖c_u‖₂`` with integer counts ``c_u`` that sum to the unit's row count ``k ≥ 1``, so
    ``‖c_u‖₂ ≥ 1`` and ``‖v_u‖₂ = 1`` exactly. Adding or removing ``u`` changes ``H`` by ``±v_u``:
    L2 sensitivity 1, whatever ``k`` (a user's eight queries share one unit vote). Noise
    ``N(0, σ²)`` on every entry, ``T`` rounds, no subsampling (``q = 1``).

    **Per query, under the user unit: sensitivity √2.** Any change inside one user's data (a
    query removed, a query dropped by ``--max-queries-per-user`` promoted in its place, a pair
    changed) replaces ``v_u`` by another unit vector ``v_u'`` with non-negative entries (or removes
    it: distance 1), and ``‖v_u − v_u'‖² = 2 − 2⟨v_u, v_u'⟩ ≤ 2``. So the per-query guarantee is the
    Gaussian mechanism's at sensitivity √2 with the same noise (``per_query_rule``, derived in
    :func:`synthq.privacy.accounting.per_query`): 2.00 per user is about 3.3 per query.
    """

    name = "private-evolution"
    sensitivity_rule = "each unit's nearest-neighbour counts scaled to L2 norm 1"
    per_query_rule = "gaussian-substitution"

    def sensitivity(self, batch_cap: int | None) -> float:
        return 1.0


def joint_vectors(document_vectors: np.ndarray, query_vectors: np.ndarray) -> np.ndarray:
    """``[e(d); e(q)] / √2`` for L2-normalised rows: unit-norm joint embeddings of pairs."""
    return np.concatenate([document_vectors, query_vectors], axis=1).astype(np.float32) / np.sqrt(2.0)


def nearest_synthetic(private: np.ndarray, synthetic: np.ndarray) -> np.ndarray:
    """For every private row, the index of the synthetic row with the highest cosine (ties to the
    lower index)."""
    nearest = np.empty(len(private), dtype=np.int64)
    for start in range(0, len(private), NEAREST_CHUNK):
        nearest[start : start + NEAREST_CHUNK] = np.argmax(
            private[start : start + NEAREST_CHUNK] @ synthetic.T, axis=1
        )
    return nearest


def vote_histogram(nearest: np.ndarray, units: PrivacyUnits, size: int) -> np.ndarray:
    """``H = Σ_u c_u / ‖c_u‖₂``: each unit's rows vote for their nearest synthetic samples
    (``nearest[row]``) with a vote vector of L2 norm exactly 1 (see
    :class:`NearestNeighbourVotes`). Rows outside every unit (a user's queries beyond the bound)
    do not vote."""
    histogram = np.zeros(size, dtype=np.float64)
    for rows in units.rows:
        samples, counts = np.unique(nearest[rows], return_counts=True)
        histogram[samples] += counts / np.sqrt(np.sum(counts.astype(np.float64) ** 2))
    return histogram


def noisy_histogram(histogram: np.ndarray, noise_std: float, generator: torch.Generator) -> np.ndarray:
    """``H + N(0, noise_std²)`` per entry, drawn from the run's secret noise stream."""
    noise = torch.randn(len(histogram), generator=generator, dtype=torch.float64).numpy()
    return histogram + noise_std * noise
