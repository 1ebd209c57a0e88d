"""Faults a user meets on the command line (issue 29): extreme ε, --epsilon without --dp, and a
one-query evaluation's plot."""

from __future__ import annotations

import shutil
import time

import pytest
from opacus.accountants import RDPAccountant
from pydantic import ValidationError

from synthq.config import EvalConfig
from synthq.errors import PrivacyError
from synthq.privacy import epsilon_for, noise_multiplier_for
from synthq.stages import evaluate, train_retriever
from tests.test_privacy_integrity import finetune, retriever_config


def test_an_unreachably_large_epsilon_is_refused_quickly():
    started = time.perf_counter()
    with pytest.raises(PrivacyError, match="beyond any meaningful guarantee.*--epsilon inf"):
        noise_multiplier_for(1e17, 1e-5, 0.05, 100)
    assert time.perf_counter() - started < 30  # Opacus' own search never returns here


def test_a_small_epsilon_is_met_from_below_and_a_tiny_one_refused():
    calibration = noise_multiplier_for(0.5, 1e-5, 0.01, 1)
    assert 0.495 <= calibration.epsilon <= 0.5  # relative tolerance, not Opacus' absolute 0.01
    independent = RDPAccountant()
    independent.history = [(calibration.noise_multiplier, 0.01, 1)]
    assert independent.get_epsilon(delta=1e-5) == pytest.approx(calibration.epsilon)
    # RDP cannot certify ε = 1e-6 at δ = 1e-5 with any noise: refused, never a negative ε written
    with pytest.raises(PrivacyError, match="cannot be reached"):
        noise_multiplier_for(1e-6, 1e-5, 0.05, 100)
    assert epsilon_for(1e5, 0.5, 1.0, 1).epsilon >= 0  # a conversion below 0 still proves (0, δ)


def test_finetune_with_an_extreme_epsilon_fails_before_training(tmp_path, tiny_beir, tiny_causal_dir):
    with pytest.raises(PrivacyError, match="beyond any meaningful guarantee"):
        finetune(tmp_path, tiny_beir, tiny_causal_dir, "gen", epsilon=1e17, max_steps=2)
    assert not (tmp_path / "gen").exists()


def test_epsilon_without_dp_is_refused(tmp_path, tiny_beir, tiny_encoder_dir):
    with pytest.raises(ValidationError, match="--epsilon needs --dp"):
        retriever_config(tmp_path / "r", tiny_beir, tiny_encoder_dir, epsilon=8)
    retriever_config(tmp_path / "r", tiny_beir, tiny_encoder_dir, epsilon="inf")  # says what it does


def test_eval_on_a_one_query_split_plots(tmp_path, tiny_beir, tiny_encoder_dir):
    data = tmp_path / "one"
    shutil.copytree(tiny_beir, data)
    lines = (data / "qrels" / "test.tsv").read_text().splitlines()
    (data / "qrels" / "test.tsv").write_text("\n".join(lines[:2]) + "\n")
    retriever = train_retriever.run(retriever_config(tmp_path / "ret", data, tiny_encoder_dir))
    config = EvalConfig(out=tmp_path / "ev", retrievers=[str(retriever.path)], datasets=[str(data)])
    result = evaluate.run(config)
    assert (result.path / "privacy_utility.png").stat().st_size > 1000


def test_a_stage_refuses_an_artifact_of_the_wrong_kind_before_work(tmp_path, tiny_beir, tiny_encoder_dir):
    from synthq.artifacts import ArtifactError

    retriever = train_retriever.run(retriever_config(tmp_path / "ret", tiny_beir, tiny_encoder_dir))
    with pytest.raises(ArtifactError, match="is a 'train-retriever' artifact, expected 'finetune-lm'"):
        finetune(tmp_path, tiny_beir, retriever.path, "gen", epsilon="inf", max_steps=1)
    assert not (tmp_path / "gen").exists()
    with pytest.raises(ArtifactError, match="expected 'generate'"):
        train_retriever.run(retriever_config(tmp_path / "r2", retriever.path, tiny_encoder_dir))


def test_an_output_inside_an_input_is_refused(tmp_path, tiny_beir, tiny_encoder_dir):
    from synthq.artifacts import ArtifactError

    data = tmp_path / "data"
    shutil.copytree(tiny_beir, data)
    with pytest.raises(ArtifactError, match="is inside an input of this command"):
        train_retriever.run(retriever_config(data / "retriever", data, tiny_encoder_dir))
    assert not (data / "retriever").exists()


@pytest.mark.parametrize("dp", [None, "sample", "group"])
def test_lengths_beyond_the_encoders_positions_are_clamped(tmp_path, tiny_beir, tiny_encoder_dir, dp, capsys):
    import json

    data = tmp_path / "long"
    shutil.copytree(tiny_beir, data)
    records = [json.loads(line) for line in (data / "corpus.jsonl").read_text().splitlines()]
    for record in records:
        record["text"] = " ".join([record["text"]] * 80)  # far beyond 512 tokens
    (data / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    options = {"max_doc_length": 2000} | ({"dp": dp, "epsilon": 8} if dp else {})
    artifact = train_retriever.run(retriever_config(tmp_path / "ret", data, tiny_encoder_dir, **options))
    assert artifact.config["max_doc_length"] == 2000  # the artifact records what was asked
    error = capsys.readouterr().err
    assert "beyond" in error and "using 512" in error
