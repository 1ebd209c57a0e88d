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

Each logical step follows Abadi et al. (2016) with Poisson sampling:

1. every training pair joins the step's batch independently with probability ``q = B / n``;
2. the batch is processed in physical micro-batches; each example's gradient ``g_i`` is clipped
   to ``g_i · min(1, C / ||g_i||)`` and the clipped gradients are summed;
3. Gaussian noise ``N(0, σ² C² I)`` is added once to the sum, which is divided by the expected
   batch size ``q n``; the optimizer (Adam, Adafactor or SGD) then uses that gradient, which is
   post-processing.

Privacy unit: one training pair (document, query). Adding or removing a pair changes the
clipped sum by at most ``C`` (its own clipped gradient; the loss of every other pair does not
depend on it), so the sensitivity is ``C`` and the accountant's noise multiplier is ``σ``.
The loss is reduced per sequence (mean over the query's tokens) *before* clipping, so the unit
really is the pair and not a token. Protecting the pair implies protecting its query.

Under ``torchrun`` (:mod:`synthq.distributed`) every rank draws the same global Poisson batch,
clips its own share, the clipped sums are all-reduced, and every rank adds the same seeded noise
once: the update, and so the accounting, is the single-process one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.func import functional_call, grad_and_value, vmap

from synthq import distributed
from synthq.models.generator import QueryGenerator


def label_window(kind: str, labels: torch.Tensor) -> int:
    """How many final positions of a causal batch need logits: the query tokens sit at the end of
    left-padded rows, so the model's vocabulary projection (a fifth of SmolLM2's compute at
    ~100-token prompts) can skip the prompt. 0 (= all positions) for seq2seq models."""
    if kind != "causal":
        return 0
    columns = torch.nonzero((labels != -100).any(0)).flatten()
    return int(labels.shape[1] - columns[0]) + 1 if len(columns) else 0


def per_sequence_loss(kind: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of each sequence's label tokens (one value per row).

    ``logits`` may cover only the last positions (``logits_to_keep``); labels are aligned to
    them."""
    if kind == "causal":
        labels = labels[:, labels.shape[1] - logits.shape[1] :]
        logits, labels = logits[:, :-1], labels[:, 1:]
    mask = labels != -100
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    picked = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def model_inputs(
    kind: str, batch: dict[str, torch.Tensor], traceable: bool = False, window: int | None = None
) -> dict[str, torch.Tensor]:
    """Forward-pass inputs for a training batch.

    Seq2seq models also get the labels (the model shifts them into decoder inputs). With
    ``traceable`` (inside ``vmap``), T5's padding mask becomes a 4-D additive mask: transformers
    returns such masks as-is instead of inspecting their values, which ``vmap`` cannot trace."""
    inputs = {k: v for k, v in batch.items() if k != "labels" or kind == "seq2seq"}
    if kind == "causal":  # inside vmap the window must be given: it is computed from data
        inputs["logits_to_keep"] = label_window(kind, batch["labels"]) if window is None else window
    if kind == "seq2seq" and traceable:
        mask = inputs["attention_mask"]
        inputs["attention_mask"] = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    return inputs


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

    def clipped_sum(self, batch: dict) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        per_example, losses = self.per_sample(batch)
        summed, norms = clip_and_sum(per_example, self.clip_norm)
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


def clip_and_sum(
    per_sample: dict[str, torch.Tensor], clip_norm: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Clip each example's whole gradient (all parameters together) to ``clip_norm`` and sum.

    Returns the summed clipped gradients and the per-example norms before clipping."""
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per_sample.values()))
    factors = (clip_norm / (norms + 1e-6)).clamp(max=1.0)
    summed = {name: torch.einsum("b,b...->...", factors, g) for name, g in per_sample.items()}
    return summed, norms


@dataclass
class DPStepResult:
    loss: float
    examples: int
    tokens: int
    mean_grad_norm: float


class DPStep:
    """One logical DP step: Poisson-sampled batch -> clipped per-example sums -> noise -> optimizer.

    Args:
        generator: the model being trained (trainable parameters = ``requires_grad``).
        optimizer: a torch optimizer over the trainable parameters.
        clip_norm: ``C``.
        noise_multiplier: ``σ``; the noise standard deviation is ``σ · C``.
        expected_batch_size: ``q · n``, the divisor of the noisy sum.
        physical_batch_size: examples per forward/backward (memory bound).
        grad_sample_mode: ``auto`` | ``ghost`` | ``hooks`` | ``vmap`` (see :func:`make_clipper`);
            all compute the same clipped sum.
    """

    def __init__(
        self,
        generator: QueryGenerator,
        optimizer: torch.optim.Optimizer,
        clip_norm: float,
        noise_multiplier: float,
        expected_batch_size: float,
        physical_batch_size: int,
        grad_sample_mode: str = "vmap",
    ):
        self.generator = generator
        self.optimizer = optimizer
        self.clip_norm = clip_norm
        self.noise_multiplier = noise_multiplier
        self.expected_batch_size = expected_batch_size
        self.physical_batch_size = physical_batch_size
        self.clipper = make_clipper(generator, clip_norm, grad_sample_mode)
        self.mode = self.clipper.mode
        self.parameters = dict(generator.model.named_parameters())

    def noisy_gradient(
        self, make_batch: Callable[[list[int]], dict], indices: list[int], noise_generator: torch.Generator
    ) -> tuple[dict[str, torch.Tensor], DPStepResult]:
        """The privatised gradient for the examples ``indices`` (already Poisson-sampled)."""
        device = next(self.generator.model.parameters()).device
        total = {n: torch.zeros_like(self.parameters[n]) for n in self.clipper.names}
        losses, norms, tokens = [], [], 0
        local = distributed.shard(indices)  # this rank's share of the global Poisson batch
        for start in range(0, len(local), self.physical_batch_size):
            chunk = local[start : start + self.physical_batch_size]
            batch = {k: v.to(device) for k, v in make_batch(chunk).items()}
            tokens += int((batch["labels"] != -100).sum())
            summed, norm, loss = self.clipper.clipped_sum(batch)
            for name, value in summed.items():
                total[name] += value
            losses.append(loss.detach())
            norms.append(norm.detach())
        # Clipped sums from every rank; then the same seeded noise on every rank, added once.
        distributed.all_reduce_sum(list(total.values()))
        std = self.noise_multiplier * self.clip_norm
        for name, value in total.items():
            noise = torch.normal(0.0, std, size=value.shape, generator=noise_generator).to(value.device)
            total[name] = (value + noise) / self.expected_batch_size
        return total, _step_result(len(indices), losses, norms, tokens)

    def step(
        self, make_batch: Callable[[list[int]], dict], indices: list[int], noise_generator: torch.Generator
    ) -> DPStepResult:
        gradient, result = self.noisy_gradient(make_batch, indices, noise_generator)
        for name, value in gradient.items():
            self.parameters[name].grad = value
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return result


def non_private_step(
    generator: QueryGenerator,
    optimizer: torch.optim.Optimizer,
    make_batch: Callable[[list[int]], dict],
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


def poisson_batch(num_examples: int, sample_rate: float, generator: torch.Generator) -> list[int]:
    """Indices of one Poisson-sampled batch: each example independently with probability ``q``."""
    return torch.nonzero(torch.rand(num_examples, generator=generator) < sample_rate).flatten().tolist()
