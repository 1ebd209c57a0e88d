"""Evaluation throughput: synthq's cached exact search vs BEIR's DenseRetrievalExactSearch.

    python benchmarks/eval_throughput.py [--repeats 2] [--model minilm-l6] [--docs 200000] [--queries 1000]

Part 1, embedded corpus (test split) with ``--model`` (minilm-l6), both paths on the same model and corpus in
one process: BEIR (encode corpus + queries, search) against synthq with a cold cache (encode
corpus into the cache + queries, search) and a warm cache (queries and search only). Cold and
BEIR runs alternate ``--repeats`` times; medians are reported, with both sets of metrics.

Part 2, a larger generated corpus (random unit vectors, ``--docs`` × ``--dim``): search alone,
BEIR's chunked top-k + per-query heaps (its model returns the precomputed vectors) against
synthq's chunked top-k merge and FAISS, with the top-100 lists compared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._measure import emit  # noqa: E402


def _timed(function):
    started = time.perf_counter()
    value = function()
    return time.perf_counter() - started, value


def embedded_part(repeats: int, model_spec: str = "minilm-l6") -> dict:
    from beir.retrieval.evaluation import EvaluateRetrieval
    from beir.retrieval.search.dense import DenseRetrievalExactSearch

    from synthq.data.pairs import document_text
    from synthq.data.sources import load_source
    from synthq.models.encoder import load_encoder
    from synthq.retrieval.cache import corpus_embeddings, encode_texts
    from synthq.retrieval.metrics import evaluate
    from synthq.retrieval.topk import exact_search

    dataset = load_source("embedded")
    queries = dataset.split_queries("test")
    qrels = dataset.qrels["test"]
    query_ids = sorted(queries)
    model = load_encoder(model_spec)

    class Wrapper:  # BEIR's dense-model interface over the same SentenceTransformer
        def encode_queries(self, texts, batch_size=64, **kwargs):
            return model.encode(
                texts, batch_size=batch_size, normalize_embeddings=True, convert_to_tensor=True
            )

        def encode_corpus(self, corpus, batch_size=64, **kwargs):
            texts = [document_text(d) for d in corpus]
            return model.encode(
                texts, batch_size=batch_size, normalize_embeddings=True, convert_to_tensor=True
            )

    def ours(key: str):
        corpus = corpus_embeddings(model, key, dataset.corpus, 64)
        encoded = encode_texts(model, [queries[q] for q in query_ids], 64, "queries")
        return corpus.cache_hit, exact_search(encoded, corpus.embeddings, query_ids, corpus.doc_ids, 100)

    def beir():
        search = DenseRetrievalExactSearch(Wrapper(), batch_size=64, show_progress_bar=False)
        return search.search(dataset.corpus, queries, 100, "dot")

    ours("warm-up")  # loads kernels and tokenizer caches for both paths alike
    cold, beir_seconds, warm = [], [], []
    for repeat in range(repeats):
        seconds, (hit, ours_run) = _timed(lambda repeat=repeat: ours(f"cold-{repeat}"))
        assert not hit
        cold.append(seconds)
        seconds, beir_run = _timed(beir)
        beir_seconds.append(seconds)
        seconds, (hit, _) = _timed(lambda repeat=repeat: ours(f"cold-{repeat}"))
        assert hit
        warm.append(seconds)
    encode_seconds, _ = _timed(lambda: corpus_embeddings(model, "encode-only", dataset.corpus, 64))
    ours_metrics = evaluate(qrels, ours_run)
    ndcg, _, recall, _ = EvaluateRetrieval.evaluate(qrels, beir_run, [10, 100], ignore_identical_ids=False)
    cold_s, beir_s, warm_s = (statistics.median(x) for x in (cold, beir_seconds, warm))
    return {
        "model": model_spec,
        "documents": len(dataset.corpus),
        "queries": len(query_ids),
        "repeats": repeats,
        "ours_cold_seconds": round(cold_s, 3),
        "ours_warm_seconds": round(warm_s, 3),
        "beir_seconds": round(beir_s, 3),
        "speedup_vs_beir_cold": round(beir_s / cold_s, 2),
        "speedup_vs_beir_warm": round(beir_s / warm_s, 2),
        "encode_docs_per_second": round(len(dataset.corpus) / encode_seconds, 1),
        "warm_queries_per_second": round(len(query_ids) / warm_s, 1),
        "metrics": {
            "ndcg@10": {"ours": ours_metrics["ndcg@10"], "beir": round(ndcg["NDCG@10"], 6)},
            "recall@10": {"ours": ours_metrics["recall@10"], "beir": round(recall["Recall@10"], 6)},
            "ndcg@100": {"ours": ours_metrics["ndcg@100"], "beir": round(ndcg["NDCG@100"], 6)},
        },
    }


def generated_part(docs: int, queries: int, dim: int) -> dict:
    import numpy as np
    import torch
    from beir.retrieval.search.dense import DenseRetrievalExactSearch

    from synthq.retrieval.topk import exact_search, faiss_search

    rng = np.random.default_rng(0)
    doc_vectors = rng.standard_normal((docs, dim), dtype=np.float32)
    doc_vectors /= np.linalg.norm(doc_vectors, axis=1, keepdims=True)
    query_vectors = rng.standard_normal((queries, dim), dtype=np.float32)
    query_vectors /= np.linalg.norm(query_vectors, axis=1, keepdims=True)
    doc_ids = [f"d{i}" for i in range(docs)]
    query_ids = [f"q{i}" for i in range(queries)]
    row_of = {doc_id: i for i, doc_id in enumerate(doc_ids)}
    # Equal text lengths, so BEIR's length sort keeps id order; "_id" lets the model look vectors up.
    corpus = {doc_id: {"_id": doc_id, "title": "", "text": "x"} for doc_id in doc_ids}
    query_texts = {q: q for q in query_ids}

    class Precomputed:  # search cost only: "encoding" returns the stored vectors
        def encode_queries(self, texts, **kwargs):
            return torch.from_numpy(query_vectors[[int(t[1:]) for t in texts]])

        def encode_corpus(self, chunk, **kwargs):
            return torch.from_numpy(doc_vectors[[row_of[d["_id"]] for d in chunk]])

    beir_seconds, beir_run = _timed(
        lambda: DenseRetrievalExactSearch(Precomputed(), show_progress_bar=False).search(
            corpus, query_texts, 100, "dot"
        )
    )
    ours_seconds, ours_run = _timed(lambda: exact_search(query_vectors, doc_vectors, query_ids, doc_ids, 100))
    faiss_seconds, faiss_run = _timed(
        lambda: faiss_search(query_vectors, doc_vectors, query_ids, doc_ids, 100)
    )

    def same(run) -> float:  # share of queries whose top-100 set equals BEIR's
        return sum(set(run[q]) == set(beir_run[q]) for q in query_ids) / len(query_ids)

    return {
        "documents": docs,
        "queries": queries,
        "dim": dim,
        "beir_search_seconds": round(beir_seconds, 3),
        "ours_search_seconds": round(ours_seconds, 3),
        "faiss_search_seconds": round(faiss_seconds, 3),
        "speedup_vs_beir": round(beir_seconds / ours_seconds, 2),
        "faiss_speedup_vs_beir": round(beir_seconds / faiss_seconds, 2),
        "ours_queries_per_second": round(queries / ours_seconds, 1),
        "identical_top100_share": {"ours": same(ours_run), "faiss": same(faiss_run)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="minilm-l6", help="Encoder spec for part 1.")
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=384)
    args = parser.parse_args()
    os.environ["SYNTHQ_CACHE"] = tempfile.mkdtemp(prefix="synthq-bench-")  # cold caches, removed by the OS
    import torch

    from synthq.runtime.console import set_verbosity

    set_verbosity(0)  # no progress bars: stdout is the JSON
    results = {
        "benchmark": "eval_throughput",
        "threads": torch.get_num_threads(),
        "embedded": embedded_part(args.repeats, args.model),
        "generated_search_only": generated_part(args.docs, args.queries, args.dim),
    }
    emit(results)


if __name__ == "__main__":
    main()
