"""synthq eval: metrics vs pytrec_eval and BEIR's own evaluator, cache, identical ids, outputs."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from synthq.artifacts import create_artifact, open_artifact
from synthq.config import EvalConfig
from synthq.data import load_beir_dir
from synthq.errors import ArtifactError, DataError
from synthq.privacy import Guarantee
from synthq.retrieval.metrics import evaluate as metrics
from synthq.retrieval.search import exact_search
from synthq.stages import evaluate


@pytest.fixture(scope="module")
def retriever(tmp_path_factory, tiny_encoder_dir):
    out = tmp_path_factory.mktemp("ret") / "ret-dp"
    with create_artifact(out, "train-retriever", {"encoder": "tiny", "dp": "group"}) as writer:
        shutil.copytree(tiny_encoder_dir, writer.dir, dirs_exist_ok=True)
        writer.privacy = Guarantee(epsilon=4.0, delta=1e-5, mechanism="dp-group", accountant="rdp")
    return open_artifact(out)


def test_metrics_by_hand():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1, "c": 1}}
    run = {"q1": {"x": 3.0, "a": 2.0}, "q2": {"b": 5.0, "y": 4.0, "c": 1.0}}
    result = metrics(qrels, run)
    ndcg_q1 = 1 / math.log2(3)
    ideal_q2 = 1 + 1 / math.log2(3)
    ndcg_q2 = (1 + 1 / math.log2(4)) / ideal_q2
    assert result["ndcg@10"] == pytest.approx((ndcg_q1 + ndcg_q2) / 2, abs=1e-6)
    assert result["recall@10"] == pytest.approx(1.0)
    assert result["mrr@10"] == pytest.approx((0.5 + 1.0) / 2)
    assert result["ndcg@1"] == pytest.approx(0.5)


def test_agrees_with_beir(tmp_path, retriever, tiny_beir):
    from beir.retrieval.evaluation import EvaluateRetrieval
    from beir.retrieval.search.dense import DenseRetrievalExactSearch
    from sentence_transformers import SentenceTransformer

    artifact = evaluate.run(
        EvalConfig(
            retrievers=[str(retriever.path)], datasets=[str(tiny_beir)], out=tmp_path / "eval", bm25=False
        )
    )
    ours = json.loads((artifact.path / "results.json").read_text())[0]["metrics"]
    model = SentenceTransformer(str(retriever.path))

    class Wrapper:  # BEIR's dense search interface over the same model
        def encode_queries(self, queries, batch_size=16, **kwargs):
            return model.encode(queries, batch_size=batch_size, normalize_embeddings=True)

        def encode_corpus(self, corpus, batch_size=16, **kwargs):
            texts = [(f"{d['title']}. {d['text']}" if d.get("title") else d["text"]) for d in corpus]
            return model.encode(texts, batch_size=batch_size, normalize_embeddings=True)

    dataset = load_beir_dir(tiny_beir)
    queries = dataset.split_queries("test")
    search = DenseRetrievalExactSearch(Wrapper(), batch_size=16, corpus_chunk_size=5)
    results = search.search(dataset.corpus, queries, top_k=100, score_function="dot")
    ndcg, _map, recall, _precision = EvaluateRetrieval.evaluate(dataset.qrels["test"], results, [10])
    assert ours["ndcg@10"] == pytest.approx(ndcg["NDCG@10"], abs=1e-4)
    assert ours["recall@10"] == pytest.approx(recall["Recall@10"], abs=1e-4)


def test_cache_hit_then_invalidated_by_corpus_change(tmp_path, retriever, tiny_beir):
    first = evaluate.run(
        EvalConfig(retrievers=[str(retriever.path)], datasets=[str(tiny_beir)], out=tmp_path / "1")
    )
    second = evaluate.run(
        EvalConfig(retrievers=[str(retriever.path)], datasets=[str(tiny_beir)], out=tmp_path / "2")
    )
    assert first.timings["cache_hits"] == 0 or second.timings["cache_hits"] == 1
    assert second.timings["cache_hits"] == 1
    changed = tmp_path / "changed"
    shutil.copytree(tiny_beir, changed)
    with open(changed / "corpus.jsonl", "a") as handle:
        handle.write(json.dumps({"_id": "new", "title": "", "text": "a brand new document"}) + "\n")
    third = evaluate.run(
        EvalConfig(retrievers=[str(retriever.path)], datasets=[str(changed)], out=tmp_path / "3")
    )
    assert third.timings["cache_hits"] == 0


def test_outputs_show_epsilon_and_reference_rows(tmp_path, retriever, tiny_beir):
    artifact = evaluate.run(
        EvalConfig(retrievers=[str(retriever.path)], datasets=[str(tiny_beir)], out=tmp_path / "e", bm25=True)
    )
    rows = json.loads((artifact.path / "results.json").read_text())
    assert {r["retriever"] for r in rows} == {"BM25", "ret-dp"}
    table = (artifact.path / "results.md").read_text()
    assert "| ret-dp | direct DP (group), tiny | 4.00 |" in table and "| BM25 | bm25 | 0.00 |" in table
    assert (artifact.path / "privacy_utility.png").stat().st_size > 1000
    assert artifact.privacy.epsilon == 4.0


def test_identical_ids_are_dropped():
    import numpy as np

    vectors = np.eye(3, dtype=np.float32)
    kept = exact_search(
        vectors, vectors, ["a", "b", "c"], ["a", "b", "c"], top_k=2, ignore_identical_ids=True
    )
    assert all(q not in hits for q, hits in kept.items()) and all(len(h) == 2 for h in kept.values())
    plain = exact_search(vectors, vectors, ["a", "b", "c"], ["a", "b", "c"], top_k=2)
    assert next(iter(plain["a"])) == "a"


def test_bad_input(tmp_path, tiny_beir):
    wrong = tmp_path / "wrong"
    with create_artifact(wrong, "generate", {}) as writer:
        (writer.dir / "x").write_text("x")
        writer.privacy = Guarantee(epsilon=1.0, delta=1e-5)
    with pytest.raises(ArtifactError, match="expected 'train-retriever'"):
        evaluate.run(EvalConfig(retrievers=[str(wrong)], datasets=[str(tiny_beir)], out=tmp_path / "o"))
    with pytest.raises(DataError, match="unknown BEIR dataset"):
        evaluate.run(EvalConfig(retrievers=[], datasets=["beir:nonsense"], out=tmp_path / "o"))
    with pytest.raises(DataError, match="nothing to evaluate"):
        evaluate.run(EvalConfig(retrievers=[], datasets=[str(tiny_beir)], bm25=False, out=tmp_path / "o"))
    empty = tmp_path / "empty"
    shutil.copytree(tiny_beir, empty)
    (empty / "corpus.jsonl").write_text("")
    with pytest.raises(DataError, match="corpus is empty"):
        evaluate.run(EvalConfig(retrievers=[], datasets=[str(empty)], out=tmp_path / "o"))
