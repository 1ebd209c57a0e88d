"""``--dp sample``: per-query clipping through in-batch negatives, the paper's DP-SGD baseline (see
:mod:`synthq.dp.contrastive`)."""

from __future__ import annotations

import math

import torch

from synthq.dp.clipping import add_into, clip, gradient
from synthq.dp.contrastive.examples import Encode, Example, on_cpu
from synthq.dp.contrastive.sample_vmap import per_query_clipped_sum
from synthq.dp.engine import Mechanism, register_mechanism
from synthq.models.encoder import in_batch_softmax_loss
from synthq.runtime import distributed

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
                vmap_documents=SAMPLE_VMAP_ON_CPU or not on_cpu(self.model),
            )  # fmt: skip
            distributed.all_reduce_sum(total)
            return total, loss
        gradients, losses = self.per_example_gradients(encode, batch, parameters, rows)
        for row, row_gradient in zip(rows, gradients, strict=True):
            add_into(total, clip(row_gradient, self.clip_norm), batch[row].weight)
        distributed.all_reduce_sum(total)
        return total, losses.mean().item()
