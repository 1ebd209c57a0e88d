"""Mistakes through the command line: one line with the right exit status, nothing deleted and
nothing written; wrong artifact kinds, outputs inside inputs, bad options, pipelines and warnings."""

from __future__ import annotations

import errno
import re
import shutil
import warnings

import pytest

from synthq.artifacts import create as artifact_create
from synthq.artifacts.manifest import partial_dir
from synthq.stages import train_retriever
from tests.helpers import _synthq, eval_argv, finetune, one_line, retriever_config, run_main

BAD_OPTIONS = [
    (["train-retriever", "--data", "embedded", "--dp", "batch", "--clip-norm=-1"], "--clip-norm"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--clip-norm", "0"], "--clip-norm"),
    (["generate", "--generator", "g", "--top-p", "1.5"], "--top-p"),
    (["generate", "--generator", "g", "--top-p", "0"], "--top-p"),
    (["generate", "--generator", "g", "--temperature", "0"], "--temperature"),
    (["generate", "--generator", "g", "--batch-size", "0"], "--generation-batch-size"),
    (["generate", "--generator", "g", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "--generator", "g", "--shard", "3/2"], "--shard"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--max-steps", "0"], "--max-steps"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--epochs", "0"], "--epochs"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--lora-rank", "-1"], "--lora-rank"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--epsilon", "abc"], "--epsilon"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--epsilon", "0"], "--epsilon"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--delta", "1"], "--delta"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--accountant", "foo"], "--accountant"),
    (["finetune-lm", "--data", "embedded", "--model", "m", "--optimizer", "foo"], "--optimizer"),
    (["train-retriever", "--data", "embedded", "--group-size", "0"], "--group-size"),
    (["train-retriever", "--data", "embedded", "--dp", "foo"], "--dp"),
    (["canary-audit", "--data", "embedded", "--model", "m", "--epsilons", "8,-1"], "--epsilons"),
    (["canary-audit", "--data", "embedded", "--model", "m", "--finetune", "lora_rnk=4"], "lora_rnk"),
    (["canary-audit", "--data", "embedded", "--model", "m", "--finetune", "clip_norm=-1"], "clip_norm"),
    (["eval", "--device", "foo"], "--device"),
    (["eval", "--top-k", "5"], "--top-k"),
    (["eval", "--bogus"], "--bogus"),
]


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


def test_a_usage_error_has_one_prefix():
    wrong = _synthq("train-retriever", "--no-such-option", "1")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert (
        wrong.stderr.startswith("synthq: train-retriever: No such option")
        and "synthq: synthq" not in wrong.stderr
    )


@pytest.mark.parametrize(
    ("argv", "option"), BAD_OPTIONS, ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_bad_option_values_are_one_line_errors(argv, option, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, output = run_main([*argv, "--out", str(tmp_path / "out")], capsys, monkeypatch)
    assert status == 2
    line = one_line(output)
    assert line.startswith("synthq") and option in line
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a partial directory


def test_cuda_on_a_cpu_build(tmp_path, capsys, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    status, output = run_main(["eval", "--device", "cuda", "--out", str(tmp_path / "o")], capsys, monkeypatch)
    assert status == 2 and "--device" in one_line(output) and "no CUDA" in output


def test_missing_and_unknown_are_one_line(tmp_path, capsys, monkeypatch):
    status, output = run_main(["finetune-lm", "--data", "x"], capsys, monkeypatch)
    assert status == 2 and "--out: required" in one_line(output) and "--model: required" in output
    status, output = run_main(["nonsense"], capsys, monkeypatch)
    assert status == 2 and "No such command" in one_line(output)


@pytest.mark.parametrize(
    ("error", "status", "words"),
    [
        (KeyboardInterrupt(), 130, "interrupted; nothing was written"),
        (
            OSError(errno.ENOSPC, "No space left on device", "/d/out"),
            1,
            "/d/out: No space left on device; free",
        ),
        (
            PermissionError(errno.EACCES, "Permission denied", "/ro/out"),
            1,
            "/ro/out: Permission denied; choose",
        ),
        (OSError(errno.EROFS, "Read-only file system", "/ro"), 1, "read-only"),
    ],
)
def test_interrupt_and_file_system_errors(
    error, status, words, tmp_path, tiny_encoder_dir, tiny_beir, capsys, monkeypatch
):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(artifact_create, "_finish", fail)
    out = tmp_path / "ev"
    code, output = run_main(
        ["-q", *eval_argv(tmp_path, tiny_encoder_dir, tiny_beir, out)], capsys, monkeypatch
    )
    assert code == status
    assert words in one_line(output)
    assert not out.exists() and not partial_dir(out).exists()


def test_quiet_still_prints_errors(tmp_path, capsys, monkeypatch):
    argv = ["-q", "eval", "--retriever", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 2 and "no such artifact directory" in one_line(output)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("stages:\n  - {name: ../../escape8, stage: eval}", "not a valid name"),
        ("stages:\n  - {name: 'a/b', stage: eval}", "not a valid name"),
        ("outt: x\nstages:\n  - {name: a, stage: eval}", "unknown key.*outt"),
        ("stages:\n  - {name: a, stage: eval, expect_secnds: 3}", "unknown key.*expect_secnds"),
        ("stages:\n  - {name: a, stage: eval, config: {datasetz: [x]}}", "datasetz: unknown option"),
        ("defaults: {evall: {}}\nstages:\n  - {name: a, stage: eval}", "unknown stage 'evall'"),
        (
            "stages:\n  - {name: a, stage: eval}\n"
            "expected:\n  - {stage: b, metric: x, value: 1, tolerance: 0}",
            "'b' is not a stage",
        ),
        (
            "stages:\n  - {name: a, stage: eval}\nexpected:\n  - {stage: a, metric: x, value: 1}",
            "needs a tolerance",
        ),
    ],
)
def test_bad_pipelines_are_one_line_errors(text, message, tmp_path, capsys, monkeypatch):
    path = tmp_path / "p.yaml"
    path.write_text(f"out: {tmp_path / 'runs'}\n{text}\n")
    status, output = run_main(["run", str(path), "--dry-run"], capsys, monkeypatch)
    assert status == 2 and re.search(message, one_line(output))
    assert not (tmp_path / "runs").exists() and not (tmp_path.parent / "escape8").exists()


def test_library_warnings_are_one_synthq_line(capsys, monkeypatch):
    from synthq import search

    def noisy(*args, **kwargs):
        warnings.warn("`resume_download` is deprecated\nand more text", FutureWarning, stacklevel=1)
        warnings.warn("a library has\nsomething to say", UserWarning, stacklevel=1)
        return [[]]

    monkeypatch.setattr(search, "search", noisy)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        status, output = run_main(["search", "--retriever", "x", "q"], capsys, monkeypatch)
    assert status == 0
    assert "resume_download" not in output  # deprecations only with -v
    assert one_line(output.replace("q\n", "")) == "warning: a library has (UserWarning)"


def test_a_state_or_cache_directory_that_cannot_be_written_names_its_variable(tmp_path, monkeypatch):
    """``synthq key`` has no --out: a read-only SYNTHQ_STATE must not be told to choose one."""
    from synthq.cli.errors import _os_error_line

    monkeypatch.setenv("SYNTHQ_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("SYNTHQ_CACHE", str(tmp_path / "cache"))
    line = _os_error_line(PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "state")))
    assert "point SYNTHQ_STATE at a writable directory" in line and "--out" not in line
    line = _os_error_line(
        OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "cache" / "e" / "x"))
    )
    assert "point SYNTHQ_CACHE at a writable directory with space" in line
    line = _os_error_line(PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "out")))
    assert "choose a writable --out" in line


def test_quiet_and_verbose_work_after_the_command(tiny_beir, capsys, monkeypatch):
    from synthq.cli.errors import global_flags_first

    assert global_flags_first(["eval", "--out", "e", "-q"]) == ["-q", "eval", "--out", "e"]
    assert global_flags_first(["-v", "key", "--", "-q"]) == ["-v", "key", "--", "-q"]
    status, output = run_main(["data", "info", str(tiny_beir), "-q"], capsys, monkeypatch)
    assert status == 0 and "No such option" not in output


def test_a_source_and_split_in_a_message_is_not_read_as_an_emoji(capsys):
    """Issue #74: rich turned ``embedded:train:`` (a misspelt --warm-start) into 'embedded🚋'."""
    from synthq.cli.errors import _fail
    from synthq.runtime.console import warn

    with pytest.raises(SystemExit):
        _fail("--warm-start embedded:train:: split 'train:' not found", 2)
    warn("pairs of embedded:test: read")
    err = capsys.readouterr().err
    assert "embedded:train::" in err and "embedded:test: read" in err
