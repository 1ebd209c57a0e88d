"""Mixed precision on the DP paths (CPU bf16 autocast, the path a GPU runs at ``--precision auto``):
per-example norms against the fp32 one-example-at-a-time ground truth, each example's clipped
contribution at most ``C``, and neighbouring batches within the sensitivity, for every clipping
engine of the generator and the retriever's per-group and per-query engines."""

from __future__ import annotations

import pytest
import torch

from synthq.dp.clipping import norm as _norm
from synthq.dp.contrastive.sample import SampleClipping
from synthq.dp.engine import build_mechanism
from synthq.dp.lm.clippers import make_clipper
from synthq.dp.noise import SecretRandomness
from synthq.runtime import precision
from synthq.runtime.precision import (
    PrecisionError,
    current,
    forward_autocast,
    full_precision,
    resolve_precision,
    use_precision,
)
from tests.dp.conftest import EXAMPLES
from tests.dp.test_contrastive import encode_with, trainable
from tests.dp.test_lm import DOCS, QUERIES, ground_truth
from tests.dp.test_lm_hooks import MODELS, load

# Measured on tiny T5 / tiny Llama: bf16 norms within 0.35 % of fp32 (every engine).
BF16_NORM_TOLERANCE = 1e-2


def test_resolution_rules():
    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"
    assert resolve_precision("fp32", "cpu") == "fp32"
    if not torch.cuda.is_available():
        assert resolve_precision("auto", "cuda") == "fp32"
    with pytest.raises(PrecisionError, match="MPS"):
        resolve_precision("bf16", "mps")
    with pytest.raises(PrecisionError, match="one of"):
        resolve_precision("fp16", "cpu")


def test_the_stage_precision_is_scoped():
    assert current() is None
    with use_precision("bf16", "cpu") as resolved:
        assert resolved == current() == "bf16"
        with forward_autocast():
            product = torch.ones(4, 4) @ torch.ones(4, 4)
        assert product.dtype == torch.bfloat16
    assert current() is None
    with forward_autocast():
        assert (torch.ones(4, 4) @ torch.ones(4, 4)).dtype == torch.float32


def test_bf16_on_a_cpu_without_bf16_arithmetic_warns_before_the_run(monkeypatch, capsys):
    # torch emulates bf16 there: a SmolLM2 step took minutes instead of seconds, silently
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: False)
    with use_precision("bf16", "cpu"):
        pass
    assert "without bf16 arithmetic" in capsys.readouterr().err
    monkeypatch.setattr(precision.platform, "machine", lambda: "aarch64")  # its flags say nothing of bf16
    with use_precision("bf16", "cpu"):
        pass
    assert "bf16 arithmetic" not in capsys.readouterr().err
    monkeypatch.setattr(precision.platform, "machine", lambda: "x86_64")
    for requested, native in (("bf16", True), ("fp32", False), ("auto", False)):
        monkeypatch.setattr(precision, "native_bf16_cpu", lambda native=native: native)
        with use_precision(requested, "cpu"):
            pass
        assert "bf16 arithmetic" not in capsys.readouterr().err


def _true_norms(expected: list[dict]) -> torch.Tensor:
    names = list(expected[0])
    return torch.stack([torch.sqrt(sum(t[n].pow(2).sum() for n in names)) for t in expected])


@pytest.mark.parametrize("kind", ["seq2seq", "causal"])
@pytest.mark.parametrize("mode", ["ghost", "hooks", "vmap"])
def test_bf16_norms_match_the_fp32_ground_truth_and_each_example_adds_at_most_c(kind, mode, request):
    generator = load(request.getfixturevalue(MODELS[kind]))
    batch = generator.training_batch(DOCS, QUERIES, max_target_length=16)
    true_norms = _true_norms(ground_truth(generator, batch))  # fp32, one example at a time
    generator.model.zero_grad(set_to_none=True)
    clip_norm = 0.05
    clipper = make_clipper(generator, clip_norm, mode)
    try:
        with use_precision("bf16", "cpu"):
            summed, norms, _ = clipper.clipped_sum(batch)
            contributions = []
            for row in range(len(DOCS)):
                alone = torch.zeros(len(DOCS))
                alone[row] = 1.0
                part, _, _ = clipper.clipped_sum(batch, alone)
                contributions.append(float(_norm(list(part.values()))))
            neighbours = []
            for removed in range(len(DOCS)):  # the same padded rows, one fewer
                keep = [r for r in range(len(DOCS)) if r != removed]
                smaller, _, _ = clipper.clipped_sum({k: v[keep] for k, v in batch.items()})
                neighbours.append(float(_norm([summed[n] - smaller[n] for n in summed])))
    finally:
        clipper.close()
    relative = ((norms - true_norms).abs() / true_norms).max()
    assert relative < BF16_NORM_TOLERANCE
    assert relative > 1e-5  # the forward really ran in bf16 (fp32 agrees to ~1e-7)
    assert norms.dtype == torch.float32 and all(v.dtype == torch.float32 for v in summed.values())
    assert (true_norms > clip_norm).all()  # every example is clipped: the worst case for the bound
    assert max(contributions) <= clip_norm * (1 + 1e-5)
    assert min(contributions) > clip_norm * (1 - 1e-3)
    assert max(neighbours) <= clip_norm * (1 + 1e-5)


def test_bf16_per_user_units_add_at_most_c(tiny_causal_dir):
    """Per-user clipping under bf16: a unit's combined gradient is clipped by its fp32 norm."""
    generator = load(tiny_causal_dir)
    batch = generator.training_batch(DOCS, QUERIES, max_target_length=16)
    clipper = make_clipper(generator, 0.05, "ghost")
    groups = torch.tensor([0, 0, 1])
    try:
        with use_precision("bf16", "cpu"):
            for unit in (0, 1):
                weights = (groups == unit).float() * torch.tensor([0.5, 0.5, 1.0])
                part, unit_norms, _ = clipper.clipped_sum(batch, weights, groups)
                assert float(_norm(list(part.values()))) <= 0.05 * (1 + 1e-5)
                assert unit_norms.dtype == torch.float32
    finally:
        clipper.close()


@pytest.mark.parametrize("mode", ["group", "sample"])
def test_bf16_retriever_neighbouring_batches_stay_within_the_sensitivity(encoder, mode):
    """The retriever's per-group (one-pass hooks) and per-query engines under bf16 autocast:
    removing a pair moves the clipped sum by at most the stated sensitivity (the neighbour's rows
    are re-padded: bf16 results that depended on the batch's padded width would show here)."""
    clip_norm = 1e-3
    parameters = trainable(encoder)
    encode = encode_with(encoder)
    batch = EXAMPLES[:8]

    def mechanism():
        if mode == "sample":
            return SampleClipping(clip_norm, 0.05)
        group = build_mechanism(
            "group", clip_norm=clip_norm, temperature=0.05, group_size=3, expected_batch_size=8,
            randomness=SecretRandomness(seed=1), model=encoder,
        )  # fmt: skip
        group.one_pass = True  # the one-pass engine, whatever the CPU default
        return group

    differences = []
    with use_precision("bf16", "cpu"):
        full, _ = mechanism().clipped_sum(encode, batch, parameters)
        assert all(g.dtype == torch.float32 for g in full)
        for removed in range(len(batch)):
            neighbour, _ = mechanism().clipped_sum(encode, batch[:removed] + batch[removed + 1 :], parameters)
            differences.append(float(_norm([a - b for a, b in zip(full, neighbour, strict=True)])))
        sensitivity = mechanism().sensitivity(len(batch))
    assert max(differences) <= sensitivity * (1 + 1e-5)
    assert max(differences) > 0.5 * clip_norm


def test_dp_noise_is_never_added_to_low_precision_sums():
    from synthq.dp.noise import add_noise
    from synthq.runtime.errors import PrivacyError

    with pytest.raises(PrivacyError, match="bfloat16"):
        add_noise([torch.zeros(4, dtype=torch.bfloat16)], 1.0, torch.Generator().manual_seed(0))
    assert (
        add_noise([torch.zeros(4, dtype=torch.float64)], 1.0, torch.Generator().manual_seed(0))[0].std() > 0
    )


def test_an_encoder_saved_in_bf16_trains_with_fp32_weights(tiny_encoder_dir, tmp_path):
    """A bf16 checkpoint loads as fp32: the DP norms, clipped sums and noise are never rounded."""
    from synthq.models.encoder import load_encoder

    saved = load_encoder(tiny_encoder_dir)
    saved.to(torch.bfloat16)
    saved.save(str(tmp_path / "bf16"))
    assert {p.dtype for p in load_encoder(tmp_path / "bf16").parameters()} == {torch.float32}


def test_full_precision_needs_no_stage_state():
    """Autograd's worker threads see autocast's state but not the stage's context variable: the
    DP arithmetic switches autocast off regardless."""
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16), full_precision():
        assert (torch.ones(4, 4) @ torch.ones(4, 4)).dtype == torch.float32
