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


def _train_one_step(model, pairs) -> None:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    queries = embed(model, [q for q, _ in pairs], 32)
    documents = embed(model, [d for _, d in pairs], 32)
    in_batch_softmax_loss(queries, documents, temperature=0.05).backward()
    optimizer.step()
    model.eval()


def test_lm_encoder_loads_encodes_trains_and_saves(tmp_path, tiny_causal_dir):
    """A causal LM cut to its first layer, mean pooled: a sentence-transformers directory that
    loads offline, pads on the right (a text's vector does not depend on its batch), trains and
    saves, and that ``SentenceTransformer(path)`` reloads with the trained weights."""
    from sentence_transformers import SentenceTransformer

    from synthq.models.lm_encoder import build_lm_encoder

    path = build_lm_encoder(tiny_causal_dir, tmp_path / "enc", layers=1)
    model = load_encoder(path)
    assert [type(m).__name__ for m in model] == ["Transformer", "Pooling"]
    assert model[0].auto_model.config.num_hidden_layers == 1 and len(model[0].auto_model.layers) == 1
    model.eval()
    alone = model.encode(["how long to boil an egg"], convert_to_tensor=True)
    batched = model.encode(["how long to boil an egg", "a much longer text " * 5], convert_to_tensor=True)
    assert torch.allclose(alone[0], batched[0], atol=1e-5)
    before = model.encode(["git rebase"], convert_to_tensor=True)
    _train_one_step(model, PAIRS)
    after = model.encode(["git rebase"], convert_to_tensor=True)
    assert not torch.allclose(before, after)
    model.save(str(tmp_path / "trained"))
    reloaded = SentenceTransformer(str(tmp_path / "trained"), device="cpu")
    assert torch.allclose(reloaded.encode(["git rebase"], convert_to_tensor=True), after, atol=1e-5)
    with pytest.raises(ValueError, match="cannot keep 5 layers"):
        build_lm_encoder(tiny_causal_dir, tmp_path / "bad", layers=5)


@pytest.mark.slow
def test_packaged_smollm2_encoder_alias_offline(tmp_path, monkeypatch):
    """The real alias: SmolLM2-135M's first 4 blocks from the packaged GGUF, no network."""
    from sentence_transformers import SentenceTransformer

    from synthq.models.resolve import resolve_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = resolve_model("smollm2-135m-enc-l4")
    model = SentenceTransformer(str(path), device="cpu")
    assert model[0].auto_model.config.num_hidden_layers == 4
    assert model.encode(["hello"]).shape == (1, 576)
    _train_one_step(model, PAIRS[:2])
    model.save(str(tmp_path / "trained"))
    assert SentenceTransformer(str(tmp_path / "trained"), device="cpu").encode(["hello"]).shape == (1, 576)
