"""``--dp group``: DP-GCL's groups with in-group negatives, each group's gradient clipped (see
:mod:`synthq.dp.contrastive`)."""

from __future__ import annotations

import math
import random

import torch

from synthq.dp.clipping import add_into, clip, gradient
from synthq.dp.contrastive.examples import Encode, Example, augment, on_cpu
from synthq.dp.contrastive.per_group import PerGroupGradients, UnsupportedLayer
from synthq.dp.engine import Mechanism, register_mechanism
from synthq.dp.noise import SecretRandomness
from synthq.models.encoder import in_batch_softmax_loss
from synthq.runtime import distributed
from synthq.runtime.console import warn


def _random_state() -> tuple:
    """torch's random state (CPU, every CUDA device, MPS where there is one): dropout's masks."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    mps = torch.mps.get_rng_state() if torch.backends.mps.is_available() else None
    return torch.get_rng_state(), cuda, mps


def _set_random_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])
    if state[2] is not None:
        torch.mps.set_rng_state(state[2])


# The one-pass per-group engine vs one backward pass per group, on CPU: with groups of 8 (the
# demo's) the loop is faster (benchmarks/retriever_step.py, MiniLM-L6, B = 32, S = 8, one run:
# loop 1.18×, one pass 1.38× of non-private; the one pass wins only for tiny groups, B = 8, S = 2:
# 1.41× vs 1.65×), so CPU runs the loop and accelerators take the one pass.
GROUP_ONE_PASS_ON_CPU = False


@register_mechanism("group")
class GroupClipping(Mechanism):
    """DP-GCL (Wang et al.): in-group negatives, one clipped gradient per group.

    Each sampled query is assigned (with all its pairs) to one of ``K = ⌈B / S⌉`` groups by a
    secret keyed draw on its own stable id (:meth:`SecretRandomness.keyed_choice` of the query
    id and the step), independent of every other query; every group's loss uses only the
    group's documents plus ``aug_negatives`` augmented copies of each of them (intra-group
    sample augmentation, eq. 12), and each group's gradient is clipped to ``C`` before summing.

    Given the encoder (``model``) on an accelerator (or on CPU with
    :data:`GROUP_ONE_PASS_ON_CPU`), all groups go through ONE forward and ONE backward pass and
    per-group gradients are read off the layers (:mod:`synthq.dp.contrastive.per_group`): a step
    costs about one non-private step. Otherwise, or for layers the engine does not know (T5's
    relative attention bias), each group gets its own forward and backward pass.

    Args:
        clip_norm: ``C`` per group.
        temperature: softmax temperature.
        group_size: ``S``, the expected group size.
        expected_batch_size: ``B = q·n`` (sets the number of groups).
        aug_negatives: ``N_a`` augmented negatives per group document.
        randomness: the run's secret randomness (keys group assignment and augmentation).
        model: the encoder, for one-pass per-group gradients.
        pass_texts: where each group takes its own passes, at most this many texts go through
            the encoder with a graph at once; a larger group's gradient is computed by GradCache
            (its embeddings without a graph, the loss's gradient with respect to them, then each
            chunk again with its graph under the same random state): the same gradient, one
            chunk's activations. ``None``: a group is one pass.

    Requirements:
        The loss of a group reads only that group's texts.

    Inputs:
        A Poisson-sampled list of :class:`Example` (query, document) pairs.

    Privacy unit:
        One unit (a query with all its pairs, or a user with all of their kept queries' pairs),
        add/remove adjacency under Poisson sampling.

    Sensitivity:
        ``2C``. Group membership of every other query depends only on its own id, the step and
        the secret key, never on whether a given query is present, so adding or removing a query
        (its pairs all go to one group) changes exactly one group's input; that group's
        clipped gradient moves from one vector of norm ≤ C to another (or to nothing), and the
        triangle inequality gives ``‖c_g − c_g'‖ ≤ 2C``. Augmented negatives are functions of the
        group's own data, so they change nothing else. No batch cap is needed.

    Recommendations:
        The strongest direct-DP baseline: the noise does not grow with the batch, and larger
        groups give more negatives per query at the price of fewer clipped terms.

    References:
        Wang et al., "DP-GCL: group-level clipping for differentially private contrastive
        learning", Algorithm 1; Bu et al., "Differentially private optimization on large model
        at small cost" (book-keeping per-sample gradients from one backward pass).
    """

    sensitivity_rule = "2C: the query changes only its own group's clipped gradient"

    def __init__(
        self,
        clip_norm: float,
        temperature: float,
        group_size: int,
        expected_batch_size: float,
        aug_negatives: int = 0,
        randomness: SecretRandomness | None = None,
        model: torch.nn.Module | None = None,
        pass_texts: int | None = None,
    ):
        self.clip_norm = clip_norm
        self.pass_texts = pass_texts
        self.temperature = temperature
        self.num_groups = max(1, math.ceil(expected_batch_size / group_size))
        self.aug_negatives = aug_negatives
        self.randomness = randomness or SecretRandomness()
        self.step = 0
        self.model = model
        self._engine: PerGroupGradients | None = None
        self.one_pass = model is not None and (GROUP_ONE_PASS_ON_CPU or not on_cpu(model))

    def sensitivity(self, batch_cap: int | None) -> float:
        return 2 * self.clip_norm

    def groups(self, batch: list[Example]) -> dict[int, list[Example]]:
        # Keyed by (secret, step, the query's own id), never by a shared stream or a position,
        # so no query's presence can change another query's group.
        assignment: dict[int, list[Example]] = {}
        for example in batch:
            group = self.randomness.keyed_choice(self.num_groups, "group", self.step, example.unit_id)
            assignment.setdefault(group, []).append(example)
        return dict(sorted(assignment.items()))

    def _documents(self, key: int, group: list[Example]) -> list[str]:
        documents = [e.document for e in group]
        rng = random.Random(self.randomness.keyed_choice(2**62, "augment", self.step, key))
        return documents + [augment(d, rng) for d in documents for _ in range(self.aug_negatives)]

    def clipped_sum(
        self, encode: Encode, batch: list[Example], parameters: list
    ) -> tuple[list[torch.Tensor], float]:
        groups = self.groups(batch)
        if not groups:
            self.step += 1
            return [torch.zeros_like(p) for p in parameters], math.nan
        # Under torchrun each rank takes its share of the groups (none when ranks outnumber them).
        mine = dict(distributed.shard(list(groups.items())))
        total, losses = [torch.zeros_like(p) for p in parameters], []
        # each group's gradient is clipped into the sum as soon as it exists: one group's gradient
        # in memory at a time where the groups take their own passes (CPU), not all of them
        for group_gradient, loss in self._group_gradients(encode, mine, parameters) if mine else ():
            add_into(total, clip(group_gradient, self.clip_norm))
            losses.append(loss)
        distributed.all_reduce_sum(total)  # the clipped groups of every rank
        self.step += 1
        return total, distributed.mean_over_ranks(losses)

    def _group_gradients(self, encode: Encode, groups: dict[int, list[Example]], parameters: list):
        """Every group's (gradient, mean loss), in group order: one pass for all groups where the
        layers allow, else one group at a time as each is asked for."""
        if self.one_pass and self._engine is None:
            try:
                self._engine = PerGroupGradients(self.model, parameters)
            except UnsupportedLayer as error:
                warn(f"group clipping: {error}; one backward pass per group instead")
                self.one_pass = False
        if self.one_pass:
            try:
                return zip(*self._one_pass(encode, groups), strict=True)
            except UnsupportedLayer as error:
                self._engine.discard()
                self._engine.close()
                warn(f"group clipping: {error}; one backward pass per group instead")
                self.one_pass = False
        return self._per_group_passes(encode, groups, parameters)

    def _one_pass(self, encode: Encode, groups: dict[int, list[Example]]):
        query_texts, query_rows, doc_texts, doc_rows, spans = [], [], [], [], []
        for position, (key, group) in enumerate(groups.items()):
            documents = self._documents(key, group)
            spans.append((len(query_texts), len(group), len(doc_texts), len(documents), group))
            query_texts += [e.query for e in group]
            query_rows += [position] * len(group)
            doc_texts += documents
            doc_rows += [position] * len(documents)
        with self._engine.record(torch.tensor(query_rows)):
            queries = encode(query_texts, "query")
        with self._engine.record(torch.tensor(doc_rows)):
            docs = encode(doc_texts, "doc")
        group_losses = [
            in_batch_softmax_loss(
                queries[q0 : q0 + nq], docs[d0 : d0 + nd], self.temperature, [e.doc_id for e in group], "sum"
            )
            for q0, nq, d0, nd, group in spans
        ]
        per_group = self._engine.gradients(torch.stack(group_losses).sum(), len(groups))
        return per_group, [loss.item() / span[1] for loss, span in zip(group_losses, spans, strict=True)]

    def _per_group_passes(self, encode: Encode, groups: dict[int, list[Example]], parameters: list):
        for key, group in groups.items():
            queries, documents = [e.query for e in group], self._documents(key, group)
            doc_ids = [e.doc_id for e in group]
            if self.pass_texts is None or len(queries) + len(documents) <= self.pass_texts:
                q, d = encode(queries, "query"), encode(documents, "doc")
                loss = in_batch_softmax_loss(q, d, self.temperature, doc_ids, "sum")
                yield gradient(loss, parameters), loss.item() / len(group)
            else:
                cached = self._cached_group_gradient(encode, queries, documents, doc_ids, parameters)
                yield cached[0], cached[1] / len(group)

    def _cached_group_gradient(self, encode: Encode, queries, documents, doc_ids, parameters: list):
        """One group's gradient by GradCache: ∂L/∂θ = Σ_chunks (∂L/∂e_chunk)ᵀ ∂e_chunk/∂θ, each
        chunk re-encoded under the random state of its first pass (the same dropout masks)."""
        size = max(1, self.pass_texts)
        chunks = [("query", queries[i : i + size]) for i in range(0, len(queries), size)]
        chunks += [("doc", documents[i : i + size]) for i in range(0, len(documents), size)]
        states, embeddings = [], []
        with torch.no_grad():
            for side, texts in chunks:
                states.append(_random_state())
                embeddings.append(encode(texts, side))
        after = _random_state()
        leaves = [e.detach().requires_grad_() for e in embeddings]
        q = torch.cat([e for (side, _), e in zip(chunks, leaves, strict=True) if side == "query"])
        d = torch.cat([e for (side, _), e in zip(chunks, leaves, strict=True) if side == "doc"])
        loss = in_batch_softmax_loss(q, d, self.temperature, doc_ids, "sum")
        cotangents = torch.autograd.grad(loss, leaves)
        total = [torch.zeros_like(p) for p in parameters]
        for (side, texts), state, cotangent in zip(chunks, states, cotangents, strict=True):
            _set_random_state(state)
            add_into(total, gradient((encode(texts, side) * cotangent).sum(), parameters))
        _set_random_state(after)  # later draws continue as if the chunks had run once
        return total, loss.item()
