"""Scoring a dense encoder on one dataset: cached corpus embeddings, exact search, per-query metrics.

The corpus is encoded once per (model, corpus) (:mod:`synthq.retrieval.cache`), the queries
every time; search is exact (:func:`synthq.retrieval.topk.exact_search`, or FAISS) and each
query is scored with pytrec_eval (:func:`synthq.retrieval.metrics.per_query`). Every run reports
its throughput, which :class:`Throughput` sums over runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from synthq.retrieval.cache import corpus_embeddings, encode_texts
from synthq.retrieval.metrics import per_query
from synthq.retrieval.topk import exact_search


def score_dense(
    load: Callable,
    key: str,
    corpus: dict[str, dict[str, str]],
    queries: dict[str, str],
    qrels: dict[str, dict[str, int]],
    *,
    batch_size: int,
    top_k: int,
    ignore_identical: bool,
    chunk_size: int,
    use_faiss: bool,
    device: str,
) -> tuple[dict[str, dict[str, float]], dict, dict[str, dict[str, float]]]:
    """Per-query metrics, throughput and the ranked lists of one dense model on one (sub-)dataset.

    Args:
        load: returns the encoder; it is loaded here and dropped on return.
        key: the embedding-cache key of its weights (:func:`synthq.retrieval.cache.weights_key`).
        batch_size: encoding batch size. ``top_k``, ``chunk_size``, ``use_faiss``, ``device``:
            :func:`synthq.retrieval.topk.exact_search`'s.
        ignore_identical: drop a document whose id is the query's (ArguAna, Quora).
    """
    # One model in memory at a time (the paper's tables hold many T5-Base retrievers);
    # reloading per dataset costs seconds, encoding a corpus costs far more.
    model = load()
    embedded = corpus_embeddings(model, key, corpus, batch_size)
    query_ids = sorted(queries)
    started = time.perf_counter()
    query_embeddings = encode_texts(model, [queries[q] for q in query_ids], batch_size, "encoding queries")
    encoded = time.perf_counter()
    results = exact_search(
        query_embeddings,
        embedded.embeddings,
        query_ids,
        embedded.doc_ids,
        top_k,
        ignore_identical,
        chunk_size=chunk_size,
        use_faiss=use_faiss,
        device=device,
    )
    searched = time.perf_counter()
    timing = {
        "documents": len(embedded.doc_ids),
        "queries": len(query_ids),
        "cache_hit": embedded.cache_hit,
        "encode_seconds": round(embedded.encode_seconds, 6),
        "encode_docs_per_second": None
        if embedded.cache_hit
        else round(len(embedded.doc_ids) / max(embedded.encode_seconds, 1e-9), 2),
        "query_seconds": round(searched - started, 6),
        "encode_queries_per_second": round(len(query_ids) / max(encoded - started, 1e-9), 2),
        "search_queries_per_second": round(len(query_ids) / max(searched - encoded, 1e-9), 2),
    }
    return per_query(qrels, results), timing, results


def _totals() -> dict[str, float]:
    return {"documents_encoded": 0, "encode_seconds": 0.0, "queries": 0, "query_seconds": 0.0}


@dataclass
class Throughput:
    """The timings of many :func:`score_dense` runs: each run's, cache hits and misses, and the
    overall documents encoded and queries answered per second."""

    per_run: dict[str, dict] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=_totals)
    cache: dict[str, int] = field(default_factory=lambda: {"hits": 0, "misses": 0})

    def add(self, run: str, timing: dict) -> None:
        """Count one run's ``timing`` (as :func:`score_dense` returns it) under the name ``run``."""
        self.per_run[run] = timing
        self.cache["hits" if timing["cache_hit"] else "misses"] += 1
        if not timing["cache_hit"]:
            self.totals["documents_encoded"] += timing["documents"]
            self.totals["encode_seconds"] += timing["encode_seconds"]
        self.totals["queries"] += timing["queries"]
        self.totals["query_seconds"] += timing["query_seconds"]

    def summary(self, device: str) -> dict:
        """Every run's timing (``per_run``), then cache hits and misses, overall throughput and
        the device."""
        totals = self.totals
        return {
            "per_run": self.per_run,
            "cache_hits": self.cache["hits"],
            "cache_misses": self.cache["misses"],
            "encode_docs_per_second": round(totals["documents_encoded"] / totals["encode_seconds"], 2)
            if totals["encode_seconds"]
            else None,
            "queries_per_second": round(totals["queries"] / totals["query_seconds"], 2)
            if totals["query_seconds"]
            else None,
            "device": device,
        }
