"""synthq filter: round-trip consistency against BM25 computed independently, likelihood ranking
against the generator's own scores, the public hold-out split, the inherited guarantee, and the
downstream stages taking a filtered set."""

from __future__ import annotations

import json

import pytest

from synthq.artifacts.manifest import open_artifact
from synthq.config.evaluation import EvalConfig
from synthq.config.generator import FilterConfig, GenerateConfig
from synthq.data.beir_io import load_beir_dir
from synthq.runtime.errors import ArtifactError, DataError, SettingError
from synthq.stages import evaluate, generate, train_retriever
from synthq.stages import filter as filter_stage
from tests.helpers import finetune, retriever_config


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory, tiny_beir, tiny_causal_dir):
    root = tmp_path_factory.mktemp("filter")
    generator = finetune(root, tiny_beir, tiny_causal_dir, "gen", epsilon=8.0, max_steps=2, seed=0)
    return generate.run(
        GenerateConfig(
            generator=generator.path, corpus=str(tiny_beir), out=root / "syn", num_queries=3,
            max_new_tokens=6, seed=0,
        )
    )  # fmt: skip


def _pairs(artifact, split="train") -> dict[str, str]:
    data = load_beir_dir(artifact.path)
    return {q: next(iter(d)) for q, d in data.qrels.get(split, {}).items()}


def test_selection_rules():
    ranked = {"a": {"d1": 0.9, "d2": 0.8}, "b": {"d3": 0.5, "d1": 0.5}, "c": {"d9": 1.0, "d4": 0.1}}
    own = {"a": "d2", "b": "d3", "c": "d4"}
    assert filter_stage.round_trip_kept(ranked, own, 1) == set()  # b: the tie goes to d1 (by id)
    assert filter_stage.round_trip_kept(ranked, own, 2) == {"a", "b", "c"}
    scores = {"q1": -1.0, "q2": -0.5, "q3": -0.5, "q4": -3.0}
    own = {"q1": "d", "q2": "d", "q3": "d", "q4": "e"}
    assert filter_stage.most_likely_kept(scores, own, 1) == {"q2", "q4"}
    assert filter_stage.most_likely_kept(scores, own, 2) == {"q2", "q3", "q4"}
    ids = [f"doc-{i}" for i in range(50)]
    held = filter_stage.holdout_documents(ids, 5)
    assert len(held) == 5 and held == filter_stage.holdout_documents(list(reversed(ids)), 5)


def test_consistency_keeps_what_bm25_finds_and_inherits_the_generator(tmp_path, synthetic, monkeypatch):
    import time

    from synthq.retrieval import bm25

    search = bm25.bm25_search
    monkeypatch.setattr(bm25, "bm25_search", lambda *a: (time.sleep(0.3), search(*a))[1])  # a slow ranking
    top_k = 3
    kept = filter_stage.run(
        FilterConfig(
            synthetic=synthetic.path, out=tmp_path / "f", method="consistency", retriever="bm25", top_k=top_k
        )
    )
    data = load_beir_dir(synthetic.path)
    queries = {q: data.queries[q] for q in data.qrels["train"]}
    independent = search(data.corpus, queries, top_k)
    expected = {q for q, ranked in independent.items() if next(iter(data.qrels["train"][q])) in ranked}
    assert set(_pairs(kept)) == expected and expected
    assert kept.metrics["kept_fraction"] == pytest.approx(len(expected) / len(queries))
    assert kept.privacy.epsilon == pytest.approx(synthetic.privacy.epsilon)  # post-processing
    assert {r["id"] for r in kept.releases} == {r["id"] for r in synthetic.releases}
    assert kept.timings["wall_seconds"] >= 0.3  # the stage's time includes the ranking before the write


def test_likelihood_keeps_each_documents_most_likely_query(tmp_path, synthetic, tiny_encoder_dir):
    from synthq.models.generator import QueryGenerator

    kept = filter_stage.run(
        FilterConfig(synthetic=synthetic.path, out=tmp_path / "l", method="likelihood", keep=1)
    )
    data = load_beir_dir(synthetic.path)
    generator = QueryGenerator.load(synthetic.config["generator"], device="cpu")
    generator.model.eval()
    by_document: dict[str, list[tuple[float, str]]] = {}
    for query_id, docs in data.qrels["train"].items():
        doc_id = next(iter(docs))
        text = data.queries[query_id]
        document = data.corpus[doc_id]
        total = generator.query_log_likelihood([f"{document['title']} {document['text']}"], [text])[0]
        tokens = len(generator.tokenizer(text, add_special_tokens=False)["input_ids"]) + 1
        by_document.setdefault(doc_id, []).append((-float(total) / tokens, query_id))
    expected = {min(candidates)[1] for candidates in by_document.values()}
    assert set(_pairs(kept)) == expected and len(expected) == len(by_document)
    retriever = train_retriever.run(retriever_config(tmp_path / "r", kept.path, tiny_encoder_dir))
    label = evaluate.describe_method(retriever)
    assert "likelihood-filtered" in label and "queries/doc" not in label  # one kept per document


def test_held_out_documents_give_a_dev_split_to_select_on_for_free(
    tmp_path, synthetic, tiny_encoder_dir, tiny_beir
):
    held = filter_stage.run(
        FilterConfig(synthetic=synthetic.path, out=tmp_path / "h", method="none", holdout_documents=3)
    )
    train, dev = _pairs(held), _pairs(held, "dev")
    assert len({*dev.values()}) == 3 and not set(train.values()) & set(dev.values())
    assert len(train) + len(dev) == synthetic.metrics["queries"]
    retrievers = [
        train_retriever.run(retriever_config(tmp_path / f"r{lr}", held.path, tiny_encoder_dir, lr=lr))
        for lr in (1e-4, 1e-3)
    ]
    assert all("dev" not in json.dumps(r.config) or r.config["split"] == "train" for r in retrievers)
    on_dev = evaluate.run(
        EvalConfig(
            out=tmp_path / "dev", retrievers=[str(r.path) for r in retrievers], datasets=[str(held.path)],
            split="dev", bm25=False,
        )
    )  # fmt: skip
    assert on_dev.privacy.epsilon == pytest.approx(synthetic.privacy.epsilon)  # nothing private read
    with pytest.raises(DataError, match="the split this eval reports"):  # chosen on what it reports
        evaluate.run(
            EvalConfig(
                out=tmp_path / "same", retrievers=[str(r.path) for r in retrievers],
                datasets=[str(held.path)], split="dev", bm25=False, select_on=str(on_dev.path),
            )
        )  # fmt: skip
    chosen = evaluate.run(
        EvalConfig(
            out=tmp_path / "test", retrievers=[str(r.path) for r in retrievers], datasets=[str(tiny_beir)],
            split="test", bm25=False, select_on=str(on_dev.path),
        )
    )  # fmt: skip
    assert chosen.privacy.epsilon == pytest.approx(synthetic.privacy.epsilon)  # selection costs nothing
    rows = json.loads((chosen.path / "results.json").read_text())
    assert len(rows) == 1 and "∞" not in (chosen.path / "results.md").read_text()
    assert not (tmp_path / "same").exists()


def test_select_data_chooses_the_filter_on_synthetic_dev_for_free(
    tmp_path, synthetic, tiny_encoder_dir, tiny_beir
):
    """Two sets of one generator (unfiltered, likelihood-filtered), each with the same public
    hold-out documents: ``--select-data`` picks one retriever among both sets and learning rates
    on the held-out synthetic queries, spending nothing."""
    sets = {
        "none": synthetic.path,
        "likelihood": filter_stage.run(
            FilterConfig(synthetic=synthetic.path, out=tmp_path / "l", method="likelihood", keep=2)
        ).path,
    }
    held = {
        name: filter_stage.run(
            FilterConfig(synthetic=path, out=tmp_path / f"h-{name}", method="none", holdout_documents=3)
        )
        for name, path in sets.items()
    }
    assert set(_pairs(held["none"], "dev").values()) >= set(_pairs(held["likelihood"], "dev").values())
    retrievers = [
        train_retriever.run(
            retriever_config(tmp_path / f"r-{name}-{lr}", artifact.path, tiny_encoder_dir, lr=lr)
        )
        for name, artifact in held.items()
        for lr in (1e-4, 1e-3)
    ]
    paths = [str(r.path) for r in retrievers]
    on_dev = evaluate.run(
        EvalConfig(
            out=tmp_path / "dev", retrievers=paths, datasets=[str(held["none"].path)], split="dev", bm25=False
        )
    )
    chosen = evaluate.run(
        EvalConfig(
            out=tmp_path / "test", retrievers=paths, datasets=[str(tiny_beir)], split="test",
            bm25=False, select_on=str(on_dev.path), select_data=True,
        )
    )  # fmt: skip
    dev_rows = json.loads((on_dev.path / "results.json").read_text())
    best = max(dev_rows, key=lambda r: r["metrics"]["ndcg@10"])
    rows = json.loads((chosen.path / "results.json").read_text())
    assert [r["model_id"] for r in rows] == [best["model_id"]]  # one row for the generator, the dev-best
    assert len({r["family"] for r in dev_rows}) == 1 and len({r["method"] for r in dev_rows}) == 2
    assert chosen.privacy.epsilon == pytest.approx(synthetic.privacy.epsilon)
    assert "synthetic set=" in (chosen.path / "results.md").read_text()


def test_a_filter_on_a_rewritten_generator_is_refused(tmp_path, tiny_beir, tiny_causal_dir):
    generator = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon="inf", max_steps=1)
    synthetic = generate.run(
        GenerateConfig(
            generator=generator.path, corpus=str(tiny_beir), out=tmp_path / "syn", max_new_tokens=4
        )
    )
    finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon="inf", max_steps=2, force=True)
    with pytest.raises(ArtifactError, match="rewritten since"):
        filter_stage.run(FilterConfig(synthetic=synthetic.path, out=tmp_path / "l", method="likelihood"))
    assert open_artifact(synthetic.path).stage == "generate"


def test_a_private_filter_model_composes(tmp_path, synthetic, tiny_beir, tiny_encoder_dir):
    """A filter retriever trained on the private pairs without DP is a read of them (ε = ∞): the
    filtered set carries it, never the synthetic set's ε alone; a DP one composes."""
    private = train_retriever.run(retriever_config(tmp_path / "private", tiny_beir, tiny_encoder_dir))
    kept = filter_stage.run(
        FilterConfig(synthetic=synthetic.path, out=tmp_path / "f", retriever=str(private.path), top_k=12)
    )
    assert kept.privacy.epsilon == float("inf")
    assert {r["id"] for r in private.releases} <= {r["id"] for r in kept.releases}
    dp = train_retriever.run(
        retriever_config(tmp_path / "dp", tiny_beir, tiny_encoder_dir, dp="group", epsilon=2.0)
    )
    both = filter_stage.run(
        FilterConfig(synthetic=synthetic.path, out=tmp_path / "g", retriever=str(dp.path), top_k=12)
    )
    assert both.privacy.epsilon == pytest.approx(synthetic.privacy.epsilon + dp.privacy.epsilon, rel=1e-6)


def test_consistency_ranks_in_a_larger_public_corpus_when_given_one(tmp_path, synthetic):
    """--corpus ranks each query among a corpus that holds the set's documents and more: the kept
    set is what an independent BM25 over that corpus finds, the written set keeps its own corpus,
    and distractors that repeat a kept query's words push its document out."""
    import shutil

    from synthq.retrieval.bm25 import bm25_search

    data = load_beir_dir(synthetic.path)
    top_k = 3
    own = filter_stage.run(
        FilterConfig(synthetic=synthetic.path, out=tmp_path / "own", retriever="bm25", top_k=top_k)
    )
    larger = tmp_path / "larger"
    shutil.copytree(synthetic.path, larger, ignore=shutil.ignore_patterns("manifest.json", "diagnostics"))
    lines = (synthetic.path / "corpus.jsonl").read_text().splitlines()

    def corpus_with(extra: list[dict]) -> None:
        (larger / "corpus.jsonl").write_text("\n".join([*lines, *map(json.dumps, extra)]) + "\n")

    corpus_with([{"_id": f"unrelated-{i}", "title": "", "text": "zyxw vutsr"} for i in range(20)])
    kept = filter_stage.run(
        FilterConfig(
            synthetic=synthetic.path, out=tmp_path / "f", retriever="bm25", top_k=top_k, corpus=str(larger)
        )
    )
    queries = {q: data.queries[q] for q in data.qrels["train"]}
    ranked = bm25_search(load_beir_dir(larger).corpus, queries, top_k)
    expected = {q for q, found in ranked.items() if next(iter(data.qrels["train"][q])) in found}
    assert set(_pairs(kept)) == expected == set(_pairs(own)) and expected
    assert sorted(load_beir_dir(kept.path).corpus) == sorted(data.corpus)
    assert any(record.get("role") == "corpus" for record in kept.inputs)
    crowd = [
        {"_id": f"d-{q}-{i}", "title": "", "text": " ".join([queries[q]] * 3)}
        for q in expected
        for i in range(top_k)
    ]
    corpus_with(crowd)
    with pytest.raises(DataError, match="kept no query"):  # in the set's own corpus they were kept
        filter_stage.run(
            FilterConfig(
                synthetic=synthetic.path,
                out=tmp_path / "c",
                retriever="bm25",
                top_k=top_k,
                corpus=str(larger),
            )
        )
    (larger / "corpus.jsonl").write_text(
        "\n".join(map(json.dumps, crowd)) + "\n"
    )  # none of the set's documents
    with pytest.raises(DataError, match="--corpus lacks"):
        filter_stage.run(
            FilterConfig(synthetic=synthetic.path, out=tmp_path / "g", retriever="bm25", corpus=str(larger))
        )
    with pytest.raises(SettingError, match="--corpus applies to --method consistency"):
        filter_stage.run(
            FilterConfig(synthetic=synthetic.path, out=tmp_path / "h", method="none", corpus=str(larger))
        )
