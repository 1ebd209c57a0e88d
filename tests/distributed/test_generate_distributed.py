"""generate under torchrun: each rank one shard, rank 0 merges; equal to one process; rerunnable."""

from __future__ import annotations

import shutil

import pytest

from synthq.artifacts.manifest import open_artifact
from synthq.config.generator import GenerateConfig
from synthq.stages import generate
from tests import helpers
from tests.distributed.launch import torchrun
from tests.stages.test_generate import tiny_generator_artifact


@pytest.mark.slow
def test_two_ranks_generate_the_single_process_set_and_a_rerun_recovers(tmp_path, tiny_beir, tiny_causal_dir):
    generator = tiny_generator_artifact(tiny_causal_dir, tmp_path / "gen", steps=30)
    options = dict(num_queries=2, max_new_tokens=8, seed=5)
    single = generate.run(
        GenerateConfig(
            generator=generator.path, corpus=str(tiny_beir), out=tmp_path / "one", device="cpu", **options
        )
    )
    arguments = [
        "generate",
        "--generator",
        str(generator.path),
        "--corpus",
        str(tiny_beir),
        "--device",
        "cpu",
    ]
    arguments += [
        "--num-queries",
        "2",
        "--max-new-tokens",
        "8",
        "--seed",
        "5",
        "--out",
        str(tmp_path / "two"),
    ]
    torchrun(2, *arguments)
    double = open_artifact(tmp_path / "two", "generate")
    expected = (single.path / "queries.jsonl").read_text()
    assert (double.path / "queries.jsonl").read_text() == expected
    assert (double.path / "qrels" / "train.tsv").read_text() == (
        single.path / "qrels" / "train.tsv"
    ).read_text()
    assert helpers.comparable(double.privacy) == helpers.comparable(single.privacy)
    assert double.config["merged_from"] == 2

    # A worker "died": its shard is gone and the merged set too. The same command redoes that
    # shard only (the other is up to date) and merges the same set again.
    shards = tmp_path / ".two.shards"
    survivor = shards / "shard-0-of-2" / "manifest.json"
    before = survivor.read_text()
    shutil.rmtree(shards / "shard-1-of-2")
    shutil.rmtree(tmp_path / "two")
    torchrun(2, *arguments)
    assert survivor.read_text() == before
    assert (tmp_path / "two" / "queries.jsonl").read_text() == expected
