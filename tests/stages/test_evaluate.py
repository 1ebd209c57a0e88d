"""synthq eval: agreement with BEIR's own search and evaluator, the embedding cache, dataset
resolution (msmarco -> dev, identical ids, sub-datasets), outputs with ε, and bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from synthq.artifacts.create import create_artifact
from synthq.config.evaluation import EvalConfig
from synthq.data.beir_io import load_beir_dir
from synthq.privacy.guarantee import Guarantee
from synthq.retrieval.metrics import METRICS
from synthq.runtime.errors import ArtifactError, DataError
from synthq.stages import evaluate
from tests.helpers import accounted, tiny_retriever_artifact, write_tiny_beir


@pytest.fixture(scope="module")
def retriever(tmp_path_factory, tiny_encoder_dir):
    out = tmp_path_factory.mktemp("ret") / "ret-dp"
    privacy = accounted(epsilon=4.0, delta=1e-5, mechanism="dp-group", accountant="rdp")
    return tiny_retriever_artifact(out, tiny_encoder_dir, privacy, {"encoder": "tiny", "dp": "group"})


def _rows(artifact) -> list[dict]:
    return json.loads((artifact.path / "results.json").read_text())


def test_agrees_with_beir_search_and_evaluator(tmp_path, retriever, tiny_beir):
    """BEIR's own SentenceBERT (its title + " " + text join), exact search and evaluator on a
    corpus whose documents all have titles give synthq's numbers."""
    from beir.retrieval.evaluation import EvaluateRetrieval
    from beir.retrieval.models import SentenceBERT
    from beir.retrieval.search.dense import DenseRetrievalExactSearch

    artifact = evaluate.run(
        EvalConfig(
            retrievers=[str(retriever.path)], datasets=[str(tiny_beir)], out=tmp_path / "e", bm25=False
        )
    )
    (row,) = _rows(artifact)
    ours = row["metrics"]
    assert all(doc["title"] for doc in load_beir_dir(tiny_beir).corpus.values())

    dataset = load_beir_dir(tiny_beir)
    search = DenseRetrievalExactSearch(SentenceBERT(str(retriever.path)), batch_size=16, corpus_chunk_size=5)
    results = search.search(
        dataset.corpus, dataset.split_queries("test"), top_k=100, score_function="cos_sim"
    )
    qrels = dataset.qrels["test"]
    ndcg, _map, recall, _ = EvaluateRetrieval.evaluate(qrels, results, [1, 3, 5, 10, 100])
    mrr = EvaluateRetrieval.evaluate_custom(qrels, results, [10], metric="mrr")
    for k in (1, 3, 5, 10, 100):
        assert ours[f"ndcg@{k}"] == pytest.approx(ndcg[f"NDCG@{k}"], abs=1e-4)
    for k in (10, 100):
        assert ours[f"recall@{k}"] == pytest.approx(recall[f"Recall@{k}"], abs=1e-4)
    assert ours["mrr@10"] == pytest.approx(mrr["MRR@10"], abs=1e-4)
    assert list(ours) == list(METRICS)  # headline pair first
    assert row["split"] == "test" and row["queries"] == 4 and row["documents"] == 12


def test_cache_hit_then_invalidated_by_corpus_change(tmp_path, retriever, tiny_beir, monkeypatch):
    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path / "cache"))

    def run(dataset, name):
        config = EvalConfig(
            retrievers=[str(retriever.path)], datasets=[str(dataset)], out=tmp_path / name, bm25=False
        )
        return evaluate.run(config)

    source = tmp_path / "corpus-a"
    shutil.copytree(tiny_beir, source)
    first, second = run(source, "1"), run(source, "2")
    assert (first.timings["cache_hits"], first.timings["cache_misses"]) == (0, 1)
    assert (second.timings["cache_hits"], second.timings["cache_misses"]) == (1, 0)
    assert first.timings["encode_docs_per_second"] > 0 and second.timings["encode_docs_per_second"] is None
    assert _rows(first)[0]["metrics"] == _rows(second)[0]["metrics"]
    # The key is the content, not the path: a copy of the same corpus hits too.
    shutil.copytree(source, tmp_path / "corpus-b")
    assert run(tmp_path / "corpus-b", "copy").timings["cache_hits"] == 1
    # One document's text changes: a different corpus, so the cache must miss.
    corpus = (source / "corpus.jsonl").read_text().replace("nine minutes", "ten minutes")
    (source / "corpus.jsonl").write_text(corpus)
    third = run(source, "3")
    assert (third.timings["cache_hits"], third.timings["cache_misses"]) == (0, 1)


@pytest.fixture(scope="module")
def with_references(tmp_path_factory, retriever, tiny_beir, tiny_encoder_dir):
    """One evaluation of the retriever beside its references (BM25, its untrained encoder), which
    several tests read."""
    return evaluate.run(
        EvalConfig(
            retrievers=[str(retriever.path)],
            untrained=[str(tiny_encoder_dir)],
            datasets=[str(tiny_beir)],
            out=tmp_path_factory.mktemp("with-references") / "e",
        )
    )


def test_outputs_show_epsilon_and_public_reference_rows(
    with_references, retriever, tiny_beir, tiny_encoder_dir
):
    artifact = with_references
    rows = {r["retriever"]: r for r in _rows(artifact)}
    assert set(rows) == {"BM25", "ret-dp", f"untrained {tiny_encoder_dir.name}"}
    assert rows["ret-dp"]["epsilon"] == 4.0 and rows["ret-dp"]["privacy"]["mechanism"] == "dp-group"
    assert rows["BM25"]["privacy"]["mechanism"] == "public" and rows["BM25"]["epsilon"] == 0.0
    assert rows[f"untrained {tiny_encoder_dir.name}"]["privacy"]["mechanism"] == "public"
    # The untrained encoder is the same network as the retriever's copy: same numbers.
    assert rows[f"untrained {tiny_encoder_dir.name}"]["metrics"] == rows["ret-dp"]["metrics"]
    table = (artifact.path / "results.md").read_text()
    ndcg = rows["ret-dp"]["metrics"]["ndcg@10"]
    assert f"| ret-dp | direct DP (group), tiny | 4.00 | {ndcg:.4f} [" in table  # with its 95 % CI
    # Per-query scores are kept, and their mean is the row's metric.
    per_query = json.loads((artifact.path / "per_query.json").read_text())["tiny-beir0"]
    scores = per_query["ret-dp"]["ndcg@10"]
    assert len(scores) == 4 and sum(scores.values()) / 4 == pytest.approx(ndcg, abs=1e-6)
    # The retriever and its untrained copy are identical systems: their difference is 0, not significant.
    assert (
        "## Which differences are significant" in table and "| +0.0000 | [+0.0000, +0.0000] | 1.0000" in table
    )
    assert (
        "| BM25 | bm25 | 0 (public) |" in table
        and "| untrained encoder | untrained, encoder | 0 (public) |" in table
    )
    assert (artifact.path / "privacy_utility.png").stat().st_size > 1000
    assert artifact.privacy.epsilon == 4.0
    assert {r["id"] for r in retriever.releases} <= {r["id"] for r in artifact.releases}
    assert artifact.metrics["tiny-beir0/ret-dp"]["epsilon"] == 4.0
    per_run = artifact.timings["per_run"][f"{tiny_beir.name}/ret-dp"]
    assert per_run["search_queries_per_second"] > 0 and per_run["encode_queries_per_second"] > 0


def test_msmarco_is_evaluated_on_dev(tmp_path, retriever, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SYNTHQ_CACHE", str(cache))
    write_tiny_beir(cache / "beir" / "msmarco")  # where `msmarco` is downloaded to
    artifact = evaluate.run(
        EvalConfig(retrievers=[str(retriever.path)], datasets=["msmarco"], out=tmp_path / "e")
    )
    rows = _rows(artifact)
    assert {(r["dataset"], r["split"], r["queries"]) for r in rows} == {("msmarco", "dev", 2)}
    explicit = evaluate.run(
        EvalConfig(retrievers=[str(retriever.path)], datasets=["msmarco"], split="test", out=tmp_path / "t")
    )
    assert {(r["split"], r["queries"]) for r in _rows(explicit)} == {("test", 4)}


def _self_retrieval_beir(root: Path) -> Path:
    """Queries that are corpus documents (same id and text), each judged relevant to itself: only
    the query's own document can score, so dropping identical ids must give 0."""
    root = write_tiny_beir(root)
    corpus = [json.loads(line) for line in (root / "corpus.jsonl").read_text().splitlines()]
    with open(root / "queries.jsonl", "w") as handle:
        for doc in corpus[:4]:
            handle.write(json.dumps({"_id": doc["_id"], "text": doc["text"]}) + "\n")
    (root / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{d['_id']}\t{d['_id']}\t1\n" for d in corpus[:4])
    )
    for split in ("train", "dev"):
        (root / "qrels" / f"{split}.tsv").unlink()
    # only test is left: the declaration names only splits the dataset has
    (root / "privacy.json").write_text(json.dumps({"public_splits": ["test"]}), encoding="utf-8")
    return root


def test_identical_ids_are_dropped_for_arguana_and_quora(tmp_path, retriever):
    kept = evaluate.run(
        EvalConfig(
            retrievers=[str(retriever.path)],
            datasets=[str(_self_retrieval_beir(tmp_path / "self"))],
            out=tmp_path / "a",
        )
    )
    dropped = evaluate.run(
        EvalConfig(
            retrievers=[str(retriever.path)],
            datasets=[str(_self_retrieval_beir(tmp_path / "arguana"))],
            out=tmp_path / "b",
        )
    )
    for row in _rows(kept):  # a document's own text is its best match
        assert row["metrics"]["ndcg@1"] == 1.0, row["retriever"]
    for row in _rows(dropped):
        assert row["dataset"] == "arguana" and row["metrics"]["recall@100"] == 0.0, row["retriever"]


def test_sub_datasets_are_averaged_like_cqadupstack(tmp_path, retriever, tiny_beir):
    forum = tmp_path / "cqadupstack"
    shutil.copytree(tiny_beir, forum / "android")
    write_tiny_beir(forum / "gaming")
    (forum / "gaming" / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\ntest-egg-0\tegg-0\t1\ntest-tax-1\ttax-2\t1\n"
    )
    (forum / "privacy.json").write_text('{"public_splits": ["test"]}')  # the whole forum's test split
    whole = evaluate.run(
        EvalConfig(retrievers=[str(retriever.path)], datasets=[str(forum)], out=tmp_path / "w")
    )
    parts = {
        name: {
            r["retriever"]: r["metrics"]
            for r in _rows(
                evaluate.run(
                    EvalConfig(
                        retrievers=[str(retriever.path)], datasets=[str(forum / name)], out=tmp_path / name
                    )
                )
            )
        }  # fmt: skip
        for name in ("android", "gaming")
    }
    assert {p.parent.name for p in (whole.path / "runs" / "cqadupstack").glob("*/*.trec")} == {
        "android",
        "gaming",
    }
    for row in _rows(whole):
        assert row["dataset"] == "cqadupstack" and set(row["parts"]) == {"android", "gaming"}
        assert row["queries"] == 6
        for metric, value in row["metrics"].items():
            expected = (
                parts["android"][row["retriever"]][metric] + parts["gaming"][row["retriever"]][metric]
            ) / 2
            assert value == pytest.approx(expected, abs=2e-6)


def test_guarantee_composes_independent_releases(tmp_path, tiny_encoder_dir, tiny_beir, monkeypatch):
    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path / "cache"))
    direct = tiny_retriever_artifact(
        tmp_path / "ret-direct", tiny_encoder_dir, accounted(epsilon=2.0, delta=1e-6, mechanism="dp-sample")
    )
    generator_hash = "a" * 64  # a synthetic retriever inherits a generator's guarantee
    synthetic = tiny_retriever_artifact(
        tmp_path / "ret-syn",
        tiny_encoder_dir,
        accounted(
            epsilon=3.0, delta=1e-6, mechanism="dp-adam+post-processing", derived_from=[generator_hash]
        ),
    )
    config = EvalConfig(
        retrievers=[str(direct.path), str(synthetic.path)],
        datasets=[str(tiny_beir)],
        bm25=False,
        out=tmp_path / "e",
    )
    artifact = evaluate.run(config)
    assert artifact.privacy.epsilon == pytest.approx(5.0) and artifact.privacy.delta == pytest.approx(2e-6)
    # Identical weights in two artifacts: the cache key is their content, so one encoding serves both.
    assert (artifact.timings["cache_misses"], artifact.timings["cache_hits"]) == (1, 1)
    # two releases without unit sets at hand: assumed to share units, so they add (a bound)
    assert {r["id"] for r in [*direct.releases, *synthetic.releases]} == {r["id"] for r in artifact.releases}
    table = (artifact.path / "results.md").read_text()
    assert "| ret-direct |" in table and "| 2.00 |" in table and "| 3.00 |" in table


def test_bad_input(tmp_path, tiny_beir, retriever, tiny_encoder_dir):
    wrong = tmp_path / "wrong"
    with create_artifact(wrong, "generate", {}) as writer:
        (writer.dir / "x").write_text("x")
        writer.privacy = accounted(epsilon=1.0, delta=1e-5)
    with pytest.raises(ArtifactError, match="expected 'train-retriever'"):
        evaluate.run(EvalConfig(retrievers=[str(wrong)], datasets=[str(tiny_beir)], out=tmp_path / "o"))
    with pytest.raises(DataError, match="unknown BEIR dataset"):
        evaluate.run(EvalConfig(datasets=["beir:nonsense"], out=tmp_path / "o"))
    with pytest.raises(DataError, match="not a directory or known source"):
        evaluate.run(EvalConfig(datasets=[str(tmp_path / "missing")], out=tmp_path / "o"))
    with pytest.raises(DataError, match="nothing to evaluate"):
        evaluate.run(EvalConfig(datasets=[str(tiny_beir)], bm25=False, out=tmp_path / "o"))
    empty = tmp_path / "empty"
    shutil.copytree(tiny_beir, empty)
    (empty / "corpus.jsonl").write_text("")
    with pytest.raises(DataError, match="corpus is empty"):
        evaluate.run(EvalConfig(datasets=[str(empty)], out=tmp_path / "o"))
    with pytest.raises(DataError, match="no qrels for split 'validation'"):
        evaluate.run(EvalConfig(datasets=[str(tiny_beir)], split="validation", out=tmp_path / "o"))
    unjudged = tmp_path / "unjudged"
    shutil.copytree(tiny_beir, unjudged)
    rows = (unjudged / "qrels" / "test.tsv").read_text().replace("\t1\n", "\t0\n")
    (unjudged / "qrels" / "test.tsv").write_text(rows)
    with pytest.raises(DataError, match="no query with a relevant document"):
        evaluate.run(EvalConfig(datasets=[str(unjudged)], out=tmp_path / "o"))
    with pytest.raises(ValidationError, match="top_k"):
        EvalConfig(datasets=[str(tiny_beir)], top_k=10, out=tmp_path / "o")
    twin = tiny_retriever_artifact(tmp_path / "other" / "ret-dp", tiny_encoder_dir, Guarantee.public())
    with pytest.raises(DataError, match="share the name 'ret-dp'"):
        evaluate.run(
            EvalConfig(
                retrievers=[str(retriever.path), str(twin.path)],
                datasets=[str(tiny_beir)],
                out=tmp_path / "o",
            )
        )
    assert not (tmp_path / "o").exists()


def test_cli_prints_metrics_with_epsilon(tmp_path, retriever, tiny_beir):
    from typer.testing import CliRunner

    from synthq.cli.app import app

    runner = CliRunner()
    args = [
        "eval",
        "--retriever",
        str(retriever.path),
        "--datasets",
        str(tiny_beir),
        "--out",
        str(tmp_path / "e"),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "NDCG@10" in result.output and "Recall@10" in result.output
    assert "| ret-dp | direct DP (group), tiny | 4.00 |" in result.output and "ε=4.00" in result.output
    report = runner.invoke(app, ["report", str(tmp_path / "e"), "--out", str(tmp_path / "r")])
    assert report.exit_code == 0, report.output
    assert "report written" in report.output and "ε=4.00" in report.output
    bad = runner.invoke(
        app, ["eval", "--datasets", str(tiny_beir), "--top-k", "5", "--out", str(tmp_path / "x")]
    )
    assert bad.exit_code != 0 and "--top-k" in str(bad.exception)


def test_trec_run_files_give_ir_measures_and_ranx_the_same_numbers(with_references, tiny_beir):
    """Every row's ranked list is written as a TREC run file that IR tools (ir_measures, ranx)
    read back with the numbers synthq printed."""
    import ir_measures
    import ranx
    from ir_measures import R, nDCG

    from synthq.retrieval.trec import run_tag

    artifact = with_references
    qrels = {q: dict(docs) for q, docs in load_beir_dir(tiny_beir).qrels["test"].items()}
    rows = _rows(artifact)
    assert {r["retriever"] for r in rows} >= {"BM25", "ret-dp"} and len(rows) == 3
    for row in rows:
        path = artifact.path / "runs" / row["dataset"] / f"{run_tag(row['retriever'])}.trec"
        lines = path.read_text().splitlines()
        first = lines[0].split()
        assert len(first) == 6 and first[1] == "Q0" and first[3] == "1"
        assert {line.split()[5] for line in lines} == {run_tag(row["retriever"])}
        scores = ir_measures.calc_aggregate(
            [nDCG @ 10, R @ 10], qrels, list(ir_measures.read_trec_run(str(path)))
        )
        assert scores[nDCG @ 10] == pytest.approx(row["metrics"]["ndcg@10"], abs=1e-6)
        assert scores[R @ 10] == pytest.approx(row["metrics"]["recall@10"], abs=1e-6)
        by_ranx = ranx.evaluate(
            ranx.Qrels.from_dict(qrels),
            ranx.Run.from_file(str(path), kind="trec"),
            ["ndcg@10", "recall@10"],
            make_comparable=True,  # queries without a judged document are not scored, as in synthq
        )
        assert by_ranx["ndcg@10"] == pytest.approx(row["metrics"]["ndcg@10"], abs=1e-6)
        assert by_ranx["recall@10"] == pytest.approx(row["metrics"]["recall@10"], abs=1e-6)
    # The run files are payload: listed (and verified) like every other file.
    assert any(name.startswith("runs/") for name in artifact.manifest["files"])


def test_run_lines_rank_from_one_and_break_ties_by_document():
    from synthq.retrieval.trec import run_lines, run_tag

    lines = run_lines({"q2": {"b": 0.5, "a": 0.5, "c": 0.9}, "q1": {"x": 1.0}}, run_tag("untrained minilm"))
    assert lines == [
        "q1 Q0 x 1 1.000000 untrained_minilm",
        "q2 Q0 c 1 0.900000 untrained_minilm",
        "q2 Q0 a 2 0.500000 untrained_minilm",
        "q2 Q0 b 3 0.500000 untrained_minilm",
    ]
    with pytest.raises(DataError, match="spaces"):
        run_lines({"q 1": {"a": 1.0}}, "t")


def test_generator_replicates_merge_like_seeds_and_compose(
    tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir
):
    """Retrievers trained on sets from two independently trained generators of one recipe are
    one system (the tests resample them like seeds), and a number computed from both rests on two
    ε = 8 releases: the table prints their composition, never 8."""
    from synthq.config.generator import GenerateConfig
    from synthq.reporting.systems import systems
    from synthq.stages import generate, train_retriever
    from tests.helpers import finetune, retriever_config

    retrievers = []
    for name in ("a", "b"):
        generator = finetune(tmp_path, tiny_beir, tiny_causal_dir, f"gen-{name}", epsilon=8.0, max_steps=1)
        synthetic = generate.run(
            GenerateConfig(generator=generator.path, corpus=str(tiny_beir), out=tmp_path / f"syn-{name}",
                           max_new_tokens=4, seed=1)
        )  # fmt: skip
        retrievers.append(
            train_retriever.run(
                retriever_config(tmp_path / f"ret-{name}-s0", synthetic.path, tiny_encoder_dir)
            )
        )
    artifact = evaluate.run(
        EvalConfig(
            retrievers=[str(r.path) for r in retrievers], datasets=[str(tiny_beir)], out=tmp_path / "e"
        )
    )
    rows = [r for r in _rows(artifact) if r["kind"] == "retriever"]
    assert rows[0]["variant"] == rows[1]["variant"] and rows[0]["replicate"] != rows[1]["replicate"]
    assert all(r["epsilon"] == pytest.approx(8.0, abs=0.05) for r in rows)  # each retriever alone
    (system,) = [s for s in systems(rows)]
    assert "2 synthetic sets" in system["retriever"]
    assert float(system["epsilon"]) == pytest.approx(rows[0]["epsilon"] + rows[1]["epsilon"], rel=1e-6)
    assert float(system["epsilon"]) == pytest.approx(artifact.privacy.epsilon, rel=1e-6)


def test_sampling_seeds_of_one_generator_merge_and_rest_on_its_one_release(
    tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir
):
    """Two sets one generator wrote with different sampling seeds are draws of one recipe, as
    two generators' sets are: their retrievers are one system. Both rest on the one ε = 8 release
    of that generator, so the system's ε is 8, not two releases composed."""
    from synthq.config.generator import GenerateConfig
    from synthq.reporting.systems import systems
    from synthq.stages import generate, train_retriever
    from tests.helpers import finetune, retriever_config

    generator = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon=8.0, max_steps=1)
    retrievers = []
    for seed in (1, 2):
        synthetic = generate.run(
            GenerateConfig(generator=generator.path, corpus=str(tiny_beir), out=tmp_path / f"syn-{seed}",
                           max_new_tokens=4, seed=seed)
        )  # fmt: skip
        retrievers.append(
            train_retriever.run(retriever_config(tmp_path / f"ret-{seed}", synthetic.path, tiny_encoder_dir))
        )
    artifact = evaluate.run(
        EvalConfig(
            retrievers=[str(r.path) for r in retrievers], datasets=[str(tiny_beir)], out=tmp_path / "e"
        )
    )
    rows = [r for r in _rows(artifact) if r["kind"] == "retriever"]
    assert rows[0]["variant"] == rows[1]["variant"] and rows[0]["replicate"] != rows[1]["replicate"]
    (system,) = systems(rows)
    assert "2 synthetic sets" in system["retriever"]
    assert float(system["epsilon"]) == pytest.approx(rows[0]["epsilon"], rel=1e-6)
    assert float(system["epsilon"]) == pytest.approx(8.0, abs=0.05)


def test_a_field_added_since_a_set_was_written_does_not_split_its_replicates(monkeypatch):
    """A filter written before ``corpus`` existed and one written after, at its old-behaviour
    value (``None``), are the same recipe; another value is another recipe."""
    from types import SimpleNamespace

    from synthq.reporting import labels

    generate = {"generator": "public-model", "corpus": "c", "num_queries": 1, "seed": 1}

    def filtered(synthetic: str, **more) -> SimpleNamespace:
        return SimpleNamespace(
            stage="filter", config={"synthetic": synthetic, "method": "consistency", **more}
        )

    written = {
        "gen-1": SimpleNamespace(stage="generate", config=generate),
        "gen-2": SimpleNamespace(stage="generate", config={**generate, "seed": 2}),
        "old": filtered("gen-1"),
        "new": filtered("gen-2", corpus=None),
        "other": filtered("gen-2", corpus="x"),
    }
    monkeypatch.setattr(labels, "open_artifact", lambda path, verify=True: written[str(path)])
    assert labels.synthetic_recipe("old") == labels.synthetic_recipe("new")
    assert labels.synthetic_recipe("other") != labels.synthetic_recipe("new")
