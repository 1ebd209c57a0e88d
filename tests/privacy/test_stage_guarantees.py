"""What each stage records as its guarantee, through the stages on tiny models and data: starting
models and synthetic sets compose, public inputs stay public, seeds are assumptions, the unit is
the query, and no DP artifact releases an un-noised statistic."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from synthq.artifacts.export import export_artifact
from synthq.config.evaluation import EvalConfig
from synthq.config.generator import GenerateConfig
from synthq.config.retriever import TrainRetrieverConfig
from synthq.data.beir_io import load_beir_dir, write_beir_dir
from synthq.models.generator import QueryGenerator
from synthq.runtime.errors import PrivacyError
from synthq.stages import evaluate, generate, train_retriever
from tests.helpers import finetune, private_copy, released_text, retriever_config


def test_generate_defaults_to_the_whole_public_corpus(tmp_path, tiny_beir, tiny_causal_dir):
    # a private train split that judges only some documents
    private = tmp_path / "private"
    shutil.copytree(tiny_beir, private)
    dataset = load_beir_dir(private)
    train = {q: d for q, d in dataset.qrels["train"].items() if next(iter(d)).startswith("egg")}
    write_beir_dir(private, dataset.corpus, dataset.queries, {**dataset.qrels, "train": train})
    generator = finetune(tmp_path, private, tiny_causal_dir, "gen", epsilon="inf", max_steps=1, batch_size=2)
    options = dict(generator=generator.path, corpus=str(private), max_new_tokens=4, seed=0)
    everything = generate.run(GenerateConfig(out=tmp_path / "syn-all", **options))
    assert everything.metrics["documents"] + everything.metrics["dropped_degenerate"] == 12
    assert everything.privacy.assumptions == generator.privacy.assumptions
    judged = generate.run(GenerateConfig(out=tmp_path / "syn-judged", split="train", **options))
    assert judged.metrics["documents"] + judged.metrics["dropped_degenerate"] <= 3
    assert any("documents judged in split 'train' is public" in a for a in judged.privacy.assumptions)
    listed = tmp_path / "ids.txt"
    listed.write_text("# public list\ngit-0\ntax-1\n")
    chosen = generate.run(GenerateConfig(out=tmp_path / "syn-list", documents=listed, **options))
    assert set(load_beir_dir(chosen.path).corpus) <= {"git-0", "tax-1"}


def test_dp_artifacts_release_no_unnoised_statistics(tmp_path, tiny_beir, tiny_causal_dir):
    artifact = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon=8.0, max_steps=3)
    manifest = artifact.manifest
    assert not {"first_loss", "final_loss"} & set(manifest["metrics"])
    assert manifest["timings"] == {}  # wall time depends on the private batch sizes
    assert set(manifest["private_files"]) == {
        "diagnostics/metrics.json",
        "diagnostics/training.jsonl",
        "diagnostics/units.bin",  # keyed unit digests: for the owner's ledger only
        "diagnostics/units-query.bin",  # keyed query ids and texts it links (the ledger's merge)
        "diagnostics/units-text.bin",
        "diagnostics/units-pair.bin",  # which id went with which text (renamed copies compose)
    }
    assert not any(name.startswith("diagnostics/") for name in manifest["files"])
    released = released_text(artifact)
    assert not any(key in released for key in ("first_loss", "final_loss", "examples_seen", "train_seconds"))
    assert "seed" not in json.dumps(manifest["privacy"]) or manifest["config"]["seed"] is None
    release, left_out = export_artifact(artifact.path, tmp_path / "release")
    assert set(left_out) == set(manifest["private_files"])
    assert not (release.path / "diagnostics").exists() and "private_files" not in release.manifest
    same = ("epsilon", "delta", "unit", "mechanism", "accountant", "details")
    assert all(getattr(release.privacy, key) == getattr(artifact.privacy, key) for key in same)
    # the owner's absolute paths (user name, layout) are named by their last component only
    owner = str(tmp_path.parents[1])
    assert owner in (artifact.path / "manifest.json").read_text()
    for path in release.path.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".md", ".txt"):
            assert owner not in path.read_text(encoding="utf-8"), path.name
    assert release.verified and release.inputs[0]["path"] == Path(artifact.inputs[0]["path"]).name


def test_a_starting_model_is_an_input_and_composes(tmp_path, tiny_beir, tiny_causal_dir):
    non_private = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen-inf", epsilon="inf", max_steps=1)
    continued = finetune(tmp_path, tiny_beir, non_private.path, "gen-from-inf", epsilon=8.0, max_steps=2)
    assert math.isinf(continued.privacy.epsilon)  # was printed as 7.99 before
    assert any(r.get("stage") == "finetune-lm" and r["role"] == "model" for r in continued.inputs)
    first = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen-a", epsilon=4.0, max_steps=2)
    second = finetune(tmp_path, tiny_beir, first.path, "gen-b", epsilon=4.0, max_steps=2)
    assert second.privacy.epsilon == pytest.approx(
        first.privacy.epsilon + second.manifest["own_privacy"]["epsilon"]
    )
    # a plain directory is recorded with its hash and stated as assumed public
    assert any("is public" in a for a in first.privacy.assumptions)
    plain = [r for r in first.inputs if r.get("role") == "model"][0]
    assert plain["kind"] == "model" and len(plain["sha256"]) == 64


def test_retriever_from_a_non_private_retriever_is_not_private(tmp_path, tiny_beir, tiny_encoder_dir):
    original = train_retriever.run(retriever_config(tmp_path / "orig", tiny_beir, tiny_encoder_dir))
    dp = train_retriever.run(
        retriever_config(tmp_path / "dp", tiny_beir, original.path, dp="batch", epsilon=8)
    )
    assert math.isinf(dp.privacy.epsilon)
    assert dp.manifest["own_privacy"]["epsilon"] <= 8


def test_eval_untrained_keeps_an_artifacts_own_guarantee(tmp_path, tiny_beir, tiny_encoder_dir):
    original = train_retriever.run(retriever_config(tmp_path / "orig", tiny_beir, tiny_encoder_dir))
    result = evaluate.run(
        EvalConfig(
            out=tmp_path / "eval", datasets=[str(tiny_beir)], untrained=[str(original.path)], bm25=False
        )
    )
    assert math.isinf(result.privacy.epsilon)
    rows = json.loads((result.path / "results.json").read_text())
    assert math.isinf(float(rows[0]["epsilon"])) and rows[0]["kind"] == "retriever"
    # tiny_beir was read as private above: its test split is private until the data declares it public
    declared = tmp_path / "declared"
    shutil.copytree(tiny_beir, declared)
    declaration = {"private_splits": ["train"], "public_splits": ["test"]}
    (declared / "privacy.json").write_text(json.dumps(declaration))
    public = evaluate.run(
        EvalConfig(
            out=tmp_path / "eval2", datasets=[str(declared)], untrained=[str(tiny_encoder_dir)], bm25=False
        )
    )
    assert public.privacy.epsilon == 0 and any("is public" in a for a in public.privacy.assumptions)
    assert any("split 'test'" in a and "declared" in a for a in public.privacy.assumptions)


def test_secure_randomness_by_default_and_a_seed_is_an_assumption(tmp_path, tiny_beir, tiny_causal_dir):
    secret = finetune(tmp_path, tiny_beir, tiny_causal_dir, "a", epsilon=8.0, max_steps=2, checkpoint_every=1)
    again = finetune(tmp_path, tiny_beir, tiny_causal_dir, "b", epsilon=8.0, max_steps=2)
    assert secret.manifest["config"]["seed"] is None
    assert not any("seed" in a for a in secret.privacy.assumptions)
    first, second = (QueryGenerator.load(a.path).model.state_dict() for a in (secret, again))
    assert any(not torch.equal(first[k], second[k]) for k in first)  # different secret noise
    seeded = finetune(tmp_path, tiny_beir, tiny_causal_dir, "c", epsilon=8.0, max_steps=2, seed=3)
    assert any("reproducible seed 3" in a for a in seeded.privacy.assumptions)
    assert not (secret.path / "checkpoints").exists()  # the secret state never leaves the checkpoint


def test_the_unit_is_the_query(tmp_path, tiny_beir, tiny_causal_dir):
    # one query judged with three documents: n counts queries, δ = 1/(2n) over queries
    multi = tmp_path / "multi"
    shutil.copytree(tiny_beir, multi)
    dataset = load_beir_dir(multi)
    train = dict(dataset.qrels["train"])
    first = next(iter(train))
    train[first] = {"egg-0": 1, "egg-1": 1, "egg-2": 1}
    write_beir_dir(multi, dataset.corpus, dataset.queries, {**dataset.qrels, "train": train})
    artifact = finetune(tmp_path, multi, tiny_causal_dir, "gen", epsilon=8.0, max_steps=2)
    details = artifact.privacy.details
    diagnostics = json.loads((artifact.path / "diagnostics" / "metrics.json").read_text())
    assert details["num_units"] == 17 and diagnostics["pairs_per_unit_max"] == 3
    assert "pairs_per_unit_max" not in released_text(artifact)  # an un-noised statistic: private
    assert artifact.privacy.delta == pytest.approx(1 / 34) and artifact.privacy.unit == "query"
    with pytest.raises(PrivacyError, match="several relevant documents|has 3 relevant documents"):
        train_retriever.run(
            TrainRetrieverConfig(
                data=str(multi),
                out=tmp_path / "logit",
                dp="logit",
                epsilon=8,
                temperature=1.0,
                batch_size=4,
                max_steps=1,
                max_query_length=16,
                max_doc_length=32,
            )  # fmt: skip
        )


def test_a_synthetic_set_used_as_data_inherits(tmp_path, tiny_beir, tiny_causal_dir):
    data = private_copy(tmp_path, tiny_beir)
    generator = finetune(tmp_path, data, tiny_causal_dir, "gen", epsilon=8.0, max_steps=2)
    synthetic = generate.run(
        GenerateConfig(
            generator=generator.path, corpus=str(data), out=tmp_path / "syn", max_new_tokens=4, seed=0
        )
    )
    queries = synthetic.metrics["documents"]
    again = finetune(
        tmp_path, synthetic.path, tiny_causal_dir, "gen-on-syn", epsilon=1.0, max_steps=2,
        batch_size=min(4, queries),
    )  # fmt: skip
    assert again.manifest["own_privacy"]["epsilon"] <= 1.0
    # towards the private data: the generator's 8 (its units are not the synthetic queries)
    assert again.privacy.epsilon == pytest.approx(generator.privacy.epsilon)
    bm25 = evaluate.run(EvalConfig(out=tmp_path / "bm25", datasets=[str(synthetic.path)], split="train"))
    assert bm25.privacy.epsilon == pytest.approx(generator.privacy.epsilon)
