"""Direct-DP contrastive mechanisms: the loss, per-example gradients, and each stated
sensitivity checked on real neighbouring batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from synthq.dp.contrastive import (
    BatchClipping,
    Example,
    GroupClipping,
    SampleClipping,
    _norm,
    max_batch_size,
    privatize,
)
from synthq.models.encoder import embed, in_batch_softmax_loss, load_encoder
from tests.helpers import TRAIN_QUERIES, corpus_records

CORPUS = corpus_records()
EXAMPLES = [
    Example(query, CORPUS[doc]["text"], doc, index)
    for index, (doc, query) in enumerate((d, q) for d, qs in TRAIN_QUERIES.items() for q in qs)
]


@pytest.fixture(scope="module")
def encoder(tiny_encoder_dir):
    torch.manual_seed(0)
    model = load_encoder(tiny_encoder_dir)
    model.eval()  # no dropout: neighbouring batches must see the same function
    return model


def encode_with(encoder):
    return lambda texts, side: embed(encoder, texts, 64)


def test_in_batch_loss_matches_an_independent_computation():
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(4, 8))
    docs = rng.normal(size=(4, 8))
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    scores = queries @ docs.T / 0.1
    expected = np.mean([-(scores[i, i] - np.log(np.exp(scores[i]).sum())) for i in range(4)])
    loss = in_batch_softmax_loss(torch.tensor(queries), torch.tensor(docs), 0.1)
    assert loss.item() == pytest.approx(expected, rel=1e-9)
    # a duplicate document is masked out of the negatives instead of being a false negative
    masked = in_batch_softmax_loss(
        torch.tensor(queries), torch.tensor(docs), 0.1, ["a", "a", "b", "c"], "none"
    )
    keep = [0, 2, 3]
    assert masked[0].item() == pytest.approx(-(scores[0, 0] - np.log(np.exp(scores[0, keep]).sum())))


def test_sample_mode_per_example_gradients_match_a_loop(encoder):
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    batch = EXAMPLES[:4]
    encode = encode_with(encoder)
    gradients, _ = SampleClipping(1.0, 0.05).per_example_gradients(encode, batch, parameters)
    for i in range(len(batch)):
        queries = encode([e.query for e in batch], "query")
        docs = encode([e.document for e in batch], "doc")
        loss = in_batch_softmax_loss(queries, docs, 0.05, [e.doc_id for e in batch], "none")[i]
        expected = torch.autograd.grad(loss, parameters, allow_unused=True)
        for got, want in zip(gradients[i], expected, strict=True):
            torch.testing.assert_close(
                got, torch.zeros_like(got) if want is None else want, atol=1e-6, rtol=1e-4
            )


@pytest.mark.parametrize("mode", ["batch", "group", "sample"])
def test_neighbouring_batches_differ_by_at_most_the_sensitivity(encoder, mode):
    """Remove each pair of a batch in turn: the clipped sum moves by no more than the claimed
    sensitivity (a small C makes every term hit the clip, the worst case for the bound)."""
    clip = 1e-3
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    encode = encode_with(encoder)
    batch = EXAMPLES[:8]
    differences = []
    for removed in range(len(batch)):
        mechanisms = []
        for _ in range(2):
            if mode == "group":
                mechanisms.append(GroupClipping(clip, 0.05, group_size=3, expected_batch_size=8, seed=1))
            else:
                mechanisms.append({"batch": BatchClipping, "sample": SampleClipping}[mode](clip, 0.05))
        full, _ = mechanisms[0].clipped_sum(encode, batch, parameters)
        neighbour, _ = mechanisms[1].clipped_sum(encode, batch[:removed] + batch[removed + 1 :], parameters)
        differences.append(float(_norm([a - b for a, b in zip(full, neighbour, strict=True)])))
    sensitivity = mechanisms[0].sensitivity(len(batch))
    assert max(differences) <= sensitivity * (1 + 1e-4)
    if mode == "sample":
        assert sensitivity == (2 * 8 + 1) * clip
    else:
        assert sensitivity == 2 * clip


def test_group_assignment_does_not_depend_on_other_pairs():
    mechanism = GroupClipping(1.0, 0.05, group_size=2, expected_batch_size=8, seed=3)
    full = mechanism.groups(EXAMPLES[:8])
    fewer = mechanism.groups(EXAMPLES[1:8])
    where = {e.index: k for k, group in full.items() for e in group}
    assert all(where[e.index] == k for k, group in fewer.items() for e in group)


def test_noise_scale_is_sigma_times_sensitivity():
    zeros = [torch.zeros(200, 100)]
    noisy = privatize(
        zeros, sensitivity=0.2, noise_multiplier=1.5, generator=torch.Generator().manual_seed(0)
    )
    assert noisy[0].std().item() == pytest.approx(0.3, rel=0.02)


def test_batch_cap_tail():
    cap, tail = max_batch_size(1000, 0.032, 100)
    assert cap > 32 and tail <= 1e-10
    assert math.isclose(max_batch_size(10, 1.0, 5)[0], 10)
