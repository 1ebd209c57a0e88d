"""IR metrics with pytrec_eval (the trec_eval implementation BEIR uses).

The paper's headline pair, NDCG@10 and Recall@10, comes first; MRR@10 is trec_eval's
reciprocal rank on each query's top 10.
"""

from __future__ import annotations

import pytrec_eval

HEADLINE = ("ndcg@10", "recall@10")
METRICS = ("ndcg@10", "recall@10", "ndcg@1", "ndcg@3", "ndcg@5", "ndcg@100", "recall@100", "mrr@10", "map")

Run = dict[str, dict[str, float]]


def top_k(run: Run, k: int) -> Run:
    return {q: dict(sorted(docs.items(), key=lambda x: (-x[1], x[0]))[:k]) for q, docs in run.items()}


def evaluate(qrels: dict[str, dict[str, int]], run: Run) -> dict[str, float]:
    """Mean of each metric over the judged queries (queries missing from the run score 0)."""
    judged = {q: docs for q, docs in qrels.items() if any(r > 0 for r in docs.values())}
    full_run = {q: run.get(q, {}) or {"__none__": 0.0} for q in judged}
    measures = {"ndcg_cut.1,3,5,10,100", "recall.10,100", "map"}
    scores = pytrec_eval.RelevanceEvaluator(judged, measures).evaluate(full_run)
    mrr = pytrec_eval.RelevanceEvaluator(judged, {"recip_rank"}).evaluate(top_k(full_run, 10))
    names = {
        "ndcg@1": "ndcg_cut_1", "ndcg@3": "ndcg_cut_3", "ndcg@5": "ndcg_cut_5", "ndcg@10": "ndcg_cut_10",
        "ndcg@100": "ndcg_cut_100", "recall@10": "recall_10", "recall@100": "recall_100", "map": "map",
    }  # fmt: skip
    count = max(len(judged), 1)
    result = {metric: sum(s[key] for s in scores.values()) / count for metric, key in names.items()}
    result["mrr@10"] = sum(s["recip_rank"] for s in mrr.values()) / count
    return {metric: round(result[metric], 6) for metric in METRICS}
