"""The CLI shell: help, info on an artifact, data info, and error exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from typer.testing import CliRunner

from synthq.artifacts.create import create_artifact
from synthq.cli.app import app
from synthq.privacy.accounting import epsilon_for
from synthq.privacy.guarantee import Guarantee

runner = CliRunner()


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "info" in result.output and "data" in result.output


def test_positional_arguments_read_as_unix_usage():
    """``DIR...`` in the usage and the list, never typer's ``{DIR}...`` or ``<list[Path]>``."""
    expected = (("ledger", "[OPTIONS] DIR..."), ("export", "[OPTIONS] DIR"), ("search", "QUERY..."))
    for command, usage in expected:
        result = runner.invoke(app, [command, "--help"], terminal_width=120)
        assert result.exit_code == 0, result.output
        first = result.output.strip().splitlines()[0]
        assert first.startswith(f"Usage: synthq {command}") and first.endswith(usage), first
        assert "<list[" not in result.output and "{" not in result.output
        assert f"  {usage.split()[-1]}  " in result.output  # the argument's own help line


def test_info_prints_guarantee_and_lineage(tmp_path, tiny_beir):
    from synthq.artifacts.records import data_input_record

    out = tmp_path / "gen"
    with create_artifact(out, "finetune-lm", {"epsilon": 8}, [data_input_record(tiny_beir)]) as writer:
        (writer.dir / "x.txt").write_text("x")
        epsilon = epsilon_for(0.9, 1e-5, 0.05, 300).epsilon
        writer.privacy = Guarantee(
            epsilon=epsilon, delta=1e-5, mechanism="dp-adam", accountant="rdp",
            details={"noise_multiplier": 0.9, "sample_rate": 0.05, "steps": 300},
        )  # fmt: skip
        writer.metrics["final_loss"] = 1.25
    result = runner.invoke(app, ["info", str(out)])
    assert result.exit_code == 0, result.output
    assert f"ε = {epsilon:.2f}" in result.output and "rdp" in result.output
    assert "noise_multiplier: 0.9" in result.output and "final_loss: 1.25" in result.output
    assert str(tiny_beir) in result.output
    as_json = runner.invoke(app, ["info", str(out), "--json"])
    assert json.loads(as_json.output)["privacy"]["epsilon"] == epsilon


def test_data_info(tiny_beir, tmp_path):
    result = runner.invoke(app, ["data", "info", str(tiny_beir), "--json"])
    assert result.exit_code == 0
    summary = json.loads(result.output)
    assert summary["documents"] == 12 and summary["splits"]["test"]["queries"] == 4
    assert {split: row["privacy"] for split, row in summary["splits"].items()} == {
        "train": "private",
        "dev": "private",
        "test": "public",  # as the fixture's privacy.json says
    }
    undeclared = shutil.copytree(tiny_beir, tmp_path / "undeclared")
    (undeclared / "privacy.json").unlink()
    table = runner.invoke(app, ["data", "info", str(undeclared)]).output
    summary = json.loads(runner.invoke(app, ["data", "info", str(undeclared), "--json"]).output)
    assert {row["privacy"] for row in summary["splits"].values()} == {"private"}  # fail closed
    assert "privacy" in table and "private unless the dataset's privacy.json declares it public" in table
    with create_artifact(tmp_path / "syn", "generate", {}) as writer:  # a synthetic set: its own ε
        for name in ("corpus.jsonl", "queries.jsonl", "qrels"):
            copy = shutil.copytree if (tiny_beir / name).is_dir() else shutil.copyfile
            copy(tiny_beir / name, writer.dir / name)
        writer.privacy = Guarantee.public()
    summary = json.loads(runner.invoke(app, ["data", "info", str(tmp_path / "syn"), "--json"]).output)
    assert {row["privacy"] for row in summary["splits"].values()} == {"the set's ε"}


def test_user_errors_exit_2_with_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "from synthq.cli import main; main()", "info", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "no such artifact directory" in result.stderr and "Traceback" not in result.stderr
