"""Per-query DP-SGD with vmapped per-query gradients equals SampleClipping's one-backward-per-query
clipped sum (every query differentiated through its own embedding and every document)."""

from __future__ import annotations

import math

import pytest
import torch

from synthq.dp.clipping import add_into as _add
from synthq.dp.clipping import clip
from synthq.dp.clipping import norm as _norm
from synthq.dp.contrastive.sample import SampleClipping
from synthq.dp.contrastive.sample_vmap import per_query_clipped_sum
from synthq.models.encoder import embed
from tests.dp.conftest import EXAMPLES


def _reference(encoder, batch, clip_norm, parameters, rows=None):
    mechanism = SampleClipping(clip_norm, 0.05)
    encode = lambda texts, side: embed(encoder, texts, 64)  # noqa: E731
    if rows is None:
        return mechanism.clipped_sum(encode, batch, parameters)
    gradients, losses = mechanism.per_example_gradients(encode, batch, parameters, rows)

    total = [torch.zeros_like(p) for p in parameters]
    for gradient in gradients:
        _add(total, clip(gradient, clip_norm))
    return total, losses.mean().item()


def _vmapped(encoder, batch, clip_norm, parameters, **kwargs):
    return per_query_clipped_sum(
        encoder, [e.query for e in batch], [e.document for e in batch], [e.doc_id for e in batch],
        0.05, clip_norm, parameters, max_query_length=64, max_doc_length=64, **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize("vmap_documents", [True, False], ids=["documents-vmapped", "documents-looped"])
@pytest.mark.parametrize(
    ("clip_norm", "chunk"), [(1e-3, 3), (1e3, 16)], ids=["clipped-uneven-chunks", "unclipped-one-chunk"]
)
def test_vmapped_per_query_sum_equals_sample_clipping(encoder, clip_norm, chunk, vmap_documents):
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    # a batch with two queries of one document: the duplicate-document mask is exercised too
    batch = EXAMPLES[:7]
    assert len({e.doc_id for e in batch}) < len(batch)
    expected, expected_loss = _reference(encoder, batch, clip_norm, parameters)
    got, loss = _vmapped(encoder, batch, clip_norm, parameters, chunk=chunk, vmap_documents=vmap_documents)
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    assert float(_norm(expected)) > 0
    if clip_norm < 1:  # every query really is clipped, so the sum's norm is at most B·C
        assert float(_norm(got)) <= len(batch) * clip_norm * (1 + 1e-5)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-7 if clip_norm < 1 else 1e-5, rtol=1e-4)


def test_a_share_of_the_queries_and_an_empty_batch(encoder):
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    batch = EXAMPLES[:5]
    expected, _ = _reference(encoder, batch, 1e-3, parameters, rows=[1, 3])
    got, _ = _vmapped(encoder, batch, 1e-3, parameters, rows=[1, 3])
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)
    empty, loss = per_query_clipped_sum(encoder, [], [], [], 0.05, 1.0, parameters)
    assert math.isnan(loss) and all(float(t.abs().sum()) == 0 for t in empty)


@pytest.fixture(scope="module")
def llama_encoder(tiny_causal_dir, tmp_path_factory):
    from synthq.models.encoder import load_encoder
    from synthq.models.lm_encoder import build_lm_encoder

    torch.manual_seed(0)
    model = load_encoder(
        build_lm_encoder(tiny_causal_dir, tmp_path_factory.mktemp("llama") / "enc", layers=1)
    )
    return model.eval()


@pytest.mark.parametrize("vmap_documents", [True, False], ids=["documents-vmapped", "documents-looped"])
@pytest.mark.parametrize("which", ["bert", "llama"])
def test_the_query_side_takes_one_pass_per_chunk_with_the_same_sum(
    which, vmap_documents, encoder, llama_encoder, monkeypatch
):
    """Query i's own side (``J_{q_i}ᵀ a_i``) is read off one backward pass through the query graph per
    chunk, where every query's cotangent used to go through the whole query batch; the sum is the
    loop's, for BERT's layers and a SmolLM2-style encoder's (Linear without bias, RMS norms)."""
    from synthq.dp.contrastive import per_group as contrastive_per_group

    model = encoder if which == "bert" else llama_encoder
    calls = []
    original = contrastive_per_group.PerGroupGradients.gradients
    monkeypatch.setattr(
        contrastive_per_group.PerGroupGradients, "gradients",
        lambda self, *a, **k: calls.append(a[1]) or original(self, *a, **k),
    )  # fmt: skip
    parameters = [p for p in model.parameters() if p.requires_grad]
    batch = EXAMPLES[:7]
    expected, _ = _reference(model, batch, 1e-3, parameters)
    got, _ = _vmapped(model, batch, 1e-3, parameters, chunk=3, vmap_documents=vmap_documents)
    assert calls == [3, 3, 1]  # one query-side pass per chunk, a group per query of the chunk
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)


@pytest.mark.parametrize("vmap_on_cpu", [False, True])
def test_sample_clipping_given_the_encoder_takes_this_path_and_follows_the_cpu_switch(
    encoder, vmap_on_cpu, monkeypatch
):
    """``--dp sample`` hands its encoder to this function; on CPU the documents' passes are looped
    unless :data:`SAMPLE_VMAP_ON_CPU` says otherwise, and the sum is the plain loop's."""
    from synthq.dp.contrastive import sample as contrastive

    seen = []
    monkeypatch.setattr(contrastive, "SAMPLE_VMAP_ON_CPU", vmap_on_cpu)
    monkeypatch.setattr(
        contrastive, "per_query_clipped_sum",
        lambda *a, **k: seen.append(k["vmap_documents"]) or per_query_clipped_sum(*a, **k),
    )  # fmt: skip
    parameters = [p for p in encoder.parameters() if p.requires_grad]
    batch = EXAMPLES[:5]
    mechanism = SampleClipping(1e-3, 0.05, model=encoder, max_query_length=64, max_doc_length=64)
    got, _ = mechanism.clipped_sum(lambda texts, side: embed(encoder, texts, 64), batch, parameters)
    expected, _ = _reference(encoder, batch, 1e-3, parameters)
    assert seen == [vmap_on_cpu]
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)
