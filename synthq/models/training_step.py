"""One training step of a query generator without DP, and the result every training step reports.

The non-private step (ε = ∞) minimises the same per-sequence loss as the DP clipping engines
(:mod:`synthq.models.sequence_loss`), averaged over the batch, with no clipping and no noise. The
DP step (:class:`synthq.dp.lm.step.DPStep`) reports its losses, tokens and gradient norms through the
same :class:`StepResult`, gathered over every rank of a ``torchrun`` job by :func:`gather_result`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from synthq.models.generator import QueryGenerator
from synthq.models.sequence_loss import model_inputs, per_sequence_loss
from synthq.runtime import distributed
from synthq.runtime.precision import forward_autocast

MakeBatch = Callable[[list[int]], dict]
# Called after each micro-batch of a step with (examples done, examples in this rank's share):
# progress inside a logical step, whose micro-batches can take minutes on a CPU.
MicroBatchProgress = Callable[[int, int], None]


@dataclass
class StepResult:
    """What one logical step saw: the mean per-sequence loss, the number of examples, the number
    of target tokens and the mean per-example gradient norm (``nan`` when not computed)."""

    loss: float
    examples: int
    tokens: int
    mean_grad_norm: float


def sequence_losses(generator: QueryGenerator, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each row's per-sequence loss ``[b]``, with the graph kept for a backward pass."""
    with forward_autocast():  # bf16 matrix products at --precision bf16; fp32 weights and loss
        logits = generator.model(**model_inputs(generator.kind, batch)).logits
    return per_sequence_loss(generator.kind, logits, batch["labels"])


def weighted_loss_gradient(
    generator: QueryGenerator, batch: dict[str, torch.Tensor], weights: torch.Tensor
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``∇ Σ_i w_i ℓ_i`` over the trainable parameters (``{name: tensor}``, fp32 as the weights
    are), by ordinary autograd, and the rows' losses: no clipping. The DP step sums this over
    the micro-batches of one privacy unit too large for one, then clips the unit's sum once."""
    trainable = [(n, p) for n, p in generator.model.named_parameters() if p.requires_grad]
    losses = sequence_losses(generator, batch)
    grads = torch.autograd.grad(
        (losses * weights.to(losses)).sum(), [p for _, p in trainable], allow_unused=True
    )
    gradient = {
        name: torch.zeros_like(parameter) if grad is None else grad
        for (name, parameter), grad in zip(trainable, grads, strict=True)
    }
    return gradient, losses.detach()


def non_private_step(
    generator: QueryGenerator,
    optimizer: torch.optim.Optimizer,
    make_batch: MakeBatch,
    indices: list[int],
    physical_batch_size: int,
    on_micro_batch: MicroBatchProgress | None = None,
) -> StepResult:
    """The ε = ∞ step: the same per-sequence loss, averaged over the batch, no clipping or noise.
    Under torchrun each rank takes its share of ``indices`` and the gradients are summed.
    ``on_micro_batch(done, total)`` is called after each micro-batch (examples of this rank's share)."""
    device = next(generator.model.parameters()).device
    losses, tokens = [], 0
    local = distributed.shard(indices)
    for start in range(0, len(local), physical_batch_size):
        chunk = local[start : start + physical_batch_size]
        batch = {k: v.to(device) for k, v in make_batch(chunk).items()}
        tokens += int((batch["labels"] != -100).sum())
        loss = sequence_losses(generator, batch)
        (loss.sum() / len(indices)).backward()
        losses.append(loss.detach())
        if on_micro_batch is not None:
            on_micro_batch(start + len(chunk), len(local))
    trainable = [p for p in generator.model.parameters() if p.requires_grad]
    for parameter in trainable:
        if parameter.grad is None:  # a rank whose share was empty
            parameter.grad = torch.zeros_like(parameter)
    distributed.all_reduce_sum([p.grad for p in trainable])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return gather_result(len(indices), losses, [], tokens)


def gather_result(
    examples: int, losses: list[torch.Tensor], norms: list[torch.Tensor], tokens: int
) -> StepResult:
    """Losses, gradient norms and tokens of every rank's share, gathered in one collective."""
    mine = (
        torch.cat(losses).tolist() if losses else [],
        torch.cat(norms).tolist() if norms else [],
        tokens,
    )
    shares = distributed.gather_objects(mine)
    all_losses = [value for share in shares for value in share[0]]
    all_norms = [value for share in shares for value in share[1]]
    return StepResult(
        loss=sum(all_losses) / len(all_losses) if all_losses else math.nan,
        examples=examples,
        tokens=sum(share[2] for share in shares),
        mean_grad_norm=sum(all_norms) / len(all_norms) if all_norms else math.nan,
    )


def training_statistics(losses: list[float], elapsed: float, steps: int) -> dict:
    """The first loss, the mean of the last tenth of the losses (``final_loss``), the seconds and
    the seconds per step of one training run: what finetune-lm and train-retriever record."""
    tail = losses[-max(1, len(losses) // 10) :]
    return {
        "first_loss": losses[0] if losses else None,
        "final_loss": sum(tail) / len(tail) if tail else None,
        "train_seconds": round(elapsed, 3),
        "seconds_per_step": round(elapsed / max(steps, 1), 4),
    }
