"""The stage chain at ``--precision bf16`` on a CPU (the path ``auto`` takes on a GPU): DP
fine-tuning, generation, DP and synthetic retriever training and evaluation all run, each
manifest records the precision its forward passes ran at, the printed ε is the fp32 run's (the
accountant's inputs do not change), and ``auto`` keeps existing fingerprints."""

from __future__ import annotations

import json
import math

from synthq.artifacts.freshness import config_fingerprint
from synthq.config.evaluation import EvalConfig
from synthq.config.generator import GenerateConfig
from synthq.stages import evaluate, generate, train_retriever
from tests.helpers import finetune, retriever_config


def _precision(artifact) -> str | None:
    return json.loads((artifact.path / "manifest.json").read_text())["environment"].get("precision")


def test_the_chain_runs_at_bf16_and_records_it(tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir):
    options = dict(epsilon=8.0, delta=1e-3, epochs=1, batch_size=4, seed=0)
    fp32 = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen-fp32", precision="fp32", **options)
    bf16 = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen-bf16", precision="bf16", **options)
    assert _precision(fp32) == "fp32" and _precision(bf16) == "bf16"
    assert bf16.manifest["privacy"]["epsilon"] == fp32.manifest["privacy"]["epsilon"]
    assert math.isfinite(bf16.manifest["privacy"]["epsilon"])

    synthetic = generate.run(
        GenerateConfig(generator=str(bf16.path), corpus=str(tiny_beir), out=tmp_path / "syn",
                       max_new_tokens=4, seed=1, precision="bf16")
    )  # fmt: skip
    assert _precision(synthetic) == "bf16"
    assert (synthetic.path / "queries.jsonl").read_text().strip()

    on_synthetic = train_retriever.run(
        retriever_config(tmp_path / "ret-syn", synthetic.path, tiny_encoder_dir, precision="bf16")
    )
    direct = train_retriever.run(
        retriever_config(tmp_path / "ret-dp", tiny_beir, tiny_encoder_dir, dp="group", precision="bf16",
                         epsilon=8.0, delta=1e-3, clip_norm=1.0)
    )  # fmt: skip
    assert _precision(on_synthetic) == _precision(direct) == "bf16"
    evaluation = evaluate.run(
        EvalConfig(retrievers=[str(on_synthetic.path), str(direct.path)], datasets=[str(tiny_beir)],
                   out=tmp_path / "eval", bm25=False, precision="bf16")
    )  # fmt: skip
    assert _precision(evaluation) == "bf16"
    rows = json.loads((evaluation.path / "results.json").read_text())
    assert len(rows) == 2 and all(0.0 <= row["metrics"]["ndcg@10"] <= 1.0 for row in rows)


def test_auto_precision_keeps_the_fingerprint_of_configs_without_the_field(tmp_path, tiny_beir):
    config = GenerateConfig(generator="g", corpus=str(tiny_beir), out=tmp_path / "s")
    without = config.model_dump()
    without.pop("precision")
    assert config_fingerprint(config, []) == config_fingerprint(without, [])
    assert config_fingerprint(config.model_copy(update={"precision": "bf16"}), []) != config_fingerprint(
        config, []
    )
