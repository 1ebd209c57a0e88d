"""Did DP fine-tuning learn? The trainable weights moved, and the loss on public held-out pairs.

Users of DP with LoRA have met runs that silently do not learn: with some PEFT and Opacus
versions the adapters stayed at their initial values while the loss and ε looked normal (Opacus
issue 820). ``finetune-lm`` therefore copies the trainable weights before the first step and,
after the last, compares: a run in which no trainable tensor changed fails with one line and
writes no generator (:func:`require_movement`). The manifest's metrics keep how far the weights
moved (``weights_moved``: ‖θ − θ₀‖ / ‖θ₀‖, and how many tensors changed).

Where the dataset has a split with queries that is declared public (the embedded data's test
split; a published benchmark's dev split), the generator's loss on a few of its pairs is measured
before and after training (:func:`held_out_loss`, no gradient) and kept in the metrics
(``public_held_out_loss``): a loss that did not fall says the generator learned nothing a reader
could use, even though it moved.

Privacy: neither check reads private data. The movement is a function of the released model and
its initial weights (public: a public starting model and torch's default initialisation), so
failing or passing is post-processing of the DP release; the held-out pairs belong to a split the
dataset declares public, read as :func:`synthq.bookkeeping.splits.split_is_private` decides (fail
closed). When no split is public, no loss is measured, and the metrics say so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from synthq.models.sequence_loss import model_inputs, per_sequence_loss
from synthq.runtime.errors import SynthqError

HELD_OUT_PAIRS = 16  # a handful: two forward passes of a 135 M model on CPU cost seconds


class NotLearningError(SynthqError):
    """DP fine-tuning ran its steps but no trainable weight changed."""


@dataclass
class Movement:
    """How far the trainable weights went from where they started."""

    changed: int  # tensors with at least one changed value
    tensors: int
    relative: float  # ‖θ − θ₀‖ / ‖θ₀‖ over all trainable weights (‖θ‖ when θ₀ = 0)

    def as_metrics(self) -> dict:
        return {"tensors_changed": self.changed, "tensors": self.tensors, "relative_change": self.relative}


def snapshot(parameters: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``parameters`` (on the CPU) to compare with after training."""
    return [p.detach().to("cpu", copy=True) for p in parameters]


def movement(before: Sequence[torch.Tensor], parameters: Sequence[torch.Tensor]) -> Movement:
    """Compare trained ``parameters`` with their :func:`snapshot`."""
    changed, moved, start = 0, 0.0, 0.0
    for old, new in zip(before, parameters, strict=True):
        new = new.detach().to("cpu", torch.float64)
        old = old.to(torch.float64)
        difference = float((new - old).pow(2).sum())
        changed += difference > 0
        moved += difference
        start += float(old.pow(2).sum())
    relative = moved**0.5 / start**0.5 if start > 0 else moved**0.5
    return Movement(changed, len(before), relative)


def require_movement(found: Movement, steps: int, what: str) -> None:
    """Refuse a run that took steps but changed none of its ``what`` (e.g. "LoRA adapters")."""
    if steps > 0 and found.changed == 0:
        raise NotLearningError(
            f"finetune-lm: none of the {found.tensors} trainable tensors ({what}) changed in {steps} "
            "steps, so the generator would be the starting model; no generator written (check the "
            "peft and opacus versions, and that --lr is above 0)"
        )


@torch.no_grad()
def held_out_loss(generator, documents: list[str], queries: list[str], max_target_length: int) -> float:
    """The generator's mean per-sequence loss on (document, query) pairs, without gradients and
    with dropout off (the model's training mode is restored)."""
    return float(held_out_losses(generator, documents, queries, max_target_length).mean())


@torch.no_grad()
def held_out_losses(
    generator, documents: list[str], queries: list[str], max_target_length: int
) -> torch.Tensor:
    """Each (document, query) pair's loss (:func:`held_out_loss` before the mean), one batch."""
    model = generator.model
    training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        batch = generator.training_batch(documents, queries, max_target_length)
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = model(**model_inputs(generator.kind, batch)).logits
        return per_sequence_loss(generator.kind, logits, batch["labels"]).float().cpu()
    finally:
        model.train(training)


@dataclass
class HeldOut:
    """(document, query) pairs of a split the dataset declares public, never the training split."""

    split: str
    documents: list[str]
    queries: list[str]


class LearningCheck:
    """Both checks around a training run: create it before the first step (it copies the
    trainable weights and measures the held-out loss), call :meth:`finish` after the last."""

    def __init__(
        self, generator, trainable: Sequence[torch.Tensor], held_out: HeldOut | None, target_length: int
    ):
        self.generator, self.trainable, self.held_out = generator, list(trainable), held_out
        self.target_length = target_length
        self.before = snapshot(self.trainable)
        self.loss_before = self._loss()

    def _loss(self) -> float | None:
        if self.held_out is None:
            return None
        pairs = self.held_out
        return held_out_loss(self.generator, pairs.documents, pairs.queries, self.target_length)

    def finish(self, steps: int, what: str) -> dict:
        """Refuse a run that moved nothing (:func:`require_movement`); else the manifest metrics
        ``weights_moved`` and ``public_held_out_loss``."""
        found = movement(self.before, self.trainable)
        require_movement(found, steps, what)
        metrics = {"weights_moved": {"what": what, **found.as_metrics()}}
        if self.held_out is None:
            metrics["public_held_out_loss"] = "not measured: the data declares no public split with queries"
        else:
            metrics["public_held_out_loss"] = {
                "split": self.held_out.split, "pairs": len(self.held_out.queries),
                "before": self.loss_before, "after": self._loss(),
            }  # fmt: skip
        return metrics
