"""Direct DP training of dual encoders with the in-batch softmax loss: the paper's baselines.

Each mechanism turns one Poisson-sampled batch of (query, document) pairs into a clipped
gradient sum whose ℓ2 sensitivity it states; :func:`privatize` then adds Gaussian noise with
standard deviation ``σ × sensitivity``, where σ comes from the accountant for the sampling rate
and step count. The privacy unit is stated once, below.

The four mechanisms differ in what they clip, which decides the sensitivity (see Wang et al.,
"DP-GCL", section 2.3, Kong et al., "Logit-DP", and Carranza et al., section 5.3.2):

* :class:`SampleClipping` — per-query clipping (the paper's DP-SGD baseline): ``(2B − 1)C``.
* :class:`BatchClipping` — clip the whole batch gradient (DP-CLIP / "Naive-DP"): ``2C``.
* :class:`GroupClipping` — DP-GCL: groups with in-group negatives, each group clipped: ``2C``.
* :class:`~synthq.dp.contrastive.logit.LogitClipping` — Logit-DP: per-pair similarity gradients
  clipped: ``(G1 + G2 + (B − 1)L)·C`` (constants derived there for cosine / temperature).

The privacy unit is one query id with all of its pairs, or under ``--privacy-unit user`` one user
with all of their kept queries' pairs (:class:`synthq.dp.privacy_units.PrivacyUnits`): units are
Poisson-sampled, and a unit with ``k`` pairs gives each of its rows weight ``1/k`` where rows are
clipped one by one. The proofs below say "query"; each holds word for word for the user unit,
because they use only that a unit's rows enter together, carry weights summing to 1, and (group
clipping) share one keyed group draw (:attr:`Example.unit_id`). Logit-DP's proof needs one row
per unit, so it refuses users with several pairs. ``B`` is a cap on the number of sampled units
for the mechanisms whose sensitivity grows with the batch; an over-full batch is replaced by an empty one
(:func:`synthq.dp.privacy_units.poisson_units`), so δ needs no tail term. Each mechanism registers
itself (``--dp NAME``) and has a neighbouring-batch test of its bound (tests/dp).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from synthq.dp.clipping import add_into, clip, gradient
from synthq.dp.contrastive.per_group import PerGroupGradients, UnsupportedLayer
from synthq.dp.contrastive.sample_vmap import per_query_clipped_sum
from synthq.dp.engine import Mechanism, register_mechanism
from synthq.dp.noise import SecretRandomness
from synthq.models.encoder import in_batch_softmax_loss
from synthq.runtime import distributed
from synthq.runtime.console import warn

Encode = Callable[[list[str], str], torch.Tensor]  # (texts, "query"|"doc") -> normalised embeddings


@dataclass(frozen=True)
class Example:
    """One training pair as the mechanisms see it.

    ``unit_id`` is the stable id of the example's privacy unit (its query id, or its user id under
    the user unit): it keys the example's secret random draws (group assignment), so no other
    unit's presence can change them and all rows of one unit share them. ``weight`` is ``1/k``
    for a unit with ``k`` pairs."""

    query: str
    document: str
    doc_id: str
    unit_id: str = ""
    weight: float = 1.0


@register_mechanism("batch")
class BatchClipping(Mechanism):
    """DP-CLIP (Huang et al., 2024): clip the gradient of the whole batch's summed loss.

    Args:
        clip_norm: ``C``, the bound on the batch gradient's norm.
        temperature: softmax temperature on cosine similarity.

    Requirements:
        None on the loss: whatever the batch loss is, its clipped gradient has norm ≤ C.

    Inputs:
        A Poisson-sampled list of :class:`Example` (query, document) pairs.

    Privacy unit:
        One unit (a query with all its pairs, or a user with all of their kept queries' pairs),
        add/remove adjacency under Poisson sampling.

    Sensitivity:
        ``2C``. The released quantity is ``clip(∇ Σ_i L_i)``: with or without one query (and all
        its pairs) it is a vector of norm ≤ C, so the two differ by at most ``2C`` however the
        other losses move.

    Recommendations:
        Cheap (one backward pass) and low noise, but clipping the batch as one vector loses the
        gradient accumulation of larger batches.

    References:
        Huang et al., "Safeguarding data in multimodal AI: a differentially private approach to
        CLIP training" (DP-CLIP); Wang et al., DP-GCL, eq. (7).
    """

    sensitivity_rule = "2C: the clipped batch gradient has norm <= C with or without the query"

    def __init__(self, clip_norm: float, temperature: float):
        self.clip_norm = clip_norm
        self.temperature = temperature

    def sensitivity(self, batch_cap: int | None) -> float:
        return 2 * self.clip_norm

    def clipped_sum(
        self, encode: Encode, batch: list[Example], parameters: list
    ) -> tuple[list[torch.Tensor], float]:
        if not batch:
            return [torch.zeros_like(p) for p in parameters], math.nan
        # Each rank encodes its share; the batch loss is computed on the gathered embeddings, so
        # every rank holds the same loss and sends each embedding's gradient back to its rank.
        local = distributed.shard(batch)
        ranks = distributed.topology().world_size
        ordered = [e for r in range(ranks) for e in batch[r::ranks]]  # the gathered row order
        queries = distributed.gather_rows(encode([e.query for e in local], "query"), with_grad=True)
        docs = distributed.gather_rows(encode([e.document for e in local], "doc"), with_grad=True)
        loss = in_batch_softmax_loss(queries, docs, self.temperature, [e.doc_id for e in ordered], "sum")
        whole = gradient(loss / ranks, parameters)
        distributed.all_reduce_sum(whole)  # the whole batch's gradient, then one clip
        return clip(whole, self.clip_norm), loss.item() / len(batch)


def _random_state() -> tuple:
    """torch's random state (CPU, and every CUDA device when there is one): dropout's masks."""
    return torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None


def _set_random_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def _on_cpu(model: torch.nn.Module) -> bool:
    return next(model.parameters()).device.type == "cpu"


def augment(text: str, rng: random.Random, drop: float = 0.2) -> str:
    """A meaning-preserving perturbation: drop ~20% of words and swap one adjacent pair."""
    words = text.split()
    kept = [w for w in words if rng.random() >= drop] or words[:1]
    if len(kept) > 2:
        i = rng.randrange(len(kept) - 1)
        kept[i], kept[i + 1] = kept[i + 1], kept[i]
    return " ".join(kept)


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
        self.one_pass = model is not None and (GROUP_ONE_PASS_ON_CPU or not _on_cpu(model))

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


# On CPU the documents' per-query passes run one after the other (make bench's retriever rows,
# 2026-11-25, MiniLM-L6, B = 16, 2 idle cores, one run): with the query side in one pass per
# chunk, looping the documents took 7.52 s and 2.12x the non-private step's memory, vmapping them
# 11.01 s and 2.35x, and the plain loop (B passes through the whole batch) 8.62 s and 2.07x.
SAMPLE_VMAP_ON_CPU = False


@register_mechanism("sample")
class SampleClipping(Mechanism):
    """Per-query DP-SGD through in-batch negatives (the paper's baseline, section 5.3.2).

    Each row's loss ``L_i`` is differentiated with respect to all parameters (through its own
    embedding *and* every document of the batch), clipped to ``C``, weighted ``1/k`` (``k`` =
    its query's pair count) and summed.

    Args:
        clip_norm: ``C`` per query.
        temperature: softmax temperature.

    Requirements:
        Every query's loss reads every document of the batch (its negatives).

    Inputs:
        A Poisson-sampled list of :class:`Example` (query, document) pairs.

    Privacy unit:
        One unit (a query with all its pairs, or a user with all of their kept queries' pairs),
        add/remove adjacency under Poisson sampling.

    Sensitivity:
        ``(2B − 1)C`` for batches of at most ``B`` queries (Wang et al., DP-GCL, section 2.3.1).
        Let the larger neighbour's batch hold query ``x`` and ``m ≤ B − 1`` other queries.
        Removing ``x`` removes its own rows' terms (``k`` rows of weight ``1/k``, ≤ C together),
        and because its documents are negatives of every other row (and the duplicate-document
        mask may change), each other row's weighted clipped term moves from one vector of norm
        ≤ ``C/k_j`` to another: a query's rows together ≤ 2C, so ≤ ``2(B − 1)C`` for the others.
        Total ``C + 2(B − 1)C``; tight (small ``C`` makes every term hit the clip, and a
        negative's removal can turn a clipped gradient around). Poisson batches are unbounded,
        so ``B`` is a cap: a batch of more than ``B`` queries is replaced by an empty one
        (:func:`synthq.dp.privacy_units.poisson_units`); that case moves the sum by ``‖f(S)‖ ≤ BC ≤
        (2B − 1)C``, inside the same bound, so no δ term is needed.

    Recommendations:
        The noise grows linearly with the batch, which is why direct DP retrieval training works
        badly. The cost is one backward pass per query through the documents. Given the encoder
        (``model``, as train-retriever does), the sum comes from
        :func:`synthq.dp.contrastive.sample_vmap.per_query_clipped_sum`: one forward pass, every
        query's own side in one backward pass per chunk of queries, and the documents' per-query
        passes vmapped on an accelerator, looped on CPU (:data:`SAMPLE_VMAP_ON_CPU`). Without it,
        each query's loss is back-propagated through the whole batch graph, queries included.

    References:
        Carranza et al., section 5.3.2; Wang et al., DP-GCL, section 2.3.1; Abadi et al., DP-SGD.
    """

    needs_batch_cap = True
    sensitivity_rule = "(2B-1)C: the query's own terms plus 2C for each other query it is a negative of"

    def __init__(
        self,
        clip_norm: float,
        temperature: float,
        model: torch.nn.Module | None = None,
        max_query_length: int = 128,
        max_doc_length: int = 384,
    ):
        self.clip_norm = clip_norm
        self.temperature = temperature
        self.model = model
        self.lengths = (max_query_length, max_doc_length)

    def sensitivity(self, batch_cap: int | None) -> float:
        return (2 * batch_cap - 1) * self.clip_norm

    def per_example_gradients(
        self, encode: Encode, batch: list[Example], parameters: list, rows: list[int] | None = None
    ) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
        """The gradients of the losses of queries ``rows`` (default: all), and every loss."""
        queries = encode([e.query for e in batch], "query")
        docs = encode([e.document for e in batch], "doc")
        losses = in_batch_softmax_loss(queries, docs, self.temperature, [e.doc_id for e in batch], "none")
        rows = list(range(len(batch))) if rows is None else rows
        return [
            gradient(losses[i], parameters, retain_graph=k < len(rows) - 1) for k, i in enumerate(rows)
        ], losses

    def clipped_sum(
        self, encode: Encode, batch: list[Example], parameters: list
    ) -> tuple[list[torch.Tensor], float]:
        total = [torch.zeros_like(p) for p in parameters]
        if not batch:
            return total, math.nan
        # Under torchrun every rank builds the whole batch's graph (each loss reads every
        # document) and back-propagates only its share of the queries: the B backward passes,
        # the cost of this mode, are split over the ranks.
        rows = distributed.shard(range(len(batch)))
        if self.model is not None:  # the same sum; the query side in one pass per chunk
            total, loss = per_query_clipped_sum(
                self.model, [e.query for e in batch], [e.document for e in batch], [e.doc_id for e in batch],
                self.temperature, self.clip_norm, parameters, *self.lengths, rows=list(rows),
                weights=[e.weight for e in batch],
                vmap_documents=SAMPLE_VMAP_ON_CPU or not _on_cpu(self.model),
            )  # fmt: skip
            distributed.all_reduce_sum(total)
            return total, loss
        gradients, losses = self.per_example_gradients(encode, batch, parameters, rows)
        for row, row_gradient in zip(rows, gradients, strict=True):
            add_into(total, clip(row_gradient, self.clip_norm), batch[row].weight)
        distributed.all_reduce_sum(total)
        return total, losses.mean().item()
