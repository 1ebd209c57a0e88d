"""synthq similarity: BLEU against sacrebleu run independently, MAUVE sanity, ledger, errors."""

from __future__ import annotations

import json
import math

import pytest
import sacrebleu

from synthq.artifacts.create import create_artifact
from synthq.artifacts.manifest import open_artifact
from synthq.config.evaluation import SimilarityConfig
from synthq.data.beir_io import load_beir_dir, write_beir_dir
from synthq.runtime.errors import DataError
from synthq.stages import similarity
from tests.helpers import accounted


def synthetic_artifact(tmp_path, beir, name, rewrite):
    """A generate-stage artifact whose queries are ``rewrite(original query)`` per document."""
    dataset = load_beir_dir(beir)
    queries, qrels = {}, {}
    for query_id, docs in dataset.qrels["train"].items():
        doc_id = next(iter(docs))
        index = sum(1 for q in queries if q.startswith(f"syn-{doc_id}-"))
        synthetic_id = f"syn-{doc_id}-{index}"
        queries[synthetic_id] = rewrite(dataset.queries[query_id], len(queries))
        qrels[synthetic_id] = {doc_id: 1}
    out = tmp_path / name
    with create_artifact(out, "generate", {"name": name}) as writer:
        write_beir_dir(writer.dir, dataset.corpus, queries, {"train": qrels})
        writer.privacy = accounted(epsilon=8.0, delta=1e-5, mechanism="dp-adam+post-processing")
    return open_artifact(out)


UNRELATED = ["purple elephant orbit", "quantum lasagna rules", "seventeen violins", "moss on granite walls"]


def independent_pairs(synthetic_dir, beir):
    """Synthetic query -> original queries of its document, read from the raw files."""

    def jsonl(path):
        return {r["_id"]: r["text"] for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())}

    def tsv(path):
        return [line.split("\t")[:2] for line in path.read_text(encoding="utf-8").splitlines()[1:]]

    originals, by_doc = jsonl(beir / "queries.jsonl"), {}
    for query_id, doc_id in tsv(beir / "qrels" / "train.tsv"):
        by_doc.setdefault(doc_id, []).append(originals[query_id])
    synthetic = jsonl(synthetic_dir / "queries.jsonl")
    pairs = sorted(tsv(synthetic_dir / "qrels" / "train.tsv"))
    return [synthetic[q] for q, _ in pairs], [by_doc[d] for _, d in pairs]


def test_bleu_equals_sacrebleu_and_the_ledger_is_honest(tmp_path, tiny_beir):
    artifact = synthetic_artifact(tmp_path, tiny_beir, "syn", lambda q, i: q.replace("how", "what") + " now")
    config = SimilarityConfig(
        synthetic=artifact.path, original=str(tiny_beir), out=tmp_path / "sim", min_samples=5, mauve_seeds=2
    )
    result = similarity.run(config)
    hypotheses, references = independent_pairs(artifact.path, tiny_beir)
    assert max(map(len, references)) == 2 and min(map(len, references)) == 1
    with_none = [[r[k] if k < len(r) else None for r in references] for k in range(2)]
    expected = sacrebleu.corpus_bleu(hypotheses, with_none).score
    assert result.metrics["bleu"] == pytest.approx(expected)
    # Repeating a reference changes neither clipped counts nor the closest length: same score.
    repeated = [[r[k] if k < len(r) else r[0] for r in references] for k in range(2)]
    assert sacrebleu.corpus_bleu(hypotheses, repeated).score == pytest.approx(expected)
    assert 0 < expected < 100 and result.metrics["bleu_signature"].startswith("nrefs:var|")
    assert math.isinf(result.privacy.epsilon)  # the scores read the private queries
    assert result.metrics["synthetic_epsilon"] == 8.0
    assert "| syn | 8.00 |" in (result.path / "similarity.md").read_text(encoding="utf-8")
    assert 0 < result.metrics["mauve_mean"] <= 1 + 1e-9 and len(result.metrics["mauve_runs"]) == 2


def test_mauve_of_a_set_against_itself_is_high_and_against_unrelated_text_low(tmp_path, tiny_beir):
    same = similarity.run(
        SimilarityConfig(
            synthetic=synthetic_artifact(tmp_path, tiny_beir, "same", lambda q, i: q).path,
            original=str(tiny_beir),
            out=tmp_path / "a",
            min_samples=5,
            mauve_seeds=3,
        )  # fmt: skip
    )
    unrelated = similarity.run(
        SimilarityConfig(
            synthetic=synthetic_artifact(tmp_path, tiny_beir, "other", lambda q, i: UNRELATED[i % 4]).path,
            original=str(tiny_beir),
            out=tmp_path / "b",
            min_samples=5,
            mauve_seeds=3,
        )  # fmt: skip
    )
    assert same.metrics["mauve_mean"] > 0.9
    assert unrelated.metrics["mauve_mean"] < same.metrics["mauve_mean"] - 0.3
    assert same.metrics["verbatim_copy_rate"] == 1.0 and unrelated.metrics["verbatim_copy_rate"] == 0.0
    assert same.metrics["bleu"] == pytest.approx(100.0)


def test_too_few_samples_is_refused(tmp_path, tiny_beir):
    artifact = synthetic_artifact(tmp_path, tiny_beir, "syn", lambda q, i: q)
    with pytest.raises(DataError, match="MAUVE needs at least 50"):
        similarity.run(SimilarityConfig(synthetic=artifact.path, original=str(tiny_beir), out=tmp_path / "s"))


def test_distinct_n():
    assert similarity.distinct_n(["a b a b"], 2) == pytest.approx(2 / 3)
    assert similarity.distinct_n(["a b", "c d"], 1) == 1.0
