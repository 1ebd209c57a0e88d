"""Opacus hook and ghost-clipping modes: per-example gradients, norms and clipped sums against a
one-example-at-a-time ground truth on tiny T5 (relative bias, tied embeddings, T5LayerNorm) and
tiny Llama (tied lm_head, LlamaRMSNorm), full and LoRA."""

from __future__ import annotations

import pytest
import torch
from opacus.grad_sample import GradSampleModule

from benchmarks.tiny import ground_truth
from benchmarks.tiny import load_for_ground_truth as load
from synthq.dp.clipping import clip_and_sum
from synthq.dp.engine import PrivacyPlan
from synthq.dp.lm.clippers import choose_grad_sample_mode, make_clipper
from synthq.dp.lm.ghost import choose_norm_method, tied_parameters, tied_squared_norms
from synthq.dp.lm.grad_samplers import batch_relative_attention_bias, register_rms_norm_grad_samplers
from synthq.dp.lm.hooks import GhostClipper, HookClipper
from synthq.dp.lm.step import DPStep
from synthq.dp.noise import SecretRandomness
from tests.dp.test_lm import DOCS, QUERIES

MODELS = {"seq2seq": "tiny_t5_dir", "causal": "tiny_causal_dir"}


@pytest.mark.parametrize("kind", ["seq2seq", "causal"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_hook_per_sample_gradients_match_ground_truth(kind, lora, request):
    generator = load(request.getfixturevalue(MODELS[kind]), lora=lora)
    batch = generator.training_batch(DOCS, QUERIES, max_target_length=16)
    expected = ground_truth(generator, batch)
    clipper = HookClipper(generator, clip_norm=1.0)
    per_sample, losses = clipper.per_sample_gradients(batch)
    trainable = {n for n, p in generator.model.named_parameters() if p.requires_grad}
    assert set(per_sample) == trainable
    if not lora:  # the parameters Opacus gets wrong out of the box are among those checked
        assert tied_parameters(generator.model)
        assert any("norm" in n.lower() for n in trainable)
        if kind == "seq2seq":
            assert any("relative_attention_bias" in n for n in trainable)
    for row, truth in enumerate(expected):
        for name, value in truth.items():
            torch.testing.assert_close(per_sample[name][row], value, atol=1e-5, rtol=1e-4, msg=name)
    assert losses.shape == (3,)
    clipper.close()


@pytest.mark.parametrize("kind", ["seq2seq", "causal"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_ghost_norms_and_clipped_sum_match_ground_truth(kind, lora, request):
    generator = load(request.getfixturevalue(MODELS[kind]), lora=lora)
    batch = generator.training_batch(DOCS, QUERIES, max_target_length=16)
    expected = ground_truth(generator, batch)
    generator.model.zero_grad(set_to_none=True)
    clipper = GhostClipper(generator, clip_norm=0.05)
    names = list(expected[0])
    true_norms = torch.stack([torch.sqrt(sum(t[n].pow(2).sum() for n in names)) for t in expected])
    torch.testing.assert_close(clipper.per_sample_norms(batch), true_norms, atol=1e-6, rtol=1e-4)
    stacked = {n: torch.stack([t[n] for t in expected]) for n in names}
    true_sum, _ = clip_and_sum(stacked, 0.05)
    assert (true_norms > 0.05).all()  # every example is really clipped
    summed, norms, _ = clipper.clipped_sum(batch)
    torch.testing.assert_close(norms, true_norms, atol=1e-6, rtol=1e-4)
    for name in names:
        torch.testing.assert_close(summed[name], true_sum[name], atol=1e-6, rtol=1e-4, msg=name)
    # no gradient is left behind on the parameters for the optimizer to pick up by mistake
    assert all(p.grad is None for p in generator.model.parameters())
    clipper.close()


@pytest.mark.parametrize("kind", ["seq2seq", "causal"])
@pytest.mark.parametrize("method", ["ghost", "instantiate"])
def test_each_norm_method_forced_on_every_layer_matches_ground_truth(kind, method, request):
    """Mixed ghost clipping: whichever branch a Linear/Embedding layer takes, norms and clipped
    sum are the one-at-a-time ones (LoRA, so both adapter matrices and untied layers exist)."""
    generator = load(request.getfixturevalue(MODELS[kind]), lora=True)
    for parameter in generator.model.parameters():  # full layers too: norms and untied weights
        parameter.requires_grad_(True)
    batch = generator.training_batch(DOCS, QUERIES, max_target_length=16)
    expected = ground_truth(generator, batch)
    generator.model.zero_grad(set_to_none=True)
    names = list(expected[0])
    stacked = {n: torch.stack([t[n] for t in expected]) for n in names}
    true_sum, true_norms = clip_and_sum(stacked, 0.05)
    clipper = GhostClipper(generator, clip_norm=0.05, norm_method=method)
    summed, norms, _ = clipper.clipped_sum(batch)
    used = clipper.module.methods
    linear = [n for n, m in generator.model.named_modules() if type(m) is torch.nn.Linear]
    assert linear and all(used[n] in (method, "tied") for n in linear)
    assert sum(used[n] == method for n in linear) > 10
    torch.testing.assert_close(norms, true_norms, atol=1e-6, rtol=1e-4)
    for name in names:
        torch.testing.assert_close(summed[name], true_sum[name], atol=1e-6, rtol=1e-4, msg=name)
    clipper.close()


def test_auto_norm_method_instantiates_low_rank_adapters_and_keeps_ghost_for_wide_layers():
    # SmolLM2 at ~150 tokens: LoRA r = 16 adapters (576 -> 16, 16 -> 576) vs its MLP (576 -> 1536)
    assert choose_norm_method(150, 16, 576) == "instantiate"
    assert choose_norm_method(150, 576, 16) == "instantiate"
    assert choose_norm_method(150, 1536, 576) == "ghost"
    # the boundary: instantiate while d·p ≤ T(d + p)
    assert choose_norm_method(10, 20, 20) == "instantiate"  # 400 ≤ 400
    assert choose_norm_method(9, 20, 20) == "ghost"  # 400 > 360
    # embeddings: only tables no bigger than the records (T5's 32 relative-position buckets)
    assert choose_norm_method(64, 32, 8, embedding=True) == "instantiate"
    assert choose_norm_method(150, 49152, 576, embedding=True) == "ghost"


def test_auto_norm_method_follows_the_cost_rule_on_a_real_batch(tiny_causal_dir):
    generator = load(tiny_causal_dir, lora=True)
    batch = generator.training_batch(DOCS, QUERIES, max_target_length=16)
    expected = ground_truth(generator, batch)
    generator.model.zero_grad(set_to_none=True)
    tokens = batch["input_ids"].shape[1]
    clipper = GhostClipper(generator, clip_norm=0.05)
    summed, _, _ = clipper.clipped_sum(batch)
    used = clipper.module.methods
    for name, module in generator.model.named_modules():
        if type(module) is torch.nn.Linear and name in used:
            rows, columns = module.weight.shape
            assert used[name] == choose_norm_method(tokens, rows, columns), name
    names = list(expected[0])
    true_sum, _ = clip_and_sum({n: torch.stack([t[n] for t in expected]) for n in names}, 0.05)
    for name in names:
        torch.testing.assert_close(summed[name], true_sum[name], atol=1e-6, rtol=1e-4, msg=name)
    clipper.close()


def test_tied_norm_includes_cross_terms():
    """The factored norm of an embedding used twice plus a linear use equals the dense norm."""
    torch.manual_seed(0)
    vocab, dim, batch = 7, 3, 2
    ids_a, ids_b = torch.randint(vocab, (batch, 4)), torch.randint(vocab, (batch, 5))
    grad_a, grad_b = torch.randn(batch, 4, dim), torch.randn(batch, 5, dim)
    lin_grad, lin_act = torch.randn(batch, 6, vocab), torch.randn(batch, 6, dim)
    dense = torch.zeros(batch, vocab, dim)
    for row in range(batch):
        dense[row].index_add_(0, ids_a[row], grad_a[row])
        dense[row].index_add_(0, ids_b[row], grad_b[row])
        dense[row] += lin_grad[row].T @ lin_act[row]
    factors = [("embedding", ids_a, grad_a), ("linear", lin_grad, lin_act), ("embedding", ids_b, grad_b)]
    torch.testing.assert_close(tied_squared_norms(factors), dense.flatten(1).pow(2).sum(1))


def test_rms_norm_samplers_are_registered_only_for_the_plain_formula(tiny_causal_dir):
    class OnePlusRMSNorm(torch.nn.Module):  # Gemma-style: (1 + weight), not ours to handle
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            return (1 + self.weight) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    generator = load(tiny_causal_dir)
    assert "LlamaRMSNorm" in register_rms_norm_grad_samplers(generator.model)
    assert register_rms_norm_grad_samplers(OnePlusRMSNorm()) == []
    assert OnePlusRMSNorm not in GradSampleModule.GRAD_SAMPLERS


def test_batched_relative_bias_keeps_the_forward_values(tiny_t5_dir):
    generator = load(tiny_t5_dir)
    batch = generator.training_batch(DOCS, QUERIES, max_target_length=16)
    with torch.no_grad():
        before = generator.model(**batch).logits
        assert batch_relative_attention_bias(generator.model) == 2  # encoder and decoder layer 0
        after = generator.model(**batch).logits
    torch.testing.assert_close(after, before)


@pytest.mark.parametrize("kind", ["seq2seq", "causal"])
def test_every_mode_gives_the_same_dp_update(kind, request):
    """One DP step (same Poisson batch, same noise) lands on the same weights in every mode."""
    path = request.getfixturevalue(MODELS[kind])
    results = {}
    for mode in ("vmap", "hooks", "ghost"):
        generator = load(path)
        optimizer = torch.optim.SGD(generator.model.parameters(), lr=1.0)
        plan = PrivacyPlan.with_noise(0.3, 0.05, expected_batch_size=3)
        step = DPStep(generator, optimizer, plan, physical_batch_size=2, grad_sample_mode=mode)
        assert step.mode == mode

        def make_batch(indices, generator=generator):
            return generator.training_batch([DOCS[i] for i in indices], [QUERIES[i] for i in indices], 16)

        step.step(make_batch, [0, 1, 2], [1.0, 1.0, 1.0], SecretRandomness(seed=5))
        results[mode] = {n: p.detach().clone() for n, p in generator.model.named_parameters()}
    for mode in ("hooks", "ghost"):
        for name, value in results["vmap"].items():
            torch.testing.assert_close(results[mode][name], value, atol=1e-5, rtol=1e-4, msg=f"{mode} {name}")


def test_auto_mode_picks_ghost_for_t5_and_llama(tiny_t5_dir, tiny_causal_dir):
    for path in (tiny_t5_dir, tiny_causal_dir):
        generator = load(path)
        assert choose_grad_sample_mode(generator, "auto") == "ghost"
        assert make_clipper(generator, 1.0, "hooks").mode == "hooks"
    with pytest.raises(ValueError, match="grad_sample_mode"):
        choose_grad_sample_mode(generator, "fast")


@pytest.mark.parametrize("mode", ["hooks", "ghost"])
def test_padding_row_of_the_embedding_gets_no_gradient_as_in_autograd(mode, tiny_causal_dir):
    """SmolLM2 pads with EOS, so ``padding_idx`` is a real token; nn.Embedding gives its row no
    gradient from the input side, and the hooks must agree (norms and update)."""
    generator = load(tiny_causal_dir)
    batch = generator.training_batch(DOCS, QUERIES, max_target_length=16)
    inside = batch["input_ids"][0, -5].item()  # a query token every row's loss depends on
    generator.model.model.embed_tokens.padding_idx = inside
    expected = ground_truth(generator, batch)
    generator.model.zero_grad(set_to_none=True)
    names = list(expected[0])
    stacked = {n: torch.stack([t[n] for t in expected]) for n in names}
    true_sum, true_norms = clip_and_sum(stacked, 0.05)
    clipper = make_clipper(generator, 0.05, mode)
    summed, norms, _ = clipper.clipped_sum(batch)
    torch.testing.assert_close(norms, true_norms, atol=1e-6, rtol=1e-4)
    for name in names:
        torch.testing.assert_close(summed[name], true_sum[name], atol=1e-6, rtol=1e-4, msg=name)
