"""Adam and AdamW as the training stages build them: with torch's fused kernel where it has one
for the parameters' device.

The default (for-each-parameter) implementation runs a chain of element-wise kernels per
parameter; the fused one updates each parameter in one pass. Measured alone on 2 CPU cores over
SmolLM2-135M's 135 M weights: 0.23 s a step for the default, 0.26 with ``foreach``, 0.09 fused — a
4 % faster finetune-lm step, DP or not. The update is the same up to floating-point rounding, and
it is post-processing of the (noisy) gradient, so no guarantee changes.
"""

from __future__ import annotations

import torch

FUSED_DEVICES = ("cpu", "cuda")


def adam(
    parameters: list[torch.nn.Parameter], lr: float, weight_decay: float = 0.0, decoupled: bool = False
) -> torch.optim.Optimizer:
    """``torch.optim.Adam`` (``decoupled=False``: L2 penalty in the gradient) or ``AdamW``
    (decoupled weight decay) over ``parameters``, fused when every parameter lives on a device
    torch fuses for."""
    fused = bool(parameters) and all(p.device.type in FUSED_DEVICES for p in parameters)
    kind = torch.optim.AdamW if decoupled else torch.optim.Adam
    return kind(parameters, lr=lr, weight_decay=weight_decay, fused=fused or None)
