"""Dense top-k search: exact chunked matrix products (CPU or GPU) or FAISS.

Scores are dot products of L2-normalised embeddings (cosine similarity), as BEIR's
``DenseRetrievalExactSearch`` with ``score_function="dot"`` on normalised embeddings. The corpus
is visited in chunks and a running top-k is merged per chunk, so memory stays bounded by
``queries × chunk_size`` scores whatever the corpus size (the corpus itself may be a
memory-mapped cache file). ``ignore_identical_ids`` drops a document whose id equals the query's
id, as BEIR does for ArguAna and Quora, where queries are themselves corpus documents.
"""

from __future__ import annotations

import numpy as np
import torch

Run = dict[str, dict[str, float]]


def _to_run(
    scores: torch.Tensor,
    indices: torch.Tensor,
    query_ids: list[str],
    doc_ids: list[str],
    top_k: int,
    ignore_identical_ids: bool,
) -> Run:
    results = {}
    for row, query_id in enumerate(query_ids):
        hits = {}
        for score, index in zip(scores[row].tolist(), indices[row].tolist(), strict=True):
            if index < 0:  # FAISS pads with -1 when fewer than k documents exist
                continue
            doc_id = doc_ids[index]
            if ignore_identical_ids and doc_id == query_id:
                continue
            hits[doc_id] = float(score)
            if len(hits) == top_k:
                break
        results[query_id] = hits
    return results


def _check(query_embeddings: np.ndarray, doc_embeddings: np.ndarray, query_ids, doc_ids, top_k) -> None:
    if len(query_ids) != query_embeddings.shape[0] or len(doc_ids) != doc_embeddings.shape[0]:
        raise ValueError("ids and embeddings differ in length")
    if query_embeddings.shape[1] != doc_embeddings.shape[1]:
        raise ValueError(
            f"query and document embeddings differ in width: {query_embeddings.shape[1]} vs "
            f"{doc_embeddings.shape[1]}"
        )
    if top_k < 1:
        raise ValueError(f"top_k must be ≥ 1, got {top_k}")


def exact_search(
    query_embeddings: np.ndarray,
    doc_embeddings: np.ndarray,
    query_ids: list[str],
    doc_ids: list[str],
    top_k: int,
    ignore_identical_ids: bool = False,
    chunk_size: int = 50_000,
    use_faiss: bool = False,
    device: str = "cpu",
) -> Run:
    """The ``top_k`` documents of every query by dot product, best first.

    Args:
        query_embeddings: ``[queries, dim]`` float32.
        doc_embeddings: ``[documents, dim]`` float32 (a memory-mapped array is fine).
        query_ids, doc_ids: the ids of the rows.
        top_k: documents kept per query.
        ignore_identical_ids: drop the document with the query's own id (one extra is fetched
            so each query still gets ``top_k``).
        chunk_size: documents scored per matrix product.
        use_faiss: search a FAISS ``IndexFlatIP`` instead (:func:`faiss_search`).
        device: where the matrix products run (``cpu``, ``cuda``, ...).
    """
    _check(query_embeddings, doc_embeddings, query_ids, doc_ids, top_k)
    if use_faiss:
        return faiss_search(query_embeddings, doc_embeddings, query_ids, doc_ids, top_k, ignore_identical_ids)
    k = min(top_k + int(ignore_identical_ids), len(doc_ids))
    queries = torch.as_tensor(np.asarray(query_embeddings, dtype=np.float32), device=device)
    best_scores = torch.full((len(query_ids), k), float("-inf"), device=device)
    best_indices = torch.zeros((len(query_ids), k), dtype=torch.long, device=device)
    for start in range(0, len(doc_ids), chunk_size):
        # A copy: memory-mapped cache files are read-only and torch wants writable memory.
        block = torch.from_numpy(np.array(doc_embeddings[start : start + chunk_size], dtype=np.float32))
        scores = queries @ block.to(device).T
        chunk_scores, chunk_indices = scores.topk(min(k, block.shape[0]), dim=1)
        merged_scores = torch.cat([best_scores, chunk_scores], dim=1)
        merged_indices = torch.cat([best_indices, chunk_indices + start], dim=1)
        best_scores, order = merged_scores.topk(k, dim=1)
        best_indices = merged_indices.gather(1, order)
    return _to_run(best_scores.cpu(), best_indices.cpu(), query_ids, doc_ids, top_k, ignore_identical_ids)


def faiss_search(
    query_embeddings: np.ndarray,
    doc_embeddings: np.ndarray,
    query_ids: list[str],
    doc_ids: list[str],
    top_k: int,
    ignore_identical_ids: bool = False,
    chunk_size: int = 50_000,
) -> Run:
    """Exact inner-product search with FAISS (``IndexFlatIP``), filled chunk by chunk from a
    possibly memory-mapped array; same results as :func:`exact_search` up to float rounding."""
    import faiss

    _check(query_embeddings, doc_embeddings, query_ids, doc_ids, top_k)
    index = faiss.IndexFlatIP(doc_embeddings.shape[1])
    for start in range(0, len(doc_ids), chunk_size):
        index.add(np.ascontiguousarray(doc_embeddings[start : start + chunk_size], dtype=np.float32))
    k = min(top_k + int(ignore_identical_ids), len(doc_ids))
    scores, indices = index.search(np.ascontiguousarray(query_embeddings, dtype=np.float32), k)
    return _to_run(
        torch.from_numpy(scores), torch.from_numpy(indices), query_ids, doc_ids, top_k, ignore_identical_ids
    )
