"""finetune-lm under torchrun (2 CPU ranks, gloo) against one process with the same settings."""

from __future__ import annotations

import json

import pytest
import torch

from synthq.artifacts.manifest import open_artifact
from synthq.config.generator import FinetuneConfig
from synthq.models.generator import QueryGenerator
from synthq.stages import finetune_lm
from tests import helpers
from tests.distributed.launch import torchrun

OPTIONS = dict(batch_size=8, epochs=2, physical_batch_size=2, lr=1e-2, max_source_length=48, seed=3)


def _weights(path) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in QueryGenerator.load(path).model.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", ["8", "inf"])
def test_two_ranks_give_the_single_process_artifact(tmp_path, tiny_beir, tiny_causal_dir, epsilon):
    single = finetune_lm.run(
        FinetuneConfig(
            data=str(tiny_beir), model=str(tiny_causal_dir), out=tmp_path / "one", epsilon=epsilon,
            device="cpu", **OPTIONS,
        )
    )  # fmt: skip
    arguments = ["finetune-lm", "--data", str(tiny_beir), "--model", str(tiny_causal_dir)]
    arguments += ["--epsilon", epsilon, "--device", "cpu", "--out", str(tmp_path / "two")]
    for key, value in OPTIONS.items():
        arguments += [f"--{key.replace('_', '-')}", str(value)]
    torchrun(2, *arguments)

    double = open_artifact(tmp_path / "two", "finetune-lm")
    assert double.manifest["distributed"] == {"world_size": 2, "backend": "gloo"}
    assert single.manifest["distributed"] == {"world_size": 1, "backend": None}
    # the same accounting: ε, δ, σ, q, steps
    assert double.privacy.epsilon == single.privacy.epsilon
    assert double.privacy.delta == single.privacy.delta
    assert helpers.comparable(double.privacy) == helpers.comparable(single.privacy)
    # the same global batches and the noise added once: the same model, up to float summation
    # order (which Adam can magnify to ~1e-5 on a near-zero gradient). With lr = 1e-2, noise
    # added once per rank, or one rank's share missing, moves weights by ~1e-2.
    one, two = _weights(single.path), _weights(double.path)
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-3, atol=1e-4)
    final = [
        json.loads((a.path / "diagnostics" / "metrics.json").read_text())["final_loss"]
        for a in (single, double)
    ]
    assert final[1] == pytest.approx(final[0], rel=1e-4)
    # written once, by rank 0; no partial or scratch directories left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]
