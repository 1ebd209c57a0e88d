"""THE registry of layer rules: how a layer's parameter gradient is read off its input ``x`` and
its output gradient ``δ`` for any partition of a batch's rows.

A layer's weight gradient is a sum over rows (examples) and tokens of a product of ``δ`` and
``x``, so summing only the rows of one part gives that part's gradient exactly. One rule per
layer type serves both engines that need it: per group, for group clipping's one-pass engine
(:mod:`synthq.dp.contrastive.per_group`, DP-GCL), and per example, for the RMS norms Opacus' hooks
do not know (:func:`synthq.dp.lm.grad_samplers.rms_norm_grad_sample`, the rule with one row a
part). Registered: ``nn.Linear``, ``nn.Embedding``, ``nn.LayerNorm`` and every RMS norm that
computes exactly ``F.rms_norm`` (checked numerically once per type, :func:`is_plain_rms_norm`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

GroupGradient = Callable[[nn.Module, torch.Tensor, torch.Tensor, list[torch.Tensor]], dict]
REGISTRY: dict[type, GroupGradient] = {}


def register(layer_type: type) -> Callable[[GroupGradient], GroupGradient]:
    def decorator(function: GroupGradient) -> GroupGradient:
        REGISTRY[layer_type] = function
        return function

    return decorator


@register(nn.Linear)
def _linear(module: nn.Linear, x: torch.Tensor, delta: torch.Tensor, rows: list[torch.Tensor]) -> list[dict]:
    x = x.reshape(x.shape[0], -1, x.shape[-1])
    delta = delta.reshape(delta.shape[0], -1, delta.shape[-1])
    out = []
    for index in rows:
        xg = x[index].reshape(-1, x.shape[-1])
        dg = delta[index].reshape(-1, delta.shape[-1])
        grads = {"weight": dg.T @ xg}
        if module.bias is not None:
            grads["bias"] = dg.sum(0)
        out.append(grads)
    return out


@register(nn.Embedding)
def _embedding(
    module: nn.Embedding, ids: torch.Tensor, delta: torch.Tensor, rows: list[torch.Tensor]
) -> list[dict]:
    out = []
    for index in rows:
        token_ids = ids[index].reshape(-1)
        values = delta[index].reshape(-1, delta.shape[-1])
        if module.padding_idx is not None:  # autograd never updates the padding row
            keep = token_ids != module.padding_idx
            token_ids, values = token_ids[keep], values[keep]
        weight = torch.zeros_like(module.weight)
        weight.index_add_(0, token_ids, values.to(weight.dtype))
        out.append({"weight": weight})
    return out


@register(nn.LayerNorm)
def _layer_norm(
    module: nn.LayerNorm, x: torch.Tensor, delta: torch.Tensor, rows: list[torch.Tensor]
) -> list[dict]:
    normalised = F.layer_norm(x, module.normalized_shape, None, None, module.eps)
    dims = len(module.normalized_shape)
    out = []
    for index in rows:
        product = (delta[index] * normalised[index]).reshape(-1, *normalised.shape[-dims:])
        grads = {}
        if module.weight is not None:
            grads["weight"] = product.sum(0)
        if module.bias is not None:
            grads["bias"] = delta[index].reshape(-1, *normalised.shape[-dims:]).sum(0)
        out.append(grads)
    return out


def rms_norm_products(module: nn.Module, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """An RMS norm's weight gradient before the sum over rows and tokens: ``(x / rms(x)) ⊙ δ``."""
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6))
    return F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(delta.dtype) * delta


def rms_norm_rule(
    module: nn.Module, x: torch.Tensor, delta: torch.Tensor, rows: list[torch.Tensor]
) -> list[dict]:
    product = rms_norm_products(module, x, delta)
    return [{"weight": product[index].reshape(-1, product.shape[-1]).sum(0)} for index in rows]


def rule_for(module: nn.Module) -> GroupGradient | None:
    """The module's per-group gradient rule; an RMS norm type is registered when its first module
    passes the numerical check."""
    rule = REGISTRY.get(type(module))
    if rule is None and type(module).__name__.lower().endswith("rmsnorm") and is_plain_rms_norm(module):
        rule = REGISTRY[type(module)] = rms_norm_rule
    return rule


def is_plain_rms_norm(module: nn.Module) -> bool:
    """True if the module computes exactly ``F.rms_norm(x, weight, eps)`` (checked on random data)."""
    weight = getattr(module, "weight", None)
    own = list(module.parameters(recurse=False))
    if not isinstance(weight, nn.Parameter) or weight.dim() != 1 or len(own) != 1:
        return False
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(eps, float):
        return False
    generator = torch.Generator().manual_seed(0)
    probe = torch.randn(2, 3, weight.shape[0], generator=generator).to(weight.device, weight.dtype)
    with torch.no_grad():
        try:
            actual = module(probe)
        except Exception:  # a norm with another signature is simply not ours to handle
            return False
        expected = F.rms_norm(probe, (weight.shape[0],), weight=weight, eps=eps)
    return actual.shape == expected.shape and torch.allclose(actual, expected, atol=1e-5, rtol=1e-4)
