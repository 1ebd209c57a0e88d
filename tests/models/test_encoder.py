"""The dual-encoder wrapper: loading, the in-batch loss (ours vs sentence-transformers vs numpy),
GradCache equal to the plain loss, and the functional embedding used for per-pair gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from synthq.models.encoder import (
    embed,
    features,
    functional_embedding,
    in_batch_softmax_loss,
    load_encoder,
    training_loss,
)
from tests.helpers import TRAIN_QUERIES, corpus_records

CORPUS = corpus_records()
PAIRS = [(q, CORPUS[d]["text"]) for d, qs in TRAIN_QUERIES.items() for q in qs[:1]][:6]


@pytest.fixture(scope="module")
def encoder(tiny_encoder_dir):
    model = load_encoder(tiny_encoder_dir)
    model.eval()
    return model


def test_plain_transformer_gets_mean_pooling(tiny_encoder_dir):
    backbone = tiny_encoder_dir.parent / (tiny_encoder_dir.name + "-backbone")
    model = load_encoder(backbone)
    assert [type(m).__name__ for m in model] == ["Transformer", "Pooling"]
    assert model[1].pooling_mode == "mean"
    # a sentence-transformers directory keeps its own modules, and embeddings are unit vectors
    vectors = embed(load_encoder(tiny_encoder_dir), ["eggs", "git rebase"], 16)
    assert torch.allclose(vectors.norm(dim=-1), torch.ones(2))


def test_sentence_transformers_loss_equals_eq1_and_numpy(encoder):
    queries = [q for q, _ in PAIRS]
    docs = [d for _, d in PAIRS]
    loss = training_loss(encoder, temperature=0.1)(
        [features(encoder, queries, 32), features(encoder, docs, 64)], None
    )
    q = embed(encoder, queries, 32)
    d = embed(encoder, docs, 64)
    ours = in_batch_softmax_loss(q, d, 0.1)
    scores = (q @ d.T).detach().double().numpy() / 0.1
    independent = np.mean([np.log(np.exp(row).sum()) - row[i] for i, row in enumerate(scores)])
    assert loss.item() == pytest.approx(ours.item(), rel=1e-5)
    assert loss.item() == pytest.approx(independent, rel=1e-5)


def test_gradcache_loss_has_the_same_gradient(encoder):
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    inputs = lambda: [  # noqa: E731
        features(encoder, [q for q, _ in PAIRS], 32),
        features(encoder, [d for _, d in PAIRS], 64),
    ]
    gradients = []
    for mini_batch in (None, 2):
        encoder.zero_grad(set_to_none=True)
        loss = training_loss(encoder, 0.05, mini_batch)(inputs(), None)
        loss.backward()
        gradients.append((loss.item(), [p.grad.clone() for p in parameters if p.grad is not None]))
    (plain_loss, plain), (cached_loss, cached) = gradients
    assert cached_loss == pytest.approx(plain_loss, rel=1e-5)
    assert len(plain) == len(cached) > 0
    for a, b in zip(plain, cached, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    encoder.zero_grad(set_to_none=True)


def test_functional_embedding_equals_the_module(encoder):
    params, embedding = functional_embedding(encoder)
    texts = ["short", "a considerably longer query about pans and eggs"]
    tokens = features(encoder, texts, 32)
    expected = encoder(features(encoder, texts, 32))["sentence_embedding"]
    for row in range(2):
        got = embedding(
            params, tokens["input_ids"][row], tokens["attention_mask"][row], tokens["token_type_ids"][row]
        )
        torch.testing.assert_close(
            F.normalize(got, dim=-1), F.normalize(expected[row], dim=-1), atol=1e-5, rtol=1e-4
        )


def test_functional_embedding_refuses_other_pooling(tiny_encoder_dir):
    from sentence_transformers import SentenceTransformer, models

    backbone = tiny_encoder_dir.parent / (tiny_encoder_dir.name + "-backbone")
    transformer = models.Transformer(str(backbone))
    cls = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="cls")
    with pytest.raises(ValueError, match="mean pooling"):
        functional_embedding(SentenceTransformer(modules=[transformer, cls], device="cpu"))
