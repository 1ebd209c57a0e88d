"""benchmarks/pipeline_wall.py times the README's audit command: the two must stay the same
command, and a finished run of another command must not be recorded as it. A demo's record sums
its stages' own times by kind."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from benchmarks.pipeline_wall import AUDIT_ARGUMENTS, _options, audit_record, stage_seconds

ROOT = Path(__file__).resolve().parents[1]


def readme_audit_command() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### 6. `synthq canary-audit`") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return shlex.split(block.replace("\\\n", " "))


def test_the_benchmark_runs_the_readme_audit_command():
    words = readme_audit_command()
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


def test_demo_stage_times_are_summed_by_kind_from_manifests_and_private_diagnostics(tmp_path):
    def artifact(name: str, stage: str, public: float | None = None, private: float | None = None):
        (tmp_path / name / "diagnostics").mkdir(parents=True)
        timings = {} if public is None else {"wall_seconds": public}
        (tmp_path / name / "manifest.json").write_text(json.dumps({"stage": stage, "timings": timings}))
        if private is not None:
            metrics = {"timings": {"wall_seconds": private}}
            (tmp_path / name / "diagnostics" / "metrics.json").write_text(json.dumps(metrics))

    artifact("gen", "finetune-lm", private=140.0)
    artifact("ret-a", "train-retriever", private=30.5)
    artifact("ret-b", "train-retriever", private=31.0)
    artifact("syn", "generate", public=94.6)
    artifact("half", "eval")  # no timings: left out
    assert list(stage_seconds(tmp_path).items()) == [  # largest first
        ("finetune-lm", {"stages": 1, "seconds": 140.0}),
        ("generate", {"stages": 1, "seconds": 94.6}),
        ("train-retriever", {"stages": 2, "seconds": 61.5}),
    ]
