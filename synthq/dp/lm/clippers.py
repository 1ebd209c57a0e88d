"""The per-example clipping engines of a generator's DP step, chosen by ``grad_sample_mode``
(:func:`make_clipper`): ``ghost`` and ``hooks`` (:mod:`synthq.dp.lm.hooks`) and ``vmap``
(:class:`VmapClipper`), which all return the sum of each example's gradient clipped to ``C`` (see
:mod:`synthq.dp.lm.step`)."""

from __future__ import annotations

import torch
from torch.func import functional_call, grad_and_value, vmap

from synthq.dp.clipping import clip_and_sum
from synthq.models.generator import QueryGenerator
from synthq.models.sequence_loss import label_window, model_inputs, per_sequence_loss
from synthq.models.training_step import (
    weighted_loss_gradient,
)
from synthq.runtime.precision import forward_autocast


def prepare_model_for_per_sample_gradients(generator: QueryGenerator) -> None:
    """Eager attention: the SDPA mask helpers read mask values, which ``vmap`` cannot trace."""
    if hasattr(generator.model, "set_attn_implementation"):
        generator.model.set_attn_implementation("eager")


class PerSampleGradients:
    """Exact per-example gradients of the per-sequence loss for a generator's trainable parameters."""

    def __init__(self, generator: QueryGenerator):
        self.generator = generator
        self.model = generator.model
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        self.window = 0

    def _loss(self, params: dict, example: dict) -> torch.Tensor:
        batch = {k: v.unsqueeze(0) for k, v in example.items()}
        inputs = model_inputs(self.generator.kind, batch, traceable=True, window=self.window)
        with forward_autocast():
            logits = functional_call(self.model, params, args=(), kwargs=inputs, strict=False).logits
        return per_sequence_loss(self.generator.kind, logits, batch["labels"])[0]

    def __call__(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Per-example gradients ``{name: [b, *shape]}`` and the per-example losses ``[b]``."""
        trainable = set(self.names)
        params = {n: p.detach() for n, p in self.model.named_parameters() if n in trainable}
        self.window = label_window(self.generator.kind, batch["labels"])
        per_example = vmap(grad_and_value(self._loss), in_dims=(None, 0), randomness="different")
        grads, losses = per_example(params, batch)
        return grads, losses.detach()


class VmapClipper:
    """Exact per-example gradients from :class:`PerSampleGradients`, clipped and summed
    (``vmap`` mode: works for any architecture; memory grows with ``b ×`` trainable parameters)."""

    mode = "vmap"

    def __init__(self, generator: QueryGenerator, clip_norm: float):
        prepare_model_for_per_sample_gradients(generator)
        self.per_sample = PerSampleGradients(generator)
        self.names = self.per_sample.names
        self.clip_norm = clip_norm

    def clipped_sum(
        self, batch: dict, weights: torch.Tensor | None = None, groups: torch.Tensor | None = None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        per_example, losses = self.per_sample(batch)
        summed, norms = clip_and_sum(per_example, self.clip_norm, weights, groups)
        return summed, norms, losses

    def unclipped_sum(
        self, batch: dict, weights: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``Σ_i w_i ∇ℓ_i`` by ordinary autograd (part of one unit too large for a micro-batch)."""
        return weighted_loss_gradient(self.per_sample.generator, batch, weights)

    def close(self) -> None:
        """Nothing to undo: ``vmap`` leaves no hooks on the model."""


GRAD_SAMPLE_MODES = ("auto", "ghost", "hooks", "vmap")


def choose_grad_sample_mode(generator: QueryGenerator, requested: str = "auto") -> str:
    """``auto``: ghost clipping when every shared parameter is a plain Linear/Embedding weight
    (true for T5 and Llama-style models, tied or not), else exact ``vmap``."""
    if requested not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode must be one of {GRAD_SAMPLE_MODES}, not {requested!r}")
    if requested != "auto":
        return requested
    from synthq.dp.lm.ghost import unsupported_for_ghost

    return "vmap" if unsupported_for_ghost(generator.model) else "ghost"


def make_clipper(generator: QueryGenerator, clip_norm: float, mode: str = "auto"):
    """The per-example clipping engine for ``mode`` (see :func:`choose_grad_sample_mode`)."""
    mode = choose_grad_sample_mode(generator, mode)
    if mode == "vmap":
        return VmapClipper(generator, clip_norm)
    from synthq.dp.lm.hooks import GhostClipper, HookClipper

    return (GhostClipper if mode == "ghost" else HookClipper)(generator, clip_norm)
