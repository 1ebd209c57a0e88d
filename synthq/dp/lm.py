"""DP-SGD / DP-Adam for query generators: Poisson sampling, per-example clipping, Gaussian noise.

The per-example clipping engine is chosen by ``grad_sample_mode`` (:func:`make_clipper`); all
engines return the same quantity, the sum of each example's gradient clipped to ``C``, and are
tested against a one-example-at-a-time ground truth for tiny T5 and tiny Llama models:

* ``ghost`` (default through ``auto``; :class:`synthq.dp.lm_hooks.GhostClipper`): Opacus ghost
  clipping. Per-example norms from layer activations and output gradients, then one reweighted
  backward; no per-example gradient is ever materialised. Tied embeddings are handled exactly.
* ``hooks`` (:class:`synthq.dp.lm_hooks.HookClipper`): Opacus ``GradSampleModule`` per-example
  gradients.
* ``vmap`` (:class:`VmapClipper`): ``vmap(grad(loss))`` over a functional call of the whole
  model, exact for any architecture at the highest memory cost.

What breaks Opacus' hooks out of the box on these models — T5's relative attention bias (computed
once and shared by the whole batch), tied input/output embeddings, ``T5LayerNorm`` and
``LlamaRMSNorm`` — is fixed in :mod:`synthq.dp.lm_grad_samplers`; every trainable parameter gets
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
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.func import functional_call, grad_and_value, vmap

from synthq.dp.clipping import clip_and_sum
from synthq.dp.engine import Mechanism, PrivacyPlan, PrivacyUnits, SecretRandomness, register_mechanism
from synthq.models.generator import QueryGenerator
from synthq.models.sequence_loss import label_window, model_inputs, per_sequence_loss
from synthq.runtime import distributed
from synthq.runtime.optim import adam


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
        self, batch: dict, weights: torch.Tensor | None = None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        per_example, losses = self.per_sample(batch)
        summed, norms = clip_and_sum(per_example, self.clip_norm, weights)
        return summed, norms, losses

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
    from synthq.dp.lm_hooks import unsupported_for_ghost

    return "vmap" if unsupported_for_ghost(generator.model) else "ghost"


def make_clipper(generator: QueryGenerator, clip_norm: float, mode: str = "auto"):
    """The per-example clipping engine for ``mode`` (see :func:`choose_grad_sample_mode`)."""
    mode = choose_grad_sample_mode(generator, mode)
    if mode == "vmap":
        return VmapClipper(generator, clip_norm)
    from synthq.dp.lm_hooks import GhostClipper, HookClipper

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
        A Poisson sample of queries (:class:`~synthq.dp.engine.PrivacyUnits`) expanded to their
        pairs, each with weight ``1/k`` (``k`` = the query's pair count).

    Privacy unit:
        One query id with all of its (document, query) pairs, add/remove adjacency; or, under
        ``--privacy-unit user``, one user with all the pairs of their (at most K) kept queries
        (:meth:`~synthq.dp.engine.PrivacyUnits.by_user`): the same proof with ``k`` = the user's
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


@dataclass
class DPStepResult:
    loss: float
    examples: int
    tokens: int
    mean_grad_norm: float


MakeBatch = Callable[[list[int]], dict]


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
    """

    def __init__(
        self,
        generator: QueryGenerator,
        optimizer: torch.optim.Optimizer,
        plan: PrivacyPlan,
        physical_batch_size: int,
        grad_sample_mode: str = "auto",
    ):
        self.generator = generator
        self.optimizer = optimizer
        self.plan = plan
        self.physical_batch_size = physical_batch_size
        self.clipper = make_clipper(generator, plan.sensitivity, grad_sample_mode)
        self.mode = self.clipper.mode
        self.parameters = dict(generator.model.named_parameters())

    def clipped_sum(
        self, make_batch: MakeBatch, rows: list[int], weights: list[float]
    ) -> tuple[dict[str, torch.Tensor], DPStepResult]:
        """``Σ_i w_i clip_C(∇ℓ_i)`` over ``rows``, summed over ranks (no noise yet)."""
        device = next(self.generator.model.parameters()).device
        total: dict[str, torch.Tensor] = {}  # the first micro-batch's sum becomes the total
        losses, norms, tokens = [], [], 0
        local = distributed.shard(list(zip(rows, weights, strict=True)))  # this rank's share
        for start in range(0, len(local), self.physical_batch_size):
            chunk = local[start : start + self.physical_batch_size]
            batch = {k: v.to(device) for k, v in make_batch([row for row, _ in chunk]).items()}
            tokens += int((batch["labels"] != -100).sum())
            chunk_weights = torch.tensor([w for _, w in chunk], device=device)
            summed, norm, loss = self.clipper.clipped_sum(batch, chunk_weights)
            for name, value in summed.items():
                total[name] = total[name].add_(value) if name in total else value
            losses.append(loss.detach())
            norms.append(norm.detach())
        total = {  # zeros where this rank's share was empty
            name: total[name] if name in total else torch.zeros_like(self.parameters[name])
            for name in self.clipper.names
        }
        distributed.all_reduce_sum(list(total.values()))
        return total, _step_result(len(rows), losses, norms, tokens)

    def step(
        self, make_batch: MakeBatch, rows: list[int], weights: list[float], randomness: SecretRandomness
    ) -> DPStepResult:
        summed, result = self.clipped_sum(make_batch, rows, weights)
        # The same secret noise on every rank, added once to the global sum.
        noisy = self.plan.privatize(list(summed.values()), randomness)
        for name, value in zip(summed, noisy, strict=True):
            self.parameters[name].grad = value
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return result


def non_private_step(
    generator: QueryGenerator,
    optimizer: torch.optim.Optimizer,
    make_batch: MakeBatch,
    indices: list[int],
    physical_batch_size: int,
) -> DPStepResult:
    """The ε = ∞ step: the same per-sequence loss, averaged over the batch, no clipping or noise.
    Under torchrun each rank takes its share of ``indices`` and the gradients are summed."""
    device = next(generator.model.parameters()).device
    losses, tokens = [], 0
    local = distributed.shard(indices)
    for start in range(0, len(local), physical_batch_size):
        chunk = local[start : start + physical_batch_size]
        batch = {k: v.to(device) for k, v in make_batch(chunk).items()}
        tokens += int((batch["labels"] != -100).sum())
        logits = generator.model(**model_inputs(generator.kind, batch)).logits
        loss = per_sequence_loss(generator.kind, logits, batch["labels"])
        (loss.sum() / len(indices)).backward()
        losses.append(loss.detach())
    trainable = [p for p in generator.model.parameters() if p.requires_grad]
    for parameter in trainable:
        if parameter.grad is None:  # a rank whose share was empty
            parameter.grad = torch.zeros_like(parameter)
    distributed.all_reduce_sum([p.grad for p in trainable])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return _step_result(len(indices), losses, [], tokens)


def _step_result(
    examples: int, losses: list[torch.Tensor], norms: list[torch.Tensor], tokens: int
) -> DPStepResult:
    """Losses, gradient norms and tokens of every rank's share, gathered in one collective."""
    mine = (
        torch.cat(losses).tolist() if losses else [],
        torch.cat(norms).tolist() if norms else [],
        tokens,
    )
    shares = distributed.gather_objects(mine)
    all_losses = [value for share in shares for value in share[0]]
    all_norms = [value for share in shares for value in share[1]]
    return DPStepResult(
        loss=sum(all_losses) / len(all_losses) if all_losses else math.nan,
        examples=examples,
        tokens=sum(share[2] for share in shares),
        mean_grad_norm=sum(all_norms) / len(all_norms) if all_norms else math.nan,
    )


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
        physical_batch_size, grad_sample_mode: as for :class:`DPStep`.
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
    ):
        self.generator, self.optimizer, self.make_batch = generator, optimizer, make_batch
        self.units, self.batch_size, self.plan, self.randomness = units, batch_size, plan, randomness
        self.physical_batch_size = physical_batch_size
        self.dp_step = (
            DPStep(generator, optimizer, plan, physical_batch_size, grad_sample_mode)
            if plan is not None
            else None
        )
        self.order: list[int] = []
        self.step_index = 0

    @property
    def mode(self) -> str | None:
        return self.dp_step.mode if self.dp_step is not None else None

    def step(self) -> DPStepResult:
        if self.plan is not None:
            rows, weights = self.units.expand(self.plan.sample(self.randomness))
            result = self.dp_step.step(self.make_batch, rows, weights, self.randomness)
        else:
            if len(self.order) < self.batch_size:
                self.order += torch.randperm(len(self.units), generator=self.randomness.sampling).tolist()
            chosen, self.order = self.order[: self.batch_size], self.order[self.batch_size :]
            rows, _ = self.units.expand(chosen)
            result = non_private_step(
                self.generator, self.optimizer, self.make_batch, rows, self.physical_batch_size
            )
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


def make_optimizer(
    name: str, parameters: list[torch.nn.Parameter], lr: float, weight_decay: float
) -> torch.optim.Optimizer:
    """``adam`` (the paper's DP-Adam), ``adafactor`` or ``sgd`` over ``parameters``."""
    if name == "adam":
        return adam(parameters, lr=lr, weight_decay=weight_decay)
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
    return torch.optim.SGD(parameters, lr=lr, weight_decay=weight_decay)
