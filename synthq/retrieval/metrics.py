"""IR metrics with pytrec_eval (the trec_eval implementation BEIR uses).

The paper's headline pair, NDCG@10 and Recall@10, comes first. NDCG uses trec_eval's gain (the
relevance grade itself, not 2^grade - 1), as BEIR reports it. MRR@10 is trec_eval's reciprocal
rank on each query's top 10, cut with trec_eval's own order (score descending, ties by document
id descending) so that it ranks exactly as the NDCG computation does.

Unlike BEIR's ``EvaluateRetrieval.evaluate``, which averages over the queries present in the run,
a judged query that the run leaves out counts as 0 here: a retriever cannot raise its score by
returning nothing for hard queries. Queries whose judgements are all 0 are not judged queries
(trec_eval skips them too) and do not enter the mean.
"""

from __future__ import annotations

import pytrec_eval

from synthq.runtime.errors import DataError

HEADLINE = ("ndcg@10", "recall@10")
METRICS = ("ndcg@10", "recall@10", "ndcg@1", "ndcg@3", "ndcg@5", "ndcg@100", "recall@100", "mrr@10", "map")

_TREC_NAMES = {
    "ndcg@1": "ndcg_cut_1", "ndcg@3": "ndcg_cut_3", "ndcg@5": "ndcg_cut_5", "ndcg@10": "ndcg_cut_10",
    "ndcg@100": "ndcg_cut_100", "recall@10": "recall_10", "recall@100": "recall_100", "map": "map",
}  # fmt: skip

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]


def top_k(run: Run, k: int) -> Run:
    """Each query's first ``k`` documents in trec_eval's order (score desc, then doc id desc)."""
    ranked = {}
    for query_id, docs in run.items():
        by_id_desc = sorted(docs.items(), key=lambda item: item[0], reverse=True)
        ranked[query_id] = dict(sorted(by_id_desc, key=lambda item: -item[1])[:k])
    return ranked


def judged_queries(qrels: Qrels) -> Qrels:
    """The queries with at least one relevant (grade > 0) document."""
    return {q: docs for q, docs in qrels.items() if any(grade > 0 for grade in docs.values())}


def per_query(qrels: Qrels, run: Run) -> dict[str, dict[str, float]]:
    """Every metric of :data:`METRICS` for every judged query (missing from the run -> 0)."""
    judged = judged_queries(qrels)
    if not judged:
        raise DataError("no judged queries: every qrels grade is 0 or the qrels are empty")
    full_run = {q: dict(run.get(q, {})) for q in judged}
    measures = {"ndcg_cut.1,3,5,10,100", "recall.10,100", "map"}
    scores = pytrec_eval.RelevanceEvaluator(judged, measures).evaluate(full_run)
    reciprocal = pytrec_eval.RelevanceEvaluator(judged, {"recip_rank"}).evaluate(top_k(full_run, 10))
    table = {}
    for query_id in judged:
        row = {metric: scores[query_id][key] for metric, key in _TREC_NAMES.items()}
        row["mrr@10"] = reciprocal[query_id]["recip_rank"]
        table[query_id] = {metric: row[metric] for metric in METRICS}
    return table


def evaluate(qrels: Qrels, run: Run) -> dict[str, float]:
    """Mean of each metric over the judged queries, rounded to 6 decimals, headline pair first.

    Args:
        qrels: ``{query_id: {doc_id: grade}}``; grades > 0 are relevant (graded for NDCG).
        run: ``{query_id: {doc_id: score}}``, higher is better; at least the top 100 per query
            for NDCG@100 and Recall@100 to mean what they say.
    """
    return query_means(per_query(qrels, run))


def query_means(table: dict[str, dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over the queries of a :func:`per_query` table, rounded to 6 decimals."""
    return {metric: round(sum(row[metric] for row in table.values()) / len(table), 6) for metric in METRICS}


def mean_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """The unweighted mean over sub-datasets (BEIR's convention for CQADupStack's sub-forums)."""
    if not parts:
        raise DataError("no sub-dataset results to average")
    return {metric: round(sum(p[metric] for p in parts) / len(parts), 6) for metric in METRICS}
