"""Logit-DP: the sensitivity constants against brute force, per-pair gradients against a loop,
the clipped sum against its definition, and the bound on real neighbouring batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from synthq.dp.clipping import norm as _norm
from synthq.dp.contrastive.logit import LogitClipping, logit_dp_constants
from synthq.models.encoder import embed
from tests.dp.conftest import EXAMPLES


def softmax_rows(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_constants_bound_the_loss_derivatives(temperature):
    """G1, G2, L hold for random and adversarial logits in [−1/T, 1/T], and are attained."""
    n, s = 6, 1 / temperature
    constants = logit_dp_constants(n, temperature)
    rng = np.random.default_rng(0)
    candidates = [rng.uniform(-s, s, size=(n, n)) for _ in range(2000)]
    worst = np.full((n, n), -s)
    worst[:, n - 1] = s  # column n as likely as possible in every row, positives unlikely
    candidates.append(worst)
    positive_unlikely = np.full((n, n), s)
    positive_unlikely[n - 1, n - 1] = -s  # row n's own document as unlikely as possible
    candidates.append(positive_unlikely)
    seen = {"G1": 0.0, "G2": 0.0, "L": 0.0}
    for z in candidates:
        p = softmax_rows(z)
        derivative = p - np.eye(n)
        seen["G1"] = max(seen["G1"], np.abs(derivative[n - 1]).sum())
        seen["G2"] = max(seen["G2"], np.abs(derivative[: n - 1, n - 1]).sum())
        smaller = softmax_rows(z[: n - 1, : n - 1]) - np.eye(n - 1)
        seen["L"] = max(seen["L"], np.abs(derivative[: n - 1, : n - 1] - smaller).sum(axis=1).max())
    for key in seen:
        assert seen[key] <= constants[key] + 1e-12
        assert seen[key] == pytest.approx(constants[key], rel=1e-6)  # the worst case is reached
    assert constants["multiplier"] == pytest.approx(
        constants["G1"] + constants["G2"] + (n - 1) * constants["L"]
    )


def test_constants_scale_with_temperature():
    # near T = 1 the multiplier stays bounded by 2(1 + e²) however large the batch ...
    assert logit_dp_constants(10_000, 1.0)["multiplier"] < 2 * (1 + math.e**2)
    assert logit_dp_constants(32, 1.0)["multiplier"] < 2 * 32 - 1
    # ... at T = 0.05 it is ≈ 2n: no better than per-query clipping's 2n − 1
    assert logit_dp_constants(32, 0.05)["multiplier"] == pytest.approx(64, rel=1e-6)
    assert logit_dp_constants(1, 1.0)["multiplier"] == 0.0


def test_per_pair_gradients_match_a_loop(encoder):
    mechanism = LogitClipping(1.0, 0.5, encoder, max_query_length=64, max_doc_length=64, pair_chunk=3)
    batch = EXAMPLES[:3]
    queries = mechanism._inputs([e.query for e in batch], "query")
    docs = mechanism._inputs([e.document for e in batch], "doc")
    pairs = [(0, 1), (2, 0), (1, 1)]
    gradients = mechanism.per_pair_gradients(queries, docs, pairs)
    names = {id(p): n for n, p in mechanism.params.items()}
    for k, (i, j) in enumerate(pairs):
        q = embed(encoder, [batch[i].query], 64)
        d = embed(encoder, [batch[j].document], 64)
        similarity = (q * d).sum() / 0.5
        parameters = list(mechanism.params.values())
        expected = torch.autograd.grad(similarity, parameters, allow_unused=True)
        for parameter, want in zip(parameters, expected, strict=True):
            got = gradients[names[id(parameter)]][k]
            torch.testing.assert_close(
                got, torch.zeros_like(got) if want is None else want, atol=1e-5, rtol=1e-4
            )


def test_clipped_sum_is_the_weighted_sum_of_clipped_pair_gradients(encoder):
    """Σ_ij (p_ij − 1[i=j]) · clip_C(∇ cos(q_i, d_j)/T), built here one pair at a time."""
    clip_norm, temperature = 0.05, 0.5
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    batch = EXAMPLES[:4]
    mechanism = LogitClipping(clip_norm, temperature, encoder, 64, 64, pair_chunk=5)
    total, loss = mechanism.clipped_sum(None, batch, parameters)
    q = embed(encoder, [e.query for e in batch], 64)
    d = embed(encoder, [e.document for e in batch], 64)
    logits = q @ d.T / temperature
    assert loss == pytest.approx(F.cross_entropy(logits, torch.arange(4)).item(), rel=1e-5)
    weights = (logits.softmax(1) - torch.eye(4)).detach()
    expected = [torch.zeros_like(p) for p in parameters]
    for i in range(4):
        for j in range(4):
            qi = embed(encoder, [batch[i].query], 64)
            dj = embed(encoder, [batch[j].document], 64)
            grads = torch.autograd.grad((qi * dj).sum() / temperature, parameters, allow_unused=True)
            grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, parameters, strict=True)]
            factor = min(1.0, clip_norm / float(_norm(grads)))
            for e, g in zip(expected, grads, strict=True):
                e.add_(weights[i, j] * factor * g)
    for got, want in zip(total, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)


@pytest.mark.slow
def test_neighbouring_batches_differ_by_at_most_the_sensitivity(encoder):
    clip_norm, temperature = 1e-3, 1.0
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    batch = EXAMPLES[:6]
    mechanism = LogitClipping(clip_norm, temperature, encoder, 64, 64, pair_chunk=12)
    full, _ = mechanism.clipped_sum(None, batch, parameters)
    differences = []
    for removed in range(len(batch)):
        neighbour, _ = mechanism.clipped_sum(None, batch[:removed] + batch[removed + 1 :], parameters)
        differences.append(float(_norm([a - b for a, b in zip(full, neighbour, strict=True)])))
    sensitivity = mechanism.sensitivity(len(batch))
    assert 0.5 * clip_norm < max(differences) <= sensitivity * (1 + 1e-4)
    constants = logit_dp_constants(6, 1.0)
    # max of Theorem 4.2's bound and the norm bound an emptied over-full batch needs
    assert sensitivity == pytest.approx(max(constants["multiplier"], 6 * constants["G1"]) * clip_norm)
    # the emptied over-full batch costs B·G1·C ≈ 2BC: at B = 6, T = 1 that is just above
    # per-query clipping's (2B − 1)C, which the stage warns about
    assert (2 * 6 - 1) * clip_norm < sensitivity <= 2 * 6 * clip_norm


def test_the_mechanism_says_when_its_sensitivity_is_no_better_than_per_query_clipping(encoder):
    """What Logit-DP gains is a property of the mechanism, not a test in the stage: at a low
    temperature its sensitivity reaches per-query clipping's (2B − 1)·C and it says so."""
    cold = LogitClipping(1.0, 0.05, encoder, 64, 64)
    assert cold.sensitivity(8) >= (2 * 8 - 1) * 1.0 and "no better than per-query" in cold.advice(8)
    assert "no better than per-query" in LogitClipping(1.0, 1.0, encoder, 64, 64).advice(8)  # 15.7 ≥ 15
    warm = LogitClipping(1.0, 5.0, encoder, 64, 64)
    assert warm.sensitivity(8) < (2 * 8 - 1) * 1.0 and warm.advice(8) is None
