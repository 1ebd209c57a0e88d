"""The faults a new user met in the first hour, through the command line: each is one
line naming the path and saying only what is known, or a correct result."""

from __future__ import annotations

import shutil

import pytest

from synthq.privacy.guarantee import Guarantee
from tests.helpers import one_line, run_main, tiny_retriever_artifact


def test_a_foreign_seal_is_not_said_to_be_unedited(tmp_path, tiny_encoder_dir, capsys, monkeypatch):
    artifact = tiny_retriever_artifact(tmp_path / "ret", tiny_encoder_dir, Guarantee.public("a public model"))
    monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path / "another-installation"))
    status, shown = run_main(["info", str(artifact.path)], capsys, monkeypatch)
    assert status == 0
    assert "cannot check whether it was edited" in shown
    assert "was not edited" not in shown  # not known either way
    status, output = run_main(
        ["export", str(artifact.path), "--out", str(tmp_path / "rel")], capsys, monkeypatch
    )
    line = one_line(output)
    assert status == 2 and f"{artifact.path}: sealed under another key" in line
    assert "was not edited" not in line and "cannot check whether it was edited" in line
    assert not (tmp_path / "rel").exists()


@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_is_refused_plainly(out, tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["train-retriever", "--data", str(tiny_beir), "--encoder", str(tiny_encoder_dir), "--out", out]
    status, output = run_main(argv, capsys, monkeypatch)
    line = one_line(output)
    assert status == 2
    assert "--out: is empty" in line and "is an input" not in line
    assert list(tmp_path.iterdir()) == []


PIPELINE = """
name: mine
out: runs/mine
stages:
  - name: ret
    stage: train-retriever
    config: {data: mydata, encoder: ./encoders/tiny}
  - name: ev
    stage: eval
    config: {retrievers: ["@ret"], datasets: [mydata, embedded], untrained: [minilm-l6]}
  - name: zero
    stage: generate
    config: {generator: smollm2-135m, corpus: embedded}
  - name: lost
    stage: generate
    config: {generator: generators/own/mine, corpus: embedded}
"""


def test_a_pipeline_reports_inputs_that_are_not_there(
    tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch
):
    pipeline = tmp_path / "pipelines" / "mine.yaml"
    pipeline.parent.mkdir()
    pipeline.write_text(PIPELINE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    status, output = run_main(["run", str(pipeline), "--dry-run"], capsys, monkeypatch)
    assert status == 0, output
    missing = [line for line in output.splitlines() if line.startswith("missing input:")]
    assert missing == [
        f"missing input: stage 'ret' (train-retriever): data mydata does not exist (read from {elsewhere}) "
        "and no earlier stage writes it",
        f"missing input: stage 'ret' (train-retriever): encoder ./encoders/tiny does not exist (read from "
        f"{elsewhere}) and no earlier stage writes it",
        f"missing input: stage 'ev' (eval): datasets mydata does not exist (read from {elsewhere}) "
        "and no earlier stage writes it",
        f"missing input: stage 'lost' (generate): generator generators/own/mine does not exist (read from "
        f"{elsewhere}) and no earlier stage writes it",
    ]  # @ret is written by an earlier stage; embedded, minilm-l6 and smollm2-135m are names, not paths
    status, output = run_main(["run", str(pipeline)], capsys, monkeypatch)
    refusal = [line for line in output.splitlines() if line.startswith("synthq:")]
    assert status == 2 and len(refusal) == 1 and "Traceback" not in output
    assert "stage 'ret' (train-retriever): data mydata does not exist" in refusal[0]
    assert "(and 3 more; see --dry-run); nothing was run" in refusal[0]
    assert not (elsewhere / "runs").exists()
    # from the directory that holds them, nothing is missing
    shutil.copytree(tiny_beir, tmp_path / "mydata")
    shutil.copytree(tiny_encoder_dir, tmp_path / "encoders" / "tiny")
    (tmp_path / "generators" / "own" / "mine").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    status, output = run_main(["run", str(pipeline), "--dry-run"], capsys, monkeypatch)
    assert status == 0 and "missing input" not in output, output
    assert "1. ret (train-retriever): run" in output


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("finetune-lm", "--lr"),
        ("finetune-lm", "--epochs"),
        ("train-retriever", "--lr"),
        ("train-retriever", "--epochs"),
        ("train-retriever", "--clip-norm"),
    ],
)
def test_a_non_finite_rate_or_length_is_refused_before_any_work(
    command, option, tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch
):
    """Fault pass round 4: --lr inf wrote a model of NaN weights and ended normally; --epochs inf
    ended in a traceback. Each is one line naming the option, and nothing is written."""
    model = (
        ["--model", str(tiny_encoder_dir)]
        if command == "finetune-lm"
        else ["--encoder", str(tiny_encoder_dir)]
    )
    argv = [command, "--data", str(tiny_beir), *model, option, "inf", "--out", str(tmp_path / "out")]
    status, output = run_main(argv, capsys, monkeypatch)
    line = one_line(output)
    assert status == 2 and option.lstrip("-").replace("-", "_") in line.replace("-", "_"), line
    assert not (tmp_path / "out").exists()


def test_nothing_is_written_inside_an_artifact_and_a_statement_is_not_overwritten(
    tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch
):
    """A release exported into an artifact, or a stage's --out inside an unrelated artifact, would
    be deleted by a later --force of that artifact's stage: both are refused before any work; a
    statement written to an existing file needs --force."""
    artifact = tiny_retriever_artifact(tmp_path / "ret", tiny_encoder_dir, Guarantee.public("a public model"))
    inner = artifact.path / "sub"
    status, output = run_main(["export", str(artifact.path), "--out", str(inner)], capsys, monkeypatch)
    assert status == 2 and f"is inside the artifact {artifact.path}" in one_line(output)
    argv = ["train-retriever", "--data", str(tiny_beir), "--encoder", str(tiny_encoder_dir),
            "--max-steps", "1", "--out", str(inner / "ret")]  # fmt: skip
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 2 and f"is inside the artifact {artifact.path}" in one_line(output)
    assert not inner.exists()
    statement = tmp_path / "statement.md"
    statement.write_text("signed by the reviewer\n")
    argv = ["ledger", str(artifact.path), "--statement", "--out", str(statement)]
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 2 and "already exists; pass --force" in one_line(output)
    assert statement.read_text() == "signed by the reviewer\n"
    status, output = run_main([*argv, "--force"], capsys, monkeypatch)
    assert status == 0 and statement.read_text().startswith("#")


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ({"SYNTHQ_THREADS": "abc"}, "SYNTHQ_THREADS must be a positive integer, not 'abc'"),
        ({"SYNTHQ_THREADS": "0"}, "SYNTHQ_THREADS must be a positive integer, not '0'"),
        ({"SYNTHQ_PROGRESS_INTERVAL": "abc"}, "SYNTHQ_PROGRESS_INTERVAL must be a number of seconds ≥ 0"),
        ({"SYNTHQ_PROGRESS_INTERVAL": "-5"}, "SYNTHQ_PROGRESS_INTERVAL must be a number of seconds ≥ 0"),
    ],
)
def test_an_impossible_environment_setting_is_one_line(
    setting, expected, tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch
):
    """Fault pass round 4: SYNTHQ_THREADS=abc|0 and SYNTHQ_PROGRESS_INTERVAL=abc ended in
    tracebacks (a ValueError from int()/float()); each is one line naming the variable."""
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    argv = ["train-retriever", "--data", str(tiny_beir), "--encoder", str(tiny_encoder_dir),
            "--max-steps", "1", "--out", str(tmp_path / "out")]  # fmt: skip
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 2 and expected in one_line(output), output
    assert not (tmp_path / "out").exists()


def test_a_device_this_machine_lacks_is_one_line(tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch):
    """Fault pass round 4: --device mps on a build without MPS died in a tensor's move."""
    import torch

    if torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    argv = ["train-retriever", "--data", str(tiny_beir), "--encoder", str(tiny_encoder_dir),
            "--device", "mps", "--out", str(tmp_path / "out")]  # fmt: skip
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 2 and "'mps' requested but this torch build or machine has no MPS" in one_line(output)
    assert not (tmp_path / "out").exists()


def test_hard_negatives_beyond_the_corpus_are_refused_and_within_it_train(
    tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch
):
    """Fault pass round 4: --hard-negatives 100 on a corpus of a few dozen documents topped the
    list up with random documents while the manifest said 100 mined. Now refused before any
    training; a count the corpus holds trains (the stage path had no test of its own)."""
    base = ["train-retriever", "--data", str(tiny_beir), "--encoder", str(tiny_encoder_dir),
            "--max-steps", "1", "--batch-size", "2", "--device", "cpu"]  # fmt: skip
    status, output = run_main(
        [*base, "--hard-negatives", "1000", "--out", str(tmp_path / "many")], capsys, monkeypatch
    )
    line = [ln for ln in output.splitlines() if ln.startswith("synthq:")]
    assert status == 2 and len(line) == 1, output
    assert "--hard-negatives 1000 is more than the" in line[0] and "documents that can be" in line[0]
    assert not (tmp_path / "many").exists()
    status, output = run_main(
        [*base, "--hard-negatives", "2", "--out", str(tmp_path / "two")], capsys, monkeypatch
    )
    assert status == 0, output
    from synthq.artifacts.manifest import open_artifact

    assert open_artifact(tmp_path / "two").config["hard_negatives"] == 2


def test_quiet_hides_progress_not_the_eval_table(tmp_path, tiny_beir, tiny_encoder_dir, capsys, monkeypatch):
    """Fault pass round 4: `-q` hid the eval table from stdout, though the help says it hides
    progress and info lines only."""
    from synthq.cli.errors import main
    from synthq.runtime import console
    from tests.helpers import eval_argv

    argv = ["-q", *eval_argv(tmp_path, tiny_encoder_dir, tiny_beir, tmp_path / "ev")]
    monkeypatch.setattr("sys.argv", ["synthq", *argv])
    monkeypatch.setitem(console._state, "verbosity", console._state["verbosity"])  # -q must not leak
    capsys.readouterr()
    main()
    captured = capsys.readouterr()
    assert "| retriever | method | ε | NDCG@10 |" in captured.out, captured.out
