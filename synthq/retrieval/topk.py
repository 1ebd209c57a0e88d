"""Dense top-k search: exact chunked matrix products (CPU or GPU) or FAISS.

Scores are dot products of L2-normalised embeddings (cosine similarity), as BEIR's
``DenseRetrievalExactSearch`` with ``score_function="dot"`` on normalised embeddings. The corpus
is visited in chunks and a running top-k is merged per chunk, so memory stays bounded by
``queries × chunk_size`` scores whatever the corpus size (the corpus itself may be a
memory-mapped cache file). ``ignore_identical_ids`` drops a document whose id equals the query's
id, as BEIR does for ArguAna and Quora, where queries are themselves corpus documents.
On the CPU the products and the top-k run in numpy (no torch import, which ``synthq search``
cannot afford at start-up); on an accelerator in torch.
"""

from __future__ import annotations

import numpy as np

Run = dict[str, dict[str, float]]


def _to_run(
    scores: np.ndarray,
    indices: np.ndarray,
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
    queries = np.asarray(query_embeddings, dtype=np.float32)
    best_scores = np.zeros((len(query_ids), 0), dtype=np.float32)
    best_indices = np.zeros((len(query_ids), 0), dtype=np.int64)
    chunk_top_k = _numpy_top_k if device == "cpu" else _torch_top_k(queries, device)
    for start in range(0, len(doc_ids), chunk_size):
        block = np.asarray(doc_embeddings[start : start + chunk_size], dtype=np.float32)
        chunk_scores, chunk_indices = chunk_top_k(queries, block, min(k, block.shape[0]))
        best_scores, best_indices = _numpy_top_k_of(
            np.concatenate([best_scores, chunk_scores], axis=1),
            np.concatenate([best_indices, chunk_indices + start], axis=1),
            k,
        )
    return _to_run(best_scores, best_indices, query_ids, doc_ids, top_k, ignore_identical_ids)


def _numpy_top_k_of(scores: np.ndarray, indices: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best (score, index) pairs of every row, best first."""
    if scores.shape[1] > k:
        keep = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        scores, indices = np.take_along_axis(scores, keep, 1), np.take_along_axis(indices, keep, 1)
    order = np.argsort(-scores, axis=1, kind="stable")
    return np.take_along_axis(scores, order, 1), np.take_along_axis(indices, order, 1)


def _numpy_top_k(queries: np.ndarray, block: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = queries @ block.T
    return _numpy_top_k_of(scores, np.broadcast_to(np.arange(block.shape[0]), scores.shape), k)


def _torch_top_k(queries: np.ndarray, device: str):
    """Scoring on an accelerator: the matrix product and the chunk's top-k run on ``device``,
    only the ``k`` best of each chunk come back."""
    import torch

    on_device = torch.as_tensor(queries, device=device)

    def top_k(_queries, block, k):
        scores, indices = (on_device @ torch.from_numpy(block).to(device).T).topk(k, dim=1)
        return scores.cpu().numpy(), indices.cpu().numpy()

    return top_k


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
    return _to_run(scores, indices, query_ids, doc_ids, top_k, ignore_identical_ids)
