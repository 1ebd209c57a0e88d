"""A field added to a stage after artifacts were written: at its old-behaviour value it changes no
fingerprint, no resume check and no replicate recipe; at any other value it does."""

from __future__ import annotations

import json

import pytest

from synthq.artifacts.freshness import ADDED_FIELD_DEFAULTS, check_resumable, config_fingerprint
from synthq.config.generator import FinetuneConfig
from synthq.config.retriever import TrainRetrieverConfig
from synthq.runtime.errors import ArtifactError

INPUTS = [{"kind": "data", "path": "/x", "sha256": "a" * 64}]


def _old(config) -> dict:
    """The config as a synthq without the added fields recorded it."""
    return {k: v for k, v in config.model_dump(mode="json").items() if k not in ADDED_FIELD_DEFAULTS}


@pytest.mark.parametrize(
    "config",
    [
        FinetuneConfig(data="embedded", model="m", out="o", privacy_unit="user", user_clipping="per-example"),
        FinetuneConfig(data="embedded", model="m", out="o"),  # the query unit: per-example by default
        TrainRetrieverConfig(data="embedded", out="o"),
    ],
)
@pytest.mark.parametrize("added", ["user_clipping", "hard_negatives", "lora_targets"])
def test_the_old_behaviour_value_keeps_the_fingerprint_and_other_values_change_it(config, added):
    assert config_fingerprint(config, INPUTS) == config_fingerprint(_old(config), INPUTS)
    if added not in type(config).model_fields:
        return
    if added == "lora_targets":  # targets need adapters: compare at one rank
        config = config.model_copy(update={"lora_rank": 8})
        assert config_fingerprint(config, INPUTS) == config_fingerprint(_old(config), INPUTS)
    other = {"user_clipping": "per-user", "hard_negatives": 2, "lora_targets": "q_proj,v_proj"}[added]
    changed = config.model_copy(update={added: other})
    assert config_fingerprint(changed, INPUTS) != config_fingerprint(config, INPUTS)


def test_a_checkpoint_written_before_the_field_existed_resumes_only_at_its_old_value(tmp_path):
    config = FinetuneConfig(
        data="embedded", model="m", out="o", privacy_unit="user", epsilon=8, user_clipping="per-example"
    )
    state = {"config": json.dumps(_old(config)), "inputs": json.dumps(INPUTS)}
    check_resumable(tmp_path / "ckpt", state, config, INPUTS)  # no error
    with pytest.raises(ArtifactError, match="user_clipping"):
        check_resumable(
            tmp_path / "ckpt", state, config.model_copy(update={"user_clipping": "per-user"}), INPUTS
        )


def test_the_changed_default_redoes_user_level_generators_only():
    """Per-user clipping became the default at the user unit: a user-level generator written
    before (1/k weighting, no field recorded) is out of date for a config that does not ask for
    per-example; the query unit, where nothing changed, keeps its fingerprint."""
    user = FinetuneConfig(data="embedded", model="m", out="o", privacy_unit="user", epsilon=8)
    assert user.user_clipping == "per-user"
    before = {**_old(user)}  # what the older synthq recorded for the same command
    assert config_fingerprint(user, INPUTS) != config_fingerprint(before, INPUTS)
    assert (
        FinetuneConfig(
            data="embedded", model="m", out="o", privacy_unit="user", epsilon=float("inf")
        ).user_clipping
        == "per-example"
    )
    query = FinetuneConfig(data="embedded", model="m", out="o", epsilon=8)
    assert query.user_clipping == "per-example"
    assert config_fingerprint(query, INPUTS) == config_fingerprint(_old(query), INPUTS)
