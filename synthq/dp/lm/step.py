"""DP-SGD / DP-Adam for query generators: Poisson sampling, per-example clipping, Gaussian noise.

The per-example clipping engine is chosen by ``grad_sample_mode`` (:func:`make_clipper`); all
engines return the same quantity, the sum of each example's gradient clipped to ``C``, and are
tested against a one-example-at-a-time ground truth for tiny T5 and tiny Llama models:

* ``ghost`` (default through ``auto``; :class:`synthq.dp.lm.hooks.GhostClipper`): Opacus ghost
  clipping. Per-example norms from layer activations and output gradients, then one reweighted
  backward; no per-example gradient is ever materialised. Tied embeddings are handled exactly.
* ``hooks`` (:class:`synthq.dp.lm.hooks.HookClipper`): Opacus ``GradSampleModule`` per-example
  gradients.
* ``vmap`` (:class:`VmapClipper`): ``vmap(grad(loss))`` over a functional call of the whole
  model, exact for any architecture at the highest memory cost.

What breaks Opacus' hooks out of the box on these models — T5's relative attention bias (computed
once and shared by the whole batch), tied input/output embeddings, ``T5LayerNorm`` and
``LlamaRMSNorm`` — is fixed in :mod:`synthq.dp.lm.grad_samplers`; every trainable parameter gets
an exact per-example gradient (or norm) in every mode.

Each logical step follows Abadi et al. (2016), with the engine's rules
(:mod:`synthq.dp.engine`):

1. every query joins the step's batch independently with probability ``q = B / n`` (secret
   randomness), bringing all of its pairs;
2. the batch is processed in physical micro-batches; each pair's gradient ``g_i`` is clipped
   to ``g_i · min(1, C / ||g_i||)``, weighted ``1/k`` (``k`` = its query's pair count) and summed;
3. Gaussian noise ``N(0, σ² C² I)`` is added once to the sum, which is divided by the expected
   batch size ``q n``; the optimizer (Adam, Adafactor or SGD) then uses that gradient, which is
   post-processing.

Privacy unit and sensitivity: :class:`PerQueryClipping` (one query with all its pairs; ``C``).
The loss is reduced per sequence (mean over the query's tokens) *before* clipping, so the unit
really is the pair/query and not a token.

Under ``torchrun`` (:mod:`synthq.runtime.distributed`) every rank draws the same global Poisson batch,
clips its own share, the clipped sums are all-reduced, and every rank adds the same secret noise
once: the update, and so the accounting, is the single-process one.

The loop that drives these steps, DP or not, is :class:`synthq.dp.lm.training.GeneratorTraining`;
the optimizer comes from :func:`synthq.runtime.optim.make_optimizer`.
"""

from __future__ import annotations

import torch

from synthq.dp.clipping import clip_factors
from synthq.dp.engine import PrivacyPlan
from synthq.dp.lm.clippers import make_clipper
from synthq.dp.lm.per_query import PerQueryClipping
from synthq.dp.lm.per_user import USER_CLIPPING, PerUserClipping
from synthq.dp.noise import SecretRandomness
from synthq.models.generator import QueryGenerator
from synthq.models.training_step import (
    MakeBatch,
    MicroBatchProgress,
    StepResult,
    gather_result,
)
from synthq.runtime import distributed


def unit_chunks(groups: list[int], limit: int) -> list[list[int]]:
    """Positions of consecutive rows cut into micro-batches of at most ``limit`` rows that never
    split a unit (``groups``: each row's unit, a unit's rows adjacent); a unit larger than
    ``limit`` is a chunk of its own (the DP step splits it, summing before it clips)."""
    chunks: list[list[int]] = []
    current: list[int] = []
    start = 0
    while start < len(groups):
        end = start
        while end < len(groups) and groups[end] == groups[start]:
            end += 1
        unit = list(range(start, end))
        if current and len(current) + len(unit) > limit:
            chunks.append(current)
            current = []
        current += unit
        start = end
    if current:
        chunks.append(current)
    return chunks


class DPStep:
    """One logical DP step: sampled rows -> weighted clipped sums -> the engine's noise -> optimizer.

    Args:
        generator: the model being trained (trainable parameters = ``requires_grad``).
        optimizer: a torch optimizer over the trainable parameters.
        plan: the :class:`~synthq.dp.engine.PrivacyPlan` (σ, expected batch, and the sensitivity
            ``C`` of :class:`PerQueryClipping`, which is also the clipping norm: C enters once,
            through the mechanism, so the clipper and the accountant cannot disagree).
        physical_batch_size: examples per forward/backward (memory bound).
        grad_sample_mode: ``auto`` | ``ghost`` | ``hooks`` | ``vmap`` (see :func:`make_clipper`);
            all compute the same clipped sum.
        user_clipping: ``per-example`` (each row clipped, weighted ``1/k``:
            :class:`PerQueryClipping`) or ``per-user`` (each unit's weighted sum clipped:
            :class:`PerUserClipping`; a unit's rows share a micro-batch, or, past
            ``physical_batch_size`` rows, are summed over several before the one clip).
    """

    def __init__(
        self,
        generator: QueryGenerator,
        optimizer: torch.optim.Optimizer,
        plan: PrivacyPlan,
        physical_batch_size: int,
        grad_sample_mode: str = "auto",
        user_clipping: str = "per-example",
    ):
        if user_clipping not in USER_CLIPPING:
            raise ValueError(f"user_clipping must be one of {USER_CLIPPING}, not {user_clipping!r}")
        planned = {PerQueryClipping.name: "per-example", PerUserClipping.name: "per-user"}.get(plan.mechanism)
        if planned is not None and planned != user_clipping:  # the recorded rule is the one that runs
            raise ValueError(f"the plan's mechanism clips {planned}, not {user_clipping}")
        self.generator = generator
        self.optimizer = optimizer
        self.plan = plan
        self.physical_batch_size = physical_batch_size
        self.per_user = user_clipping == "per-user"
        self.clipper = make_clipper(generator, plan.sensitivity, grad_sample_mode)
        self.mode = self.clipper.mode
        self.parameters = dict(generator.model.named_parameters())

    def clipped_sum(
        self,
        make_batch: MakeBatch,
        rows: list[int],
        weights: list[float],
        on_micro_batch: MicroBatchProgress | None = None,
        groups: list[int] | None = None,
    ) -> tuple[dict[str, torch.Tensor], StepResult]:
        """``Σ_i w_i clip_C(∇ℓ_i)`` over ``rows``, summed over ranks (no noise yet);
        ``on_micro_batch(done, total)`` after each micro-batch of this rank's share (progress only:
        it sees counts of a secret sample, for the console, never for the artifact). Under
        per-user clipping ``groups`` gives each row's unit (a unit's rows adjacent), and each
        unit's weighted sum is clipped instead (whole units per micro-batch and per rank)."""
        device = next(self.generator.model.parameters()).device
        total: dict[str, torch.Tensor] = {}  # the first micro-batch's sum becomes the total
        losses, norms, tokens, done = [], [], 0, 0
        local, chunks = self._micro_batches(rows, weights, groups, getattr(make_batch, "lengths", None))
        for chunk in chunks:
            if self.per_user and len(chunk) > self.physical_batch_size:  # one unit, too large
                summed, norm, loss, chunk_tokens = self._large_unit_sum(make_batch, chunk, device)
            else:
                summed, norm, loss, chunk_tokens = self._micro_batch_sum(make_batch, chunk, device)
            tokens += chunk_tokens
            for name, value in summed.items():
                total[name] = total[name].add_(value) if name in total else value
            losses.append(loss.detach())
            norms.append(norm.detach())
            done += len(chunk)
            if on_micro_batch is not None:
                on_micro_batch(done, len(local))
        total = {  # zeros where this rank's share was empty
            name: total[name] if name in total else torch.zeros_like(self.parameters[name])
            for name in self.clipper.names
        }
        distributed.all_reduce_sum(list(total.values()))
        return total, gather_result(len(rows), losses, norms, tokens)

    def _micro_batch_sum(self, make_batch: MakeBatch, chunk: list[tuple], device) -> tuple:
        """One micro-batch through the clipper: whole units, each clipped (or each row)."""
        batch = {k: v.to(device) for k, v in make_batch([row for row, _, _ in chunk]).items()}
        weights = torch.tensor([w for _, w, _ in chunk], device=device)
        groups = None
        if self.per_user:
            groups = torch.unique(torch.tensor([g for _, _, g in chunk]), return_inverse=True)[1].to(device)
        summed, norms, losses = self.clipper.clipped_sum(batch, weights, groups)
        return summed, norms, losses, int((batch["labels"] != -100).sum())

    def _large_unit_sum(self, make_batch: MakeBatch, unit: list[tuple], device) -> tuple:
        """One unit with more rows than a micro-batch holds (per-user clipping): its weighted
        gradient ``G_u = Σ_{i∈u} w_i ∇ℓ_i`` accumulated unclipped over micro-batches of its
        rows, then clipped once — ``min(1, C/‖G_u‖) · G_u``, the clipper's own per-unit result,
        with one micro-batch's activations in memory. Clipping each part instead would let the
        unit move the sum by up to parts × C."""
        total: dict[str, torch.Tensor] = {}
        losses, tokens = [], 0
        for start in range(0, len(unit), self.physical_batch_size):
            part = unit[start : start + self.physical_batch_size]
            batch = {k: v.to(device) for k, v in make_batch([row for row, _, _ in part]).items()}
            weights = torch.tensor([w for _, w, _ in part], device=device)
            gradient, loss = self.clipper.unclipped_sum(batch, weights)
            for name, value in gradient.items():
                total[name] = total[name].add_(value.float()) if name in total else value.float()
            losses.append(loss)
            tokens += int((batch["labels"] != -100).sum())
        norm = torch.sqrt(sum(value.pow(2).sum() for value in total.values())).view(1)
        factor = clip_factors(norm, self.clipper.clip_norm)
        return {name: value * factor for name, value in total.items()}, norm, torch.cat(losses), tokens

    def _micro_batches(
        self,
        rows: list[int],
        weights: list[float],
        groups: list[int] | None,
        lengths: list[int] | None = None,
    ) -> tuple[list[tuple], list[list[tuple]]]:
        """This rank's ``(row, weight, unit)`` items and their micro-batches. Per-user clipping
        sorts a unit's rows together, gives every rank whole units and never splits a unit between
        two chunks; a unit larger than a micro-batch is a chunk of its own, which
        :meth:`_large_unit_sum` sums in parts before it clips (a unit clipped in parts would move
        the sum by up to parts × C). With ``lengths`` (each row's tokens, where ``make_batch``
        tells them: query-only rows, whose lengths vary by a factor of several) rows of similar
        length share a micro-batch (less padding): each example's clipped gradient is the same in
        any micro-batch, so the sum is too."""
        if self.per_user and groups is None:
            raise ValueError("per-user clipping needs each row's unit (groups)")
        items = list(zip(rows, weights, groups if self.per_user else [0] * len(rows), strict=True))
        size = self.physical_batch_size
        if not self.per_user:
            local = distributed.shard(items)
            if lengths is not None:
                local = sorted(local, key=lambda item: lengths[item[0]])
            return local, [local[s : s + size] for s in range(0, len(local), size)]
        items.sort(key=lambda item: item[2])
        units = [[items[i] for i in unit] for unit in unit_chunks([g for _, _, g in items], 1)]
        if lengths is not None:  # the same order on every rank: whole units still shard alike
            units.sort(key=lambda unit: max(lengths[row] for row, _, _ in unit))
        local = [item for unit in distributed.shard(units) for item in unit]
        return local, [[local[i] for i in chunk] for chunk in unit_chunks([g for _, _, g in local], size)]

    def step(
        self,
        make_batch: MakeBatch,
        rows: list[int],
        weights: list[float],
        randomness: SecretRandomness,
        on_micro_batch: MicroBatchProgress | None = None,
        groups: list[int] | None = None,
    ) -> StepResult:
        summed, result = self.clipped_sum(make_batch, rows, weights, on_micro_batch, groups)
        # The same secret noise on every rank, added once to the global sum.
        noisy = self.plan.privatize(list(summed.values()), randomness)
        for name, value in zip(summed, noisy, strict=True):
            self.parameters[name].grad = value
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return result
