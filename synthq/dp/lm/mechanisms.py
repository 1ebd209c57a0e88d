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
from torch.func import functional_call, grad_and_value, vmap

from synthq.dp.clipping import clip_and_sum, clip_factors
from synthq.dp.engine import Mechanism, PrivacyPlan, register_mechanism
from synthq.dp.noise import SecretRandomness
from synthq.models.generator import QueryGenerator
from synthq.models.sequence_loss import label_window, model_inputs, per_sequence_loss
from synthq.models.training_step import (
    MakeBatch,
    MicroBatchProgress,
    StepResult,
    gather_result,
    weighted_loss_gradient,
)
from synthq.runtime import distributed
from synthq.runtime.precision import forward_autocast


def prepare_model_for_per_sample_gradients(generator: QueryGenerator) -> None:
    """Eager attention: the SDPA mask helpers read mask values, which ``vmap`` cannot trace."""
    if hasattr(generator.model, "set_attn_implementation"):
        generator.model.set_attn_implementation("eager")


class PerSampleGradients:
    """Exact per-example gradients of the per-sequence loss for a generator's trainable parameters."""

    def __init__(self, generator: QueryGenerator):
        self.generator = generator
        self.model = generator.model
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        self.window = 0

    def _loss(self, params: dict, example: dict) -> torch.Tensor:
        batch = {k: v.unsqueeze(0) for k, v in example.items()}
        inputs = model_inputs(self.generator.kind, batch, traceable=True, window=self.window)
        with forward_autocast():
            logits = functional_call(self.model, params, args=(), kwargs=inputs, strict=False).logits
        return per_sequence_loss(self.generator.kind, logits, batch["labels"])[0]

    def __call__(self, batch: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Per-example gradients ``{name: [b, *shape]}`` and the per-example losses ``[b]``."""
        trainable = set(self.names)
        params = {n: p.detach() for n, p in self.model.named_parameters() if n in trainable}
        self.window = label_window(self.generator.kind, batch["labels"])
        per_example = vmap(grad_and_value(self._loss), in_dims=(None, 0), randomness="different")
        grads, losses = per_example(params, batch)
        return grads, losses.detach()


class VmapClipper:
    """Exact per-example gradients from :class:`PerSampleGradients`, clipped and summed
    (``vmap`` mode: works for any architecture; memory grows with ``b ×`` trainable parameters)."""

    mode = "vmap"

    def __init__(self, generator: QueryGenerator, clip_norm: float):
        prepare_model_for_per_sample_gradients(generator)
        self.per_sample = PerSampleGradients(generator)
        self.names = self.per_sample.names
        self.clip_norm = clip_norm

    def clipped_sum(
        self, batch: dict, weights: torch.Tensor | None = None, groups: torch.Tensor | None = None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        per_example, losses = self.per_sample(batch)
        summed, norms = clip_and_sum(per_example, self.clip_norm, weights, groups)
        return summed, norms, losses

    def unclipped_sum(
        self, batch: dict, weights: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``Σ_i w_i ∇ℓ_i`` by ordinary autograd (part of one unit too large for a micro-batch)."""
        return weighted_loss_gradient(self.per_sample.generator, batch, weights)

    def close(self) -> None:
        """Nothing to undo: ``vmap`` leaves no hooks on the model."""


GRAD_SAMPLE_MODES = ("auto", "ghost", "hooks", "vmap")


def choose_grad_sample_mode(generator: QueryGenerator, requested: str = "auto") -> str:
    """``auto``: ghost clipping when every shared parameter is a plain Linear/Embedding weight
    (true for T5 and Llama-style models, tied or not), else exact ``vmap``."""
    if requested not in GRAD_SAMPLE_MODES:
        raise ValueError(f"grad_sample_mode must be one of {GRAD_SAMPLE_MODES}, not {requested!r}")
    if requested != "auto":
        return requested
    from synthq.dp.lm.ghost import unsupported_for_ghost

    return "vmap" if unsupported_for_ghost(generator.model) else "ghost"


def make_clipper(generator: QueryGenerator, clip_norm: float, mode: str = "auto"):
    """The per-example clipping engine for ``mode`` (see :func:`choose_grad_sample_mode`)."""
    mode = choose_grad_sample_mode(generator, mode)
    if mode == "vmap":
        return VmapClipper(generator, clip_norm)
    from synthq.dp.lm.hooks import GhostClipper, HookClipper

    return (GhostClipper if mode == "ghost" else HookClipper)(generator, clip_norm)


@register_mechanism("per-query")
class PerQueryClipping(Mechanism):
    """DP-SGD / DP-Adam for a query generator: every training pair's gradient clipped, a query's
    pairs weighted so that the whole query contributes at most ``C``.

    Args:
        clip_norm: ``C``.

    Requirements:
        The loss is reduced per sequence (one value per pair) *before* clipping, so each pair's
        gradient is a function of that pair alone.

    Inputs:
        A Poisson sample of queries (:class:`~synthq.dp.privacy_units.PrivacyUnits`) expanded to their
        pairs, each with weight ``1/k`` (``k`` = the query's pair count).

    Privacy unit:
        One query id with all of its (document, query) pairs, add/remove adjacency; or, under
        ``--privacy-unit user``, one user with all the pairs of their (at most K) kept queries
        (:meth:`~synthq.dp.privacy_units.PrivacyUnits.by_user`): the same proof with ``k`` = the user's
        pair count, since every pair's loss reads only that pair.

    Sensitivity:
        ``C``. The released sum is ``Σ_i w_i · clip_C(∇ℓ_i)``. Adding or removing a query adds
        or removes its ``k`` terms, each of norm ≤ ``C/k``, and changes no other term (pair
        ``j``'s loss reads only pair ``j``): together ≤ ``C``. With one pair per query this is
        the usual per-example clipping of Abadi et al.

    References:
        Abadi et al., "Deep learning with differential privacy" (2016); Carranza et al., section 4.
    """

    sensitivity_rule = "C: a query's k pairs are clipped to C and weighted 1/k, together ≤ C"

    def __init__(self, clip_norm: float):
        self.clip_norm = clip_norm

    def sensitivity(self, batch_cap: int | None) -> float:
        return self.clip_norm


USER_CLIPPING = ("per-example", "per-user")


@register_mechanism("per-user")
class PerUserClipping(Mechanism):
    """DP-SGD / DP-Adam for a query generator at the user level, clipping each user's *combined*
    gradient (user-level sampling with per-user clipping, "ULS" in Charles et al.).

    Args:
        clip_norm: ``C``.

    Inputs:
        A Poisson sample of users (:meth:`~synthq.dp.privacy_units.PrivacyUnits.by_user`), each brought
        whole into one micro-batch with its rows weighted ``1/k``.

    Privacy unit:
        One user with all the pairs of their (at most K) kept queries, add/remove adjacency.

    Sensitivity:
        ``C``. The released sum is ``Σ_u min(1, C/‖G_u‖) G_u`` with
        ``G_u = Σ_{i∈u} w_i ∇ℓ_i``: adding or removing a user adds or removes one term of norm
        ≤ ``C`` and changes no other (pair ``j``'s loss reads only pair ``j``, and a user's
        factor reads only their own rows). Unlike per-example clipping weighted ``1/k``
        (:class:`PerQueryClipping`), a user whose rows agree keeps up to ``C`` of signal instead
        of ``C/k`` per row, and rows that disagree can cancel before the clip.

    References:
        Charles et al., "Fine-tuning large language models with user-level differential privacy"
        (2024); Chua et al., "Mind the privacy unit!" (2024).
    """

    sensitivity_rule = "C: a user's rows are summed (weighted 1/k) and the sum clipped to C"

    def __init__(self, clip_norm: float):
        self.clip_norm = clip_norm

    def sensitivity(self, batch_cap: int | None) -> float:
        return self.clip_norm


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
        local, chunks = self._micro_batches(rows, weights, groups)
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
        self, rows: list[int], weights: list[float], groups: list[int] | None
    ) -> tuple[list[tuple], list[list[tuple]]]:
        """This rank's ``(row, weight, unit)`` items and their micro-batches. Per-user clipping
        sorts a unit's rows together, gives every rank whole units and never splits a unit between
        two chunks; a unit larger than a micro-batch is a chunk of its own, which
        :meth:`_large_unit_sum` sums in parts before it clips (a unit clipped in parts would move
        the sum by up to parts × C)."""
        if self.per_user and groups is None:
            raise ValueError("per-user clipping needs each row's unit (groups)")
        items = list(zip(rows, weights, groups if self.per_user else [0] * len(rows), strict=True))
        size = self.physical_batch_size
        if not self.per_user:
            local = distributed.shard(items)
            return local, [local[s : s + size] for s in range(0, len(local), size)]
        items.sort(key=lambda item: item[2])
        units = [[items[i] for i in unit] for unit in unit_chunks([g for _, _, g in items], 1)]
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
