"""Direct DP training of dual encoders with the in-batch softmax loss: the paper's baselines.

Each mechanism turns one Poisson-sampled batch of (query, document) pairs into a clipped
gradient sum whose ℓ2 sensitivity it states; :func:`privatize` then adds Gaussian noise with
standard deviation ``σ × sensitivity``, where σ comes from the accountant for the sampling rate
and step count. The privacy unit is one pair (which protects its query).

The three mechanisms differ in what they clip, which decides the sensitivity (see Wang et al.,
"DP-GCL", section 2.3, and Carranza et al., section 5.3.2):

* :class:`SampleClipping` — per-query clipping (the paper's DP-SGD baseline): ``(2B + 1)C``.
* :class:`BatchClipping` — clip the whole batch gradient (DP-CLIP / "Naive-DP"): ``2C``.
* :class:`GroupClipping` — DP-GCL: groups with in-group negatives, each group clipped: ``2C``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from scipy import stats

from synthq.models.encoder import in_batch_softmax_loss

Encode = Callable[[list[str], str], torch.Tensor]  # (texts, "query"|"doc") -> normalised embeddings


@dataclass(frozen=True)
class Example:
    query: str
    document: str
    doc_id: str
    index: int = 0  # position in the training set: keys the example's own random draws


def _gradient(
    loss: torch.Tensor, parameters: list[torch.nn.Parameter], retain_graph: bool = False
) -> list[torch.Tensor]:
    grads = torch.autograd.grad(loss, parameters, retain_graph=retain_graph, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(grads, parameters, strict=True)]


def _norm(vectors: list[torch.Tensor]) -> torch.Tensor:
    return torch.sqrt(sum(v.pow(2).sum() for v in vectors))


def clip(vectors: list[torch.Tensor], clip_norm: float) -> list[torch.Tensor]:
    factor = min(1.0, clip_norm / (float(_norm(vectors)) + 1e-12))
    return [v * factor for v in vectors]


def _add(total: list[torch.Tensor], part: list[torch.Tensor]) -> None:
    for t, p in zip(total, part, strict=True):
        t.add_(p)


class BatchClipping:
    """DP-CLIP (Huang et al., 2024): clip the gradient of the whole batch's summed loss.

    Args:
        clip_norm: ``C``, the bound on the batch gradient's norm.
        temperature: softmax temperature on cosine similarity.

    Privacy unit:
        One (query, document) pair, add/remove adjacency under Poisson sampling.

    Sensitivity:
        ``2C``. The released quantity is ``clip(∇ Σ_i L_i)``: with or without one pair it is a
        vector of norm ≤ C, so the two differ by at most ``2C`` however the other losses move.

    Recommendations:
        Cheap (one backward pass) and low noise, but clipping the batch as one vector loses the
        gradient accumulation of larger batches.

    References:
        Huang et al., "Safeguarding data in multimodal AI: a differentially private approach to
        CLIP training" (DP-CLIP); Wang et al., DP-GCL, eq. (7).
    """

    name = "batch"

    def __init__(self, clip_norm: float, temperature: float):
        self.clip_norm = clip_norm
        self.temperature = temperature

    def sensitivity(self, max_batch_size: int) -> float:
        return 2 * self.clip_norm

    def clipped_sum(
        self, encode: Encode, batch: list[Example], parameters: list
    ) -> tuple[list[torch.Tensor], float]:
        if not batch:
            return [torch.zeros_like(p) for p in parameters], math.nan
        queries = encode([e.query for e in batch], "query")
        docs = encode([e.document for e in batch], "doc")
        loss = in_batch_softmax_loss(queries, docs, self.temperature, [e.doc_id for e in batch], "sum")
        return clip(_gradient(loss, parameters), self.clip_norm), loss.item() / len(batch)


def augment(text: str, rng: random.Random, drop: float = 0.2) -> str:
    """A meaning-preserving perturbation: drop ~20% of words and swap one adjacent pair."""
    words = text.split()
    kept = [w for w in words if rng.random() >= drop] or words[:1]
    if len(kept) > 2:
        i = rng.randrange(len(kept) - 1)
        kept[i], kept[i + 1] = kept[i + 1], kept[i]
    return " ".join(kept)


class GroupClipping:
    """DP-GCL (Wang et al.): in-group negatives, one clipped gradient per group.

    Each sampled pair is assigned to one of ``K = ⌈B / S⌉`` groups by its *own* random draw
    (independent of the other pairs), every group's loss uses only the group's documents plus
    ``aug_negatives`` augmented copies of each of them (intra-group sample augmentation,
    eq. 12), and each group's gradient is clipped to ``C`` before summing. A group's forward and
    backward pass touch only its own members, so a step costs about one ordinary batch pass.

    Args:
        clip_norm: ``C`` per group.
        temperature: softmax temperature.
        group_size: ``S``, the expected group size.
        expected_batch_size: ``B = q·n`` (sets the number of groups).
        aug_negatives: ``N_a`` augmented negatives per group document.
        seed: seeds group assignment and augmentation.

    Privacy unit:
        One (query, document) pair, add/remove adjacency under Poisson sampling.

    Sensitivity:
        ``2C``. Group membership of every other pair does not depend on whether a given pair is
        present, so adding or removing it changes exactly one group's input; that group's
        clipped gradient moves from one vector of norm ≤ C to another (or to nothing).
        Augmented negatives are functions of the group's own data, so they change nothing.

    References:
        Wang et al., "DP-GCL: group-level clipping for differentially private contrastive
        learning", Algorithm 1.
    """

    name = "group"

    def __init__(
        self,
        clip_norm: float,
        temperature: float,
        group_size: int,
        expected_batch_size: float,
        aug_negatives: int = 0,
        seed: int = 0,
    ):
        self.clip_norm = clip_norm
        self.temperature = temperature
        self.num_groups = max(1, math.ceil(expected_batch_size / group_size))
        self.aug_negatives = aug_negatives
        self.seed = seed
        self.step = 0

    def _draw(self, *key: int) -> random.Random:
        # Every random choice is keyed by (seed, step, own key), never by a shared stream, so no
        # pair's presence can change another pair's group or another group's augmentations.
        return random.Random(hash((self.seed, self.step, *key)))

    def sensitivity(self, max_batch_size: int) -> float:
        return 2 * self.clip_norm

    def groups(self, batch: list[Example]) -> dict[int, list[Example]]:
        assignment: dict[int, list[Example]] = {}
        for example in batch:
            group = self._draw(0, example.index).randrange(self.num_groups)
            assignment.setdefault(group, []).append(example)
        return dict(sorted(assignment.items()))

    def clipped_sum(
        self, encode: Encode, batch: list[Example], parameters: list
    ) -> tuple[list[torch.Tensor], float]:
        total = [torch.zeros_like(p) for p in parameters]
        losses = []
        groups = self.groups(batch)
        for key, group in groups.items():
            queries = encode([e.query for e in group], "query")
            documents = [e.document for e in group]
            rng = self._draw(1, key)
            documents += [augment(d, rng) for d in documents for _ in range(self.aug_negatives)]
            docs = encode(documents, "doc")
            loss = in_batch_softmax_loss(queries, docs, self.temperature, [e.doc_id for e in group], "sum")
            _add(total, clip(_gradient(loss, parameters), self.clip_norm))
            losses.append(loss.item() / len(group))
        self.step += 1
        return total, (sum(losses) / len(losses)) if losses else math.nan


class SampleClipping:
    """Per-query DP-SGD through in-batch negatives (the paper's baseline, section 5.3.2).

    Each query's loss ``L_i`` is differentiated with respect to all parameters (through its own
    embedding *and* every document of the batch), clipped to ``C``, and summed.

    Args:
        clip_norm: ``C`` per query.
        temperature: softmax temperature.

    Privacy unit:
        One (query, document) pair.

    Sensitivity:
        ``(2B + 1)C`` for batches of at most ``B`` pairs (Wang et al., DP-GCL, section 2.3.1):
        adding or removing one pair adds or removes its own clipped term (≤ C), and because its
        document is a negative of every other query, each of the other ≤ B clipped terms can
        move by up to 2C. Poisson batches are unbounded, so ``B`` is a cap ``B_max`` chosen
        where ``P(|batch| > B_max)`` over all steps is below 10⁻¹⁰ (added to δ); a rarer larger
        batch is cut to ``B_max``.

    Recommendations:
        The noise grows linearly with the batch, which is why direct DP retrieval training works
        badly. The cost is one backward pass per query: about ``B×`` a non-private step.
    """

    name = "sample"

    def __init__(self, clip_norm: float, temperature: float):
        self.clip_norm = clip_norm
        self.temperature = temperature

    def sensitivity(self, max_batch_size: int) -> float:
        return (2 * max_batch_size + 1) * self.clip_norm

    def per_example_gradients(
        self, encode: Encode, batch: list[Example], parameters: list
    ) -> list[list[torch.Tensor]]:
        queries = encode([e.query for e in batch], "query")
        docs = encode([e.document for e in batch], "doc")
        losses = in_batch_softmax_loss(queries, docs, self.temperature, [e.doc_id for e in batch], "none")
        return [
            _gradient(losses[i], parameters, retain_graph=i < len(batch) - 1) for i in range(len(batch))
        ], losses

    def clipped_sum(
        self, encode: Encode, batch: list[Example], parameters: list
    ) -> tuple[list[torch.Tensor], float]:
        total = [torch.zeros_like(p) for p in parameters]
        if not batch:
            return total, math.nan
        gradients, losses = self.per_example_gradients(encode, batch, parameters)
        for gradient in gradients:
            _add(total, clip(gradient, self.clip_norm))
        return total, losses.mean().item()


MECHANISMS = {"batch": BatchClipping, "group": GroupClipping, "sample": SampleClipping}


def max_batch_size(
    num_examples: int, sample_rate: float, steps: int, tail: float = 1e-10
) -> tuple[int, float]:
    """The smallest cap ``b`` with ``steps · P(Binomial(n, q) > b) ≤ tail``, and that probability."""
    distribution = stats.binom(num_examples, sample_rate)
    cap = int(distribution.mean())
    while steps * distribution.sf(cap) > tail and cap < num_examples:
        cap += 1
    return cap, float(steps * distribution.sf(cap))


def privatize(
    clipped_sum: list[torch.Tensor], sensitivity: float, noise_multiplier: float, generator: torch.Generator
) -> list[torch.Tensor]:
    """Add ``N(0, (σ · sensitivity)²)`` to every coordinate of the clipped sum."""
    std = noise_multiplier * sensitivity
    return [
        g + torch.normal(0.0, std, size=g.shape, generator=generator).to(g.device) if std > 0 else g
        for g in clipped_sum
    ]
