"""Opacus hook-based per-example clipping for query generators: ``hooks`` and ``ghost`` modes.

Both produce the same thing as :class:`synthq.dp.lm.clippers.VmapClipper` — the sum over a micro-batch
of each example's gradient clipped to ``C`` — with less memory or time:

* ``hooks`` (:class:`HookClipper`): Opacus ``GradSampleModule``. One forward and one backward;
  each layer's hook builds the per-example gradients ``[b, *param.shape]``; they are clipped
  and summed. Memory grows with ``b ×`` the trainable parameters.
* ``ghost`` (:class:`GhostClipper`): ghost clipping with book-keeping (Li et al., 2022; Bu et
  al., 2023) on the hooks of Opacus ``GradSampleModuleFastGradientClipping``. One backward pass
  that computes layer output gradients only (no parameter gradients) gives each example's
  gradient *norm*, layer by layer, from activations and output gradients
  (``‖Σ_s g_s a_sᵀ‖² = Σ_{s,s'} (g_s·g_s')(a_s·a_s')`` for a linear layer) without ever forming
  a per-example gradient; the clipped sum ``Σ_i min(1, C/‖∇ℓ_i‖) ∇ℓ_i`` is then one weighted
  matrix product per layer from the same records (``Σ_{i,s} c_i g_{is} a_{is}ᵀ``) — no second
  backward. Memory: the output gradients of every trainable layer are kept until the update.
  Mixed ghost clipping (Bu et al., 2022): each Linear / Embedding layer takes whichever of the
  ghost norm and an instantiated per-example gradient is cheaper for its shape and the batch's
  sequence length (:func:`~synthq.dp.lm.ghost.choose_norm_method`); instantiated gradients are
  kept and weighted directly (low-rank LoRA adapters), ghost layers keep their records. The norm
  math and the book-keeping live in :mod:`synthq.dp.lm.ghost`; this module holds the clippers.

Exactness for T5 and Llama-style models (see :mod:`synthq.dp.lm.grad_samplers`): RMS norms get
a registered grad sampler, T5's shared relative attention bias is looked up per example, and a
parameter used by several modules (tied input/output embeddings: T5's ``shared`` used by the
encoder, the decoder and ``lm_head``; SmolLM2's ``embed_tokens`` and ``lm_head``) is handled in
both modes: hooks sum the per-example contributions; ghost keeps each use in factored form
(activations and output gradients) and computes the norm of their *sum*, cross terms included
(:func:`~synthq.dp.lm.ghost.tied_squared_norms`), where Opacus itself refuses tied parameters.

Privacy unit and sensitivity are those of :mod:`synthq.dp.lm.per_query` (one pair; ``C``): the clipped
sum is the same quantity, computed differently.
"""

from __future__ import annotations

import warnings

import torch
from opacus.grad_sample import GradSampleModule
from torch import nn

from synthq.dp.clipping import clip_and_sum, clip_factors, group_clip_factors
from synthq.dp.lm.ghost import GroupLayout, TiedGhostClipping, unsupported_for_ghost
from synthq.dp.lm.grad_samplers import batch_relative_attention_bias, register_rms_norm_grad_samplers
from synthq.models.generator import QueryGenerator
from synthq.models.training_step import sequence_losses, weighted_loss_gradient
from synthq.runtime.precision import as_fp32, full_precision

# Embedding lookups have no input gradient, so their hooks fire on output gradients: expected.
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")


def prepare_model_for_hooks(model: nn.Module) -> None:
    """Grad samplers for the model's RMS norms and a per-example T5 relative attention bias."""
    register_rms_norm_grad_samplers(model)
    batch_relative_attention_bias(model)


def _trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


class PaddingAwareGradSampleModule(GradSampleModule):
    """Opacus' ``GradSampleModule`` whose embedding hooks give ``padding_idx`` rows no gradient,
    as autograd does (SmolLM2 pads with its EOS token, so that row is a real parameter)."""

    def capture_backprops_hook(self, module, forward_input, forward_output, loss_reduction, batch_first):
        if (
            self.hooks_enabled
            and isinstance(module, nn.Embedding)
            and module.padding_idx is not None
            and getattr(module, "activations", None)
        ):
            ids = module.activations[-1][0]  # the lookup this backward belongs to (popped next)
            keep = (ids != module.padding_idx).unsqueeze(-1).to(forward_output[0].dtype)
            forward_output = (forward_output[0] * keep, *forward_output[1:])
        if self.hooks_enabled and getattr(module, "activations", None):
            # bf16 autocast records bf16 inputs and output gradients: per-example gradients in fp32
            module.activations[-1] = [as_fp32(t) for t in module.activations[-1]]
            forward_output = (as_fp32(forward_output[0]), *forward_output[1:])
        with full_precision():
            return super().capture_backprops_hook(
                module, forward_input, forward_output, loss_reduction, batch_first
            )


class HookClipper:
    """Per-example gradients from Opacus' layer hooks, then clipped and summed (``hooks`` mode).

    Args:
        generator: the model being trained; must be in ``train()`` mode (hooks skip eval mode).
        clip_norm: ``C``.
    """

    mode = "hooks"

    def __init__(self, generator: QueryGenerator, clip_norm: float):
        self.generator = generator
        self.clip_norm = clip_norm
        prepare_model_for_hooks(generator.model)
        self.names = [n for n, _ in _trainable(generator.model)]
        self.module = PaddingAwareGradSampleModule(
            generator.model, batch_first=True, loss_reduction="sum", strict=False
        )

    def per_sample_gradients(self, batch: dict) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``{name: [b, *shape]}`` for every trainable parameter, and the per-example losses."""
        losses = sequence_losses(self.generator, batch)
        losses.sum().backward()
        grads = {}
        for name, parameter in _trainable(self.generator.model):
            grads[name] = parameter.grad_sample
            parameter.grad_sample = None
            parameter.grad = None
        return grads, losses.detach()

    def clipped_sum(
        self, batch: dict, weights: torch.Tensor | None = None, groups: torch.Tensor | None = None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """``Σ_i w_i clip_C(∇ℓ_i)``; with ``groups`` (each row's unit), each unit's weighted
        gradient is clipped instead (:func:`~synthq.dp.clipping.clip_and_sum`)."""
        grads, losses = self.per_sample_gradients(batch)
        summed, norms = clip_and_sum(grads, self.clip_norm, weights, groups)
        return summed, norms, losses

    def unclipped_sum(
        self, batch: dict, weights: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``Σ_i w_i ∇ℓ_i`` by ordinary autograd, the per-example hooks off (part of one unit)."""
        return _without_hooks(self.module, self.generator, batch, weights)

    def close(self) -> None:
        self.module._close()


def _without_hooks(module, generator: QueryGenerator, batch: dict, weights: torch.Tensor):
    module.disable_hooks()
    try:
        return weighted_loss_gradient(generator, batch, weights)
    finally:
        module.enable_hooks()


class GhostClipper:
    """Ghost clipping with book-keeping: per-example norms without per-example gradients, then
    the clipped sum from the recorded activations and output gradients (``ghost`` mode).

    Args:
        generator: the model being trained, in ``train()`` mode.
        clip_norm: ``C``.
        norm_method: ``auto`` (per layer, by cost: :func:`~synthq.dp.lm.ghost.choose_norm_method`),
            or ``ghost`` / ``instantiate`` for every Linear and Embedding layer (the result is the
            same).

    Requirements:
        Parameters shared by several modules must be plain ``nn.Linear`` / ``nn.Embedding``
        weights (tied embeddings); :func:`~synthq.dp.lm.ghost.unsupported_for_ghost` says when they are not.
    """

    mode = "ghost"

    def __init__(self, generator: QueryGenerator, clip_norm: float, norm_method: str = "auto"):
        problems = unsupported_for_ghost(generator.model)
        if problems:
            raise NotImplementedError("ghost clipping: " + "; ".join(problems))
        self.generator = generator
        self.clip_norm = clip_norm
        prepare_model_for_hooks(generator.model)
        self.names = [n for n, _ in _trainable(generator.model)]
        self.module = TiedGhostClipping(generator.model, max_grad_norm=clip_norm, norm_method=norm_method)
        self._roots: list[torch.Tensor] = []
        self._root_hooks = [
            m.register_forward_hook(self._record_root)
            for m in generator.model.modules()
            if any(p.requires_grad for p in m.parameters(recurse=False))
        ]

    def _record_root(self, module: nn.Module, inputs: tuple, output) -> None:
        """Keep the outputs of trainable layers fed only by data (embedding lookups): the norm
        pass differentiates with respect to these, so autograd computes every layer's output
        gradient (what the ghost norms need) and no parameter gradient (which it would discard)."""
        if not (self.module.hooks_enabled and module.training and torch.is_grad_enabled()):
            return
        if any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
            return
        if isinstance(output, torch.Tensor) and output.requires_grad:
            self._roots.append(output)

    def _norms(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        self.module.enable_hooks()
        self.module.reset()  # records of forward passes that never reached a norm pass
        self._roots.clear()
        losses = sequence_losses(self.generator, batch)
        roots, self._roots = self._roots, []
        # Every layer's backward hook lies between the loss and these roots, so all of them fire.
        torch.autograd.grad(losses.sum(), roots, allow_unused=True)
        norms = self.module.get_norm_sample()
        return losses.detach(), norms.detach()

    def per_sample_norms(self, batch: dict) -> torch.Tensor:
        _, norms = self._norms(batch)
        self.module.reset()
        return norms

    def clipped_sum(
        self, batch: dict, weights: torch.Tensor | None = None, groups: torch.Tensor | None = None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """``Σ_i w_i clip_C(∇ℓ_i)``; with ``groups`` (each row's unit), each unit's weighted
        gradient ``Σ_{i∈u} w_i ∇ℓ_i`` is clipped instead: its norm comes from Gram matrices
        across the unit's rows (:class:`~synthq.dp.lm.ghost.GroupLayout`), and the update from
        the same records with per-row factors (norms returned: the units')."""
        self.module.layout = None if groups is None else GroupLayout(groups, weights)
        try:
            losses, norms = self._norms(batch)
        finally:
            self.module.layout = None
        if groups is None:
            factors = clip_factors(norms, self.clip_norm, weights)
        else:
            factors = group_clip_factors(norms, groups, self.clip_norm, weights)
        by_id = self.module.clipped_gradients(factors)
        summed = {}
        for name, parameter in _trainable(self.generator.model):
            summed[name] = by_id[id(parameter)] if id(parameter) in by_id else torch.zeros_like(parameter)
        return summed, norms, losses

    def unclipped_sum(
        self, batch: dict, weights: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``Σ_i w_i ∇ℓ_i`` by ordinary autograd, the ghost hooks off (part of one unit)."""
        return _without_hooks(self.module, self.generator, batch, weights)

    def close(self) -> None:
        for handle in self._root_hooks:
            handle.remove()
        self.module._close()
