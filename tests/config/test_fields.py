"""Shared field types and defaults: each default written once and used by every stage that has it."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from synthq.config.audit import CanaryAuditConfig
from synthq.config.fields import (
    DEFAULT_EPSILON,
    DEFAULT_PRIVACY_UNIT,
    DEFAULT_TOP_P,
    StageConfig,
    check_device,
)
from synthq.config.generator import EvolveConfig, FinetuneConfig, GenerateConfig
from synthq.config.registry import STAGES, stage_entry
from synthq.config.retriever import TrainRetrieverConfig
from synthq.config.search import SearchConfig
from synthq.runtime.errors import SynthqError


def test_the_papers_defaults():
    assert (DEFAULT_EPSILON, DEFAULT_PRIVACY_UNIT, DEFAULT_TOP_P) == (8.0, "query", 0.8)


@pytest.mark.parametrize(
    "config_class", [FinetuneConfig, EvolveConfig, TrainRetrieverConfig, CanaryAuditConfig]
)
def test_every_stage_spending_budget_shares_the_default_epsilon_and_unit(config_class):
    fields = config_class.model_fields
    if "epsilons" in fields:  # the audit's list: non-private, then the default
        epsilon = fields["epsilons"].get_default(call_default_factory=True)[-1]
    else:
        epsilon = fields["epsilon"].default
    assert epsilon == DEFAULT_EPSILON
    assert fields["privacy_unit"].default == DEFAULT_PRIVACY_UNIT


def test_the_generators_top_p_is_one_default():
    assert GenerateConfig.model_fields["top_p"].default == DEFAULT_TOP_P
    assert CanaryAuditConfig.model_fields["top_p"].default == DEFAULT_TOP_P
    assert EvolveConfig.model_fields["top_p"].default == 0.9  # the public model's own, not the generator's


def test_epsilon_text():
    for text in ("inf", "Infinity", "∞", " none "):
        assert math.isinf(FinetuneConfig(out="o", data="d", model="m", epsilon=text).epsilon)
    assert FinetuneConfig(out="o", data="d", model="m", epsilon="2.5").epsilon == 2.5
    for bad in ("abc", 0, -1):
        with pytest.raises(ValidationError, match="epsilon"):
            FinetuneConfig(out="o", data="d", model="m", epsilon=bad)


def test_device_names():
    import torch

    for name in ("auto", "cpu"):
        assert check_device(name) == name
    if torch.backends.mps.is_available():
        assert check_device("mps") == "mps"
    else:
        with pytest.raises(ValueError, match="no MPS"):
            check_device("mps")
    for bad in ("gpu", "cuda:x", "cpu:0"):
        with pytest.raises(ValueError, match="not a device"):
            check_device(bad)


def test_retriever_weight_decay_is_an_option_with_the_old_default():
    assert TrainRetrieverConfig(out="o", data="d").weight_decay == 0.01
    assert TrainRetrieverConfig(out="o", data="d", weight_decay=0).weight_decay == 0
    with pytest.raises(ValidationError, match="weight_decay"):
        TrainRetrieverConfig(out="o", data="d", weight_decay=-0.1)


def test_limit_is_refused_with_dp():
    with pytest.raises(ValidationError, match="--limit cannot be used with DP"):
        FinetuneConfig(out="o", data="d", model="m", limit=5)
    assert FinetuneConfig(out="o", data="d", model="m", limit=5, epsilon="inf").limit == 5
    with pytest.raises(ValidationError, match="--limit cannot be used with DP"):
        TrainRetrieverConfig(out="o", data="d", dp="batch", limit=5)


def test_registry_names_a_stage_config_and_module_per_stage():
    for name, entry in STAGES.items():
        assert issubclass(entry.config_type(), StageConfig)
        assert entry.module.startswith("synthq.stages.")
        assert f"``synthq {name}``" in entry.config_type().__doc__
    with pytest.raises(SynthqError, match="unknown stage 'nope'"):
        stage_entry("nope")


def test_search_config():
    config = SearchConfig(query=["boil", "an egg"], retriever="r")
    assert config.queries() == ["boil an egg"] and config.top_k == 10 and config.corpus == "embedded"
    assert SearchConfig(query=["boil", "an egg"], retriever="r", each=True).queries() == ["boil", "an egg"]
    valid = {"query": ["q"], "retriever": "r"}
    for bad in ({"query": []}, {"retriever": None}, {"top_k": 0}, {"device": "gpu"}, {"x": 1}):
        bad = {k: v for k, v in {**valid, **bad}.items() if v is not None}
        with pytest.raises(ValidationError):
            SearchConfig(**bad)


def test_max_queries_per_user_at_the_query_unit_is_refused_not_ignored():
    """K only means something at --privacy-unit user; given at the query unit it was silently
    dropped. Its default still applies everywhere, and the user unit takes it."""
    made = {
        FinetuneConfig: dict(out="o", data="d", model="m"),
        TrainRetrieverConfig: dict(out="o", data="d", dp="group"),
        EvolveConfig: dict(out="o", data="d", model="m"),
        CanaryAuditConfig: dict(out="o", data="d", model="m"),
    }
    for config_class, options in made.items():
        with pytest.raises(ValidationError, match="--max-queries-per-user applies with --privacy-unit user"):
            config_class(**options, max_queries_per_user=4)
        assert config_class(**options).max_queries_per_user == 8
        assert config_class(**options, privacy_unit="user", max_queries_per_user=4).max_queries_per_user == 4


def test_a_batch_size_is_a_whole_number_or_auto_wherever_it_is_read():
    """One parser for finetune-lm's config and synthq plan's options (they had drifted copies)."""
    from synthq.config.fields import batch_size_or_auto
    from synthq.config.generator import FinetuneConfig

    assert [batch_size_or_auto(v) for v in ("auto", " AUTO ", 5, "7")] == ["auto", "auto", 5, 7]
    for bad in (0, "-1", "big", True, "2.5"):
        with pytest.raises(ValueError, match="whole number ≥ 1, or auto"):
            batch_size_or_auto(bad)
    assert FinetuneConfig(data="d", model="m", out="o", batch_size="Auto").batch_size == "auto"


def test_a_path_or_an_artifact_goes_wherever_a_path_does():
    """Issue #74: ``train_retriever(data=syn.path)`` and ``evaluate(retrievers=[ret.path])`` were
    refused (a Path where a string was expected)."""
    from pathlib import Path

    from synthq.artifacts.manifest import Artifact
    from synthq.config.evaluation import EvalConfig, ReportConfig, SimilarityConfig
    from synthq.config.generator import FilterConfig

    syn = Artifact(Path("/runs/syn"), {})
    config = TrainRetrieverConfig(data=syn.path, encoder=Path("/models/enc"), out=Path("/runs/ret"))
    assert (config.data, config.encoder) == ("/runs/syn", "/models/enc")
    assert TrainRetrieverConfig(data=syn, out=syn).data == "/runs/syn"
    evaluation = EvalConfig(
        retrievers=[Path("/runs/ret"), syn], untrained=[Path("/e")], out="/x", select_on=syn
    )
    assert evaluation.retrievers == ["/runs/ret", "/runs/syn"] and evaluation.select_on == "/runs/syn"
    assert GenerateConfig(generator=syn, corpus=Path("/c"), documents=syn, out="/x").corpus == "/c"
    assert FilterConfig(synthetic=syn, retriever=syn, out="/x").retriever == "/runs/syn"
    assert ReportConfig(evals=[syn], similarity=[syn], out="/x").evals == ["/runs/syn"]
    assert SimilarityConfig(synthetic=syn, original=Path("/o"), out="/x").original == "/o"
    assert FinetuneConfig(data=Path("/d"), model=syn, out="/x").model == "/runs/syn"
    assert EvolveConfig(data=Path("/d"), model=Path("/m"), embedder=Path("/e"), out="/x").embedder == "/e"
    assert SearchConfig(query=["q"], retriever=syn, corpus=Path("/c")).corpus == "/c"
    with pytest.raises(ValidationError, match="data"):
        TrainRetrieverConfig(data=3, out="/x")
