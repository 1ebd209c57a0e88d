"""Where the command line writes: results on stdout, everything else on stderr, plain progress lines
when not a terminal, and inspection commands that start without torch."""

from __future__ import annotations

import subprocess
import sys

from synthq.stages import train_retriever
from tests.helpers import _synthq, retriever_config


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


def test_info_and_ledger_do_not_import_torch(tmp_path, tiny_beir, tiny_encoder_dir):
    """A guarantee is recomputed on every open; the accountant's answers are remembered (keyed,
    sealed), so from the second call on ``info`` and ``ledger`` need neither torch nor Opacus."""
    artifact = train_retriever.run(
        retriever_config(tmp_path / "r", tiny_beir, tiny_encoder_dir, dp="group", epsilon=8)
    )
    probe = (
        "import sys\nfrom synthq.cli.app import app\n"
        f"app(['{{}}', {str(artifact.path)!r}], standalone_mode=False)\n"
        "print('heavy:', sorted(m for m in ('torch', 'opacus', 'scipy') if m in sys.modules))"
    )
    for command in ("info", "ledger"):
        _synthq(command, str(artifact.path))  # the first call may compute
        shown = subprocess.run([sys.executable, "-c", probe.format(command)], capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        assert "heavy: []" in shown.stdout and "8.00" in shown.stdout


def test_progress_prints_plain_lines_when_not_a_terminal(capsys, monkeypatch):
    from synthq.runtime import console

    monkeypatch.setenv("SYNTHQ_PROGRESS_INTERVAL", "0")
    monkeypatch.setattr(console.console, "_force_terminal", False)
    bar = console.progress()
    assert isinstance(bar, console.LoggedProgress)
    with bar:
        task = bar.add_task("finetune-lm", total=4, eps="0")
        for step in range(4):
            bar.update(task, advance=1, eps=f"{0.5 * (step + 1):.2f}", loss=1.0 / (step + 1))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("finetune-lm")]
    assert len(lines) == 4
    assert lines[1].startswith("finetune-lm: 2/4 (50%) eps=1.00 loss=0.5 | ") and "/s elapsed=" in lines[1]
    assert "eta=" in lines[1] and "elapsed=" in lines[-1]
