"""``--dp batch``: DP-CLIP's clipping of the whole batch gradient (see :mod:`synthq.dp.contrastive`)."""

from __future__ import annotations

import math

import torch

from synthq.dp.clipping import clip, gradient
from synthq.dp.contrastive.examples import Encode, Example
from synthq.dp.engine import Mechanism, register_mechanism
from synthq.models.encoder import in_batch_softmax_loss
from synthq.runtime import distributed


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
