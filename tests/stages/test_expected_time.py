"""Every long stage says how long it will take before it starts: the figure is the reference
machine's measured cost per row (``synthq/models/reference_costs.json``, itself checked against
``benchmarks/results.json`` in ``tests/dp/test_route_plans.py``) times this run's rows, scaled by
its model's parameters and its document tokens; at the user unit the rows are counted at K,
never at how many queries each user has."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from synthq.config.generator import GenerateConfig
from synthq.models import stage_costs
from synthq.models.encoder import load_encoder
from synthq.models.generator import QueryGenerator
from synthq.stages import finetune_lm, generate, train_retriever
from tests.helpers import retriever_config
from tests.stages.test_fitted_defaults import finetune_config

COSTS = json.loads((Path(stage_costs.__file__).parent / "reference_costs.json").read_text())


def test_the_costs_scale_by_rows_parameters_and_document_tokens():
    row = COSTS["generator_dp_seconds_per_row"]["value"]
    assert stage_costs.generator_training_seconds(64, 384, 2 * 134_515_008) == pytest.approx(64 * row * 3 * 2)
    per_query = 1 / COSTS["generated_queries_per_second"]["value"]
    assert stage_costs.generation_seconds(100, 156, 24, 134_515_008) == pytest.approx(100 * per_query * 2)
    pair = COSTS["retriever_dp_sample_seconds_per_pair"]["value"]
    assert stage_costs.retriever_training_seconds(32, 64, 22_713_216, "sample") == pytest.approx(16 * pair)
    assert stage_costs.retriever_training_seconds(32, 64, 22_713_216, "logit") is None  # never measured
    chunked = COSTS["retriever_gradcache_factor"]["value"] * COSTS["retriever_seconds_per_pair"]["value"]
    assert stage_costs.retriever_training_seconds(10, 128, 22_713_216, None, chunked=True) == pytest.approx(
        10 * chunked
    )
    assert stage_costs.retriever_training_seconds(
        10, 128, 22_713_216, "group", chunked=True
    ) == pytest.approx(10 * COSTS["retriever_dp_group_seconds_per_pair"]["value"])  # DP never chunks
    assert stage_costs.expected_line(600).startswith("expected about 10 min on 2 CPU cores")
    assert stage_costs.expected_line(None).startswith("expected time: no measured cost")


def test_bf16_on_a_cpu_with_bf16_arithmetic_scales_each_figure_by_its_measured_ratio(monkeypatch):
    from synthq.runtime import precision

    def figures():
        return (
            stage_costs.generation_seconds(100, 66, 24, 134_515_008),
            stage_costs.generator_training_seconds(64, 128, 134_515_008),
            stage_costs.retriever_training_seconds(32, 128, 22_713_216, None),
        )

    fp32 = figures()
    works = ("generation", "generator_training", "retriever_training")
    ratios = [COSTS[f"cpu_bf16_{work}_ratio"]["value"] for work in works]
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: True)
    with precision.use_precision("bf16", "cpu"):
        assert figures() == pytest.approx([f * r for f, r in zip(fp32, ratios, strict=True)])
    with precision.use_precision("fp32", "cpu"):
        assert figures() == pytest.approx(fp32)
    # bf16 without bf16 arithmetic: slower, by a ratio never measured, so fp32's figure
    monkeypatch.setattr(precision, "native_bf16_cpu", lambda: False)
    with precision.use_precision("bf16", "cpu"):
        assert figures() == pytest.approx(fp32)


@pytest.mark.slow
def test_the_reference_sizes_are_the_shipped_models_sizes():
    """The costs were measured on SmolLM2-135M and MiniLM-L6: a stage on those models scales by 1."""
    generator = QueryGenerator.load("smollm2-135m")
    assert stage_costs.parameter_count(generator.model) == stage_costs.REFERENCE_GENERATOR_PARAMETERS
    encoder = load_encoder("minilm-l6")
    assert stage_costs.parameter_count(encoder) == stage_costs.REFERENCE_ENCODER_PARAMETERS


def _lines_before(err: str, marker: str) -> list[str]:
    lines = err.splitlines()
    return lines[: next(i for i, line in enumerate(lines) if marker in line)]


def test_finetune_lm_says_its_expected_time_before_the_first_step(
    tmp_path, tiny_beir, tiny_causal_dir, capsys
):
    log = tmp_path / "log"
    shutil.copytree(tiny_beir, log)
    train = [line.split("\t")[0] for line in (log / "qrels" / "train.tsv").read_text().splitlines()[1:]]
    (log / "users.tsv").write_text(
        "query-id\tuser-id\n" + "".join(f"{q}\tperson-{i % 8}\n" for i, q in enumerate(train))
    )
    options = dict(batch_size=2, max_steps=3, epsilon=8, privacy_unit="user", max_queries_per_user=2)
    artifact = finetune_lm.run(finetune_config(tmp_path, log, tiny_causal_dir, **options))
    model = QueryGenerator.load(artifact.path).model
    seconds = stage_costs.generator_training_seconds(
        3 * 2 * 2, artifact.config["max_source_length"], stage_costs.parameter_count(model)
    )  # 3 steps of B = 2 users counted at K = 2 queries each
    err = capsys.readouterr().err
    assert stage_costs.expected_line(seconds) in _lines_before(err, "finetune-lm ε")


def test_generate_and_train_retriever_say_theirs(
    tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir, capsys
):
    generator = finetune_lm.run(finetune_config(tmp_path, tiny_beir, tiny_causal_dir))
    capsys.readouterr()
    config = GenerateConfig(generator=generator.path, corpus=str(tiny_beir), out=tmp_path / "syn", limit=3,
                            num_queries=2)  # fmt: skip
    generate.run(config)
    loaded = QueryGenerator.load(generator.path)
    template = len(
        loaded.tokenizer(loaded.template.format(document=""), add_special_tokens=False)["input_ids"]
    )
    seconds = stage_costs.generation_seconds(
        6,
        loaded.max_source_length + template,
        config.max_new_tokens,
        stage_costs.parameter_count(loaded.model),
    )
    assert f"6 queries to write; {stage_costs.expected_line(seconds)}" in capsys.readouterr().err

    config = retriever_config(
        tmp_path / "r", tiny_beir, tiny_encoder_dir, dp="group", epsilon=8, batch_size=8
    )
    artifact = train_retriever.run(config)
    encoder = load_encoder(tiny_encoder_dir)
    seconds = stage_costs.retriever_training_seconds(
        artifact.metrics["steps"] * 8, config.max_doc_length, stage_costs.parameter_count(encoder), "group"
    )
    assert stage_costs.expected_line(seconds) in capsys.readouterr().err
