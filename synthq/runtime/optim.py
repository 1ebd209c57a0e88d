"""The one optimizer factory of the training stages: Adam, AdamW, Adafactor or SGD by name, with
torch's fused kernel where it has one for the parameters' device.

The default (for-each-parameter) implementation of Adam runs a chain of element-wise kernels per
parameter; the fused one updates each parameter in one pass. Measured alone on 2 CPU cores over
SmolLM2-135M's 135 M weights: 0.23 s a step for the default, 0.26 with ``foreach``, 0.09 fused — a
4 % faster finetune-lm step, DP or not. The update is the same up to floating-point rounding, and
it is post-processing of the (noisy) gradient, so no guarantee changes.
"""

from __future__ import annotations

import torch

FUSED_DEVICES = ("cpu", "cuda")
OPTIMIZERS = ("adam", "adamw", "adafactor", "sgd")


def adam(
    parameters: list[torch.nn.Parameter], lr: float, weight_decay: float = 0.0, decoupled: bool = False
) -> torch.optim.Optimizer:
    """``torch.optim.Adam`` (``decoupled=False``: L2 penalty in the gradient) or ``AdamW``
    (decoupled weight decay) over ``parameters``, fused when every parameter lives on a device
    torch fuses for."""
    fused = bool(parameters) and all(p.device.type in FUSED_DEVICES for p in parameters)
    kind = torch.optim.AdamW if decoupled else torch.optim.Adam
    return kind(parameters, lr=lr, weight_decay=weight_decay, fused=fused or None)


def make_optimizer(
    name: str, parameters: list[torch.nn.Parameter], lr: float, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """The optimizer ``name`` over ``parameters``.

    Args:
        name: ``adam`` (the paper's DP-Adam; L2 penalty in the gradient), ``adamw`` (decoupled
            weight decay), both fused where torch can (:func:`adam`); ``adafactor``
            (transformers' Adafactor at a fixed learning rate); or ``sgd``.
        parameters: the trainable parameters.
        lr: the learning rate.
        weight_decay: the weight decay (for ``adam`` and ``sgd`` an L2 penalty in the gradient).
    """
    if name in ("adam", "adamw"):
        return adam(parameters, lr=lr, weight_decay=weight_decay, decoupled=name == "adamw")
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(
            parameters,
            lr=lr,
            relative_step=False,
            scale_parameter=False,
            warmup_init=False,
            weight_decay=weight_decay,
        )
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, not {name!r}")
