"""The finetune-lm stage end to end on tiny models: accounting, learning, resume, bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch
from opacus.accountants import RDPAccountant

from synthq.artifacts.manifest import open_artifact, partial_dir
from synthq.config.generator import FinetuneConfig, GenerateConfig
from synthq.models.generator import QueryGenerator
from synthq.runtime.errors import DataError, ModelResolutionError, PrivacyError
from synthq.stages import finetune_lm, generate
from tests import helpers


def diagnostics(artifact) -> dict:
    return json.loads((artifact.path / "diagnostics" / "metrics.json").read_text())


def config(tmp_path, beir, model, name="gen", **options) -> FinetuneConfig:
    defaults = dict(batch_size=8, epochs=4, physical_batch_size=4, lr=1e-2, max_source_length=48)
    return FinetuneConfig(data=str(beir), model=str(model), out=tmp_path / name, **{**defaults, **options})


@pytest.mark.parametrize("model_fixture", ["tiny_t5_dir", "tiny_causal_dir"])
def test_dp_run_reports_an_epsilon_an_independent_accountant_reproduces(
    tmp_path, tiny_beir, model_fixture, request
):
    model = request.getfixturevalue(model_fixture)
    artifact = finetune_lm.run(config(tmp_path, tiny_beir, model, epsilon=8.0))
    guarantee = artifact.privacy
    details = guarantee.details
    n = details["num_units"]
    assert n == 17 and guarantee.delta == pytest.approx(1 / (2 * n))
    assert details["sample_rate"] == pytest.approx(8 / 17)
    assert details["steps"] == math.ceil(4 * 17 / 8)
    accountant = RDPAccountant()
    accountant.history = [(details["noise_multiplier"], details["sample_rate"], details["steps"])]
    assert guarantee.epsilon == pytest.approx(accountant.get_epsilon(delta=guarantee.delta))
    assert guarantee.epsilon <= 8.0 and guarantee.unit == "query"
    # its release keeps the keyed ids, texts and (id, text) pairs of its queries, as the ledger compares them
    assert set(artifact.releases[0]["units"]["links"]) == {"query", "text", "pair"}
    assert details["per_sample_clipping"].startswith("ghost clipping")  # auto picks ghost
    # a Hugging Face directory any tool loads, and the training curve
    generator = QueryGenerator.load(artifact.path)
    assert generator.kind == ("seq2seq" if model_fixture == "tiny_t5_dir" else "causal")
    lines = (artifact.path / "diagnostics" / "training.jsonl").read_text().splitlines()
    assert len(lines) == details["steps"]
    assert "diagnostics/training.jsonl" in artifact.manifest["private_files"]


def test_non_private_run_learns_and_heavy_noise_does_not(tmp_path, tiny_beir, tiny_causal_dir):
    clean = finetune_lm.run(config(tmp_path, tiny_beir, tiny_causal_dir, "clean", epsilon="inf", epochs=20))
    assert math.isinf(clean.privacy.epsilon) and clean.privacy.mechanism == "none"
    assert diagnostics(clean)["final_loss"] < 0.5 * diagnostics(clean)["first_loss"]
    noisy = finetune_lm.run(
        config(tmp_path, tiny_beir, tiny_causal_dir, "noisy", epsilon=0.5, epochs=20, clip_norm=0.01)
    )
    assert noisy.privacy.epsilon <= 0.5
    assert diagnostics(noisy)["final_loss"] > 0.8 * diagnostics(noisy)["first_loss"]


def test_resume_after_interruption_gives_identical_accounting_and_weights(
    tmp_path, tiny_beir, tiny_causal_dir, monkeypatch
):
    options = dict(epsilon=8.0, epochs=6, checkpoint_every=3, seed=0)
    reference = finetune_lm.run(config(tmp_path, tiny_beir, tiny_causal_dir, "reference", **options))

    original_step = finetune_lm.GeneratorTraining.step
    calls = {"n": 0}

    def interrupted(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 8:
            raise KeyboardInterrupt
        return original_step(self, *args, **kwargs)

    monkeypatch.setattr(finetune_lm.GeneratorTraining, "step", interrupted)
    resumable = config(tmp_path, tiny_beir, tiny_causal_dir, "resumed", **options)
    with pytest.raises(KeyboardInterrupt):
        finetune_lm.run(resumable)
    assert not resumable.out.exists()  # nothing finished-looking
    assert (partial_dir(resumable.out) / "checkpoints" / "state.pt").is_file()
    monkeypatch.setattr(finetune_lm.GeneratorTraining, "step", original_step)
    resumed = finetune_lm.run(resumable.model_copy(update={"resume": True}))
    assert resumed.privacy.epsilon == reference.privacy.epsilon
    assert helpers.comparable(resumed.privacy) == helpers.comparable(reference.privacy)
    first = QueryGenerator.load(reference.path).model.state_dict()
    second = QueryGenerator.load(resumed.path).model.state_dict()
    for name, value in first.items():
        torch.testing.assert_close(second[name], value)


def test_up_to_date_run_is_skipped(tmp_path, tiny_beir, tiny_causal_dir):
    first = finetune_lm.run(config(tmp_path, tiny_beir, tiny_causal_dir, max_steps=1, epsilon="inf"))
    again = finetune_lm.run(config(tmp_path, tiny_beir, tiny_causal_dir, max_steps=1, epsilon="inf"))
    assert again.manifest == first.manifest and again.manifest_hash == first.manifest_hash
    assert open_artifact(first.path, stage="finetune-lm")


def test_bad_input(tmp_path, tiny_beir, tiny_causal_dir):
    with pytest.raises(ModelResolutionError):
        finetune_lm.run(config(tmp_path, tiny_beir, tmp_path / "no-such-model"))
    with pytest.raises(ValueError, match="greater than 0"):  # refused by the config, before any work
        config(tmp_path, tiny_beir, tiny_causal_dir, epsilon=0)
    with pytest.raises(PrivacyError, match="larger than the 17 privacy units"):
        finetune_lm.run(config(tmp_path, tiny_beir, tiny_causal_dir, batch_size=64))
    with pytest.raises(DataError, match="no qrels for split 'validation'"):
        finetune_lm.run(config(tmp_path, tiny_beir, tiny_causal_dir, split="validation"))
    empty = tmp_path / "empty"
    (empty / "qrels").mkdir(parents=True)
    (empty / "corpus.jsonl").write_text("")
    (empty / "queries.jsonl").write_text("")
    (empty / "qrels" / "train.tsv").write_text("")
    with pytest.raises(DataError, match="empty"):
        finetune_lm.run(config(tmp_path, empty, tiny_causal_dir))


def test_a_dp_run_records_how_far_the_adapters_moved_and_the_public_held_out_loss(
    tmp_path, tiny_beir, tiny_causal_dir
):
    from synthq.dp.lm.learning_check import held_out_loss

    data = helpers.private_copy(tmp_path, tiny_beir, public=("test",))
    artifact = finetune_lm.run(config(tmp_path, data, tiny_causal_dir, epsilon=8, lora_rank=2, epochs=2))
    moved = artifact.metrics["weights_moved"]
    assert moved["what"] == "LoRA adapters" and 0 < moved["tensors_changed"] <= moved["tensors"]
    loss = artifact.metrics["public_held_out_loss"]
    assert loss["split"] == "test" and loss["pairs"] > 0  # the declared-public split, never train
    # "after" is the saved generator's loss on those public pairs, computed independently here
    pairs = finetune_lm.training_pairs(finetune_lm.load_source(str(data), splits=["test"]), "test")
    pairs = pairs[: loss["pairs"]]
    generator = QueryGenerator.load(artifact.path)
    again = held_out_loss(generator, [p.document for p in pairs], [p.query for p in pairs], 32)
    assert again == pytest.approx(loss["after"], rel=1e-3) and loss["after"] != loss["before"]
    # a dataset that declares nothing public: the loss is not measured, and the metric says why
    private = helpers.private_copy(tmp_path, tiny_beir, "all-private", public=())
    options = dict(epsilon=8, lora_rank=2, epochs=1)
    quiet = finetune_lm.run(config(tmp_path, private, tiny_causal_dir, "quiet", **options))
    assert quiet.metrics["public_held_out_loss"].startswith("not measured")


def test_a_run_whose_adapters_never_move_is_refused_in_one_line(
    tmp_path, tiny_beir, tiny_causal_dir, monkeypatch
):
    """The silent failure users met with DP + LoRA: the optimizer steps, but not the adapters
    (here it holds other tensors). No generator is written."""
    from synthq.dp.lm.learning_check import NotLearningError

    elsewhere = torch.nn.Parameter(torch.zeros(1))
    monkeypatch.setattr(finetune_lm, "make_optimizer", lambda *_: torch.optim.SGD([elsewhere], lr=0.1))
    out = config(tmp_path, tiny_beir, tiny_causal_dir, epsilon=8, lora_rank=2, epochs=1)
    refusal = r"none of the \d+ trainable tensors \(LoRA adapters\) changed"
    with pytest.raises(NotLearningError, match=refusal):
        finetune_lm.run(out)
    assert not (out.out / "manifest.json").exists()


def test_adam_bc_removes_the_plans_gradient_noise_variance(tmp_path, tiny_beir, tiny_causal_dir, monkeypatch):
    """--optimizer adam-bc gets Φ = (σΔ/B)² from the plan's public values (recomputed here from
    the sealed guarantee), and 0 without DP; the guarantee names the optimizer and is unchanged."""
    from synthq.runtime import optim

    seen = []

    def spy(name, parameters, lr, weight_decay=0.0, noise_variance=0.0):
        seen.append((name, noise_variance))
        return optim.make_optimizer(name, parameters, lr, weight_decay, noise_variance)

    monkeypatch.setattr(finetune_lm, "make_optimizer", spy)
    dp = finetune_lm.run(config(tmp_path, tiny_beir, tiny_causal_dir, "bc", epsilon=8, optimizer="adam-bc"))
    details = dp.privacy.details
    phi = (details["noise_multiplier"] * details["sensitivity"] / details["expected_batch_size"]) ** 2
    assert seen == [("adam-bc", pytest.approx(phi))] and phi > 0
    assert dp.privacy.mechanism == "dp-adam-bc" and dp.privacy.epsilon <= 8.0
    finetune_lm.run(
        config(tmp_path, tiny_beir, tiny_causal_dir, "bc-inf", epsilon="inf", optimizer="adam-bc")
    )
    assert seen[-1] == ("adam-bc", 0.0)


def test_max_steps_zero_is_the_warm_started_generator_that_read_nothing_private(
    tmp_path, tiny_beir, tiny_causal_dir
):
    """--max-steps 0 --warm-start: the ε = 0 control. It trains the public phase only, reads
    nothing of --data (a path that does not exist works), records no release, and its generator
    is the warm start a DP run of the same seed begins from; without --warm-start it is refused."""
    control = finetune_lm.run(
        config(tmp_path, tmp_path / "absent", tiny_causal_dir, "control", warm_start=f"{tiny_beir}:test",
               warm_start_epochs=5, max_steps=0, epsilon=8, seed=0)
    )  # fmt: skip
    assert control.privacy.epsilon == 0 and control.releases == []
    assert control.metrics["steps"] == 0 and control.metrics["warm_start_steps"] >= 1
    assert [i.get("role") for i in control.inputs if i.get("kind") != "model"] == ["--warm-start"]
    assert any("--warm-start pairs" in a for a in control.privacy.assumptions)
    assert QueryGenerator.load(control.path).kind == "causal"
    written = generate.run(
        GenerateConfig(generator=control.path, corpus=str(tiny_beir), out=tmp_path / "syn")
    )
    assert written.privacy.epsilon == 0 and written.releases == [] and written.metrics["queries"] == 12
    from synthq.reporting.labels import _synthetic_origin

    label, _, _ = _synthetic_origin(str(written.path))
    assert label == f"{tiny_causal_dir.name}, warm start {tiny_beir}:test only"  # not "per user"
    zero = GenerateConfig(generator=tiny_causal_dir, corpus=str(tiny_beir), out=tmp_path / "zero")
    public = generate.run(zero)
    assert _synthetic_origin(str(public.path))[0] == f"public {tiny_causal_dir.name}, zero-shot"
    assert any("--warm-start pairs" in a for a in written.privacy.assumptions)
    with pytest.raises(ValueError, match="only the public control of --warm-start"):
        config(tmp_path, tiny_beir, tiny_causal_dir, "nothing", max_steps=0)


def test_a_public_warm_start_trains_before_dp_costs_no_eps_and_is_named(tmp_path, tiny_beir, tiny_causal_dir):
    """--warm-start SOURCE:SPLIT trains on the public pairs without DP first: the loss on them
    falls, the DP plan and ε are those of the same run without it, the input is recorded with
    its role and the guarantee names it; a private split is refused before any work."""
    base = dict(epsilon=8, epochs=1, seed=0)
    plain = finetune_lm.run(config(tmp_path, tiny_beir, tiny_causal_dir, "plain", **base))
    warm = finetune_lm.run(
        config(tmp_path, tiny_beir, tiny_causal_dir, "warm", warm_start=f"{tiny_beir}:test",
               warm_start_epochs=20, **base)
    )  # fmt: skip
    assert warm.metrics["warm_start_last_loss"] < 0.85 * warm.metrics["warm_start_first_loss"]
    assert warm.metrics["warm_start_steps"] == math.ceil(20 * len(helpers.TEST_QUERIES) / 16)
    assert warm.privacy.epsilon == plain.privacy.epsilon
    assert warm.privacy.details["noise_multiplier"] == plain.privacy.details["noise_multiplier"]
    assert any(i.get("role") == "--warm-start" and i["split"] == "test" for i in warm.inputs)
    assert any("--warm-start pairs" in a and "public" in a for a in warm.privacy.assumptions)
    with pytest.raises(PrivacyError, match="not declared public"):
        finetune_lm.run(
            config(tmp_path, tiny_beir, tiny_causal_dir, "leak", warm_start=f"{tiny_beir}:train", **base)
        )
    assert not (tmp_path / "leak").exists()


def test_batch_size_auto_trains_at_the_batch_it_prints_and_the_manifest_records(
    tmp_path, tiny_beir, tiny_causal_dir, capsys
):
    """--batch-size auto: the stage trains at the batch choose_batch_size picks for n = 17 (what
    the plan's q and steps say), prints why, records it in the manifest's config, and keeps
    "auto" in the fingerprint (the same command is up to date); refused without a DP budget."""
    from synthq.dp.batch_choice import choose_batch_size

    artifact = finetune_lm.run(
        config(tmp_path, tiny_beir, tiny_causal_dir, "auto", epsilon=8.0, batch_size="auto")
    )
    details = artifact.privacy.details
    expected = choose_batch_size(17, 4, None, 8.0, 1 / 34)
    assert details["expected_batch_size"] == expected.batch_size == artifact.manifest["config"]["batch_size"]
    assert details["sample_rate"] == pytest.approx(expected.batch_size / 17)
    assert details["steps"] == expected.chosen.steps
    assert "--batch-size auto: B = " in capsys.readouterr().err
    again = finetune_lm.run(
        config(tmp_path, tiny_beir, tiny_causal_dir, "auto", epsilon=8.0, batch_size="auto")
    )
    assert again.manifest_hash == artifact.manifest_hash  # up to date: nothing retrained
    with pytest.raises(ValueError, match="--batch-size auto chooses the batch for a DP budget"):
        config(tmp_path, tiny_beir, tiny_causal_dir, "auto-inf", epsilon="inf", batch_size="auto")


def test_lora_targets_train_only_the_named_layers_and_the_saved_model_differs_there_only(
    tmp_path, tiny_beir, tiny_causal_dir, monkeypatch
):
    """A DP run with --lora-targets q_proj,v_proj: the shipped (merged) generator equals its base
    everywhere but in the attention query and value projections, which moved; the config records
    the targets; a target the model lacks is refused before any training."""
    from synthq.runtime.errors import SettingError

    out = config(tmp_path, tiny_beir, tiny_causal_dir, epsilon=8, lora_rank=2, lora_targets="q_proj,v_proj")
    artifact = finetune_lm.run(out)
    assert artifact.config["lora_targets"] == "q_proj,v_proj"
    moved = artifact.metrics["weights_moved"]
    assert moved["tensors"] == 2 * 2 * 2  # 2 layers × (q, v) × (A, B)
    base = QueryGenerator.load(tiny_causal_dir).model.state_dict()
    trained = QueryGenerator.load(artifact.path).model.state_dict()
    changed = {name for name in base if not torch.equal(base[name], trained[name])}
    assert changed and all(name.endswith(("q_proj.weight", "v_proj.weight")) for name in changed)
    # a bad name is refused from the model's config before the data is read or a directory made
    monkeypatch.setattr(finetune_lm, "load_source", lambda *_a, **_k: pytest.fail("read the data"))
    monkeypatch.setattr(finetune_lm, "_resolve_sources", lambda *_a, **_k: pytest.fail("resolved the data"))
    bad = config(tmp_path, tiny_beir, tiny_causal_dir, "bad", epsilon=8, lora_rank=2, lora_targets="wq")
    with pytest.raises(SettingError, match="no linear layer named wq"):
        finetune_lm.run(bad)
    assert not bad.out.exists() and not partial_dir(bad.out).exists()
    with pytest.raises(ValueError, match="lora_targets"):
        FinetuneConfig(
            data=str(tiny_beir), model=str(tiny_causal_dir), out=tmp_path / "x", lora_targets="q_proj;rm"
        )
    # one spelling per set of layers; targets without LoRA (every weight trained) are refused
    same = dict(data=str(tiny_beir), model=str(tiny_causal_dir), out=tmp_path / "x", lora_rank=2)
    assert FinetuneConfig(**same, lora_targets="v_proj,q_proj,v_proj").lora_targets == "q_proj,v_proj"
    with pytest.raises(ValueError, match="needs --lora-rank > 0"):
        FinetuneConfig(**{**same, "lora_rank": 0}, lora_targets="q_proj")
