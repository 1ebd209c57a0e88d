"""The generators' held-out comparison: per-pair losses on a public split only, paired."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import generator_held_out
from synthq.data.pairs import training_pairs
from synthq.data.sources import load_source
from synthq.dp.lm.learning_check import held_out_loss
from synthq.models.generator import QueryGenerator, apply_lora
from synthq.runtime.errors import PrivacyError
from tests import helpers


def test_losses_are_per_pair_paired_against_the_first_generator_and_private_splits_are_refused(
    tmp_path, tiny_beir, tiny_causal_dir, monkeypatch, capsys
):
    data = helpers.private_copy(tmp_path, tiny_beir, public=("test",))
    moved = QueryGenerator.load(tiny_causal_dir, max_source_length=32)
    apply_lora(moved, rank=2)
    for parameter in moved.model.parameters():
        if parameter.requires_grad:
            parameter.data.normal_(0, 0.5)  # a generator that differs from its base
    moved.model = moved.model.merge_and_unload()
    moved.save(tmp_path / "moved")
    argv = [str(tiny_causal_dir), str(tmp_path / "moved"), "--data", str(data), "--split", "test"]
    monkeypatch.setattr(
        sys, "argv", ["generator_held_out.py", *argv, "--pairs", "3", "--max-source-length", "32"]
    )
    generator_held_out.main()
    result = json.loads(capsys.readouterr().out)
    assert result["pairs"] == 3 and result["reference"] == str(tiny_causal_dir)
    first, second = (result["generators"][str(path)] for path in (tiny_causal_dir, tmp_path / "moved"))
    assert first["minus_reference"] == 0 and first["interval_95"] == [0, 0]
    # the learning check's mean over the same three pairs, in one batch: the slicing and the mean
    pairs = training_pairs(load_source(str(data), splits=["test"]), "test")[:3]
    for path, row in ((tiny_causal_dir, first), (tmp_path / "moved", second)):
        generator = QueryGenerator.load(path, max_source_length=32)
        mean = held_out_loss(generator, [p.document for p in pairs], [p.query for p in pairs], 32)
        assert row["mean_loss"] == pytest.approx(mean, rel=1e-5)
    assert second["minus_reference"] == pytest.approx(second["mean_loss"] - first["mean_loss"], abs=1e-5)
    low, high = second["interval_95"]
    assert low <= second["minus_reference"] <= high and low < high
    assert first["epsilon"] == second["epsilon"] == "public model"  # neither is a synthq artifact
    # a split declared private, and one of a dataset that declares nothing (fail closed): refused,
    # nothing printed
    undeclared = helpers.private_copy(tmp_path, tiny_beir, "undeclared")
    (undeclared / "privacy.json").unlink()
    for root, split in ((data, "train"), (undeclared, "test")):
        monkeypatch.setattr(
            sys, "argv", ["generator_held_out.py", *argv[:2], "--data", str(root), "--split", split]
        )
        with pytest.raises(PrivacyError, match="not declared public"):
            generator_held_out.main()
        assert capsys.readouterr().out == ""
