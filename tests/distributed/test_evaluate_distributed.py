"""eval under torchrun: the corpus and queries are encoded over 2 CPU ranks; the results equal
a one-process evaluation."""

from __future__ import annotations

import json

import pytest

from synthq.artifacts.manifest import open_artifact
from synthq.config.evaluation import EvalConfig
from synthq.stages import evaluate
from tests import helpers
from tests.distributed.launch import torchrun
from tests.helpers import accounted, tiny_retriever_artifact


@pytest.mark.slow
def test_two_ranks_give_the_single_process_metrics(tmp_path, tiny_beir, tiny_encoder_dir, monkeypatch):
    retriever = tiny_retriever_artifact(
        tmp_path / "ret", tiny_encoder_dir, accounted(epsilon=8.0, delta=1e-5, mechanism="dp-group")
    )
    options = dict(retrievers=[str(retriever.path)], datasets=[str(tiny_beir)], split="test", device="cpu")
    single = evaluate.run(EvalConfig(out=tmp_path / "one", **options))
    # a separate embedding cache, so the ranks really encode (no hit on the one-process cache)
    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path / "rank-cache"))
    arguments = ["eval", "--retriever", str(retriever.path), "--datasets", str(tiny_beir), "--split", "test"]
    torchrun(2, *arguments, "--device", "cpu", "--out", str(tmp_path / "two"))
    double = open_artifact(tmp_path / "two", "eval")
    assert double.manifest["distributed"]["world_size"] == 2
    assert double.timings["cache_misses"] >= 1

    def metrics(artifact) -> dict:
        rows = json.loads((artifact.path / "results.json").read_text())
        return {(r["dataset"], r["retriever"]): r["metrics"] for r in rows}

    one, two = metrics(single), metrics(double)
    assert one.keys() == two.keys() and len(one) >= 2  # the retriever and BM25
    for key in one:
        for name, value in one[key].items():
            assert two[key][name] == pytest.approx(value, abs=1e-9), (key, name)
    assert helpers.comparable(double.privacy) == helpers.comparable(single.privacy)
