"""Hard negatives for in-batch softmax, mined by the starting encoder on the corpus.

For each training pair, the documents the *starting* (public) encoder ranks highest for the
query, without its positives, become extra negatives of that query in the in-batch softmax
(sentence-transformers' ``MultipleNegativesRankingLoss`` with ``(anchor, positive, negative…)``
columns). Candidates scoring at least ``relative_margin ×`` the positive's score are skipped as
likely false negatives ("TopK-PercPos" of Moreira et al., "NV-Retriever: Improving text embedding
models with effective hard-negative mining", 2024, who keep negatives below 95 % of the
positive's score).

Privacy: mining reads the training queries and the corpus through a fixed encoder. On a
synthetic set (DP output) and a public corpus this is post-processing at no ε; on private pairs
trained without DP the retriever is ε = ∞ anyway. Direct DP training does not use it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Encode = Callable[[list[str]], torch.Tensor]  # texts -> L2-normalised embeddings [n, dim]


def mine_hard_negatives(
    encode_queries: Encode,
    encode_documents: Encode,
    queries: Sequence[str],
    positives: Sequence[set[str]],
    corpus: dict[str, str],
    count: int,
    relative_margin: float = 0.95,
    depth: int = 30,
    chunk: int = 4096,
) -> list[list[str]]:
    """The ids of up to ``count`` hard negatives for each query.

    Args:
        encode_queries, encode_documents: the starting encoder, normalised (no gradients needed).
        queries: the training queries (one per pair; repeated queries are mined once).
        positives: for each query, the ids of every document judged relevant to it (never a
            negative).
        corpus: document id -> text, the candidates.
        count: negatives per query.
        relative_margin: skip candidates scoring ``≥ relative_margin ×`` the best positive's score.
        depth: candidates looked at per query (the top ``depth`` by the starting encoder).
        chunk: documents embedded and scored at once (memory: ``chunk × dim`` plus the running
            top ``depth`` of every query).

    Returns:
        ``negatives[i]``: document ids, best-scoring first; fewer than ``count`` when the top
        ``depth`` holds too few that pass the margin.
    """
    if count < 1:
        return [[] for _ in queries]
    unique = list(dict.fromkeys(queries))
    where = {query: i for i, query in enumerate(unique)}
    with torch.no_grad():
        query_embeddings = encode_queries(unique)
        ids = list(corpus)
        best_scores = torch.full((len(unique), 0), -float("inf"))
        best_rows = torch.zeros((len(unique), 0), dtype=torch.long)
        keep = depth + max((len(p) for p in positives), default=0)  # positives are skipped later
        judged_ids = {doc for judged in positives for doc in judged}
        judged_vectors: dict[str, torch.Tensor] = {}  # kept from the pass, never encoded twice
        for start in range(0, len(ids), chunk):
            part = ids[start : start + chunk]
            documents = encode_documents([corpus[i] for i in part])
            for row, doc_id in enumerate(part):
                if doc_id in judged_ids:
                    judged_vectors[doc_id] = documents[row].float().cpu()
            scores = (query_embeddings @ documents.T).float().cpu()
            top_scores, top_rows = scores.topk(min(keep, scores.shape[1]), dim=1)
            scores = torch.cat([best_scores, top_scores], dim=1)
            rows = torch.cat([best_rows, top_rows + start], dim=1)
            best_scores, order = scores.topk(min(keep, scores.shape[1]), dim=1)
            best_rows = rows.gather(1, order)
        positive_scores = _positive_scores(judged_vectors, query_embeddings, unique, queries, positives)
    negatives = []
    for query, judged in zip(queries, positives, strict=True):
        row = where[query]
        ceiling = relative_margin * positive_scores[(query, frozenset(judged))]
        chosen = []
        for score, index in zip(best_scores[row].tolist(), best_rows[row].tolist(), strict=True):
            doc_id = ids[index]
            if doc_id in judged or score >= ceiling:
                continue
            chosen.append(doc_id)
            if len(chosen) == count:
                break
        negatives.append(chosen)
    return negatives


def _positive_scores(embedded: dict, query_embeddings, unique, queries, positives) -> dict:
    """The best score of each (query, judged set) among its judged documents in the corpus
    (``embedded``: their embeddings, kept from the mining pass)."""
    where = {query: i for i, query in enumerate(unique)}
    scores = {}
    for query, judged in zip(queries, positives, strict=True):
        vectors = [embedded[d] for d in judged if d in embedded]
        key = (query, frozenset(judged))
        if key not in scores:
            scores[key] = (
                max(float(query_embeddings[where[query]].float().cpu() @ v) for v in vectors)
                if vectors
                else float("inf")  # no judged document in the corpus: no margin to apply
            )
    return scores
