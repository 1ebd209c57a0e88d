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


def group_clip_factors(
    group_norms: torch.Tensor, groups: torch.Tensor, clip_norm: float, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-example factors ``w_i · min(1, C / ‖Σ_{j∈u(i)} w_j g_j‖)`` (per-unit clipping): the
    clipped sum ``Σ_i f_i g_i`` gives each unit ``u`` the contribution
    ``min(1, C/‖G_u‖) · G_u`` with ``G_u = Σ_{j∈u} w_j g_j``, of norm at most ``C``.

    ``group_norms[u]`` is ``‖G_u‖``; ``groups[i]`` is example ``i``'s unit (``0 .. U-1``)."""
    factors = clip_factors(group_norms, clip_norm)[groups]
    return factors if weights is None else factors * weights.to(factors)


def group_sums(
    per_sample: dict[str, torch.Tensor], groups: torch.Tensor, weights: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """``{name: [U, *shape]}``: each unit's weighted gradient ``G_u = Σ_{i∈u} w_i g_i``."""
    count = int(groups.max()) + 1 if groups.numel() else 0
    sums = {}
    for name, g in per_sample.items():
        scaled = g if weights is None else g * weights.to(g.dtype).view(-1, *[1] * (g.dim() - 1))
        sums[name] = g.new_zeros(count, *g.shape[1:]).index_add_(0, groups, scaled)
    return sums


def clip_and_sum(
    per_sample: dict[str, torch.Tensor],
    clip_norm: float,
    weights: torch.Tensor | None = None,
    groups: torch.Tensor | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Clip each example's whole gradient (all parameters together) to ``clip_norm``, scale it by
    its weight (default 1) and sum. Returns the sum and the per-example norms before clipping.

    With ``groups`` (each example's unit, ``0 .. U-1``), each unit's weighted gradient
    ``Σ_{i∈u} w_i g_i`` is clipped instead (:func:`group_clip_factors`), and the norms returned
    are the units' (``[U]``)."""
    if groups is None:
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per_sample.values()))
        factors = clip_factors(norms, clip_norm, weights)
    else:
        sums = group_sums(per_sample, groups, weights)
        norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in sums.values()))
        factors = group_clip_factors(norms, groups, clip_norm, weights)
    summed = {name: torch.einsum("b,b...->...", factors, g) for name, g in per_sample.items()}
    return summed, norms
