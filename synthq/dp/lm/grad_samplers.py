"""Opacus grad samplers and model patches that make hook-based per-example gradients exact for
T5 and Llama-style language models.

Opacus computes per-example gradients with module hooks: a forward hook keeps each layer's
input, a backward hook combines it with the gradient of the layer's output. That is exact only
when every layer's input and output carry the batch in their first dimension and the layer has
a registered grad sampler. Three pieces of T5 / Llama break it out of the box:

* ``T5LayerNorm`` and ``LlamaRMSNorm`` (and the other RMS norms of ``transformers``) have no
  grad sampler, so Opacus falls back to a per-layer ``functorch`` call. They compute
  ``weight · x / rms(x)``, the same function as ``torch.nn.RMSNorm``, so the per-example
  gradient of ``weight`` is ``Σ_tokens (x / rms(x)) · ∂L/∂y`` (:func:`rms_norm_grad_sample`).
  Each module type is checked numerically against ``F.rms_norm`` before it is registered, so a
  variant with another formula (Gemma's ``1 + weight``) keeps the generic fallback.
* T5's relative attention bias is an ``nn.Embedding`` looked up with a ``[query, key]`` bucket
  matrix that has *no batch dimension*; the resulting bias is broadcast over the batch and
  shared by every layer of the stack. Opacus' hook would read the query length as the batch
  size and return nonsense. :func:`batch_relative_attention_bias` makes the lookup per example
  (``[batch, query, key]``), which gives each example its own copy of the bias, and hence its own
  gradient, while the forward values stay identical.
* Tied input/output embeddings are one parameter used by several modules; hook mode sums their
  per-example contributions, and :mod:`synthq.dp.lm.hooks` computes the exact ghost norm of
  that sum.
"""

from __future__ import annotations

import types

import torch
from opacus.grad_sample import GradSampleModule
from opacus.grad_sample.utils import register_grad_sampler
from torch import nn

from synthq.dp.layer_rules import is_plain_rms_norm, rms_norm_products


def rms_norm_grad_sample(
    layer: nn.Module, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example gradient of an RMS norm's ``weight``, ``Σ_tokens (x / rms(x)) ⊙ ∂L/∂y``: the
    registered layer rule's products (:mod:`synthq.dp.layer_rules`) summed per example."""
    per_token = rms_norm_products(layer, activations[0], backprops)
    return {layer.weight: per_token.reshape(per_token.shape[0], -1, per_token.shape[-1]).sum(1)}


def register_rms_norm_grad_samplers(model: nn.Module) -> list[str]:
    """Register :func:`rms_norm_grad_sample` for every RMS-norm class in ``model`` that passes the
    numerical check. Returns the class names registered (idempotent)."""
    registered = []
    seen: set[type] = set()
    for module in model.modules():
        cls = type(module)
        if cls in seen or not cls.__name__.lower().endswith(("rmsnorm", "layernorm")):
            continue
        seen.add(cls)
        if cls not in GradSampleModule.GRAD_SAMPLERS and is_plain_rms_norm(module):
            register_grad_sampler(cls)(rms_norm_grad_sample)
        if GradSampleModule.GRAD_SAMPLERS.get(cls) is rms_norm_grad_sample:
            registered.append(cls.__name__)
    return registered


class RelativePositionBias(nn.Embedding):
    """T5's relative attention bias table, looked up per example (see
    :func:`batch_relative_attention_bias`). A separate type so that ghost clipping uses the
    grad sampler (a ``[batch, buckets, heads]`` tensor, tiny) instead of Opacus' embedding norm
    sampler, which would sort all ``batch × query × key`` lookups."""


register_grad_sampler(RelativePositionBias)(GradSampleModule.GRAD_SAMPLERS[nn.Embedding])


def _batched_compute_bias(self, query_length, key_length, device=None, past_seen_tokens=0):
    """T5's ``compute_bias`` with one bias copy per example: ``[batch, heads, query, key]``."""
    if device is None:
        device = self.relative_attention_bias.weight.device
    context_position = torch.arange(query_length, dtype=torch.long, device=device)[:, None] + past_seen_tokens
    memory_position = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
    buckets = self._relative_position_bucket(
        memory_position - context_position,
        bidirectional=(not self.is_decoder),
        num_buckets=self.relative_attention_num_buckets,
        max_distance=self.relative_attention_max_distance,
    )
    # The batch dimension is what lets Opacus' Embedding hook see one lookup per example.
    buckets = buckets.unsqueeze(0).expand(self._synthq_batch_size, -1, -1)
    return self.relative_attention_bias(buckets).permute(0, 3, 1, 2)


def _remember_batch_size(module: nn.Module, args: tuple, kwargs: dict) -> None:
    hidden_states = args[0] if args else kwargs["hidden_states"]
    module._synthq_batch_size = hidden_states.shape[0]


def batch_relative_attention_bias(model: nn.Module) -> int:
    """Give every T5-style relative attention bias a per-example lookup (see module docstring).

    Forward values are unchanged (the bias is merely expanded over the batch before it is added
    to the attention scores). Returns the number of attention modules patched; idempotent."""
    patched = 0
    for module in model.modules():
        if not getattr(module, "has_relative_attention_bias", False) or not hasattr(module, "compute_bias"):
            continue
        if getattr(module, "_synthq_batched_bias", False):
            patched += 1
            continue
        if type(module.relative_attention_bias) is nn.Embedding:
            module.relative_attention_bias.__class__ = RelativePositionBias
        module.compute_bias = types.MethodType(_batched_compute_bias, module)
        module.register_forward_pre_hook(_remember_batch_size, with_kwargs=True)
        module._synthq_batched_bias = True
        patched += 1
    return patched
