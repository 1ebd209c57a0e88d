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
        FinetuneConfig(data="embedded", model="m", out="o", privacy_unit="user"),
        TrainRetrieverConfig(data="embedded", out="o"),
    ],
)
def test_the_old_behaviour_value_keeps_the_fingerprint_and_other_values_change_it(config):
    assert config_fingerprint(config, INPUTS) == config_fingerprint(_old(config), INPUTS)
    field = next(k for k in ADDED_FIELD_DEFAULTS if k in type(config).model_fields)
    changed = config.model_copy(update={field: "per-user" if field == "user_clipping" else 2})
    assert config_fingerprint(changed, INPUTS) != config_fingerprint(config, INPUTS)


def test_a_checkpoint_written_before_the_field_existed_resumes_only_at_its_old_value(tmp_path):
    config = FinetuneConfig(data="embedded", model="m", out="o", privacy_unit="user", epsilon=8)
    state = {"config": json.dumps(_old(config)), "inputs": json.dumps(INPUTS)}
    check_resumable(tmp_path / "ckpt", state, config, INPUTS)  # no error
    with pytest.raises(ArtifactError, match="user_clipping"):
        check_resumable(
            tmp_path / "ckpt", state, config.model_copy(update={"user_clipping": "per-user"}), INPUTS
        )
