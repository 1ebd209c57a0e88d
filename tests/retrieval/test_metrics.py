"""Metrics: hand-computed values, pytrec_eval's per-query numbers, and BEIR's evaluator."""

from __future__ import annotations

import math
import random

import pytest

from synthq.retrieval.metrics import METRICS, evaluate, mean_metrics, per_query, top_k
from synthq.runtime.errors import DataError


def test_hand_computed():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1, "c": 1}}
    run = {"q1": {"x": 3.0, "a": 2.0}, "q2": {"b": 5.0, "y": 4.0, "c": 1.0}}
    result = evaluate(qrels, run)
    ndcg_q1 = 1 / math.log2(3)
    ndcg_q2 = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert result["ndcg@10"] == pytest.approx((ndcg_q1 + ndcg_q2) / 2, abs=1e-6)
    assert result["recall@10"] == pytest.approx(1.0)
    assert result["mrr@10"] == pytest.approx((0.5 + 1.0) / 2)
    assert result["ndcg@1"] == pytest.approx(0.5)
    # AP: q1 = 1/2; q2 = (1/1 + 2/3) / 2
    assert result["map"] == pytest.approx((0.5 + (1 + 2 / 3) / 2) / 2, abs=1e-6)
    assert list(result) == list(METRICS) and list(result)[:2] == ["ndcg@10", "recall@10"]


def test_graded_ndcg_by_hand():
    qrels = {"q": {"a": 2, "b": 1}}
    run = {"q": {"b": 2.0, "a": 1.0}}
    # trec_eval's NDCG uses the grade itself as the gain (not 2^grade - 1), as BEIR reports it.
    dcg = 1 / math.log2(2) + 2 / math.log2(3)
    ideal = 2 / math.log2(2) + 1 / math.log2(3)
    assert evaluate(qrels, run)["ndcg@10"] == pytest.approx(dcg / ideal, abs=1e-6)


def test_missing_and_unjudged_queries():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 0}}
    run = {"q1": {"a": 1.0}}  # q2 not retrieved at all; q3 has no relevant document
    result = evaluate(qrels, run)
    assert result["ndcg@10"] == pytest.approx(0.5) and result["recall@100"] == pytest.approx(0.5)
    assert set(per_query(qrels, run)) == {"q1", "q2"}
    with pytest.raises(DataError, match="no judged queries"):
        evaluate({"q": {"a": 0}}, run)


def test_mrr_is_cut_at_ten_in_trec_eval_order():
    relevant_11th = {f"d{i:02d}": 100.0 - i for i in range(10)} | {"rel": 1.0}
    assert evaluate({"q": {"rel": 1}}, {"q": relevant_11th})["mrr@10"] == 0.0
    # Ties are ranked by document id descending, as trec_eval (and so NDCG here) ranks them.
    tied = {"q": {"a": 1.0, "b": 1.0}}
    assert list(top_k(tied, 2)["q"]) == ["b", "a"]
    scores = evaluate({"q": {"a": 1}}, tied)
    assert scores["mrr@10"] == pytest.approx(0.5) and scores["ndcg@1"] == 0.0


def _random_case(seed: int):
    rng = random.Random(seed)
    docs = [f"d{i}" for i in range(300)]
    qrels = {
        f"q{i}": {d: rng.choice([1, 1, 2]) for d in rng.sample(docs, rng.randint(1, 4))} for i in range(40)
    }
    run = {q: {d: rng.random() for d in rng.sample(docs, 150)} for q in qrels}
    return qrels, run


def test_equals_pytrec_eval_per_query():
    import pytrec_eval

    qrels, run = _random_case(0)
    ours = per_query(qrels, run)
    direct = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100", "map"}).evaluate(run)
    for q in qrels:
        assert ours[q]["ndcg@10"] == pytest.approx(direct[q]["ndcg_cut_10"])
        assert ours[q]["recall@100"] == pytest.approx(direct[q]["recall_100"])
        assert ours[q]["map"] == pytest.approx(direct[q]["map"])


def test_equals_beir_evaluator():
    from beir.retrieval.evaluation import EvaluateRetrieval

    qrels, run = _random_case(1)
    ours = evaluate(qrels, run)
    ndcg, _, recall, _ = EvaluateRetrieval.evaluate(
        qrels, run, [1, 3, 5, 10, 100], ignore_identical_ids=False
    )
    mrr = EvaluateRetrieval.evaluate_custom(qrels, run, [10], metric="mrr")
    for k in (1, 3, 5, 10, 100):
        assert ours[f"ndcg@{k}"] == pytest.approx(ndcg[f"NDCG@{k}"], abs=1e-5)
    assert ours["recall@10"] == pytest.approx(recall["Recall@10"], abs=1e-5)
    assert ours["recall@100"] == pytest.approx(recall["Recall@100"], abs=1e-5)
    assert ours["mrr@10"] == pytest.approx(mrr["MRR@10"], abs=1e-5)


def test_mean_over_sub_datasets():
    a = dict.fromkeys(METRICS, 0.2)
    b = dict.fromkeys(METRICS, 0.6)
    assert mean_metrics([a, b]) == pytest.approx(dict.fromkeys(METRICS, 0.4))
    with pytest.raises(DataError):
        mean_metrics([])
