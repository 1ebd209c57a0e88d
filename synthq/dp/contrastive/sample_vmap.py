"""Per-query DP-SGD (``--dp sample``) from one forward pass of the batch: every query's own side in
one backward pass per chunk of queries, the documents' per-query passes batched with ``vmap`` (or
looped, on CPU).

:class:`synthq.dp.contrastive.sample.SampleClipping` differentiates each query's loss ``L_i`` through its
own embedding *and* every document of the batch (its positive and its negatives), clips it to
``C`` and sums; without its encoder it runs ``B`` backward passes one after the other through the
whole batch graph. :func:`per_query_clipped_sum` computes the same sum, with the same graph and
the same dropout draw (one forward pass), and pulls the ``B`` cotangents back with less work:

1. embed the queries and documents once (with gradients); ``L = in_batch_softmax_loss(...)``;
2. ``V_i = ∂L_i/∂(Q, D)`` for every query ``i`` — cheap, the loss is a ``B × B`` matrix away;
3. for a chunk of queries, ``autograd.grad(D, θ, grad_outputs=V_chunk^D, is_grads_batched=True)``
   (``vmap`` over the cotangents of the retained graph) gives every chunk query's gradient
   through the documents at once (``vmap_documents=False``: one pass per query through the
   document graph only);
4. the query side: ``L_i`` reads only query ``i``'s own embedding (``∂L_i/∂q_j = 0`` for
   ``j ≠ i``), so ``J_{q_i}ᵀ a_i`` for every query of the chunk comes out of ONE backward pass
   of ``Σ_i a_i · q_i`` through the query graph, read off the layers with a group per query
   (:class:`~synthq.dp.contrastive.per_group.PerGroupGradients`). Vmapping the query side with
   the documents sent each query's cotangent through the whole query batch, ``B − 1`` rows of
   zeros included. An encoder with a layer that engine does not know (T5's relative attention
   bias) keeps that path;
5. each query's two sides are added, clipped to ``C`` and summed.

Why the documents are not held fixed: with ``∂L_i/∂D`` dropped (document embeddings computed once
without gradient, only the query side differentiated) each term is a function of query ``i``'s
encoder alone, and could use ghost norms in one pass. The sensitivity would survive — removing
pair ``k`` still changes its own term (≤ C) and, through the softmax denominators, every other
clipped term (≤ 2C each): ``(2B − 1)C`` either way — but the gradient would be a different one
(the encoder would never learn from the document side, which every other mode trains), so it
would not be the paper's baseline any more. The exact per-query gradient needs ``∇θ`` of every
document's embedding against ``B`` different cotangents: ``B`` backward passes through the
document encoder is the inherent price. With one forward pass ``F = F_q + F_d`` and a backward
pass about ``2F``, a step costs about ``F + 2B·F_d + 2·(chunks)·F_q`` against the non-private
``3F``; at B = 16 with 32-token queries and 128-token documents (``F_d ≈ 0.8F``) that is about
``9×``, the floor of this exact gradient. What vmapping the documents' passes saves is sequential
overhead, not flops, and it holds the batched backward's activations: on 2 idle cores (``make
bench``, MiniLM-L6, B = 16, 2026-11-25) this function took 7.52 s (7.1× the non-private step,
2.12× its memory) with the documents' passes looped (``vmap_documents=False``, what CPU runs:
:data:`synthq.dp.contrastive.sample.SAMPLE_VMAP_ON_CPU`), 11.01 s and 2.35× with them vmapped (what
accelerators run), and one backward pass per query through the whole batch, queries included,
8.62 s and 2.07×. Memory grows with ``chunk ×`` the trainable parameters, plus the batched
backward's activations when the documents are vmapped.

Privacy unit, sensitivity and requirements: those of ``SampleClipping`` (one query; ``(2B − 1)C``),
which uses this function when it is given the encoder.
"""

from __future__ import annotations

import math

import torch

from synthq.dp.contrastive.per_group import PerGroupGradients, UnsupportedLayer
from synthq.models.encoder import embed, in_batch_softmax_loss


def per_query_clipped_sum(
    encoder,
    queries: list[str],
    documents: list[str],
    doc_ids: list[str],
    temperature: float,
    clip_norm: float,
    parameters: list[torch.nn.Parameter] | None = None,
    max_query_length: int = 128,
    max_doc_length: int = 384,
    chunk: int = 8,
    rows: list[int] | None = None,
    weights: list[float] | None = None,
    vmap_documents: bool = True,
) -> tuple[list[torch.Tensor], float]:
    """``Σ_i clip_C(∇θ L_i)`` over the queries ``rows`` (default: all) and the mean loss of the
    batch: exactly ``SampleClipping.clipped_sum`` on ``embed``-encoded texts.

    Args:
        encoder: the sentence-transformers encoder (its mode decides dropout, as in training).
        queries, documents, doc_ids: the batch's pairs; ``documents[i]`` is query ``i``'s positive
            and every other document is a negative (duplicates of the positive are masked).
        temperature: ``T`` of the in-batch softmax.
        clip_norm: ``C`` per query.
        parameters: the trainable parameters, in the order of the returned gradients (default:
            ``encoder``'s parameters that require gradients).
        max_query_length, max_doc_length: truncation, as in the rest of training.
        chunk: queries whose gradients are formed at once (memory ``chunk ×`` the parameters).
        rows: the queries to clip and sum (a torchrun rank's share); the graph is the whole batch.
        weights: each row's weight after clipping (``1/k`` for a query with ``k`` pairs; default 1).
        vmap_documents: pull the chunk's document cotangents back together (``vmap``); False
            pulls them back one query after the other through the retained graph (CPU: the
            same flops without the batched backward's activations).

    Returns:
        The clipped sum, one tensor per parameter, and the batch's mean loss (``nan`` if empty).
    """
    if parameters is None:
        parameters = [p for p in encoder.parameters() if p.requires_grad]
    total = [torch.zeros_like(p) for p in parameters]
    if not queries:
        return total, math.nan
    try:
        query_side = PerGroupGradients(encoder, parameters)
    except UnsupportedLayer:  # a layer the one-pass engine does not know: both sides vmapped
        query_side = None
    try:
        if query_side is None:
            query_embeddings = embed(encoder, queries, max_query_length)
        else:
            with query_side.record(torch.arange(len(queries))):
                query_embeddings = embed(encoder, queries, max_query_length)
        doc_embeddings = embed(encoder, documents, max_doc_length)
        losses = in_batch_softmax_loss(query_embeddings, doc_embeddings, temperature, doc_ids, "none")
        rows = list(range(len(queries))) if rows is None else list(rows)
        if not rows:
            return total, losses.mean().item()
        basis = torch.eye(len(queries), dtype=losses.dtype, device=losses.device)[rows]
        # V_i = ∂L_i/∂(Q, D) for each query i in rows: [rows, B, dim] on each side
        query_cotangents, doc_cotangents = torch.autograd.grad(
            losses, [query_embeddings, doc_embeddings], grad_outputs=basis, is_grads_batched=True,
            retain_graph=True,
        )  # fmt: skip
        for start in range(0, len(rows), chunk):
            stop = min(start + chunk, len(rows))
            if query_side is None:
                outputs = [query_embeddings, doc_embeddings]
                cotangents = [query_cotangents[start:stop], doc_cotangents[start:stop]]
            else:
                outputs, cotangents = [doc_embeddings], [doc_cotangents[start:stop]]
            grads = _pull_back(outputs, cotangents, parameters, stop - start, vmap_documents)
            if query_side is not None:
                # query i's own side, J_{q_i}ᵀ a_i: each row of the chunk is its own group of one
                # backward pass through the query graph (a_i is row i of its cotangent)
                groups = torch.full((len(queries),), -1, dtype=torch.long)
                groups[rows[start:stop]] = torch.arange(stop - start)
                own = query_cotangents[start:stop].sum(0)  # [B, dim]: a_i in row i, 0 elsewhere
                query_side.gradients(
                    (query_embeddings * own).sum(), stop - start, groups=groups,
                    into=[[g[k] for g in grads] for k in range(stop - start)], keep=True,
                )  # fmt: skip
            norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads))
            factors = (clip_norm / (norms + 1e-12)).clamp(max=1.0)  # the factor of clipping.clip
            if weights is not None:
                factors = factors * torch.tensor(
                    [weights[i] for i in rows[start:stop]], dtype=factors.dtype, device=factors.device
                )
            for t, g in zip(total, grads, strict=True):
                t.add_(torch.tensordot(factors.to(g.dtype), g, dims=1))
        return total, losses.mean().item()
    finally:
        if query_side is not None:
            query_side.close()


def _pull_back(
    outputs: list[torch.Tensor], cotangents: list[torch.Tensor], parameters: list, count: int, batched: bool
) -> list[torch.Tensor]:
    """``[count, *p.shape]`` per parameter: row ``k`` is ``Σ_o J_oᵀ cotangents[o][k]`` through the
    retained graph, vmapped over ``k`` (``batched``) or one backward pass per ``k``."""
    if batched:
        grads = torch.autograd.grad(
            outputs, parameters, grad_outputs=cotangents, is_grads_batched=True, retain_graph=True,
            allow_unused=True,
        )  # fmt: skip
        return [
            torch.zeros(count, *p.shape, dtype=p.dtype, device=p.device) if g is None else g
            for g, p in zip(grads, parameters, strict=True)
        ]
    stacked = [torch.zeros(count, *p.shape, dtype=p.dtype, device=p.device) for p in parameters]
    for k in range(count):
        grads = torch.autograd.grad(
            outputs, parameters, grad_outputs=[c[k] for c in cotangents], retain_graph=True,
            allow_unused=True,
        )  # fmt: skip
        for into, g in zip(stacked, grads, strict=True):
            if g is not None:
                into[k].copy_(g)
    return stacked
