"""synthq canary-audit on a tiny causal generator: memorisation is detected without DP and not
with heavy noise; canary construction and bad input."""

from __future__ import annotations

import json
import math

import pytest

from synthq.audit.canaries import SHAPES, make_canaries
from synthq.config import CanaryAuditConfig
from synthq.data import load_beir_dir
from synthq.errors import SynthqError
from synthq.stages import canary_audit


def test_canaries_have_secret_on_the_query_side(tiny_beir):
    dataset = load_beir_dir(tiny_beir)
    canaries = make_canaries(dataset, "train", list(SHAPES), 2, [3], references=15, seed=0)
    assert len(canaries) == 3 * 2 * 2  # shapes × per_shape × (one repetition count + held out)
    for canary in canaries:
        assert canary.query.endswith(canary.secret) and canary.secret not in canary.document
        assert len(canary.secret) == 10 and canary.secret.isdigit()
        assert len(set(canary.reference_secrets)) == 15 and canary.secret not in canary.reference_secrets
    real = [c for c in canaries if c.shape == "real-document"]
    assert all(c.query_prefix in dataset.queries.values() for c in real)
    assert make_canaries(dataset, "train", list(SHAPES), 2, [3], 15, seed=0)[0].secret == canaries[0].secret
    with pytest.raises(SynthqError, match="unknown canary shape"):
        make_canaries(dataset, "train", ["shouting"], 1, [1], 15, 0)


def test_repetitions_beyond_the_data_are_refused(tmp_path, tiny_beir, tiny_causal_dir):
    config = CanaryAuditConfig(
        data=str(tiny_beir),
        model=str(tiny_causal_dir),
        out=tmp_path / "a",
        repetitions=[100],
        epsilons=[math.inf],
    )
    with pytest.raises(SynthqError, match="canaries must not outnumber the data"):
        canary_audit.run(config)


@pytest.mark.slow
def test_audit_detects_memorisation_without_dp_and_not_with_heavy_noise(tmp_path, tiny_beir, tiny_causal_dir):
    config = CanaryAuditConfig(
        data=str(tiny_beir),
        model=str(tiny_causal_dir),
        out=tmp_path / "audit",
        epsilons=[math.inf, 0.5],
        repetitions=[12],
        shapes=["random-query"],
        canaries_per_shape=1,
        references=30,
        leak_samples=8,
        max_new_tokens=14,
        finetune={"batch_size": 8, "epochs": 40, "lr": 0.02, "physical_batch_size": 8, "clip_norm": 0.05},
    )
    artifact = canary_audit.run(config)
    summary = json.loads((artifact.path / "audit.json").read_text())["summary"]
    row = {(r["epsilon"], r["repetitions"], r["shape"]): r for r in summary}
    non_private = row[("∞", 12, "all")]
    private = (
        row[("0.50", 12, "all")]
        if ("0.50", 12, "all") in row
        else row[(next(k for k in row if k[0] != "∞")[0], 12, "all")]
    )
    assert non_private["mean_rank"] == 1 and non_private["leaked"] == 1.0
    assert private["mean_rank"] > 1 and private["leaked"] == 0.0
    assert non_private["exposure_extrapolated"] > private["exposure_extrapolated"]
    assert math.isinf(artifact.privacy.epsilon)  # the audit includes a non-private generator
    assert (artifact.path / "audit.md").read_text().count("|") > 20
    assert (artifact.path / "exposure.png").stat().st_size > 1000
    phases = artifact.timings
    assert {"train_seconds[eps=∞]", "score_seconds[eps=∞]", "leak_sampling_seconds[eps=∞]"} <= set(phases)
