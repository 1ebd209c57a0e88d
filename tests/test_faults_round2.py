"""Faults a user meets on the command line (issue 29): extreme ε and δ, --epsilon without --dp, a
one-query evaluation's plot, wrong artifact kinds, outputs inside inputs, lengths, what goes to
stdout, one error prefix, and the start-up of info / ledger."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import warnings

import pytest
from opacus.accountants import RDPAccountant
from pydantic import ValidationError

from synthq.config import EvalConfig
from synthq.data.beir_io import load_beir_dir
from synthq.privacy.guarantee import epsilon_for, noise_multiplier_for
from synthq.runtime.errors import PrivacyError
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
    from synthq.runtime.errors import ArtifactError

    retriever = train_retriever.run(retriever_config(tmp_path / "ret", tiny_beir, tiny_encoder_dir))
    with pytest.raises(ArtifactError, match="is a 'train-retriever' artifact, expected 'finetune-lm'"):
        finetune(tmp_path, tiny_beir, retriever.path, "gen", epsilon="inf", max_steps=1)
    assert not (tmp_path / "gen").exists()
    with pytest.raises(ArtifactError, match="expected 'generate'"):
        train_retriever.run(retriever_config(tmp_path / "r2", retriever.path, tiny_encoder_dir))


def test_an_output_inside_an_input_is_refused(tmp_path, tiny_beir, tiny_encoder_dir):
    from synthq.runtime.errors import ArtifactError

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


def test_delta_not_below_one_over_n_is_refused(tmp_path, tiny_beir, tiny_encoder_dir):
    units = len(load_beir_dir(tiny_beir).split_queries("train"))
    with pytest.raises(PrivacyError, match="not below 1/n"):
        train_retriever.run(
            retriever_config(
                tmp_path / "r", tiny_beir, tiny_encoder_dir, dp="group", epsilon=8, delta=1 / units
            )
        )
    assert not (tmp_path / "r").exists()


def test_the_calibration_prints_no_accountant_advice():
    """Opacus' "optimal order is the largest alpha" comes from the σ the search probes, not from
    the answer: it must not reach every DP run's log."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        noise_multiplier_for(8.0, 1e-5, 0.05, 8)
        noise_multiplier_for(0.5, 1e-5, 0.01, 1000, "prv")
    assert not [w for w in caught if "Optimal order" in str(w.message)]


def _synthq(*arguments: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "synthq", *arguments], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_results_go_to_stdout_and_everything_else_to_stderr(tmp_path, tiny_beir, tiny_encoder_dir):
    common = [
        "--data",
        str(tiny_beir),
        "--encoder",
        str(tiny_encoder_dir),
        "--batch-size",
        "4",
        "--max-steps",
        "1",
    ]
    trained = _synthq(
        "train-retriever", *common, "--dp", "group", "--epsilon", "8", "--out", str(tmp_path / "r")
    )
    assert trained.returncode == 0, trained.stderr
    assert trained.stdout.startswith("train-retriever written to") and "ε=8.00" in trained.stdout
    assert "written to" not in trained.stderr
    evaluated = _synthq(
        "eval", "--retriever", str(tmp_path / "r"), "--datasets", str(tiny_beir), "--out", str(tmp_path / "e")
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert "NDCG@10" in evaluated.stdout and "eval written to" in evaluated.stdout
    assert "NDCG@10" not in evaluated.stderr
    for command in (["info", str(tmp_path / "r")], ["ledger", str(tmp_path / "e")]):
        shown = _synthq(*command)
        assert shown.returncode == 0 and "ε" in shown.stdout and shown.stderr == "", shown.stderr
    # -q keeps the results
    quiet = _synthq("-q", "train-retriever", *common, "--out", str(tmp_path / "r2"))
    assert (
        quiet.stdout.startswith("train-retriever written to")
        and "WITHOUT differential privacy" in quiet.stderr
    )
    assert "elapsed=" not in quiet.stderr and "written to" not in quiet.stderr


def test_a_usage_error_has_one_prefix():
    wrong = _synthq("train-retriever", "--no-such-option", "1")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert (
        wrong.stderr.startswith("synthq: train-retriever: No such option")
        and "synthq: synthq" not in wrong.stderr
    )


def test_info_and_ledger_do_not_import_torch(tmp_path, tiny_beir, tiny_encoder_dir):
    """A guarantee is recomputed on every open; the accountant's answers are remembered (keyed,
    sealed), so from the second call on ``info`` and ``ledger`` need neither torch nor Opacus."""
    artifact = train_retriever.run(
        retriever_config(tmp_path / "r", tiny_beir, tiny_encoder_dir, dp="group", epsilon=8)
    )
    probe = (
        "import sys\nfrom synthq.cli import app\n"
        f"app(['{{}}', {str(artifact.path)!r}], standalone_mode=False)\n"
        "print('heavy:', sorted(m for m in ('torch', 'opacus', 'scipy') if m in sys.modules))"
    )
    for command in ("info", "ledger"):
        _synthq(command, str(artifact.path))  # the first call may compute
        shown = subprocess.run([sys.executable, "-c", probe.format(command)], capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        assert "heavy: []" in shown.stdout and "8.00" in shown.stdout


def test_an_edited_accountant_memo_is_recomputed(tmp_path):
    from synthq.privacy import keys
    from synthq.privacy import memo as accountant_memo

    calls = []

    def compute(*parameters):
        calls.append(parameters)
        return 3.25

    assert accountant_memo.remembered(compute, 1.0, 1e-5, 0.1, 10, "rdp") == 3.25
    assert accountant_memo.remembered(compute, 1.0, 1e-5, 0.1, 10, "rdp") == 3.25 and len(calls) == 1
    memo = keys.state_dir() / accountant_memo.MEMO_FILE
    entries = json.loads(memo.read_text())
    for entry in entries.values():
        entry["epsilon"] = 0.01  # an adversary lowering the answer without the key
    memo.write_text(json.dumps(entries))
    accountant_memo._loaded.clear()
    assert accountant_memo.remembered(compute, 1.0, 1e-5, 0.1, 10, "rdp") == 3.25 and len(calls) == 2


def test_a_full_disk_names_the_artifact_and_a_resume_keeps_only_checkpoints(tmp_path):
    """A library reports ENOSPC without a file name: the error names the artifact being written.
    The partial directory keeps its checkpoints for --resume; what the failed run had begun to
    write beside them (a cut-off model) is gone before the resumed run writes, so it cannot end up
    in the finished artifact."""
    import errno

    from synthq.artifacts import create_artifact, open_artifact, partial_dir
    from synthq.cli import _os_error_line

    out = tmp_path / "gen"
    with (
        pytest.raises(OSError) as failure,
        create_artifact(out, "generate", {"v": 1}, keep_partial_on_error=True) as w,
    ):
        (w.checkpoint_dir / "state.pt").write_bytes(b"whole checkpoint")
        (w.dir / "model.safetensors").write_bytes(b"cut o")
        raise OSError(errno.ENOSPC, "No space left on device")
    line = _os_error_line(failure.value)
    assert line.startswith(f"while writing {out}: No space left on device") and "free some space" in line
    assert (partial_dir(out) / "model.safetensors").exists()
    with create_artifact(out, "generate", {"v": 1}, resume=True, keep_partial_on_error=True) as writer:
        assert sorted(p.name for p in writer.dir.iterdir()) == ["checkpoints"]
        assert (writer.checkpoint_dir / "state.pt").read_bytes() == b"whole checkpoint"
        (writer.dir / "model.safetensors").write_bytes(b"the whole model")
        writer.public()
    assert set(open_artifact(out).manifest["files"]) == {"model.safetensors"}
