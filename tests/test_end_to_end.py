"""A miniature pipeline through every stage with tiny models: lineage and the privacy ledger of
every artifact, skipping, --force, and failing before training on a bad reference."""

from __future__ import annotations

import math

import pytest

from synthq.artifacts.manifest import open_artifact
from synthq.pipeline.plan import plan_pipeline
from synthq.pipeline.run import run_plan
from synthq.runtime.errors import SynthqError

PIPELINE = """
# synthq run mini.yaml
name: mini
out: {out}
defaults:
  finetune-lm: {{data: "{beir}", model: "{generator}", batch_size: 8, epochs: 6, physical_batch_size: 8,
                 lr: 0.01, max_source_length: 48}}
  generate: {{corpus: "{beir}", max_new_tokens: 8, batch_size: 6}}
  train-retriever: {{encoder: "{encoder}", batch_size: 6, epochs: 1, lr: 0.001, max_doc_length: 48}}
stages:
  - name: gen-eps{{eps}}
    stage: finetune-lm
    sweep: {{eps: [inf, 4]}}
    config: {{epsilon: "{{eps}}"}}
  - name: syn-eps{{eps}}
    stage: generate
    sweep: {{eps: [inf, 4]}}
    config: {{generator: "@gen-eps{{eps}}"}}
  - name: ret-original
    stage: train-retriever
    config: {{data: "{beir}"}}
  - name: ret-syn-eps{{eps}}
    stage: train-retriever
    sweep: {{eps: [inf, 4]}}
    config: {{data: "@syn-eps{{eps}}"}}
  - name: ret-dp-group-eps3
    stage: train-retriever
    config: {{data: "{beir}", dp: group, epsilon: 3, group_size: 3}}
  - name: eval
    stage: eval
    config: {{retrievers: ["@ret-*"], datasets: ["{beir}"]}}
  - name: sim-eps4
    stage: similarity
    config: {{synthetic: "@syn-eps4", original: "{beir}", min_samples: 5, mauve_seeds: 2}}
  - name: report
    stage: report
    config: {{evals: ["@eval"], similarity: ["@sim-eps4"]}}
"""


@pytest.mark.slow
def test_miniature_pipeline(tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir):
    path = tmp_path / "mini.yaml"
    out = tmp_path / "runs"
    path.write_text(
        PIPELINE.format(out=out, beir=tiny_beir, generator=tiny_causal_dir, encoder=tiny_encoder_dir)
    )
    results = run_plan(plan_pipeline(path))
    art = {name: open_artifact(p) for name, p in results.items()}

    # finetune: its own accountant's ε; ε = ∞ without DP
    assert math.isinf(art["gen-epsinf"].privacy.epsilon)
    assert 0 < art["gen-eps4"].privacy.epsilon <= 4
    # generate inherits by post-processing, with lineage to the generator
    for eps in ("inf", "4"):
        generator, synthetic = art[f"gen-eps{eps}"], art[f"syn-eps{eps}"]
        assert synthetic.privacy.epsilon == generator.privacy.epsilon
        assert synthetic.inputs[0]["sha256"] == generator.manifest_hash
        retriever = art[f"ret-syn-eps{eps}"]
        assert retriever.privacy.epsilon == generator.privacy.epsilon
        assert retriever.inputs[0]["sha256"] == synthetic.manifest_hash
    # non-private on the originals is ∞; direct DP has its own accounting
    assert math.isinf(art["ret-original"].privacy.epsilon)
    assert 0 < art["ret-dp-group-eps3"].privacy.epsilon <= 3
    assert art["ret-dp-group-eps3"].privacy.details["sensitivity"] == 2.0
    # the table shows every retriever with its ε
    table = (art["eval"].path / "results.md").read_text()
    for name in ("ret-original", "ret-syn-eps4", "ret-dp-group-eps3", "BM25"):
        assert f"| {name} |" in table
    assert "| ret-syn-eps4 | synthetic" in table and "direct DP (group)" in table
    assert math.isinf(art["sim-eps4"].privacy.epsilon)  # similarity reads the private queries
    report = (art["report"].path / "README.md").read_text()
    assert "BLEU" in report and "privacy_utility.png" in report

    # everything is up to date on a rerun; --force redoes one stage and what depends on it
    plan = plan_pipeline(path)
    assert all(stage.up_to_date for stage in plan.stages)
    forced = plan_pipeline(path, force=["syn-eps4"])
    stale = [s.name for s in forced.stages if not s.up_to_date]
    assert stale == ["syn-eps4", "ret-syn-eps4", "eval", "sim-eps4", "report"]


def test_bad_reference_fails_before_any_training(tmp_path, tiny_beir, tiny_causal_dir, tiny_encoder_dir):
    text = PIPELINE.format(
        out=tmp_path / "runs", beir=tiny_beir, generator=tiny_causal_dir, encoder=tiny_encoder_dir
    )
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace('"@syn-eps4", original', '"@syn-eps99", original'))
    with pytest.raises(SynthqError, match="names no earlier stage"):
        plan_pipeline(path)
    assert not (tmp_path / "runs").exists()
