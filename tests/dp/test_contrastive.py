"""Direct-DP contrastive mechanisms: per-example and per-group gradients against ground truth,
and each stated sensitivity checked on real neighbouring batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from synthq.dp.clipping import clip
from synthq.dp.clipping import norm as _norm
from synthq.dp.contrastive.batch import BatchClipping
from synthq.dp.contrastive.group import GroupClipping
from synthq.dp.contrastive.per_group import PerGroupGradients, UnsupportedLayer
from synthq.dp.contrastive.sample import SampleClipping
from synthq.dp.engine import build_mechanism
from synthq.dp.noise import SecretRandomness
from synthq.models.encoder import embed, in_batch_softmax_loss
from synthq.runtime.errors import PrivacyError
from tests.dp.conftest import EXAMPLES


def encode_with(encoder):
    return lambda texts, side: embed(encoder, texts, 64)


def trainable(encoder):
    return [p for p in encoder.parameters() if p.requires_grad]


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
    parameters = trainable(encoder)
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


def test_one_pass_group_gradients_equal_one_backward_per_group(encoder):
    """The book-keeping engine (one forward, one backward for all groups) gives each group's
    gradient exactly, including augmented negatives and position embeddings shared by broadcast."""
    parameters = trainable(encoder)
    encode = encode_with(encoder)
    batch = EXAMPLES[:10]
    one_pass = GroupClipping(1.0, 0.05, 3, 10, aug_negatives=1, randomness=SecretRandomness(4), model=encoder)
    one_pass.one_pass = True  # the engine, whatever the CPU default (GROUP_ONE_PASS_ON_CPU)
    loop = GroupClipping(1.0, 0.05, 3, 10, aug_negatives=1, randomness=SecretRandomness(4))
    groups = one_pass.groups(batch)
    assert len(groups) > 1
    _engine(one_pass, parameters)
    per_group, losses = one_pass._one_pass(encode, groups)
    expected, expected_losses = zip(*loop._per_group_passes(encode, groups, parameters), strict=True)
    assert losses == pytest.approx(expected_losses, rel=1e-5)
    for got, want in zip(per_group, expected, strict=True):
        assert float(_norm(want)) > 0
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    # the clipped sums agree as well, and the one-pass path really ran
    total, _ = one_pass.clipped_sum(encode, batch, parameters)
    reference, _ = loop.clipped_sum(encode, batch, parameters)
    assert one_pass.one_pass and float(_norm([a - b for a, b in zip(total, reference, strict=True)])) < 1e-5


def _engine(mechanism, parameters):
    from synthq.dp.contrastive.per_group import PerGroupGradients

    mechanism._engine = PerGroupGradients(mechanism.model, parameters)
    return True


def test_per_group_engine_sums_to_the_batch_gradient(encoder):
    parameters = trainable(encoder)
    engine = PerGroupGradients(encoder, parameters)
    try:
        rows = torch.tensor([0, 1, 2, 0, 1])
        with engine.record(rows):
            queries = embed(encoder, [e.query for e in EXAMPLES[:5]], 64)
        with engine.record(rows):
            docs = embed(encoder, [e.document for e in EXAMPLES[:5]], 64)
        loss = sum(
            in_batch_softmax_loss(queries[rows == g], docs[rows == g], 0.05, reduction="sum")
            for g in range(3)
        )
        per_group = engine.gradients(loss, 3)
    finally:
        engine.close()
    queries = embed(encoder, [e.query for e in EXAMPLES[:5]], 64)
    docs = embed(encoder, [e.document for e in EXAMPLES[:5]], 64)
    loss = sum(
        in_batch_softmax_loss(queries[rows == g], docs[rows == g], 0.05, reduction="sum") for g in range(3)
    )
    full = torch.autograd.grad(loss, parameters, allow_unused=True)
    for k, want in enumerate(full):
        got = sum(group[k] for group in per_group)
        torch.testing.assert_close(got, torch.zeros_like(got) if want is None else want, atol=1e-5, rtol=1e-4)


def test_per_group_engine_refuses_unknown_layers():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.factor = torch.nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x * self.factor

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), Scale())
    with pytest.raises(UnsupportedLayer, match="Scale"):
        PerGroupGradients(model, list(model.parameters()))
    assert not model[0]._forward_hooks  # hooks already registered were removed


@pytest.mark.parametrize("mode", ["batch", "group", "group-loop", "sample"])
def test_neighbouring_batches_differ_by_at_most_the_sensitivity(encoder, mode):
    """Remove each pair of a batch in turn: the clipped sum moves by no more than the claimed
    sensitivity (a small C makes every term hit the clip, the worst case for the bound)."""
    clip_norm = 1e-3
    parameters = trainable(encoder)
    encode = encode_with(encoder)
    batch = EXAMPLES[:8]
    differences = []
    for removed in range(len(batch)):
        mechanisms = []
        for _ in range(2):
            if mode.startswith("group"):
                model = encoder if mode == "group" else None
                mechanisms.append(
                    GroupClipping(
                        clip_norm,
                        0.05,
                        group_size=3,
                        expected_batch_size=8,
                        randomness=SecretRandomness(seed=1),
                        model=model,
                    )  # fmt: skip
                )
                mechanisms[-1].one_pass = model is not None  # "group" = the one-pass engine
            else:
                mechanisms.append({"batch": BatchClipping, "sample": SampleClipping}[mode](clip_norm, 0.05))
        full, _ = mechanisms[0].clipped_sum(encode, batch, parameters)
        neighbour, _ = mechanisms[1].clipped_sum(encode, batch[:removed] + batch[removed + 1 :], parameters)
        differences.append(float(_norm([a - b for a, b in zip(full, neighbour, strict=True)])))
    sensitivity = mechanisms[0].sensitivity(len(batch))
    assert max(differences) <= sensitivity * (1 + 1e-4)
    assert max(differences) > (0.5 * clip_norm if mode != "batch" else 0)  # not vacuous
    if mode == "sample":
        assert sensitivity == (2 * 8 - 1) * clip_norm
    else:
        assert sensitivity == 2 * clip_norm


def test_group_engine_default_on_cpu_follows_the_switch(encoder, monkeypatch):
    from synthq.dp.contrastive import group as contrastive

    assert contrastive.GROUP_ONE_PASS_ON_CPU is False  # measured: the loop is faster on CPU
    assert GroupClipping(1.0, 0.05, 3, 10, model=encoder).one_pass is False
    monkeypatch.setattr(contrastive, "GROUP_ONE_PASS_ON_CPU", True)
    assert GroupClipping(1.0, 0.05, 3, 10, model=encoder).one_pass is True
    assert GroupClipping(1.0, 0.05, 3, 10).one_pass is False  # no model, no engine


def test_group_assignment_is_keyed_by_unit_id_and_the_secret():
    mechanism = GroupClipping(1.0, 0.05, group_size=2, expected_batch_size=8, randomness=SecretRandomness(3))
    full = mechanism.groups(EXAMPLES[:8])
    fewer = mechanism.groups(EXAMPLES[1:8])
    where = {e.unit_id: k for k, group in full.items() for e in group}
    assert all(where[e.unit_id] == k for k, group in fewer.items() for e in group)
    # reordering the data (list positions) changes nothing: the key is the stable id
    shuffled = mechanism.groups(list(reversed(EXAMPLES[:8])))
    assert {e.unit_id: k for k, g in shuffled.items() for e in g} == where
    # without the secret key the assignment cannot be replayed: another key, another assignment
    others = [
        GroupClipping(1.0, 0.05, group_size=2, expected_batch_size=8, randomness=SecretRandomness())
        for _ in range(5)
    ]
    assignments = [{e.unit_id: k for k, g in m.groups(EXAMPLES[:8]).items() for e in g} for m in others]
    assert any(a != where for a in assignments)


def test_clip_bounds_the_norm():
    vectors = [torch.full((3,), 2.0), torch.full((4,), -1.0)]
    assert float(_norm(clip(vectors, 0.5))) == pytest.approx(0.5)
    assert float(_norm(clip(vectors, 100.0))) == pytest.approx(float(_norm(vectors)))


def test_build_mechanism_knows_every_mode(encoder):
    for mode in ("sample", "batch", "group", "logit"):
        options = dict(clip_norm=1.0, temperature=1.0, model=encoder, group_size=2, expected_batch_size=8)
        assert build_mechanism(mode, **options, unrelated_setting=3).name == mode
    with pytest.raises(PrivacyError, match="unknown DP mechanism"):
        build_mechanism("pair", clip_norm=1.0, temperature=1.0)


def test_a_group_larger_than_a_pass_gets_the_same_gradient_by_gradcache(encoder):
    """On a CPU a group of up to S users × K queries took one pass (4.1-6.6 GB on long documents);
    above ``pass_texts`` texts its gradient is computed in chunks by GradCache: the whole pass's
    gradient and loss (no dropout here, so the two are the same function)."""
    parameters = trainable(encoder)
    encode = encode_with(encoder)
    whole = GroupClipping(1.0, 0.05, 10, 10, aug_negatives=1, randomness=SecretRandomness(4))
    chunked = GroupClipping(1.0, 0.05, 10, 10, aug_negatives=1, randomness=SecretRandomness(4), pass_texts=3)
    groups = whole.groups(EXAMPLES[:10])
    assert max(len(g) for g in groups.values()) > 3  # some group holds more texts than one pass
    expected = list(whole._per_group_passes(encode, groups, parameters))
    got = list(chunked._per_group_passes(encode, groups, parameters))
    for (got_gradient, got_loss), (want_gradient, want_loss) in zip(got, expected, strict=True):
        assert got_loss == pytest.approx(want_loss, rel=1e-5)
        for a, b in zip(got_gradient, want_gradient, strict=True):
            # fp32 sums in another order (chunks, 2 threads): one element of 64 differed by 1.5e-5
            # (an element of about 1e-3) on an AMD EPYC without AVX512
            torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-4)


def test_with_dropout_each_chunk_is_replayed_with_the_masks_of_its_first_pass(encoder):
    """GradCache is exact only if a chunk's second pass (with its graph) draws the dropout masks of
    its first (without one): the random state is restored per chunk, and left where the first
    passes left it."""
    parameters = trainable(encoder)
    passes = []

    def recording(texts, side):
        embeddings = embed(encoder, texts, 64)
        passes.append((tuple(texts), embeddings.detach().clone()))
        return embeddings

    chunked = GroupClipping(1.0, 0.05, 10, 10, randomness=SecretRandomness(4), pass_texts=3)
    groups = chunked.groups(EXAMPLES[:6])
    encoder.train()
    try:
        torch.manual_seed(3)
        list(chunked._per_group_passes(recording, groups, parameters))
        after = torch.rand(1)
    finally:
        encoder.eval()
    first, replay = passes[: len(passes) // 2], passes[len(passes) // 2 :]
    assert [texts for texts, _ in first] == [texts for texts, _ in replay] and len(first) > 2
    for (_, once), (_, again) in zip(first, replay, strict=True):
        torch.testing.assert_close(once, again)  # the same masks
    torch.manual_seed(3)
    encoder.train()
    try:
        for texts, _ in first:
            with torch.no_grad():
                embed(encoder, list(texts), 64)
    finally:
        encoder.eval()
    assert torch.equal(torch.rand(1), after)  # later draws continue as after the first passes only
