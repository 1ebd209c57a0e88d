"""benchmarks/pipeline_wall.py times the documented audit command (the first command of
docs/stages/canary-audit.md, the command the README used to hold): the two must stay the same
command, and a finished run of another command must not be recorded as it. A demo's record sums
its stages' own times by kind."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from benchmarks.pipeline_wall import AUDIT_ARGUMENTS, _options, audit_record, stage_seconds

ROOT = Path(__file__).resolve().parents[2]


def documented_audit_command() -> list[str]:
    text = (ROOT / "docs" / "stages" / "canary-audit.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    return shlex.split(block.replace("\\\n", " "))


def test_the_benchmark_runs_the_documented_audit_command():
    words = documented_audit_command()
    assert words[:2] == ["synthq", "canary-audit"]
    arguments = words[2:]
    out = arguments.index("--out")
    assert arguments[:out] + arguments[out + 2 :] == AUDIT_ARGUMENTS


def _finished_audit(tmp_path: Path, **changes) -> Path:
    options = _options(AUDIT_ARGUMENTS)
    config = {
        **{k: v for k, v in options.items() if k not in ("canaries", "private_pairs", "retriever_documents")},
        "canaries": 200, "private_pairs": 120, "retriever_documents": 30, "epsilons": ["inf", 8.0],
        "finetune": {k: (int(v) if v.isdigit() else v) for k, v in options["finetune"].items()},
        "retriever": {"epochs": 3, "lr": 0.0001, "batch_size": 16},
    }  # fmt: skip
    config.update(changes)
    manifest = {
        "stage": "canary-audit",
        "config": config,
        "timings": {"wall_seconds": 587.0, "reference_seconds": 44.3},
    }
    rows = [
        {"audited": "generator", "proven_epsilon": float("inf"), "correct": 60, "guesses": 60,
         "epsilon_lower_bound": 2.4737, "auroc": 0.926},
        {"audited": "generator", "proven_epsilon": 7.99, "correct": 48, "guesses": 100,
         "epsilon_lower_bound": 0.0, "auroc": 0.48},
    ]  # fmt: skip
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "audit.json").write_text(json.dumps({"one_run": rows}))
    return tmp_path


def test_a_finished_audit_is_recorded_with_its_power(tmp_path):
    record = audit_record(_finished_audit(tmp_path), None)
    assert record["wall_seconds"] == 587.0 and record["phases"] == {"reference_seconds": 44.3}
    assert record["power"]["generator_inf_lower_bound"] == 2.47
    assert record["power"]["correct"] == "60/60"


def test_a_finished_run_of_another_command_is_refused(tmp_path):
    directory = _finished_audit(tmp_path, canaries=100)
    with pytest.raises(SystemExit, match="differs in: canaries"):
        audit_record(directory, None)


def test_demo_stage_times_are_summed_by_kind_from_the_run_output():
    output = [
        "───── [1/5] finetune-lm gen-eps8 (elapsed 0 s, pipeline ≈ 77.2 min left) ──────",
        "[1/5] finetune-lm gen-eps8 done in 2.4 min: ε=8.00 δ=4.1e-04 (query)",
        "train-retriever: 38/38 (100%) | 1.19/s elapsed=0m32s eta=0m00s",
        "[2/5] train-retriever ret-a done in 32 s: ε=∞",
        "[3/5] train-retriever ret-b done in 1.5 min: ε=8.00 δ=4.1e-04 (query)",
        "[4/5] generate syn done in 59 s: ε=8.00 δ=4.1e-04 (query)",
        "[5/5] eval eval-dev: up to date, skipped",
    ]
    assert list(stage_seconds(output).items()) == [  # largest first
        ("finetune-lm", {"stages": 1, "seconds": 144.0}),
        ("train-retriever", {"stages": 2, "seconds": 122.0}),
        ("generate", {"stages": 1, "seconds": 59.0}),
    ]
