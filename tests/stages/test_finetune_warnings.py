"""Runs that are accepted but protect nothing, or spend ε for nothing, say so (issue #74): DP
fine-tuning on a split the dataset declares public, and a user unit without DP (ε = ∞)."""

from __future__ import annotations

from tests.helpers import finetune
from tests.privacy.test_user_level import with_users


def test_dp_on_a_public_split_says_a_warm_start_costs_nothing(tmp_path, tiny_beir, tiny_causal_dir, capsys):
    finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", split="test", epsilon=8.0, delta=0.05, max_steps=1,
             batch_size=2, physical_batch_size=2)  # fmt: skip
    err = capsys.readouterr().err
    assert f"split 'test' of {tiny_beir} is declared public: DP spends ε" in err
    assert f"--warm-start {tiny_beir}:test" in err


def test_a_user_unit_without_dp_says_it_protects_nothing(tmp_path, tiny_beir, tiny_causal_dir, capsys):
    data = with_users(tmp_path, tiny_beir)
    gen = finetune(tmp_path, data, tiny_causal_dir, "gen", epsilon="inf", max_steps=1, privacy_unit="user")
    assert gen.privacy.epsilon == float("inf")
    assert "--privacy-unit user without DP (--epsilon inf) protects nothing" in capsys.readouterr().err


def test_an_encoder_given_as_model_is_named_before_any_data_is_read(tmp_path, tiny_beir, tiny_encoder_dir):
    """Faults round 5: a sentence-transformers directory as --model failed after the data was
    read, on "the tokenizer has no end-of-sequence token", naming neither the model nor the fix."""
    import pytest

    from synthq.models.generator import QueryGenerator
    from synthq.runtime.errors import ModelResolutionError

    with pytest.raises(ModelResolutionError) as refused:
        finetune(tmp_path, tiny_beir, tiny_encoder_dir, "gen", max_steps=1)
    message = str(refused.value)
    assert message.startswith(f"--model {tiny_encoder_dir}: ")
    assert "is a sentence-transformers encoder (modules.json), not a query generator" in message
    assert "train-retriever's --encoder" in message and not (tmp_path / "gen").exists()
    with pytest.raises(ModelResolutionError, match="sentence-transformers encoder"):  # generate, filter, ...
        QueryGenerator.load(tiny_encoder_dir)
