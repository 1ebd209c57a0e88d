"""Evaluation throughput on the embedded corpus with minilm-l6: synthq's cached exact search vs
BEIR's DenseRetrievalExactSearch on the same model and corpus, with identical metrics.

    python benchmarks/eval_throughput.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import os

    os.environ["SYNTHQ_CACHE"] = tempfile.mkdtemp()  # a cold cache for the first run
    from beir.retrieval.evaluation import EvaluateRetrieval
    from beir.retrieval.search.dense import DenseRetrievalExactSearch

    from synthq.data import load_source
    from synthq.data.pairs import document_text
    from synthq.models.encoder import load_encoder
    from synthq.retrieval.metrics import evaluate
    from synthq.retrieval.search import corpus_embeddings, encode_texts, exact_search

    dataset = load_source("embedded")
    queries = dataset.split_queries("test")
    query_ids = sorted(queries)
    model = load_encoder("minilm-l6")
    timings = {}
    for label in ("cold_cache", "warm_cache"):
        started = time.perf_counter()
        doc_ids, docs, hit = corpus_embeddings(model, "minilm-l6", dataset.corpus, 64)
        encoded = encode_texts(model, [queries[q] for q in query_ids], 64, "queries")
        ours = exact_search(encoded, docs, query_ids, doc_ids, 100)
        timings[label] = time.perf_counter() - started
    ours_metrics = evaluate(dataset.qrels["test"], ours)

    class Wrapper:
        def encode_queries(self, texts, batch_size=64, **kwargs):
            return model.encode(texts, batch_size=batch_size, normalize_embeddings=True)

        def encode_corpus(self, corpus, batch_size=64, **kwargs):
            return model.encode(
                [document_text(d) for d in corpus], batch_size=batch_size, normalize_embeddings=True
            )

    started = time.perf_counter()
    beir_results = DenseRetrievalExactSearch(Wrapper(), batch_size=64).search(
        dataset.corpus, queries, 100, "dot"
    )
    beir_seconds = time.perf_counter() - started
    ndcg, _, recall, _ = EvaluateRetrieval.evaluate(dataset.qrels["test"], beir_results, [10])
    print(
        json.dumps(
            {
                "benchmark": "eval_throughput[minilm-l6, embedded test]",
                "documents": len(doc_ids),
                "queries": len(query_ids),
                "ours_cold_seconds": round(timings["cold_cache"], 3),
                "ours_warm_seconds": round(timings["warm_cache"], 3),
                "beir_seconds": round(beir_seconds, 3),
                "docs_per_second_cold": round(len(doc_ids) / timings["cold_cache"], 1),
                "speedup_vs_beir_cold": round(beir_seconds / timings["cold_cache"], 2),
                "speedup_vs_beir_warm": round(beir_seconds / timings["warm_cache"], 2),
                "ndcg@10": {"ours": ours_metrics["ndcg@10"], "beir": ndcg["NDCG@10"]},
                "recall@10": {"ours": ours_metrics["recall@10"], "beir": recall["Recall@10"]},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
