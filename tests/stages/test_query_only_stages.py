"""``finetune-lm --query-only`` then ``generate`` on a tiny causal model: the DP run trains
adapters that act on the query only, its prefix cache stays in the private partial area and is
gone when the artifact is finished, and generate samples from the saved base + adapter."""

from __future__ import annotations

import json

import pytest
import torch

from synthq.config.generator import FinetuneConfig, GenerateConfig
from synthq.models import query_only
from synthq.models.generator import QueryGenerator
from synthq.stages import finetune_lm, generate


def run_query_only(tmp_path, beir, model, name, **options):
    settings = dict(
        batch_size=8,
        epochs=2,
        lr=1e-2,
        max_source_length=48,
        lora_rank=4,
        query_only=True,
        seed=0,
        device="cpu",
    )
    return finetune_lm.run(
        FinetuneConfig(data=str(beir), model=str(model), out=tmp_path / name, **{**settings, **options})
    )


def test_query_only_dp_run_then_generate(tmp_path, tiny_beir, tiny_causal_dir, monkeypatch):
    monkeypatch.setattr(query_only, "MEMORY_LIMIT_BYTES", 0)  # the memory-mapped private file
    built = []
    original = query_only.CachedRows.build

    def build(self, directory):
        store = original(self, directory)
        built.append((store.path, store.path.exists(), len(store)))
        return store

    monkeypatch.setattr(query_only.CachedRows, "build", build)
    artifact = run_query_only(
        tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon=8, warm_start=f"{tiny_beir}:test"
    )
    [(path, existed, documents)] = built
    assert existed and documents > 0
    assert path.parent.name == "checkpoints" and path.parent.parent.name.endswith(".partial")
    assert not path.exists() and not path.parent.parent.exists()  # deleted; the partial dir renamed
    files = [p.relative_to(artifact.path).as_posix() for p in artifact.path.rglob("*") if p.is_file()]
    assert not any("prefix_cache" in f for f in files)
    assert not any(f.startswith("checkpoints/") for f in files)
    assert "query_adapter/adapter_config.json" in files
    saved = json.loads((artifact.path / "synthq_generator.json").read_text())
    assert saved["query_only"]["prefix_dtype"] == "bfloat16"
    assert 0 < artifact.privacy.epsilon <= 8
    assert "query-only" in json.dumps(artifact.manifest)  # the release says what was trained
    assert artifact.metrics["weights_moved"]["what"] == "LoRA adapters"
    assert artifact.config["physical_batch_size"] == 21  # 1,024 // (32 query + 16) rows of query tokens

    loaded = QueryGenerator.load(artifact.path)
    assert loaded.query_only
    synthetic = generate.run(
        GenerateConfig(
            generator=artifact.path, corpus=str(tiny_beir), out=tmp_path / "syn", seed=1, max_new_tokens=8
        )
    )
    queries = [json.loads(line) for line in (synthetic.path / "queries.jsonl").read_text().splitlines()]
    assert queries and synthetic.privacy.epsilon == artifact.privacy.epsilon


def test_query_only_needs_lora_and_refuses_a_query_only_start(tmp_path, tiny_beir, tiny_causal_dir):
    with pytest.raises(ValueError, match="--lora-rank"):
        FinetuneConfig(data=str(tiny_beir), model=str(tiny_causal_dir), out=tmp_path / "x", query_only=True)
    first = run_query_only(tmp_path, tiny_beir, tiny_causal_dir, "first", epsilon="inf", max_steps=2)
    from synthq.runtime.errors import SettingError

    with pytest.raises(SettingError, match="query-only generator"):
        run_query_only(tmp_path, tiny_beir, first.path, "second", epsilon="inf", max_steps=1)


def test_seq2seq_query_only_run_then_generate(tmp_path, tiny_beir, tiny_t5_dir):
    artifact = run_query_only(tmp_path, tiny_beir, tiny_t5_dir, "t5", epsilon=8)
    assert "frozen encoder" in json.dumps(artifact.manifest)
    assert not (artifact.path / "query_adapter").exists()  # decoder adapters merge exactly
    synthetic = generate.run(
        GenerateConfig(
            generator=artifact.path, corpus=str(tiny_beir), out=tmp_path / "syn", seed=1, max_new_tokens=8
        )
    )
    assert (synthetic.path / "queries.jsonl").read_text().strip()


@pytest.mark.slow
def test_interrupted_query_only_run_deletes_its_cache_and_resumes_to_the_same_adapter(
    tmp_path, tiny_beir, tiny_causal_dir, monkeypatch
):
    from synthq.artifacts.manifest import partial_dir

    monkeypatch.setattr(query_only, "MEMORY_LIMIT_BYTES", 0)
    options = dict(epsilon=8.0, epochs=6, checkpoint_every=3, batch_size=4)
    reference = run_query_only(tmp_path, tiny_beir, tiny_causal_dir, "reference", **options)
    original_step = finetune_lm.GeneratorTraining.step
    calls = {"n": 0}

    def interrupted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(finetune_lm.GeneratorTraining, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_query_only(tmp_path, tiny_beir, tiny_causal_dir, "resumed", **options)
    checkpoints = partial_dir(tmp_path / "resumed") / "checkpoints"
    assert (checkpoints / "state.pt").is_file()
    assert not (checkpoints / query_only.PREFIX_FILE).exists()  # the cache goes however training ends
    monkeypatch.setattr(finetune_lm.GeneratorTraining, "step", original_step)
    resumed = run_query_only(tmp_path, tiny_beir, tiny_causal_dir, "resumed", resume=True, **options)
    assert resumed.privacy.epsilon == reference.privacy.epsilon
    first = QueryGenerator.load(reference.path).model.state_dict()
    second = QueryGenerator.load(resumed.path).model.state_dict()
    assert any("lora_B" in name for name in first)
    for name, value in first.items():
        torch.testing.assert_close(second[name], value)
