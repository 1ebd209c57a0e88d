from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from synthq.config.audit import CanaryAuditConfig
from synthq.config.generator import FinetuneConfig
from synthq.config.loading import apply_overrides, load_yaml
from synthq.runtime.errors import SynthqError


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("finetune:\n  epsilon: 8\n  lr: 0.001\n")
    data = apply_overrides(load_yaml(path), ["finetune.epsilon=inf", "finetune.batch_size=64", "new.key=x"])
    assert data["finetune"] == {"epsilon": "inf", "lr": 0.001, "batch_size": 64}
    assert data["new"] == {"key": "x"}
    config = FinetuneConfig(out=tmp_path / "o", data="embedded", model="m", **data["finetune"])
    assert math.isinf(config.epsilon) and config.batch_size == 64


def test_errors(tmp_path):
    with pytest.raises(SynthqError, match="no such config"):
        load_yaml(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("a: [1, 2\n")
    with pytest.raises(SynthqError, match="invalid YAML"):
        load_yaml(tmp_path / "bad.yaml")
    with pytest.raises(SynthqError, match="key=value"):
        apply_overrides({}, ["novalue"])
    with pytest.raises(ValidationError):
        FinetuneConfig(out="o", data="d", model="m", unknown_option=1)


def test_epsilon_lists():
    config = CanaryAuditConfig(out="o", data="d", model="m", epsilons="inf,16,8")
    assert math.isinf(config.epsilons[0]) and config.epsilons[1:] == [16.0, 8.0]
