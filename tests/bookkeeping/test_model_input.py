"""A starting model's public status is an assumption, and synthq's own weights are never taken
for a public model (issue #74, wrong 5).

A DP generator's weights copied without their ``manifest.json`` used to be read as a public local
model: ``generate`` wrote an ε = 0.00 set and ``ledger`` said nothing read private data. Weights
that carry synthq's model card are refused as a local copy (the artifact brings its guarantee) and
warned about as a hub model; and the result line of a stage whose ε rests on a starting model
being public says so, not only the ledger.
"""

from __future__ import annotations

import shutil

import pytest

from synthq.bookkeeping.inputs import model_input
from synthq.runtime.errors import PrivacyError
from tests.helpers import finetune, one_line, run_main


@pytest.fixture
def copied_weights(tmp_path, tiny_beir, tiny_causal_dir):
    gen = finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon=4.0, max_steps=1)
    assert 0 < gen.privacy.epsilon <= 4
    copy = tmp_path / "weights"
    shutil.copytree(gen.path, copy, ignore=shutil.ignore_patterns("manifest.json", "diagnostics"))
    return copy


def test_a_dp_generator_copied_without_its_manifest_is_not_a_public_model(
    tmp_path, tiny_beir, copied_weights, capsys, monkeypatch
):
    out = tmp_path / "syn"
    status, output = run_main(
        ["generate", "--generator", str(copied_weights), "--corpus", str(tiny_beir), "--out", str(out),
         "--max-new-tokens", "4", "--device", "cpu"],
        capsys, monkeypatch,
    )  # fmt: skip
    line = one_line(output)
    assert status != 0 and not out.exists()
    assert "carry synthq's model card (its card states ε " in line and "manifest.json" in line
    with pytest.raises(PrivacyError, match="synthq's model card"):
        model_input(str(copied_weights), stage="finetune-lm")


def test_a_published_synthq_model_from_the_hub_is_public_only_by_a_stated_assumption(
    copied_weights, capsys, monkeypatch
):
    from synthq.models import resolve

    monkeypatch.setattr(resolve, "resolve_model", lambda spec, **_: copied_weights)
    start = model_input("someone/synthq-generator", stage="finetune-lm")
    assert start.guarantee.epsilon == 0 and not start.is_artifact
    assert "a model published by synthq" in capsys.readouterr().err
    assert any("someone/synthq-generator" in a for a in start.guarantee.assumptions)


def test_the_result_line_states_that_the_starting_model_is_assumed_public(
    tmp_path, tiny_beir, tiny_causal_dir, capsys, monkeypatch
):
    out = tmp_path / "syn"
    status, output = run_main(
        ["generate", "--generator", str(tiny_causal_dir), "--corpus", str(tiny_beir), "--out", str(out),
         "--max-new-tokens", "4", "--device", "cpu"],
        capsys, monkeypatch,
    )  # fmt: skip
    assert status == 0, output
    result = next(line for line in output.splitlines() if line.startswith("generate written to"))
    assert "ε=0" in result and f"assuming the starting model {tiny_causal_dir}" in result
