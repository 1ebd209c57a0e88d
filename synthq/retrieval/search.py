"""Dense retrieval with an on-disk embedding cache, exact chunked search, optional FAISS, and BM25.

Corpus embeddings are cached under ``$SYNTHQ_CACHE/embeddings`` keyed by the sha256 of the
model (its retriever manifest, or its files) and of the corpus content and encoding length, so a
second evaluation of the same retriever on the same corpus encodes only the queries, and any
change to the corpus or the model misses the cache.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import torch

from synthq.console import progress
from synthq.data.pairs import document_text
from synthq.paths import cache_dir


def corpus_fingerprint(corpus: dict[str, dict[str, str]]) -> str:
    digest = hashlib.sha256()
    for doc_id in sorted(corpus):
        digest.update(doc_id.encode() + b"\x00" + document_text(corpus[doc_id]).encode() + b"\x01")
    return digest.hexdigest()


def encode_texts(model, texts: list[str], batch_size: int, description: str) -> np.ndarray:
    """Normalised embeddings in length-sorted batches (little padding), original order kept."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    output = np.zeros((len(texts), model.get_embedding_dimension()), dtype=np.float32)
    with progress() as bar:
        task = bar.add_task(description, total=len(texts))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            vectors = model.encode(
                [texts[i] for i in chunk],
                batch_size=batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
            )
            output[chunk] = vectors
            bar.advance(task, len(chunk))
    return output


def corpus_embeddings(
    model, model_key: str, corpus: dict[str, dict[str, str]], batch_size: int
) -> tuple[list[str], np.ndarray, bool]:
    """(doc ids, embeddings, cache hit)."""
    doc_ids = sorted(corpus)
    key = hashlib.sha256(
        json.dumps([model_key, corpus_fingerprint(corpus), model.max_seq_length]).encode()
    ).hexdigest()
    path = cache_dir("embeddings") / f"{key}.npy"
    if path.is_file():
        return doc_ids, np.load(path), True
    embeddings = encode_texts(
        model, [document_text(corpus[d]) for d in doc_ids], batch_size, "encoding corpus"
    )
    tmp = path.with_name(path.stem + f".tmp{os.getpid()}.npy")
    np.save(tmp, embeddings)
    os.replace(tmp, path)
    return doc_ids, embeddings, False


def exact_search(
    query_embeddings: np.ndarray,
    doc_embeddings: np.ndarray,
    query_ids: list[str],
    doc_ids: list[str],
    top_k: int,
    ignore_identical_ids: bool = False,
    chunk_size: int = 50_000,
    use_faiss: bool = False,
) -> dict[str, dict[str, float]]:
    """Top-k documents per query by dot product (cosine on normalised vectors).

    Chunked over the corpus so memory stays bounded; FAISS (``IndexFlatIP``) on request."""
    k = min(top_k + (1 if ignore_identical_ids else 0), len(doc_ids))
    if use_faiss:
        import faiss

        index = faiss.IndexFlatIP(doc_embeddings.shape[1])
        index.add(doc_embeddings.astype(np.float32))
        scores, indices = index.search(query_embeddings.astype(np.float32), k)
        best_scores, best_indices = torch.from_numpy(scores), torch.from_numpy(indices)
    else:
        queries = torch.from_numpy(query_embeddings)
        best_scores = torch.full((len(query_ids), k), float("-inf"))
        best_indices = torch.zeros((len(query_ids), k), dtype=torch.long)
        for start in range(0, len(doc_ids), chunk_size):
            block = torch.from_numpy(doc_embeddings[start : start + chunk_size])
            scores = queries @ block.T
            chunk_scores, chunk_indices = scores.topk(min(k, block.shape[0]), dim=1)
            merged_scores = torch.cat([best_scores, chunk_scores], dim=1)
            merged_indices = torch.cat([best_indices, chunk_indices + start], dim=1)
            best_scores, order = merged_scores.topk(k, dim=1)
            best_indices = merged_indices.gather(1, order)
    results = {}
    for row, query_id in enumerate(query_ids):
        hits = {}
        for score, index in zip(best_scores[row].tolist(), best_indices[row].tolist(), strict=True):
            doc_id = doc_ids[index]
            if ignore_identical_ids and doc_id == query_id:
                continue
            hits[doc_id] = float(score)
        results[query_id] = dict(list(hits.items())[:top_k])
    return results


def bm25_search(
    corpus: dict[str, dict[str, str]],
    queries: dict[str, str],
    top_k: int,
    ignore_identical_ids: bool = False,
) -> dict[str, dict[str, float]]:
    """BM25 (Lucene variant, k1 = 1.5, b = 0.75) with the ``bm25s`` package."""
    import logging

    import bm25s

    logging.getLogger("bm25s").setLevel(logging.WARNING)
    doc_ids = sorted(corpus)
    retriever = bm25s.BM25()
    retriever.index(
        bm25s.tokenize([document_text(corpus[d]) for d in doc_ids], stopwords="en", show_progress=False),
        show_progress=False,
    )
    query_ids = sorted(queries)
    k = min(top_k + (1 if ignore_identical_ids else 0), len(doc_ids))
    tokens = bm25s.tokenize([queries[q] for q in query_ids], stopwords="en", show_progress=False)
    indices, scores = retriever.retrieve(tokens, k=k, show_progress=False)
    results = {}
    for row, query_id in enumerate(query_ids):
        hits = {
            doc_ids[i]: float(s)
            for i, s in zip(indices[row], scores[row], strict=True)
            if not (ignore_identical_ids and doc_ids[i] == query_id)
        }
        results[query_id] = dict(list(hits.items())[:top_k])
    return results
