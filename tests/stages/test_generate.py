"""synthq generate on a tiny generator: reproducibility, batching, shards, resume, privacy, errors."""

from __future__ import annotations

import math

import pytest

from synthq.artifacts import create_artifact, open_artifact, partial_dir
from synthq.config import FinetuneConfig, GenerateConfig
from synthq.errors import ArtifactError, DataError, SynthqError
from synthq.generation import Request, sample_queries, top_p_filter
from synthq.models.generator import QueryGenerator
from synthq.privacy import Guarantee
from synthq.stages import finetune_lm, generate


@pytest.fixture(scope="module")
def trained_generator(tmp_path_factory, tiny_beir, tiny_causal_dir):
    out = tmp_path_factory.mktemp("gen") / "generator"
    config = FinetuneConfig(
        data=str(tiny_beir), model=str(tiny_causal_dir), out=out, epsilon="inf",
        batch_size=8, epochs=15, physical_batch_size=8, lr=1e-2,
    )  # fmt: skip
    return finetune_lm.run(config)


def make(tmp_path, artifact, corpus, name, **options):
    return generate.run(
        GenerateConfig(generator=artifact.path, corpus=str(corpus), out=tmp_path / name, **options)
    )


def read(artifact) -> str:
    return (artifact.path / "queries.jsonl").read_text(encoding="utf-8")


def test_output_is_a_beir_dir_and_inherits_the_guarantee(tmp_path, trained_generator, tiny_beir):
    from beir.datasets.data_loader import GenericDataLoader

    synthetic = make(tmp_path, trained_generator, tiny_beir, "syn", num_queries=2, batch_size=4)
    corpus, queries, qrels = GenericDataLoader(str(synthetic.path)).load(split="train")
    assert len(corpus) == 12 and len(queries) == 24
    assert all(qid.startswith(f"syn-{next(iter(docs))}-") for qid, docs in qrels.items())
    assert synthetic.privacy.epsilon == trained_generator.privacy.epsilon
    assert synthetic.privacy.derived_from == [trained_generator.manifest_hash]
    assert synthetic.inputs[0]["sha256"] == trained_generator.manifest_hash


def test_sampling_is_reproducible_and_independent_of_batch_plan(tmp_path, trained_generator, tiny_beir):
    first = make(tmp_path, trained_generator, tiny_beir, "a", batch_size=4, seed=3)
    again = make(tmp_path, trained_generator, tiny_beir, "b", batch_size=1, seed=3)
    other = make(tmp_path, trained_generator, tiny_beir, "c", batch_size=4, seed=4)
    assert read(first) == read(again)
    assert read(first) != read(other)


def test_greedy_batched_equals_one_at_a_time(trained_generator):
    generator = QueryGenerator.load(trained_generator.path)
    requests = [
        Request(f"d{i}", text, 0) for i, text in enumerate(["boil eggs nine minutes", "git stash saves"])
    ]
    together = sample_queries(generator, requests, 0, 0.8, 1.0, 8, greedy=True)
    alone = [sample_queries(generator, [r], 0, 0.8, 1.0, 8, greedy=True)[0] for r in requests]
    assert together == alone


def test_top_p_keeps_the_smallest_nucleus():
    import torch

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logits, 0.8))
    assert kept.tolist() == [[True, True, False, False]]
    assert torch.isfinite(top_p_filter(logits, 0.1)).sum() == 1  # the top token always stays


def test_shards_merge_into_the_unsharded_set(tmp_path, trained_generator, tiny_beir):
    whole = make(tmp_path, trained_generator, tiny_beir, "whole", num_queries=2, batch_size=3)
    shards = [
        make(tmp_path, trained_generator, tiny_beir, f"shard{i}", num_queries=2, batch_size=5, shard=f"{i}/3")
        for i in range(3)
    ]
    merged = generate.merge([s.path for s in shards], tmp_path / "merged")
    assert read(merged) == read(whole)
    assert merged.privacy.epsilon == whole.privacy.epsilon
    with pytest.raises(ArtifactError, match="not exactly"):
        generate.merge([s.path for s in shards[:2]], tmp_path / "incomplete")


def test_resume_skips_finished_documents(tmp_path, trained_generator, tiny_beir, monkeypatch):
    reference = make(tmp_path, trained_generator, tiny_beir, "reference", batch_size=2)
    calls = {"n": 0}
    original = generate.sample_queries

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(generate, "sample_queries", flaky)
    config = GenerateConfig(
        generator=trained_generator.path, corpus=str(tiny_beir), out=tmp_path / "r", batch_size=2
    )
    with pytest.raises(KeyboardInterrupt):
        generate.run(config)
    assert not config.out.exists() and partial_dir(config.out).exists()
    calls["n"] = -100
    resumed = generate.run(config.model_copy(update={"resume": True}))
    assert calls["n"] == -100 + 4  # only the 4 unfinished batches of 2 documents ran
    assert read(resumed) == read(reference)


def test_bad_input(tmp_path, trained_generator, tiny_beir):
    with pytest.raises(ArtifactError, match="no such artifact"):
        make(tmp_path, type("A", (), {"path": tmp_path / "nope"})(), tiny_beir, "x")
    with pytest.raises(SynthqError, match="i/n"):
        make(tmp_path, trained_generator, tiny_beir, "x", shard="two")
    with pytest.raises(SynthqError, match="0 <= i < n"):
        make(tmp_path, trained_generator, tiny_beir, "x", shard="3/3")
    with pytest.raises(DataError, match="no qrels for split 'nope'"):
        make(tmp_path, trained_generator, tiny_beir, "x", split="nope")
    wrong_stage = tmp_path / "wrong"
    with create_artifact(wrong_stage, "eval", {}) as writer:
        (writer.dir / "x").write_text("x")
        writer.privacy = Guarantee(epsilon=math.inf)
    with pytest.raises(ArtifactError, match="expected 'finetune-lm'"):
        make(tmp_path, open_artifact(wrong_stage), tiny_beir, "x")
