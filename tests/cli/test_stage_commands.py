"""Stage commands: a config field is an option that reaches the stage."""

from __future__ import annotations

from typer.testing import CliRunner

from synthq.cli.app import app

runner = CliRunner()


class Stop(Exception):
    """Ends the stage once the optimizer is built."""


def test_retriever_weight_decay_reaches_the_optimizer(tmp_path, tiny_beir, tiny_encoder_dir, monkeypatch):
    """``--weight-decay`` (default 0.01, the value that used to be written in the stage) is the
    optimizer's decoupled weight decay."""
    from synthq.stages import train_retriever

    seen = []

    def make_optimizer(name, parameters, lr, weight_decay=0.0):
        seen.append((name, lr, weight_decay))
        raise Stop

    monkeypatch.setattr(train_retriever, "make_optimizer", make_optimizer)
    base = ["train-retriever", "--data", str(tiny_beir), "--encoder", str(tiny_encoder_dir),
            "--out", str(tmp_path / "r"), "--batch-size", "4", "--max-steps", "1", "--seed", "0"]  # fmt: skip
    for extra in ([], ["--weight-decay", "0.05"]):
        result = runner.invoke(app, base + extra)
        assert isinstance(result.exception, Stop), result.output
    assert seen == [("adamw", 2e-5, 0.01), ("adamw", 2e-5, 0.05)]
    assert not (tmp_path / "r").exists()
