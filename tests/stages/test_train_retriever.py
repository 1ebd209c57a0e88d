"""synthq train-retriever: the ledger for each kind of input, batches, learning, errors."""

from __future__ import annotations

import math
import random

import pytest
from opacus.accountants import RDPAccountant
from sentence_transformers import SentenceTransformer

from synthq.artifacts import create_artifact, open_artifact
from synthq.config import TrainRetrieverConfig
from synthq.data import load_beir_dir, training_pairs, write_beir_dir
from synthq.errors import ArtifactError, DataError
from synthq.privacy import Guarantee
from synthq.retrieval.metrics import evaluate
from synthq.retrieval.search import exact_search
from synthq.stages import train_retriever


def config(tmp_path, data, encoder, name, **options):
    defaults = dict(batch_size=8, epochs=2, lr=1e-3, max_doc_length=64, max_query_length=32)
    return TrainRetrieverConfig(
        data=str(data), encoder=str(encoder), out=tmp_path / name, **{**defaults, **options}
    )


def ndcg(model_path, beir, split):
    dataset = load_beir_dir(beir)
    model = SentenceTransformer(str(model_path))
    doc_ids = sorted(dataset.corpus)
    docs = model.encode([dataset.corpus[d]["text"] for d in doc_ids], normalize_embeddings=True)
    queries = dataset.split_queries(split)
    query_ids = sorted(queries)
    embedded = model.encode([queries[q] for q in query_ids], normalize_embeddings=True)
    return evaluate(dataset.qrels[split], exact_search(embedded, docs, query_ids, doc_ids, 10))["ndcg@10"]


def test_batches_never_repeat_a_document(tiny_beir):
    pairs = training_pairs(load_beir_dir(tiny_beir), "train")
    batches = train_retriever.unique_document_batches(pairs, 8, random.Random(0))
    assert sorted(i for b in batches for i in b) == list(range(len(pairs)))
    for batch in batches:
        docs = [pairs[i].doc_id for i in batch]
        assert len(docs) == len(set(docs)) and len(batch) <= 8


def test_private_pairs_without_dp_are_epsilon_infinity(tmp_path, tiny_beir, tiny_encoder_dir):
    artifact = train_retriever.run(config(tmp_path, tiny_beir, tiny_encoder_dir, "plain"))
    assert math.isinf(artifact.privacy.epsilon) and "without DP" in artifact.privacy.note
    assert SentenceTransformer(str(artifact.path)).encode(["egg"]).shape == (1, 32)


@pytest.mark.parametrize("mode", ["batch", "group", "sample"])
def test_direct_dp_reports_its_own_accounted_epsilon(tmp_path, tiny_beir, tiny_encoder_dir, mode):
    artifact = train_retriever.run(
        config(tmp_path, tiny_beir, tiny_encoder_dir, mode, dp=mode, epsilon=6, epochs=1)
    )
    details = artifact.privacy.details
    accountant = RDPAccountant()
    accountant.history = [(details["noise_multiplier"], details["sample_rate"], details["steps"])]
    assert artifact.privacy.epsilon == pytest.approx(
        accountant.get_epsilon(delta=details["accountant_delta"])
    )
    assert artifact.privacy.epsilon <= 6
    expected = 2 * 1.0 if mode != "sample" else (2 * details["max_batch_size"] + 1) * 1.0
    assert details["sensitivity"] == expected and details["mode"] == mode
    assert artifact.privacy.delta == pytest.approx(
        details["accountant_delta"] + details["batch_cap_tail_probability"]
    )


def test_synthetic_input_inherits_the_generator_guarantee(tmp_path, tiny_beir, tiny_encoder_dir):
    dataset = load_beir_dir(tiny_beir)
    synthetic = tmp_path / "synthetic"
    with create_artifact(synthetic, "generate", {"x": 1}) as writer:
        queries = {f"syn-{d}-0": f"about {d.split('-')[0]}" for d in dataset.corpus}
        write_beir_dir(
            writer.dir, dataset.corpus, queries, {"train": {f"syn-{d}-0": {d: 1} for d in dataset.corpus}}
        )
        writer.privacy = Guarantee(
            epsilon=3.0, delta=1e-6, mechanism="dp-adam+post-processing", accountant="rdp"
        )
    source = open_artifact(synthetic)
    artifact = train_retriever.run(config(tmp_path, synthetic, tiny_encoder_dir, "on-synthetic"))
    assert artifact.privacy.epsilon == 3.0 and artifact.privacy.delta == 1e-6
    assert artifact.privacy.derived_from[-1] == source.manifest_hash
    assert artifact.inputs[0]["stage"] == "generate"


@pytest.mark.slow
def test_non_private_training_improves_ndcg_on_the_dev_split(tmp_path, tiny_beir, tiny_encoder_dir):
    before = ndcg(tiny_encoder_dir, tiny_beir, "dev") + ndcg(tiny_encoder_dir, tiny_beir, "test")
    artifact = train_retriever.run(
        config(tmp_path, tiny_beir, tiny_encoder_dir, "trained", epochs=30, lr=3e-3)
    )
    after = ndcg(artifact.path, tiny_beir, "dev") + ndcg(artifact.path, tiny_beir, "test")
    assert after > before + 0.1


def test_bad_input(tmp_path, tiny_beir, tiny_encoder_dir):
    with pytest.raises(DataError, match="larger than the 17 training pairs"):
        train_retriever.run(config(tmp_path, tiny_beir, tiny_encoder_dir, "x", batch_size=100))
    wrong = tmp_path / "wrong"
    with create_artifact(wrong, "eval", {}) as writer:
        (writer.dir / "x").write_text("x")
        writer.privacy = Guarantee(epsilon=1.0, delta=1e-5)
    with pytest.raises(ArtifactError, match="expected 'generate'"):
        train_retriever.run(config(tmp_path, wrong, tiny_encoder_dir, "x"))
    with pytest.raises(DataError, match="no qrels for split 'dev2'"):
        train_retriever.run(config(tmp_path, tiny_beir, tiny_encoder_dir, "x", split="dev2"))
