"""Every config field is an option with help; old option names and repeated shards still parse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from synthq.cli.app import app
from synthq.config.evaluation import EvalConfig
from synthq.config.generator import FinetuneConfig, GenerateConfig
from synthq.config.retriever import TrainRetrieverConfig
from synthq.runtime.errors import ArtifactError
from tests.helpers import one_line, run_main


@pytest.mark.parametrize(
    ("command", "config_class"),
    [
        ("finetune-lm", FinetuneConfig),
        ("generate", GenerateConfig),
        ("train-retriever", TrainRetrieverConfig),
        ("eval", EvalConfig),
    ],  # fmt: skip
)
def test_every_config_field_is_an_option_with_help(command, config_class):
    from typer.testing import CliRunner

    from synthq.cli.options import flag_name

    result = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0
    text = result.output.split("\nOptions:\n")[1]
    assert "<bool>" not in text and "list[" not in text
    for name, field in config_class.model_fields.items():
        if (field.json_schema_extra or {}).get("cli", {}).get("hidden"):
            continue
        entries = ("\n" + text).split("\n  -")  # one option (and its wrapped help) per entry
        line = " ".join(
            next(e for e in entries if re.match(re.escape(flag_name(name, field)[1:]) + r"[ ,]", e)).split()
        )
        assert field.description and " ".join(field.description.split()[:3]) in line
        default = field.get_default(call_default_factory=True)
        if isinstance(default, int | float | str) and not isinstance(default, bool) and default != "":
            assert f"[default: {default}]" in line


def test_old_batch_size_names_still_work():
    assert GenerateConfig(out="o", generator="g", batch_size=3).generation_batch_size == 3
    assert EvalConfig(out="o", batch_size=5).encode_batch_size == 5
    from synthq.cli.options import build

    assert (
        build(
            GenerateConfig, {"out": "o", "generator": "g", "generation_batch_size": "7"}
        ).generation_batch_size
        == 7
    )


def test_merge_takes_several_shards_after_one_flag(tmp_path, capsys, monkeypatch):
    from synthq.stages import generate

    seen = {}

    def merge(shards, out, force=False):
        seen.update(shards=shards, out=out, force=force)
        raise ArtifactError("stop here")

    monkeypatch.setattr(generate, "merge", merge)
    argv = ["generate", "--merge", "runs/syn-0", "runs/syn-1", "runs/syn-2", "--out", "runs/syn"]
    status, output = run_main(argv, capsys, monkeypatch)
    assert status == 2 and "stop here" in one_line(output)
    assert seen == {
        "shards": [Path(f"runs/syn-{i}") for i in range(3)],
        "out": Path("runs/syn"),
        "force": False,
    }
    status, output = run_main(["generate", "runs/syn-0", "--out", "x"], capsys, monkeypatch)
    assert status == 2 and "after --merge" in one_line(output)
