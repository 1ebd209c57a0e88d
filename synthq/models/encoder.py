"""The dual encoder: one shared sentence-transformers encoder for queries and documents.

The paper shares one T5-Base encoder between queries and documents; the embedded default is
``minilm-l6``. Any spec works: a sentence-transformers directory keeps its pooling; a plain
Hugging Face model (e.g. ``google-t5/t5-base``) gets mean pooling. Saved retrievers are
sentence-transformers directories, so ``SentenceTransformer(path)`` loads them.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from synthq.models.resolve import resolve_model


def load_encoder(spec: str | Path, device: str = "cpu"):
    """A ``SentenceTransformer`` for a spec (alias, local dir, hub id), with mean pooling if the
    model is a plain transformer."""
    from sentence_transformers import SentenceTransformer, models

    path = resolve_model(str(spec))
    if (path / "modules.json").is_file():
        return SentenceTransformer(str(path), device=device)
    transformer = models.Transformer(str(path))
    pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    return SentenceTransformer(modules=[transformer, pooling], device=device)


def embed(encoder, texts: list[str], max_length: int) -> torch.Tensor:
    """L2-normalised embeddings with gradients (so dot products are cosine similarities)."""
    encoder.max_seq_length = max_length
    tokenize = getattr(encoder, "preprocess", None) or encoder.tokenize
    features = tokenize(texts)
    device = next(encoder.parameters()).device
    features = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}
    return F.normalize(encoder(features)["sentence_embedding"], dim=-1)


def in_batch_softmax_loss(
    query_embeddings: torch.Tensor,
    doc_embeddings: torch.Tensor,
    temperature: float,
    doc_ids: list[str] | None = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """Equation 1 of Carranza et al.: ``-log softmax_j(sim(q_i, d_j) / T)[i]``.

    Args:
        query_embeddings: ``[b, h]`` normalised query embeddings.
        doc_embeddings: ``[b + a, h]`` normalised embeddings; row ``i < b`` is query ``i``'s
            positive, every other row is a negative (``a`` extra negatives may follow).
        temperature: ``T``; similarities are cosine / T (sentence-transformers' scale = 1/T).
        doc_ids: optional ids of the first ``b`` documents; a column holding the same document
            as the query's positive is masked out, so duplicates are never false negatives.
        reduction: ``mean``, ``sum`` or ``none`` (per-query losses).
    """
    scores = query_embeddings @ doc_embeddings.T / temperature
    batch = query_embeddings.shape[0]
    if doc_ids is not None:
        same = torch.zeros_like(scores, dtype=torch.bool)
        for i in range(batch):
            for j in range(batch):
                same[i, j] = i != j and doc_ids[i] == doc_ids[j]
        scores = scores.masked_fill(same, float("-inf"))
    losses = F.cross_entropy(scores, torch.arange(batch, device=scores.device), reduction="none")
    if reduction == "none":
        return losses
    return losses.sum() if reduction == "sum" else losses.mean()
