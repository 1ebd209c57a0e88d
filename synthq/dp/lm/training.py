"""The training loop of a query generator, DP or not: the state ``finetune-lm`` steps, saves and resumes.

With a :class:`~synthq.dp.engine.PrivacyPlan` every step is a DP step
(:class:`synthq.dp.lm.step.DPStep`: a Poisson sample of privacy units, clipped per pair,
noised once); without one it is the non-private step
(:func:`synthq.models.training_step.non_private_step`) over shuffled epochs of the units.
Sampling, noise and shuffling all draw from the run's :class:`~synthq.dp.noise.SecretRandomness`,
which a private checkpoint saves with the weights and the optimizer, so a resumed run continues
with identical accounting.
"""

from __future__ import annotations

import torch

from synthq.dp.engine import PrivacyPlan
from synthq.dp.lm.step import DPStep
from synthq.dp.noise import SecretRandomness
from synthq.dp.privacy_units import PrivacyUnits
from synthq.models.generator import QueryGenerator
from synthq.models.training_step import MakeBatch, MicroBatchProgress, StepResult, non_private_step


class GeneratorTraining:
    """The training loop's state for one generator, DP or not: what ``finetune-lm`` and the canary
    audit drive step by step, and what a private checkpoint saves.

    Args:
        generator: the model (LoRA already applied if wanted), in train mode on its device.
        optimizer: over its trainable parameters.
        make_batch: row indices -> a training batch (``QueryGenerator.training_batch``).
        units: the rows grouped by query id.
        batch_size: the (expected) logical batch size in queries.
        plan: the privacy plan, or ``None`` for non-private training (shuffled epochs of rows).
        randomness: the run's secret randomness (sampling, noise, shuffling).
        physical_batch_size, grad_sample_mode, user_clipping: as for :class:`~synthq.dp.lm.step.DPStep`.
    """

    def __init__(
        self,
        generator: QueryGenerator,
        optimizer: torch.optim.Optimizer,
        make_batch: MakeBatch,
        units: PrivacyUnits,
        batch_size: int,
        plan: PrivacyPlan | None,
        randomness: SecretRandomness,
        physical_batch_size: int,
        grad_sample_mode: str = "auto",
        user_clipping: str = "per-example",
    ):
        self.generator, self.optimizer, self.make_batch = generator, optimizer, make_batch
        self.units, self.batch_size, self.plan, self.randomness = units, batch_size, plan, randomness
        self.physical_batch_size = physical_batch_size
        self.dp_step = (
            DPStep(generator, optimizer, plan, physical_batch_size, grad_sample_mode, user_clipping)
            if plan is not None
            else None
        )
        self.order: list[int] = []
        self.step_index = 0

    @property
    def mode(self) -> str | None:
        return self.dp_step.mode if self.dp_step is not None else None

    def step(self, on_micro_batch: MicroBatchProgress | None = None) -> StepResult:
        """One logical step; ``on_micro_batch(done, total)`` after each micro-batch (progress)."""
        if self.plan is not None:
            sample = self.plan.sample(self.randomness)
            rows, weights = self.units.expand(sample)
            groups = self.units.positions(sample)
            result = self.dp_step.step(
                self.make_batch, rows, weights, self.randomness, on_micro_batch, groups
            )
        else:
            if len(self.order) < self.batch_size:
                self.order += torch.randperm(len(self.units), generator=self.randomness.sampling).tolist()
            chosen, self.order = self.order[: self.batch_size], self.order[self.batch_size :]
            rows, _ = self.units.expand(chosen)
            result = non_private_step(
                self.generator, self.optimizer, self.make_batch, rows, self.physical_batch_size,
                on_micro_batch,
            )  # fmt: skip
        self.step_index += 1
        return result

    def close(self) -> None:
        """Remove the clipping hooks, so the saved model carries none."""
        if self.dp_step is not None:
            self.dp_step.clipper.close()

    def state_dict(self) -> dict:
        """Everything a resumed run needs: trainable weights, optimizer, step, secret randomness.
        Tensors and plain values only, so it loads with ``torch.load(weights_only=True)``."""
        model = self.generator.model
        return {
            "trainable": {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad},
            "optimizer": self.optimizer.state_dict(),
            "step": self.step_index,
            "order": torch.tensor(self.order, dtype=torch.long),
            "randomness": self.randomness.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        parameters = dict(self.generator.model.named_parameters())
        with torch.no_grad():
            for name, value in state["trainable"].items():
                parameters[name].copy_(value)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step_index = int(state["step"])
        self.order = state["order"].tolist()
        self.randomness.load_state_dict(state["randomness"])
