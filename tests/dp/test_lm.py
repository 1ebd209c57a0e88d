"""DP fine-tuning internals: per-example gradients vs a one-at-a-time ground truth, the clipping
bound, the noise scale, and LoRA."""

from __future__ import annotations

import pytest
import torch

from benchmarks.tiny import ground_truth
from synthq.dp.clipping import clip_and_sum
from synthq.dp.lm.clippers import PerSampleGradients, prepare_model_for_per_sample_gradients
from synthq.models.generator import QueryGenerator

DOCS = [
    "Boil eggs for nine minutes for a firm yolk.",
    "Git rebase replays your commits on top of another branch to keep history linear.",
    "Adults need seven to nine hours of sleep.",
]
QUERIES = ["how long to boil an egg", "what does rebase do", "hours of sleep adults"]


def load(path, lora: bool = False) -> QueryGenerator:
    generator = QueryGenerator.load(path, max_source_length=64)
    if lora:
        from synthq.models.generator import apply_lora as _apply_lora

        _apply_lora(generator, rank=4, alpha=8)
    prepare_model_for_per_sample_gradients(generator)
    generator.model.eval()  # no dropout: the ground truth must see the same function
    return generator


@pytest.mark.parametrize("kind", ["seq2seq", "causal"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_per_sample_gradients_match_micro_batch_ground_truth(kind, lora, tiny_t5_dir, tiny_causal_dir):
    generator = load(tiny_t5_dir if kind == "seq2seq" else tiny_causal_dir, lora=lora)
    batch = generator.training_batch(DOCS, QUERIES, max_target_length=16)
    per_sample, losses = PerSampleGradients(generator)(batch)
    expected = ground_truth(generator, batch)
    trainable = {n for n, p in generator.model.named_parameters() if p.requires_grad}
    assert set(per_sample) == trainable  # every trainable parameter, T5 relative bias included
    if kind == "seq2seq" and not lora:
        assert any("relative_attention_bias" in n for n in trainable)
    for row, truth in enumerate(expected):
        for name, value in truth.items():
            torch.testing.assert_close(per_sample[name][row], value, atol=1e-5, rtol=1e-4)
    assert losses.shape == (3,) and (losses > 0).all()


def test_clipped_contributions_never_exceed_the_clip_norm(tiny_causal_dir):
    generator = load(tiny_causal_dir)
    batch = generator.training_batch(DOCS, QUERIES)
    per_sample, _ = PerSampleGradients(generator)(batch)
    clip = 0.01
    _, norms = clip_and_sum(per_sample, clip)
    assert (norms > clip).all()  # the test is meaningful: every example gets clipped
    for row in range(3):
        single = {n: g[row : row + 1] for n, g in per_sample.items()}
        summed, _ = clip_and_sum(single, clip)
        total = torch.sqrt(sum(v.pow(2).sum() for v in summed.values()))
        assert total <= clip * (1 + 1e-5)
    # neighbouring batches (one pair removed) differ by at most C
    with_all, _ = clip_and_sum(per_sample, clip)
    without_last, _ = clip_and_sum({n: g[:2] for n, g in per_sample.items()}, clip)
    difference = torch.sqrt(sum((with_all[n] - without_last[n]).pow(2).sum() for n in with_all))
    assert difference <= clip * (1 + 1e-5)
