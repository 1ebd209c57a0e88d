"""Clipping primitives shared by every mechanism: norms, clip, clip-and-sum, weighted sums."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def norm(vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The ℓ2 norm of several tensors taken together as one vector."""
    return torch.sqrt(sum(v.pow(2).sum() for v in vectors))


def clip(vectors: Sequence[torch.Tensor], clip_norm: float) -> list[torch.Tensor]:
    """``v · min(1, C / ‖v‖)`` for the vector made of ``vectors`` (all scaled by one factor)."""
    factor = min(1.0, clip_norm / (float(norm(vectors)) + 1e-12))
    return [v * factor for v in vectors]


def add_into(total: Sequence[torch.Tensor], part: Sequence[torch.Tensor], weight: float = 1.0) -> None:
    """``total += weight · part`` element-wise, in place."""
    for t, p in zip(total, part, strict=True):
        t.add_(p, alpha=weight)


def gradient(
    loss: torch.Tensor, parameters: Sequence[torch.nn.Parameter], retain_graph: bool = False
) -> list[torch.Tensor]:
    """``∂loss/∂p`` for every parameter, zeros for those the loss does not use."""
    grads = torch.autograd.grad(loss, list(parameters), retain_graph=retain_graph, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, parameters, strict=True)]


def clip_factors(norms: torch.Tensor, clip_norm: float, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Per-example factors ``w_i · min(1, C / ‖g_i‖)``: the clipped, weighted sum is ``Σ_i f_i g_i``.

    With unit weights ``1/k`` (a query with ``k`` pairs) a whole query contributes at most ``C``."""
    factors = (clip_norm / (norms + 1e-6)).clamp(max=1.0)
    return factors if weights is None else factors * weights.to(factors)


def clip_and_sum(
    per_sample: dict[str, torch.Tensor], clip_norm: float, weights: torch.Tensor | None = None
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Clip each example's whole gradient (all parameters together) to ``clip_norm``, scale it by
    its weight (default 1) and sum. Returns the sum and the per-example norms before clipping."""
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per_sample.values()))
    factors = clip_factors(norms, clip_norm, weights)
    summed = {name: torch.einsum("b,b...->...", factors, g) for name, g in per_sample.items()}
    return summed, norms
