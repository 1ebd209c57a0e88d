"""The dual encoder: one shared sentence-transformers encoder for queries and documents.

The paper shares one T5-Base encoder between queries and documents; the embedded default is
``minilm-l6``. Any spec works: a sentence-transformers directory keeps its pooling; a plain
Hugging Face model (e.g. ``google-t5/t5-base``) gets mean pooling. Saved retrievers are
sentence-transformers directories, so ``SentenceTransformer(path)`` loads them.

Similarities are cosine similarities divided by a temperature ``T`` (sentence-transformers'
``scale = 1/T``), the in-batch softmax of Carranza et al., eq. (1).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from synthq.models.resolve import resolve_model
from synthq.runtime.precision import forward_autocast


def load_encoder(spec: str | Path, device: str = "cpu"):
    """A ``SentenceTransformer`` for a spec (alias, local dir, hub id), with mean pooling if the
    model is a plain transformer, its weights in fp32 whatever dtype the checkpoint was saved in:
    DP norms, clipped sums and noise are computed in the weights' dtype, and a bf16 checkpoint
    would round them (``--precision bf16`` runs the forward passes in bf16 instead)."""
    from sentence_transformers import SentenceTransformer, models

    path = resolve_model(str(spec))
    if (path / "modules.json").is_file():
        return SentenceTransformer(str(path), device=device).float()
    transformer = models.Transformer(str(path))
    pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
    return SentenceTransformer(modules=[transformer, pooling], device=device).float()


def features(encoder, texts: list[str], max_length: int) -> dict[str, torch.Tensor]:
    """Tokenised inputs (truncated to ``max_length``) on the encoder's device."""
    encoder.max_seq_length = max_length
    tokenize = getattr(encoder, "preprocess", None) or encoder.tokenize
    device = next(encoder.parameters()).device
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in tokenize(texts).items()}


def position_limit(encoder) -> int | None:
    """The longest input the encoder's position embeddings allow (``None`` if it does not say)."""
    model = getattr(encoder[0], "auto_model", None)
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(limit) if limit else None


def freeze_token_embeddings(encoder) -> int:
    """Keep the encoder's token-embedding matrix fixed; returns how many weights that froze.

    The matrix is most of a small language model (SmolLM2: 28 M of the first four blocks' 42 M
    weights) and a batch touches only the rows of its own tokens. Under DP every weight that
    trains also gets noise, so a frozen matrix means no noise on rows the private data never
    used, and no per-example gradient of a ``vocabulary × dim`` matrix: faster steps in every
    mode. Position embeddings and everything after the lookup still train."""
    frozen = 0
    for module in encoder:
        model = getattr(module, "auto_model", None)
        if model is not None and hasattr(model, "get_input_embeddings"):
            weight = model.get_input_embeddings().weight
            if weight.requires_grad:
                weight.requires_grad_(False)
                frozen += weight.numel()
    return frozen


def sentence_embeddings(encoder, texts: list[str], max_length: int) -> torch.Tensor:
    """The encoder's sentence embeddings with gradients, in fp32 (the forward pass at the stage's
    precision)."""
    with forward_autocast():
        embeddings = encoder(features(encoder, texts, max_length))["sentence_embedding"]
    return embeddings.float()


def embed(encoder, texts: list[str], max_length: int) -> torch.Tensor:
    """L2-normalised embeddings with gradients (so dot products are cosine similarities)."""
    return F.normalize(sentence_embeddings(encoder, texts, max_length), dim=-1)


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


def training_loss(encoder, temperature: float, mini_batch_size: int | None = None):
    """sentence-transformers' in-batch softmax for the non-private path: ``MultipleNegatives-
    RankingLoss`` with ``scale = 1/T`` (equal to :func:`in_batch_softmax_loss`, tested), or with
    ``mini_batch_size`` its GradCache form ``CachedMultipleNegativesRankingLoss``, which embeds the
    batch in chunks without a graph, then replays each chunk with gradients: the loss of a batch
    larger than memory, exactly."""
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )

    if mini_batch_size is None:
        return MultipleNegativesRankingLoss(encoder, scale=1.0 / temperature)
    return CachedMultipleNegativesRankingLoss(
        encoder, scale=1.0 / temperature, mini_batch_size=mini_batch_size
    )


def functional_embedding(encoder) -> tuple[dict[str, torch.nn.Parameter], Callable]:
    """A pure function ``(params, input_ids, attention_mask, token_type_ids) -> embedding`` of ONE
    unpadded-or-padded text, for ``torch.func`` transforms (per-pair gradients in Logit-DP).

    It runs the backbone with a 4-D additive attention mask (transformers returns a prepared
    mask as-is; its 2-D mask helpers read tensor values, which ``vmap`` cannot) and mean-pools
    over real tokens, exactly what the ``Transformer → Pooling(mean) [→ Normalize]`` stack does.
    Returns the backbone's trainable parameters by name and the function.

    Raises:
        ValueError: for any other module stack.
    """
    from torch.func import functional_call

    kinds = [type(module).__name__ for module in encoder]
    if kinds[:2] != ["Transformer", "Pooling"] or any(k != "Normalize" for k in kinds[2:]):
        raise ValueError(f"per-pair gradients need a Transformer → Pooling(mean) encoder, not {kinds}")
    if encoder[1].pooling_mode != "mean":
        raise ValueError(f"per-pair gradients need mean pooling, not {encoder[1].pooling_mode!r}")
    backbone = encoder[0].auto_model
    params = {name: p for name, p in backbone.named_parameters() if p.requires_grad}
    frozen = {name: p for name, p in backbone.named_parameters() if not p.requires_grad}
    buffers = dict(backbone.named_buffers())
    minimum = torch.finfo(torch.float32).min

    def embedding(params, input_ids, attention_mask, token_type_ids=None):
        mask = attention_mask.to(torch.float32)
        additive = ((1.0 - mask) * minimum)[None, None, None, :]
        kwargs = {"input_ids": input_ids[None], "attention_mask": additive}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids[None]
        with forward_autocast():
            hidden = functional_call(backbone, ({**params, **frozen}, buffers), (), kwargs)
        hidden = hidden.last_hidden_state[0].float()
        return (hidden * mask[:, None]).sum(0) / mask.sum().clamp(min=1e-9)

    return params, embedding
