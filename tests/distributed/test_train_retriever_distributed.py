"""train-retriever under torchrun (2 CPU ranks, gloo): in-batch negatives gathered across ranks,
DP modes with the single-process accounting and update."""

from __future__ import annotations

import json

import pytest
import torch
from sentence_transformers import SentenceTransformer

from synthq.artifacts.manifest import open_artifact
from synthq.config.retriever import TrainRetrieverConfig
from synthq.stages import train_retriever
from tests import helpers
from tests.distributed.launch import torchrun

OPTIONS = dict(batch_size=6, epochs=1, max_steps=3, lr=1e-3, max_query_length=16, max_doc_length=32, seed=2)


@pytest.fixture(scope="module")
def deterministic_encoder(tmp_path_factory):
    return helpers.tiny_sentence_encoder(tmp_path_factory.mktemp("encoder") / "encoder", dropout=0.0)


def _weights(path) -> dict[str, torch.Tensor]:
    return {
        k: v.detach().clone() for k, v in SentenceTransformer(str(path), device="cpu").state_dict().items()
    }


def _diagnostics(artifact) -> dict:
    return json.loads((artifact.path / "diagnostics" / "metrics.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    "dp",
    [None, "batch", "group", "sample", "logit"],
    ids=["non-private", "batch", "group", "sample", "logit"],
)
def test_two_ranks_train_the_single_process_retriever(tmp_path, tiny_beir, deterministic_encoder, dp):
    extra = {} if dp is None else {"dp": dp, "epsilon": "8", "clip_norm": 0.5, "group_size": 2}
    if dp == "logit":
        extra["temperature"] = 1.0
    single = train_retriever.run(
        TrainRetrieverConfig(
            data=str(tiny_beir), encoder=str(deterministic_encoder), out=tmp_path / "one", device="cpu",
            **OPTIONS, **extra,
        )
    )  # fmt: skip
    arguments = ["train-retriever", "--data", str(tiny_beir), "--encoder", str(deterministic_encoder)]
    arguments += ["--device", "cpu", "--out", str(tmp_path / "two")]
    for key, value in {**OPTIONS, **extra}.items():
        arguments += [f"--{key.replace('_', '-')}", str(value)]
    torchrun(2, *arguments)

    double = open_artifact(tmp_path / "two", "train-retriever")
    assert double.manifest["distributed"]["world_size"] == 2
    assert double.privacy.epsilon == single.privacy.epsilon
    assert helpers.comparable(double.privacy) == helpers.comparable(single.privacy)
    # The first step's loss is the loss of the same first batch before any update: equal only
    # if each rank's queries saw the other rank's documents as negatives.
    first_losses = [_diagnostics(a)["first_loss"] for a in (single, double)]
    assert first_losses[1] == pytest.approx(first_losses[0], rel=1e-5)
    # Same gradients (and, with DP, the same noise added once): the same retriever.
    one, two = _weights(single.path), _weights(double.path)
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-3, atol=1e-4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]
